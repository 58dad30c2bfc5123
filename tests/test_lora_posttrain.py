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
from tests.test_sft import _cli, _pretrain
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
