"""`redline dpo` and `redline grpo` end to end on a tiny pretrained checkpoint: exact resume through the one training
loop (bit-for-bit losses on a CPU), what their metrics and evaluations record, and bad input as one line with
nothing written."""

from __future__ import annotations

import json
import shutil

import pytest

from redline.training import checkpoint as ckpt_io
from tests.test_sft import _cli, _pretrain
from tests.test_train import dataset, train_losses  # noqa: F401  (a pytest fixture)


def records(run_dir, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def resumed_equals_straight(tmp_path, command: list[str]) -> None:
    """The command run to step 4, and the same run cut at its step-2 checkpoint and resumed: the same losses and
    gradient norms (GRPO's loss is near 0 on policy whatever it samples; its gradient is not)."""
    assert _cli([*command, "run_name=straight", "max_steps=4"]) == 0
    shutil.copytree(tmp_path / "straight", tmp_path / "half")
    shutil.rmtree(ckpt_io.list_checkpoints(tmp_path / "half")[-1])
    assert _cli([command[0], "--resume", str(tmp_path / "half")]) == 0
    assert train_losses(tmp_path / "straight") == train_losses(tmp_path / "half")
    norms = [[r["grad_norm"] for r in records(tmp_path / run, "train")] for run in ("straight", "half")]
    assert len(norms[0]) == 4 and norms[0] == norms[1]


@pytest.mark.slow
def test_dpo_cli_resumes_exactly_and_evaluates_held_out_pairs(dataset, tmp_path):  # noqa: F811
    pre = _pretrain(dataset, tmp_path)
    resumed_equals_straight(tmp_path, [
        "dpo", "--from", str(pre), "--data", "task:arithmetic", "dpo.max_pairs=24", "seq_len=128", "batch_size=4",
        "eval_batches=1", "eval_every=2", "log_every=1", "checkpoint_every=2", "tensorboard=False",
        f"out_dir={tmp_path}"])
    first = records(tmp_path / "straight", "train")[0]
    assert first["loss"] == pytest.approx(0.693147, abs=1e-5)  # the policy starts as the reference: -log σ(0)
    assert {"reward_margin", "preference_accuracy", "rewards_chosen", "rewards_rejected"} <= set(first)
    evaluation = records(tmp_path / "straight", "eval")[-1]
    assert 0 <= evaluation["preference_accuracy"] <= 1 and "reward_margin" in evaluation
    state = ckpt_io.load_state(ckpt_io.resolve_checkpoint(tmp_path / "straight"))
    assert state["train_step"]["objective"]["reference"].shape == (24, 2)  # computed once, kept in checkpoints


def digit_task(tmp_path):
    """A task the tiny pretrained model sometimes gets right by chance (a one-digit answer, the last number it
    samples), so that its rollouts earn rewards that differ and a resume has something to get wrong: on arithmetic
    it earns none, and every record would match trivially."""
    path = tmp_path / "digit.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Name a number ({i}).", "answer": str(i % 10)}) + "\n"
                            for i in range(8)))
    return str(path)


def rewarded(run_dir) -> bool:
    return any(r["reward_mean"] > 0 for r in records(run_dir, "train")[2:])  # in the steps after the cut


@pytest.mark.slow
def test_grpo_cli_resumes_exactly_and_logs_rewards(dataset, tmp_path):  # noqa: F811
    pre = _pretrain(dataset, tmp_path)
    resumed_equals_straight(tmp_path, [
        "grpo", "--from", str(pre), "--task", digit_task(tmp_path), "grpo.prompts_per_step=2", "grpo.group_size=3",
        "grpo.max_new_tokens=8", "grpo.eval_examples=3", "grpo.kl_coef=0.1", "grpo.pass_k=2", "batch_size=3",
        "eval_every=2", "log_every=1", "checkpoint_every=2", "tensorboard=False", f"out_dir={tmp_path}"])
    assert rewarded(tmp_path / "straight")
    step = records(tmp_path / "straight", "train")[-1]
    assert {"reward_mean", "pass_at_1", "pass_at_2", "kl", "completion_tokens"} <= set(step)
    assert "accuracy" in records(tmp_path / "straight", "eval")[-1]
    # tokens count the rows as computed (micro-batches of 3 rows, each as long as its longest prompt + completion),
    # not the plan's 6 rows × seq_len a step
    seq_len = json.loads((tmp_path / "straight" / "config.json").read_text())["seq_len"]
    tokens = records(tmp_path / "straight", "event")[-1]["tokens"]
    assert tokens % 3 == 0 and tokens != 4 * 6 * seq_len


