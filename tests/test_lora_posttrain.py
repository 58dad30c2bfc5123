"""LoRA with `redline sft`, `redline dpo` and `redline grpo` on a tiny model: only the adapters train, the base's
files stay as they were, resume is exact, the result loads merged for generate --chat and exports as a PEFT
adapter; DPO's reference is the base with the adapters off; GRPO's rollouts see the adapters."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from redline.training import checkpoint as ckpt_io
from tests.test_sft import _cli, _info, _pretrain
from tests.test_train import dataset, train_losses  # noqa: F401  (a pytest fixture)

SFT = ["--data", "task:letter_count", "seq_len=128", "batch_size=4", "eval_batches=1", "log_every=1",
       "tensorboard=False", "optim.warmup_steps=1"]


def _digests(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def chat_base(dataset, tmp_path_factory):  # noqa: F811
    """A pretrained tiny model given redline's chat tokens by one step of full SFT: a base LoRA can fine-tune."""
    root = tmp_path_factory.mktemp("chatbase")
    pre = _pretrain(dataset, root)
    assert _cli(["sft", "--from", str(pre), *SFT, f"out_dir={root}", "run_name=chat", "max_steps=1"]) == 0
    return ckpt_io.resolve_checkpoint(root / "chat")


@pytest.mark.slow
def test_lora_sft_trains_adapters_resumes_exactly_and_chats(chat_base, tmp_path, capsys):
    before = _digests(chat_base)
    common = [*SFT, "lora.enabled=True", "lora.rank=4", "lora.dropout=0.1", f"out_dir={tmp_path}",
              "checkpoint_every=2"]
    assert _cli(["sft", "--from", str(chat_base), *common, "run_name=straight", "max_steps=4"]) == 0
    shutil.copytree(tmp_path / "straight", tmp_path / "half")
    shutil.rmtree(ckpt_io.list_checkpoints(tmp_path / "half")[-1])
    assert _cli(["sft", "--resume", str(tmp_path / "half")]) == 0
    assert train_losses(tmp_path / "straight") == train_losses(tmp_path / "half")  # bit-for-bit on a CPU
    assert _digests(chat_base) == before  # the base's files untouched

    ckpt = ckpt_io.resolve_checkpoint(tmp_path / "straight")
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["lora_base"]["path"] == str(chat_base.resolve())
    saved = load_file(str(ckpt / "model.safetensors"))
    assert saved and all(k.endswith(("lora_A", "lora_B")) for k in saved)  # only what trained
    assert any(v.abs().max() > 0 for k, v in saved.items() if k.endswith("lora_B"))  # B moved off zero

    # merged on load: only the adapted Linear weights differ from the base; the vocabulary did not grow
    merged, tokenizer, cfg = ckpt_io.load_for_inference(ckpt)
    base, base_tokenizer, _ = ckpt_io.load_for_inference(chat_base)
    assert cfg.model.vocab_size == base.cfg.vocab_size and tokenizer.identity == base_tokenizer.identity
    adapted = {k.removesuffix(".lora_A") + ".weight" for k in saved if k.endswith("lora_A")}
    base_state = base.state_dict()
    for name, value in merged.state_dict().items():
        if name in adapted:
            assert not torch.equal(value, base_state[name]), name
        else:
            torch.testing.assert_close(value, base_state[name], rtol=0, atol=0, msg=name)

    capsys.readouterr()
    assert _cli(["generate", "--checkpoint", str(tmp_path / "straight"), "--chat", "--prompt", "Remember: a=1. "
                 "What is the value of a?", "--max-new-tokens", "4", "--temperature", "0", "--jsonl", "-"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 1 <= record["completion_tokens"] <= 4

    # the adapters of an SFT LoRA run export as a PEFT adapter, as a `redline train` LoRA run's do
    assert _cli(["export", str(tmp_path / "straight"), "--adapter", str(tmp_path / "adapter")]) == 0
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and (tmp_path / "adapter" / "adapter_model.safetensors").is_file()


def test_lora_sft_of_a_base_without_chat_tokens_is_one_line(dataset, tmp_path, capsys):  # noqa: F811
    pre = _pretrain(dataset, tmp_path)
    code = _cli(["sft", "--from", str(pre), *SFT, "lora.enabled=True", "max_steps=1", f"out_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code != 0 and "LoRA does not grow the vocabulary" in err and "without LoRA first" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pre"]  # nothing written


# ----------------------------------------------------------------------------------------------------
# DPO and GRPO: the reference is the base with the adapters off; only the adapters train


def _lora_step(cfg_args, objective, seed=0):
    from redline.config import TrainConfig, parse
    from redline.model import GPT
    from redline.training.step import TrainStep

    cfg = parse(TrainConfig, [*cfg_args, "lora.enabled=True", "init_from=unused", "lora.rank=4"], prog="t",
                description="t")
    torch.manual_seed(seed)
    model = GPT(cfg.model)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    return TrainStep(cfg, torch.device("cpu"), model=model, objective=objective), start, cfg


def _frozen_unchanged(step, start) -> None:
    """Every base weight (under its pre-LoRA name) as it started; the adapters' B moved."""
    state = step.model.state_dict()
    for name, value in start.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=name)
    assert all(p.requires_grad == n.endswith(("lora_A", "lora_B")) for n, p in step.model.named_parameters())
    assert any(state[n].abs().max() > 0 for n in state if n.endswith("lora_B"))


@pytest.mark.slow
def test_dpo_lora_reference_is_the_starting_model_and_only_adapters_train():
    from redline.model import GPT
    from redline.posttrain.data import PairData, PairSet
    from redline.posttrain.dpo import DPO, PairBatches, reference_logps
    from tests.test_dpo import random_pairs

    pairs = random_pairs(4)
    objective = DPO(beta=0.5)
    args = ["--preset", "tiny", "model.n_layer=2", "model.n_embd=32", "model.n_head=4", "model.n_kv_head=2",
            "model.vocab_size=256", "model.context_len=64", "seq_len=64", "batch_size=2", "compile=False",
            "optim.lr=3e-2", "optim.warmup_steps=0", "optim.weight_decay=0"]
    step, start, cfg = _lora_step(args, objective)
    data = PairData("pairs", None, PairSet(pairs, 0), None, objective)
    data.train_loader(cfg, _info(), torch.device("cpu"))  # a new LoRA run: the reference from the base, adapters off
    plain = GPT(cfg.model)
    plain.load_state_dict(start)
    expected = reference_logps(plain, pairs, 4, torch.device("cpu"))
    torch.testing.assert_close(objective.reference, expected, rtol=1e-5, atol=1e-5)  # the starting model's
    batches = PairBatches(pairs, 2, torch.device("cpu"), seed=3)
    losses = [float(step.step((batches.next_batch() for _ in range(1)), 1.0).loss) for _ in range(15)]
    assert losses[0] == pytest.approx(0.693147, abs=1e-4) and losses[-1] < losses[0] - 0.05
    _frozen_unchanged(step, start)
    # after training, the adapters-off pass still gives the reference: it is the base, not the policy
    again = DPO()
    PairData("pairs", None, PairSet(pairs, 0), None, again).reference_from_base(step, 4, None)
    torch.testing.assert_close(again.reference, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_grpo_lora_rollouts_see_the_adapters_and_the_kl_reference_is_the_base():
    from redline.model import GPT
    from redline.posttrain.grpo import GRPO
    from redline.posttrain.rollouts import Rollouts, RolloutSettings, disabled_reference, task_prompts
    from redline.posttrain.rollouts import token_logps
    from tests.test_grpo import FirstLetterTask, chat_setup

    args = ["--preset", "tiny", "model.n_layer=2", "model.n_embd=32", "model.n_head=4", "model.n_kv_head=2",
            "model.vocab_size=261", "model.context_len=64", "seq_len=64", "batch_size=8", f"tokens_per_step={16 * 64}",
            "compile=False", "optim.lr=2e-2", "optim.warmup_steps=0", "optim.weight_decay=0"]
    objective = GRPO(0.1)
    step, start, cfg = _lora_step(args, objective)
    tokenizer, renderer = chat_setup()
    task = FirstLetterTask()
    prompts, _ = task_prompts(task, renderer, "train", 64 - 8)
    settings = RolloutSettings(group_size=4, prompts_per_step=4, max_new_tokens=6)
    loader = Rollouts(objective, prompts, task, renderer, tokenizer, settings, 8, torch.device("cpu"), None, seed=5,
                      reference=disabled_reference(step))
    for _ in range(3):
        step.step((loader.next_batch() for _ in range(step.plan.accum)), 1.0)
    _frozen_unchanged(step, start)
    assert loader._engine.model is step.model  # the engine runs the adapted training model, no copy

    batch = loader.next_batch()
    base = GPT(cfg.model).eval()
    base.load_state_dict(start)
    with torch.no_grad():  # the KL reference: the base's log-probabilities, not the policy's
        torch.testing.assert_close(batch["ref_logps"], token_logps(base, batch["inputs"], batch["targets"]),
                                   rtol=1e-5, atol=1e-5)
    # the engine's greedy decoding is the merged (adapted) model's, and differs from the base's
    lora = step.converters.get("lora")
    with torch.no_grad():
        for layer in lora.layers.values():
            layer.lora_B.normal_(0, 0.5)  # an update large enough to change the argmax
    merged = GPT(cfg.model).eval()
    merged_state = dict(start)
    for name, layer in lora.layers.items():
        merged_state[name + ".weight"] = start[name + ".weight"] + layer.delta()
    merged.load_state_dict(merged_state)
    from redline.inference import InferenceEngine, SamplingParams

    rows = [p.ids for p in prompts[:3]]
    with step.evaluation() as model:
        adapted = [g.tokens for g in loader.engine(model).generate(rows, 6, SamplingParams())]
    assert adapted == [g.tokens for g in InferenceEngine(merged).generate(rows, 6, SamplingParams())]
    assert adapted != [g.tokens for g in InferenceEngine(base).generate(rows, 6, SamplingParams())]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["dpo", "grpo"])
def test_lora_dpo_and_grpo_cli_resume_exactly_and_save_adapters(chat_base, tmp_path, command):
    from tests.test_posttrain_cli import records, resumed_equals_straight

    before = _digests(chat_base)
    own = (["--data", "task:arithmetic", "dpo.max_pairs=24", "seq_len=128", "batch_size=4", "eval_every=2"]
           if command == "dpo" else
           ["--task", "arithmetic", "grpo.prompts_per_step=2", "grpo.group_size=3", "grpo.max_new_tokens=4",
            "grpo.eval_examples=3", "grpo.kl_coef=0.1", "batch_size=3", "eval_every=2"])
    resumed_equals_straight(tmp_path, [command, "--from", str(chat_base), *own, "lora.enabled=True", "lora.rank=4",
                                       "eval_batches=1", "log_every=1", "checkpoint_every=2", "tensorboard=False",
                                       f"out_dir={tmp_path}"])
    assert _digests(chat_base) == before
    ckpt = ckpt_io.resolve_checkpoint(tmp_path / "straight")
    assert json.loads((ckpt / "meta.json").read_text())["lora_base"]["path"] == str(chat_base.resolve())
    assert all(k.endswith(("lora_A", "lora_B")) for k in load_file(str(ckpt / "model.safetensors")))
    first = records(tmp_path / "straight", "train")[0]
    if command == "dpo":  # the policy starts as the reference (the base with the adapters off): -log σ(0)
        assert first["loss"] == pytest.approx(0.693147, abs=1e-5)
    else:  # the first rollout's policy is the reference: KL 0
        assert first["kl"] == pytest.approx(0.0, abs=1e-6)
    merged, _, _ = ckpt_io.load_for_inference(ckpt)  # eval, generate, chat load it merged
    assert merged.cfg.vocab_size == ckpt_io.load_for_inference(chat_base)[0].cfg.vocab_size
