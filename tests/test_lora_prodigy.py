"""optim.name=prodigy: learning-rate free (the schedule scales 1), its d in the metrics, exact resume, and the
missing package named before any work."""

import importlib.util
import json

import pytest

from redline.config import TrainConfig, parse
from redline.errors import UserError
from redline.training import checkpoint as ckpt_io
from redline.training.loop import train
from tests.test_train import config, dataset, train_losses, train_stopped_at  # noqa: F401 (dataset is a fixture)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("prodigyopt") is None, reason="needs prodigyopt")


def records(run_dir, kind="train"):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == kind]


def test_prodigy_resume_is_exact_and_logs_d(dataset, tmp_path, monkeypatch):  # noqa: F811
    extra = ("optim.name=prodigy", "max_steps=4", "optim.warmup_steps=2")
    straight = train(config(dataset, tmp_path / "a", *extra))
    first = train_stopped_at(config(dataset, tmp_path / "b", *extra), 2, monkeypatch)
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