@pytest.mark.slow
def test_grpo_cli_with_several_updates_per_rollout_resumes_exactly_mid_rollout(dataset, tmp_path):  # noqa: F811
    """The queued batches go through a checkpoint and back, with rewards that differ."""
    pre = _pretrain(dataset, tmp_path)
    resumed_equals_straight(tmp_path, [  # 3 steps a rollout: the step-2 checkpoint holds the third's batches
        "grpo", "--from", str(pre), "--task", digit_task(tmp_path), "grpo.prompts_per_step=2", "grpo.group_size=6",
        "grpo.max_new_tokens=16", "grpo.eval_examples=3", "grpo.updates_per_rollout=3", "batch_size=6",
        "eval_every=0", "log_every=1", "checkpoint_every=2", "tensorboard=False", f"out_dir={tmp_path}"])
    assert rewarded(tmp_path / "straight")
    state = ckpt_io.load_state(ckpt_io.list_checkpoints(tmp_path / "half")[0])
    queue = state["loader"]["queue"]
    assert len(queue) == 2 and all(b["old_logps"].shape == b["inputs"].shape for b in queue)


@pytest.mark.slow
def test_bad_input_is_one_line_and_writes_nothing(dataset, tmp_path, capsys):  # noqa: F811
    pre = _pretrain(dataset, tmp_path)
    same = tmp_path / "same.jsonl"
    same.write_text(json.dumps({"prompt": "2+2?", "chosen": "4", "rejected": "4"}) + "\n")
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "x" * 400, "chosen": "4", "rejected": "5"}) + "\n")
    for args, match in [
        (["dpo", "--data", str(same)], "\"chosen\" and \"rejected\" are identical"),
        (["dpo", "--data", str(long)], "every pair of"),
        (["dpo", "--data", "task:nope"], "unknown task 'nope'"),
        (["grpo", "--task", "nope"], "unknown task 'nope'"),
        (["grpo", "--task", "arithmetic_mc"], "is multiple-choice"),
        (["grpo", "--task", "arithmetic", "grpo.group_size=3", "batch_size=5"], "not a multiple of batch_size=5"),
        (["grpo", "--task", "arithmetic", "grpo.max_new_tokens=127"], "leaves no room for a prompt"),
    ]:
        code = _cli([args[0], "--from", str(pre), *args[1:], f"out_dir={tmp_path}", "run_name=bad"])
        last = capsys.readouterr().err.strip().splitlines()[-1]  # (after any library warnings)
        assert code == 2 and last.startswith(f"redline {args[0]}: error: ") and match in last, (args, last)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.jsonl", "pre", "same.jsonl"]


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_dpo_and_grpo_run_on_a_gpu_compiled(dataset, tmp_path):  # noqa: F811
    """The GPU path of both commands as a user runs them (device and compilation left to their defaults): DPO's
    compiled step, GRPO's rollouts through the engine (compiled, CUDA graphs, on the bf16 copy that
    grpo.rollout_weights=auto takes on a GPU) between compiled training steps; rewards and margins logged."""
    import torch

    pre = _pretrain(dataset, tmp_path)  # a CPU checkpoint: the commands move it to the GPU
    common = ["eval_every=2", "log_every=1", "tensorboard=False", f"out_dir={tmp_path}", "max_steps=2"]
    assert _cli(["dpo", "--from", str(pre), "--data", "task:arithmetic", "dpo.max_pairs=16", "seq_len=128",
                 "batch_size=4", "eval_batches=1", "run_name=dpo", *common]) == 0
    assert _cli(["grpo", "--from", str(pre), "--task", "arithmetic", "grpo.prompts_per_step=2",
                 "grpo.group_size=4", "grpo.max_new_tokens=8", "grpo.eval_examples=4", "batch_size=4",
                 "run_name=grpo", *common]) == 0
    for name, keys in (("dpo", {"reward_margin", "preference_accuracy"}), ("grpo", {"reward_mean", "pass_at_1"})):
        steps = records(tmp_path / name, "train")
        assert len(steps) == 2 and keys <= set(steps[-1]) and all(torch.isfinite(torch.tensor(s["loss"]))
                                                                  for s in steps), (name, steps)
        assert steps[-1]["peak_memory_gib"] is not None, steps[-1]  # measured on a CUDA device (None on a CPU)


