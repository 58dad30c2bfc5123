"""The warm-ups of the batch's shape: batch size (batch_ramp_*) and sequence length (seq_ramp_*): their sizes, what a
ramped run trains on, the training clock around their recompiles, and where they are refused. Exact resume in the
middle of each ramp is in tests/test_train.py."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from redline.config import TrainConfig, parse
from redline.errors import UserError
from redline.training.loop import train
from redline.training.step import ramp_rows, ramp_seq_len
from tests.test_train import config, dataset  # noqa: F401  (the session-scoped prepared corpus)


def ramp_config(*extra: str) -> TrainConfig:
    return parse(TrainConfig, ["batch_size=32", "batch_ramp_steps=100", *extra], prog="t", description="t")


def test_the_rows_grow_linearly_to_the_full_batch_in_whole_multiples():
    cfg = ramp_config()  # from a quarter (8 rows), multiples of 8
    rows = [ramp_rows(cfg, step) for step in range(0, 110)]
    assert rows[0] == 8 and rows[50] == 24 and rows[99] is None and rows[100] is None and rows[109] is None
    sizes = [r for r in rows if r is not None]
    assert sizes == sorted(sizes) and set(sizes) == {8, 16, 24}  # then the full 32 (None)
    assert ramp_rows(parse(TrainConfig, ["batch_size=32"], prog="t", description="t"), 0) is None  # off
    fine = ramp_config("batch_ramp_multiple=1", "batch_ramp_start=0.5")
    assert ramp_rows(fine, 0) == 16 and ramp_rows(fine, 50) == 24 and ramp_rows(fine, 90) == 31
    assert all(ramp_rows(fine, s) is None or 16 <= ramp_rows(fine, s) < 32 for s in range(100))


@pytest.mark.parametrize("setting", ["batch_ramp_steps=-1", "batch_ramp_start=0", "batch_ramp_start=1.5",
                                     "batch_ramp_multiple=0"])
def test_bad_ramp_settings_are_refused(setting):
    with pytest.raises(UserError, match="batch_ramp"):
        ramp_config(setting).validate()


def test_a_ramped_run_trains_the_rows_its_steps_hold(dataset, tmp_path):  # noqa: F811
    """batch 4 × 32 tokens, the ramp over 6 steps from 1 row: steps of 1, 2, 2, 3, 3, 4... rows, each counted."""
    cfg = config(dataset, tmp_path, "batch_ramp_steps=6", "batch_ramp_start=0.25", "batch_ramp_multiple=1",
                 "max_steps=8", "log_every=1")
    result = train(cfg)
    rows = [ramp_rows(cfg, step) or 4 for step in range(8)]
    assert rows[0] == 1 and rows[-1] == 4 and len(set(rows)) == 4
    assert result.tokens == sum(rows) * 32
    steps = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    tokens = [r["tokens"] for r in steps if r["kind"] == "train" and "tokens" in r]
    assert tokens == [sum(rows[:n]) * 32 for n in range(1, 9)]


def test_max_time_leaves_out_the_first_step_at_each_new_size(dataset, tmp_path, monkeypatch):  # noqa: F811
    """Each new micro-batch size recompiles on a GPU: here the first step at each of the 4 sizes takes 1.5 s, longer
    than the 1.2 s budget, and the run still trains for its budget."""
    from redline.training.step import TrainStep

    real_step, seen = TrainStep.step, set()

    def step(self, batches, multiplier):
        first = next(iter(batches))
        rows = first[0].shape[0]
        if rows not in seen:
            seen.add(rows)
            time.sleep(1.5)
        return real_step(self, iter([first]), multiplier)

    monkeypatch.setattr(TrainStep, "step", step)
    cfg = config(dataset, tmp_path, "batch_ramp_steps=6", "batch_ramp_start=0.25", "batch_ramp_multiple=1",
                 "max_steps=0", "max_time=0.02", "log_every=100")
    result = train(cfg)
    # past the ramp (6 steps) on the budget alone: its 4 slow steps would have spent it 5 times over
    assert result.status == "completed" and seen == {1, 2, 3, 4} and result.step > 6
    end = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert end["event"] == "end" and 1.2 <= end["train_time"] < end["elapsed"] - 6.0


def test_fine_tuning_refuses_the_ramp_before_making_a_run(dataset, tmp_path):  # noqa: F811
    cfg = config(dataset, tmp_path, "batch_ramp_steps=4")
    with pytest.raises(UserError, match="batch_ramp_steps"):
        train(cfg, data=lambda run_dir: pytest.fail("the data source was built"))
    assert not (tmp_path / "runs").exists()


def test_fine_tuning_starts_from_a_ramped_run_without_its_warm_ups(tmp_path):
    from redline.commands.sft import base_config

    run = tmp_path / "ramped" / "checkpoints" / "step_00000010"
    run.mkdir(parents=True)
    cfg = ramp_config("seq_ramp_steps=10", "seq_len=128", "seq_ramp_start=32")
    (run / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    start = base_config(run)
    assert (start.batch_ramp_steps, start.seq_ramp_steps) == (0, 0)
    assert (start.batch_size, start.seq_len) == (32, 128)  # the rest is the pretraining run's


def test_a_run_says_what_its_warm_ups_will_do():
    from redline.training.loop import warm_up_lines

    cfg = parse(TrainConfig, ["preset=modern-124m", "batch_size=32", "seq_len=1024", "batch_ramp_steps=100",
                              "seq_ramp_steps=300", "seq_ramp_start=256"], prog="t", description="t")
    assert warm_up_lines(cfg) == [
        "batch-size warm-up: 8 → 16 → 24 → 32 rows a micro-batch over the first 100 steps",
        "sequence-length warm-up: rows of 256 → 512 → 1024 tokens over the first 300 steps"]
    assert warm_up_lines(parse(TrainConfig, [], prog="t", description="t")) == []
    idle = parse(TrainConfig, ["batch_size=8", "batch_ramp_steps=10", "seq_len=64", "seq_ramp_steps=10",
                               "seq_ramp_start=64"], prog="t", description="t")
    assert [line.split(":")[0] for line in warm_up_lines(idle)] == ["[yellow]batch_ramp_steps=10 changes nothing",
                                                                    "[yellow]seq_ramp_steps=10 changes nothing"]


def test_the_row_length_doubles_as_the_linear_ramp_reaches_each_double():
    cfg = parse(TrainConfig, ["preset=modern-124m", "seq_len=1024", "seq_ramp_steps=300", "seq_ramp_start=256"],
                prog="t", description="t")
    lengths = [ramp_seq_len(cfg, step) for step in range(320)]
    assert lengths[0] == 256 and lengths[99] == 256 and lengths[100] == 512 and lengths[299] == 512
    assert lengths[300] is None and lengths[319] is None  # the full 1024
    off = parse(TrainConfig, ["preset=modern-124m", "seq_len=1024", "seq_ramp_steps=0"], prog="t", description="t")
    assert ramp_seq_len(off, 0) is None


@pytest.mark.parametrize("seq_len, start", [(1024, 256), (128, 32), (6, 3), (7, 7)])
def test_the_warm_up_starts_from_a_quarter_of_the_rows_unless_told(seq_len, start):
    """seq_ramp_start=0 (the default): a quarter of seq_len, half where a quarter is not whole, and the full length
    (no warm-up) where neither is; so the modern presets' warm-up suits any seq_len a user gives."""
    cfg = parse(TrainConfig, ["preset=modern-124m", f"seq_len={seq_len}"], prog="t", description="t")
    assert cfg.seq_ramp_steps == 100 and cfg.effective_seq_ramp_start == start
    assert ramp_seq_len(cfg, 0) == (None if start == seq_len else start)


