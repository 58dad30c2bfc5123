"""optim.name=prodigy: learning-rate free (the schedule scales 1), its d in the metrics, exact resume, and the
missing package named before any work."""

import importlib.util
import json
import os
import signal

import pytest

from redline.config import TrainConfig, parse
from redline.errors import UserError
from redline.training import checkpoint as ckpt_io
from redline.training.loop import train
from tests.test_train import config, dataset, train_losses  # noqa: F401 (dataset is a fixture)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("prodigyopt") is None, reason="needs prodigyopt")


def records(run_dir, kind="train"):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == kind]


def test_prodigy_resume_is_exact_and_logs_d(dataset, tmp_path, monkeypatch):  # noqa: F811
    import redline.training.step as step_mod

    extra = ("optim.name=prodigy", "max_steps=4", "optim.warmup_steps=2")
    straight = train(config(dataset, tmp_path / "a", *extra))
    real_set_lr, calls = step_mod.set_lr, {"n": 0}

    def set_lr_then_signal(optimizers, multiplier):
        real_set_lr(optimizers, multiplier)
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(step_mod, "set_lr", set_lr_then_signal)
    first = train(config(dataset, tmp_path / "b", *extra))
    monkeypatch.setattr(step_mod, "set_lr", real_set_lr)
    assert first.status == "interrupted" and first.step == 2
    second = train(config(dataset, tmp_path / "b", *extra), resume_from=ckpt_io.list_checkpoints(first.run_dir)[-1])
    a, b = records(straight.run_dir), records(second.run_dir)
    assert [(r["step"], r["loss"], r["prodigy_d"]) for r in a] == [(r["step"], r["loss"], r["prodigy_d"]) for r in b]
    ds = [r["prodigy_d"] for r in a]
    assert ds[0] == pytest.approx(1e-6, rel=1e-3)  # d0 (logged through float32)
    # d never falls, and rises by at most growth_rate a step
    assert all(earlier <= later <= earlier * 1.05 * (1 + 1e-6) for earlier, later in zip(ds, ds[1:]))
    assert a[0]["lr"] == pytest.approx(0.5)  # 1 × the warmup's first multiplier
    assert len(train_losses(straight.run_dir)) == 4


def test_missing_prodigyopt_is_one_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "prodigyopt" else real(name, *a))
    with pytest.raises(UserError, match=r"pip install 'redline\[lora\]'") as e:
        parse(TrainConfig, ["optim.name=prodigy"], prog="t", description="t")
    assert "\n" not in str(e.value)