def test_dpo_and_grpo_lower_an_inherited_learning_rate_unless_told():
    """A full DPO or GRPO run that names no learning rate takes the starting run's peak / LR_DIVISOR (AdamW where
    that run used Muon) and says so; optim.lr on the command line, or LoRA, keeps what is given."""
    from redline.config import TrainConfig
    from redline.posttrain.launch import LR_DIVISOR, _post_training_lr

    cfg = TrainConfig()
    cfg.optim.lr, cfg.optim.head_lr = 1e-3, 2e-3
    note = _post_training_lr(cfg, ["max_steps=40"], "dpo")
    assert cfg.optim.lr == pytest.approx(1e-3 / LR_DIVISOR["dpo"]) and cfg.optim.head_lr == pytest.approx(2e-5)
    assert note.startswith("optim.lr 1e-05 (the starting run's 0.001 / 100")

    cfg = TrainConfig()
    cfg.optim.lr, cfg.optim.name = 6e-4, "muon"
    assert "AdamW instead of the starting run's Muon" in _post_training_lr(cfg, [], "grpo")
    assert cfg.optim.name == "adamw" and cfg.optim.lr == pytest.approx(6e-4 / LR_DIVISOR["grpo"])

    for argv in (["optim.lr=3e-4"], ["--optim.lr", "3e-4"], ["--optim.lr=3e-4"]):
        cfg = TrainConfig()
        cfg.optim.lr = 3e-4
        assert _post_training_lr(cfg, argv, "dpo") is None and cfg.optim.lr == 3e-4
    cfg = TrainConfig()
    cfg.lora.enabled, cfg.optim.lr = True, 2e-4
    assert _post_training_lr(cfg, [], "grpo") is None and cfg.optim.lr == 2e-4


def test_sft_of_a_muon_trained_base_takes_adamw_unless_told(capsys):
    """SFT keeps the starting run's rate; where that run used Muon (the modern presets' default) it fine-tunes with
    AdamW at that rate, every weight at it (the head's own rate beside Muon dropped), and says so, unless the
    command line names optim.name."""
    from redline.commands.sft import switch_from_muon
    from redline.config import TrainConfig

    cfg = TrainConfig()
    cfg.optim.name, cfg.optim.lr = "muon", 1e-3
    cfg.optim.head_lr = cfg.optim.gain_lr = 1e-2  # modern-124m's rates beside Muon
    switch_from_muon(cfg, ["max_steps=5"], "sft")
    assert cfg.optim.name == "adamw" and cfg.optim.lr == 1e-3 and cfg.optim.head_lr is cfg.optim.gain_lr is None
    assert "AdamW at optim.lr 0.001 instead of the starting run's Muon" in capsys.readouterr().err
    cfg = TrainConfig()
    cfg.optim.name, cfg.optim.head_lr = "muon", 1e-2
    switch_from_muon(cfg, ["optim.head_lr=1e-2"], "sft")  # a rate the command line names stays
    assert cfg.optim.name == "adamw" and cfg.optim.head_lr == 1e-2
    for argv in (["optim.name=muon"], ["--optim.name", "muon"]):
        cfg = TrainConfig()
        cfg.optim.name = "muon"
        switch_from_muon(cfg, argv, "sft")
        assert cfg.optim.name == "muon"


