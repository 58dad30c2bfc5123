"""The training loop under faults and odd input (issue 27's loop items): metrics.jsonl complete up to the
checkpoint a run resumes from, signals during evaluation and saving, non-finite settings, exit codes, a finished
run resumed, the ETA after a resume, the progress bar and the closing summary."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from redline import cli
from redline.training import checkpoint as ckpt_io
from redline.training.loop import train
from tests.test_train import config, dataset  # noqa: F401  (the session-scoped prepared corpus)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_steps(run_dir: Path) -> Counter:
    return Counter(r["step"] for r in records(run_dir) if r["kind"] == "train")


# ----------------------------------------------------------------------------------------------------
# metrics.jsonl ends complete up to the checkpoint a run resumes from


def test_kill_after_a_checkpoint_loses_no_step_record(dataset, tmp_path):  # noqa: F811
    """kill -9 right after the step-6 checkpoint (steps 5 and 6 not yet on a log line): the resumed run's
    metrics hold every step exactly once."""
    args = ("max_steps=12", "checkpoint_every=3", "log_every=4", "keep_checkpoints=5")
    script = f"""
import os, signal
from pathlib import Path
from redline.training import checkpoint as ckpt_io
from redline.training.loop import train
from tests.test_train import config

real = ckpt_io.save_checkpoint

def save_then_die(run_dir, step, *args, **kwargs):
    path = real(run_dir, step, *args, **kwargs)
    if step == 6:
        os.kill(os.getpid(), signal.SIGKILL)
    return path