@pytest.mark.parametrize("start", ["300", "-1", "2048"])
def test_a_first_length_that_does_not_divide_the_windows_by_a_power_of_two_is_refused(start):
    with pytest.raises(UserError, match="seq_ramp_start"):
        parse(TrainConfig, ["preset=modern-124m", "seq_len=1024", "seq_ramp_steps=10", f"seq_ramp_start={start}"],
              prog="t", description="t")


def test_a_sequence_ramp_cuts_the_windows_into_rows_of_its_length(dataset, tmp_path, monkeypatch):  # noqa: F811
    """4 windows of 32 tokens a step, the ramp from 8 tokens over 6 steps: rows of 8 (16 of them), then 16 (8),
    then the windows; every step the same 128 tokens, each row's targets its own tokens' successors."""
    from redline.training.step import TrainStep

    real_step, shapes = TrainStep.step, []

    def step(self, batches, multiplier):
        batch = next(iter(batches))
        x, y = batch
        shapes.append(tuple(x.shape))
        assert x.shape == y.shape and bool((x[:, 1:] == y[:, :-1]).all())
        return real_step(self, iter([batch]), multiplier)

    monkeypatch.setattr(TrainStep, "step", step)
    result = train(config(dataset, tmp_path, "seq_ramp_steps=6", "seq_ramp_start=8", "max_steps=8"))
    assert shapes == [(16, 8), (16, 8), (8, 16), (8, 16), (8, 16), (8, 16), (4, 32), (4, 32)]
    assert result.tokens == 8 * 4 * 32