def test_grpo_after_dpo_divides_the_sft_peak_not_dpos_lowered_rate():
    """The chain SFT (3e-3) -> DPO -> GRPO: GRPO's default is 3e-3 / 200 whether DPO derived its rate or was told
    one; without finetune.base_lr carried along it was DPO's 3e-5 / 200 = 1.5e-7, a run that does not move."""
    import dataclasses

    from redline.config import TrainConfig
    from redline.posttrain.launch import _post_training_lr

    for dpo_argv, dpo_lr in (([], 3e-5), (["optim.lr=1e-5"], 1e-5)):
        sft = TrainConfig()
        sft.optim.lr = 3e-3
        dpo = dataclasses.replace(sft, optim=dataclasses.replace(sft.optim), finetune=dataclasses.replace(sft.finetune))
        if dpo_argv:  # as the command line sets it, over the SFT run's 3e-3
            dpo.optim.lr = 1e-5
        _post_training_lr(dpo, dpo_argv, "dpo", base=3e-3)  # start_run reads base from the SFT run's config
        assert dpo.optim.lr == pytest.approx(dpo_lr) and dpo.finetune.base_lr == 3e-3
        grpo = dataclasses.replace(dpo, optim=dataclasses.replace(dpo.optim), finetune=dataclasses.replace(dpo.finetune))
        note = _post_training_lr(grpo, [], "grpo")
        assert grpo.optim.lr == pytest.approx(3e-3 / 200) and "the pretraining or SFT run's 0.003 / 200" in note


def test_the_chain_sft_dpo_grpo_divides_the_sft_peak(dataset, tmp_path):  # noqa: F811
    """Through the commands: sft at 2e-3, then dpo told 1e-5, then grpo told nothing: 2e-3 / 200."""
    pre = _pretrain(dataset, tmp_path)
    task = digit_task(tmp_path)
    common = [f"out_dir={tmp_path}", "seq_len=64", "max_steps=1", "eval_batches=1", "tensorboard=False"]
    assert _cli(["sft", "--from", str(pre), "--data", task, "run_name=s", "batch_size=2", "optim.lr=2e-3",
                 *common]) == 0
    pairs = tmp_path / "p.jsonl"
    pairs.write_text(json.dumps({"prompt": "Name a number (1).", "chosen": "1", "rejected": "2"}) + "\n")
    assert _cli(["dpo", "--from", str(tmp_path / "s"), "--data", str(pairs), "run_name=d", "batch_size=1",
                 "optim.lr=1e-5", *common]) == 0
    assert _cli(["grpo", "--from", str(tmp_path / "d"), "--task", task, "run_name=g", "batch_size=2",
                 "grpo.prompts_per_step=1", "grpo.group_size=2", "grpo.max_new_tokens=2", "grpo.eval_examples=1",
                 *common]) == 0
    lr = {run: json.loads((tmp_path / run / "config.json").read_text())["optim"]["lr"] for run in "sdg"}
    assert lr["s"] == 2e-3 and lr["d"] == 1e-5 and lr["g"] == pytest.approx(2e-3 / 200)


def test_a_run_is_not_started_over_an_existing_one_nor_resumed_with_other_data(dataset, tmp_path, capsys):  # noqa: F811
    """dpo (as sft) refuses a run_name that holds a run, which would mix two runs' metrics and checkpoints; --resume
    refuses a --data other than the run's own (the same one, repeated, is fine); the run keeps absolute paths, so
    --resume works from another directory."""
    pre = _pretrain(dataset, tmp_path)
    args = ["dpo", "--from", str(pre), "--data", "task:arithmetic", "dpo.max_pairs=8", "seq_len=128", "batch_size=4",
            "eval_batches=1", "max_steps=1", "tensorboard=False", f"out_dir={tmp_path}", "run_name=once"]
    assert _cli(args) == 0
    capsys.readouterr()
    assert _cli(args) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert len(ckpt_io.list_checkpoints(tmp_path / "once")) == 1
    assert _cli(["dpo", "--resume", str(tmp_path / "once"), "--data", "task:letter_count"]) == 2
    assert "--data task:letter_count with --resume" in capsys.readouterr().err
    saved = ckpt_io.load_config_dict(ckpt_io.resolve_checkpoint(tmp_path / "once"))
    assert saved["finetune"]["init_from"].startswith("/")


def test_local_paths_and_resume_checks(tmp_path, monkeypatch):
    from redline.commands.sft import local_path, refuse_changed_on_resume
    from redline.errors import UserError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "chats.jsonl").write_text("")
    assert local_path("chats.jsonl") == str(tmp_path / "chats.jsonl") and local_path("task:arithmetic") == \
        "task:arithmetic"
    refuse_changed_on_resume("sft", {"--data": "chats.jsonl", "--from": None},
                             {"--data": str(tmp_path / "chats.jsonl"), "--from": "/x"})
    with pytest.raises(UserError, match="--from /y with --resume"):
        refuse_changed_on_resume("sft", {"--from": "/y"}, {"--from": "/x"})