ckpt_io.save_checkpoint = save_then_die
train(config(Path({str(dataset)!r}), Path({str(tmp_path)!r}), *{args!r}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    run_dir = tmp_path / "runs" / "t"
    last = ckpt_io.list_checkpoints(run_dir)[-1]
    assert last.name == "step_00000006"
    result = train(config(dataset, tmp_path, *args), resume_from=last)
    assert result.step == 12
    assert train_steps(run_dir) == Counter(range(1, 13))
    assert not [r for r in records(run_dir) if r.get("event") == "metrics_gap"]


def test_resume_drops_what_a_run_wrote_after_its_checkpoint(dataset, tmp_path):  # noqa: F811
    """A run went on to step 8 after its step-6 checkpoint (as a killed one does); resumed from step 6, the
    steps after it run again and are recorded once, and the abandoned run's end and evaluation go."""
    args = ("checkpoint_every=3", "log_every=2", "keep_checkpoints=5", "eval_every=4")
    first = train(config(dataset, tmp_path, "max_steps=8", *args))
    six = ckpt_io.list_checkpoints(first.run_dir)[-2]
    assert six.name == "step_00000006"
    train(config(dataset, tmp_path, "max_steps=10", *args), resume_from=six)
    assert train_steps(first.run_dir) == Counter(range(1, 11))
    ends = [r for r in records(first.run_dir) if r.get("event") == "end"]
    assert [e["step"] for e in ends] == [10]
    assert [r["step"] for r in records(first.run_dir) if r["kind"] == "eval"] == [4, 8, 10]


def test_resume_says_once_which_records_are_missing(dataset, tmp_path, capsys):  # noqa: F811
    first = train(config(dataset, tmp_path, "max_steps=6", "log_every=2"))
    path = first.run_dir / "metrics.jsonl"
    kept = [line for line in path.read_text().splitlines()
            if not (json.loads(line)["kind"] == "train" and json.loads(line)["step"] in (2, 3))]
    path.write_text("\n".join(kept) + "\n")
    train(config(dataset, tmp_path, "max_steps=8", "log_every=2"),
          resume_from=ckpt_io.list_checkpoints(first.run_dir)[-1])
    gaps = [r for r in records(first.run_dir) if r.get("event") == "metrics_gap"]
    assert len(gaps) == 1 and gaps[0]["ranges"] == [[2, 3]] and gaps[0]["missing_steps"] == 2
    assert "no record of 2 step(s)" in capsys.readouterr().out


@pytest.mark.parametrize("during", ["eval", "save"])
def test_a_signal_during_eval_or_save_keeps_the_pending_records(dataset, tmp_path, monkeypatch, during):  # noqa: F811
    """SIGTERM arrives while the step-4 evaluation (or checkpoint) runs, with steps 1-4 not yet on a log line:
    they are written before the run stops, and the run exits with its checkpoint."""
    import redline.training.evaluate as evaluate_mod

    target, name = (evaluate_mod, "evaluate") if during == "eval" else (ckpt_io, "save_checkpoint")
    real, sent = getattr(target, name), []

    def signal_then_run(*args, **kwargs):
        if not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, signal_then_run)
    result = train(config(dataset, tmp_path, "max_steps=12", "log_every=10", "eval_every=4", "checkpoint_every=4"))
    assert result.status == "interrupted" and result.step == 4
    assert train_steps(result.run_dir) == Counter(range(1, 5))
    assert ckpt_io.list_checkpoints(result.run_dir)[-1].name == "step_00000004"


# ----------------------------------------------------------------------------------------------------
# settings, exit codes, a finished run


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.mark.parametrize("setting, fragment", [
    ("optim.lr=nan", "optim.lr must be a finite number"), ("optim.lr=inf", "optim.lr must be a finite number"),
    ("optim.lr=-1e-3", "optim.lr must be positive"), ("optim.weight_decay=nan", "optim.weight_decay must be a finite"),
    ("optim.beta2=1.5", "optim.beta2 must be in [0, 1)"), ("optim.grad_clip=-1", "optim.grad_clip must be >= 0"),
    ("max_time=inf", "max_time must be a finite number"), ("memory_fraction=nan", "memory_fraction must be a finite"),
])
def test_non_finite_and_negative_settings_are_refused_in_one_line(setting, fragment, capsys, tmp_path):
    code, out, err = run_cli(["train", f"out_dir={tmp_path}", "max_steps=1", setting], capsys)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_resuming_a_finished_run_says_so_and_changes_nothing(dataset, tmp_path, capsys):  # noqa: F811
    base = [f"data.path={dataset}", f"out_dir={tmp_path}", "run_name=f", "model.n_layer=1", "model.n_embd=32",
            "model.n_head=2", "model.context_len=32", "batch_size=2", "seq_len=16", "max_steps=3",
            "eval_batches=1", "sample_tokens=5", "tensorboard=False"]
    code, _, _ = run_cli(["train", *base], capsys)
    assert code == 0
    metrics = (tmp_path / "f" / "metrics.jsonl").read_bytes()
    checkpoints = ckpt_io.list_checkpoints(tmp_path / "f")
    code, out, _ = run_cli(["train", "--resume", f"out_dir={tmp_path}", "run_name=f"], capsys)
    assert code == 0 and "is already complete (step 3" in out and "sample" not in out
    assert (tmp_path / "f" / "metrics.jsonl").read_bytes() == metrics
    assert ckpt_io.list_checkpoints(tmp_path / "f") == checkpoints
    code, out, _ = run_cli(["train", "--resume", f"out_dir={tmp_path}", "run_name=f", "max_steps=4"], capsys)
    assert code == 0 and "already complete" not in out and max(train_steps(tmp_path / "f")) == 4


def test_the_eta_after_a_resume_counts_only_this_process(dataset, tmp_path, monkeypatch, capsys):  # noqa: F811
    """The checkpoint says the run had trained 10 hours: the resumed half's ETA still comes from its own pace."""
    first = train(config(dataset, tmp_path, "max_steps=6"))
    real_load_state = ckpt_io.load_state
    monkeypatch.setattr(ckpt_io, "load_state", lambda ckpt: {**real_load_state(ckpt), "elapsed": 36000.0})
    capsys.readouterr()
    train(config(dataset, tmp_path, "max_steps=12", "log_every=2"),
          resume_from=ckpt_io.list_checkpoints(first.run_dir)[-1])
    etas = re.findall(r"eta (\d+):(\d\d)(?::(\d\d))?", capsys.readouterr().out)
    assert etas and all(not hours and int(minutes) < 5 for minutes, _, hours in
                        [(m, s, h) for m, s, h in etas]), etas


def test_max_time_counts_neither_the_compiling_first_step_nor_evaluations(dataset, tmp_path, monkeypatch):  # noqa: F811
    """A first step (compilation) and an evaluation that each take longer than the whole 1.2 s budget: the run still
    trains for its budget, and the checkpoint keeps its training time apart from the wall time, for a resume."""
    from redline.training.loop import Run
    from redline.training.step import TrainStep

    real_step, real_evaluate = TrainStep.step, Run.evaluate
    calls = []

    def step(self, *args, **kwargs):
        calls.append(1)
        if calls.count(1) == 1:
            time.sleep(1.5)
        return real_step(self, *args, **kwargs)

    def evaluate(self):
        calls.append(0)
        if calls.count(0) == 1:  # the first evaluation (at step 3) alone: later ones at their own speed
            time.sleep(1.5)
        return real_evaluate(self)

    monkeypatch.setattr(TrainStep, "step", step)
    monkeypatch.setattr(Run, "evaluate", evaluate)
    result = train(config(dataset, tmp_path, "max_steps=0", "max_time=0.02", "eval_every=3", "log_every=100"))
    state = ckpt_io.load_state(result.checkpoint)
    assert result.status == "completed" and result.step > 3  # an evaluation at step 3, and training after it
    assert 1.2 <= state["train_time"] < state["elapsed"] - 3.0
    from redline.experiments.results import summarize_run

    end = [r for r in records(result.run_dir) if r.get("event") == "end"][-1]
    assert end["train_time"] < end["elapsed"] - 3.0 and summarize_run(result.run_dir)["train_time"] == end["train_time"]


# ----------------------------------------------------------------------------------------------------
# what the console shows


def test_without_a_terminal_the_output_has_no_progress_bar(dataset, tmp_path, capsys):  # noqa: F811
    train(config(dataset, tmp_path, "max_steps=4", "log_every=2"))
    out = capsys.readouterr().out
    assert "\r" not in out and "\x1b" not in out  # plain lines for a log file or a pipe
    lines = out.splitlines()
    assert [line.split("|")[0].split()[1] for line in lines if line.startswith("step ")] == ["2/4", "4/4"]


def test_a_decaying_schedule_without_a_budget_is_named():
    """warmup-stable-decay (the modern presets') and cosine decay over the budget: with none, the start says the rate
    stays at its peak; a constant schedule, or any budget, says nothing."""
    from redline.config import TrainConfig, parse
    from redline.training.loop import schedule_lines

    def lines(*argv):
        return schedule_lines(parse(TrainConfig, ["--preset", "modern-124m", *argv], prog="t", description="t"), 0)

    assert any("no budget" in line and "wsd" in line for line in lines())
    assert lines("max_time=5") == [] and lines("max_tokens=1000") == [] and lines("optim.schedule=constant") == []
    short = schedule_lines(parse(TrainConfig, ["--preset", "modern-124m", "max_steps=50"], prog="t", description="t"), 50)
    assert any("seq_ramp_steps=100 is not shorter than the run's 50 steps" in line for line in short)


def test_a_warmup_as_long_as_the_run_is_named(dataset, tmp_path, capsys):  # noqa: F811
    """A short run (a fine-tune) that keeps a longer warmup never reaches its peak learning rate: the start says so."""
    train(config(dataset, tmp_path, "max_steps=2", "run_name=short"))  # config's optim.warmup_steps=2
    assert "optim.warmup_steps=2 is not shorter than the run's 2 steps" in capsys.readouterr().out
    train(config(dataset, tmp_path, "max_steps=3", "run_name=long"))
    assert "is not shorter than" not in capsys.readouterr().out


def test_the_start_says_how_many_epochs_the_budget_reads(dataset, tmp_path, capsys):  # noqa: F811
    """The training split's size and the epochs the step budget reads of it; evaluations log the epochs so far."""
    from types import SimpleNamespace

    from redline.data.prepare import load_meta
    from redline.training.loop import data_lines

    run = train(config(dataset, tmp_path, "max_steps=12", "eval_every=6")).run_dir
    total = load_meta(dataset)["splits"]["train"]["tokens"]
    assert f"training data: {total:,} tokens; 12 steps of 128 tokens read {12 * 128 / total:.2f} epochs of it\n" \
        in capsys.readouterr().out
    windows = (total - 1) // 32
    assert [(r["step"], r["epoch"]) for r in records(run) if r["kind"] == "eval"] == \
        [(6, round(6 * 4 / windows, 4)), (12, round(12 * 4 / windows, 4))]
    loader = SimpleNamespace(total_tokens=1000)
    assert data_lines(loader, 300, 10) == ["training data: 1,000 tokens; 10 steps of 300 tokens read 3.00 epochs of "
                                           "it (the data repeats, reshuffled, from about step 4)"]
    assert data_lines(loader, 300, 0) == ["training data: 1,000 tokens"] and data_lines(object(), 300, 10) == []


def test_on_a_terminal_a_progress_bar_runs_between_the_log_lines(dataset, tmp_path, monkeypatch):  # noqa: F811
    import rich.console

    import redline.training.metrics as metrics_mod

    screen = io.StringIO()
    monkeypatch.setattr(metrics_mod, "Console", lambda **kwargs: rich.console.Console(
        file=screen, force_terminal=True, width=120, **{k: v for k, v in kwargs.items() if k != "stderr"}))
    train(config(dataset, tmp_path, "max_steps=4", "log_every=2"))
    text = screen.getvalue()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert re.search(r"(^|\r)step +2/4 \| loss", plain, re.M) and re.search(r"(^|\r)step +4/4 \| loss", plain, re.M)
    assert "\r" in text and "━" in plain and "100%" in plain  # the bar, redrawn in place under the lines


def test_the_closing_summary_says_what_to_run_next(dataset, tmp_path, capsys):  # noqa: F811
    result = train(config(dataset, tmp_path, "max_steps=3", "eval_every=2"))
    out = capsys.readouterr().out
    assert f"done: 3 steps, 384 tokens in" in out and "val bpb" in out
    assert f"checkpoint {result.checkpoint}" in out
    assert f"next: redline generate --checkpoint {result.run_dir}" in out


# ----------------------------------------------------------------------------------------------------
# metrics.jsonl on a full disk, and odd lines in it


def test_resume_drops_lines_that_are_not_utf8_or_not_records(tmp_path):
    from redline.training.metrics import resume_metrics

    good = [json.dumps({"kind": "train", "step": s, "loss": 1.0}) for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_bytes(
        (good[0] + "\n").encode() + b"\xff\xfe not text\n" + b"[1, 2]\n" + b"3\n" + b"null\n"
        + "\n".join(good[1:]).encode() + b"\n")
    history = resume_metrics(tmp_path, 3)
    assert history.dropped == 4 and history.missing == []
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == good


def test_metrics_on_a_full_disk_keep_their_earlier_records_whole(tmp_path, monkeypatch):
    from redline.durable import DiskFullError
    from redline.training.metrics import MetricsLogger
    from tests.test_faults import FullDisk

    log = MetricsLogger(tmp_path, tensorboard=False)
    log.log({"kind": "train", "step": 1, "loss": 2.0})
    log.flush(durable=True)
    before = (tmp_path / "metrics.jsonl").read_bytes()
    FullDisk(monkeypatch, tmp_path / "metrics.jsonl", budget=40)  # room for part of the next records only
    for step in (2, 3):
        log.log({"kind": "train", "step": step, "loss": 2.0})
    with pytest.raises(DiskFullError, match=r"^disk full while writing .*metrics.jsonl; its earlier records are "
                                            r"intact\. Free space"):
        log.flush()
    assert (tmp_path / "metrics.jsonl").read_bytes() == before  # no torn record
    log.close()  # nothing left to write again


def test_training_on_a_disk_that_fills_stops_in_one_line_and_resumes(dataset, tmp_path, monkeypatch, capsys):  # noqa: F811
    from redline.durable import DiskFullError
    from tests.test_faults import FullDisk

    args = ("max_steps=8", "log_every=2", "checkpoint_every=2", "keep_checkpoints=5")
    run_dir = tmp_path / "runs" / "t"
    disk = FullDisk(monkeypatch, run_dir / "metrics.jsonl", budget=2_500)
    with pytest.raises(DiskFullError, match="metrics.jsonl; its earlier records are intact"):
        train(config(dataset, tmp_path, *args))
    kept = records(run_dir)  # every line whole
    assert kept and ckpt_io.list_checkpoints(run_dir)
    disk.left = 10**9  # space again
    train(config(dataset, tmp_path, *args), resume_from=ckpt_io.list_checkpoints(run_dir)[-1])
    steps = train_steps(run_dir)
    assert max(steps) == 8 and all(n == 1 for n in steps.values())
    missing = {s for s in range(1, 9)} - set(steps)
    gaps = [r for r in records(run_dir) if r.get("event") == "metrics_gap"]
    assert bool(missing) == bool(gaps)  # a hole is said, once, or there is none


def test_the_console_line_shows_an_objectives_metrics_as_the_windows_mean(tmp_path, capsys):
    """GRPO's reward and DPO's preference accuracy reach the console line, averaged over the log window (one
    GRPO step's reward depends on the prompts it drew); each step's own value stays in metrics.jsonl."""
    from types import SimpleNamespace

    import torch

    from redline.training.metrics import MetricsLogger, StepRecords, Throughput

    log = MetricsLogger(tmp_path, tensorboard=False)
    records = StepRecords(log, Throughput(1.0, None, None, 1, torch.device("cpu")))
    for step, reward in enumerate((0.25, 0.5, 0.0, 0.75), start=1):
        metrics = {"reward_mean": torch.tensor(reward), "kl": torch.tensor(0.0), "completion_tokens": torch.tensor(3.0)}
        records.add(step, 1e-4, SimpleNamespace(loss=torch.tensor(0.1), metrics=metrics, grad_norm=torch.tensor(1.0)),
                    tokens=10)
    records.write(tokens=40, elapsed=1.0, summary=True, max_steps=4)
    line = capsys.readouterr().out
    assert "loss 0.1000 | reward 0.375 | lr" in line and "kl" not in line and "completion" not in line
    rewards = [json.loads(r)["reward_mean"] for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rewards == [0.25, 0.5, 0.0, 0.75]
