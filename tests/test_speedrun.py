"""`redline speedrun` and the named training recipes: the clock (evaluations and compilation left out), the
interpolated crossing, planning errors, the nanogpt recipe's settings, and one real run of two tiny recipes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from redline.commands.speedrun import SpeedrunArgs, clocked_evals, crossing, log_every_for, plan, split_overrides
from redline.config import TrainConfig, parse, training_recipes
from redline.errors import UserError

REPO = Path(__file__).resolve().parent.parent


def synthetic_metrics() -> list[dict]:
    """A run logged every 2 steps (0.5 s a step, the first window 10 s longer: compilation), evaluated at steps
    4 and 8 (3 s each) and at the end (step 10, after the last logged step)."""
    records, elapsed = [], 0.0
    for step in range(1, 11):
        records.append({"kind": "train", "step": step, "loss": 5.0})
        if step % 2 == 0:
            elapsed += 1.0 + (10.0 if step == 2 else 0.0)
            records[-1].update(elapsed=elapsed, tokens=step * 100, tokens_per_second=200.0)
        if step in (4, 8, 10):
            elapsed += 3.0
            records.append({"kind": "eval", "step": step, "elapsed": elapsed, "loss": 2.0, "bpb": {4: 2.0, 8: 1.5, 10: 1.4}[step]})
    return records


def test_the_clock_leaves_out_evaluations_and_compilation():
    clock = clocked_evals(synthetic_metrics())
    assert clock["eval_time_known"] and clock["steady_step_seconds"] == pytest.approx(0.5)
    assert clock["compile_seconds"] == pytest.approx(10.0) and clock["eval_seconds"] == pytest.approx(9.0)
    assert [e["step"] for e in clock["evals"]] == [4, 8, 10]
    assert [e["train_seconds"] for e in clock["evals"]] == pytest.approx([2.0, 4.0, 5.0])  # 0.5 s a step
    assert [e["tokens"] for e in clock["evals"]] == [400, 800, 1000]
    assert [e["epoch"] for e in clock["evals"]] == [None] * 3  # runs logged before the trainer logged epochs
    for r in (records := synthetic_metrics()):
        if r["kind"] == "eval":
            r["epoch"] = r["step"] / 5
    assert [e["epoch"] for e in clocked_evals(records)["evals"]] == [0.8, 1.6, 2.0]


def test_the_trainers_own_clock_is_used_where_the_records_carry_it():
    """A recompile mid-run (a batch-size warm-up's new size, 6 s at step 6) that the first-window estimate counts
    as training: the evaluations' train_time (the trainer's clock, which left it out) is what the speedrun uses."""
    records = synthetic_metrics()
    for r in records:
        if r["kind"] == "train" and r.get("elapsed") and r["step"] >= 6:
            r["elapsed"] += 6.0
        if r["kind"] == "eval":
            r["elapsed"] += 6.0 if r["step"] >= 6 else 0.0
            r["train_time"] = 0.5 * r["step"]
    old = clocked_evals([{k: v for k, v in r.items() if k != "train_time"} for r in records])
    assert [e["train_seconds"] for e in old["evals"]] == pytest.approx([2.0, 10.0, 11.0])  # the recompile counted
    clock = clocked_evals(records)
    assert [e["train_seconds"] for e in clock["evals"]] == pytest.approx([2.0, 4.0, 5.0])
    assert clock["compile_seconds"] == pytest.approx(16.0) and clock["eval_seconds"] == pytest.approx(9.0)


def test_an_evaluation_after_no_logged_step_is_flagged():
    records = [r for r in synthetic_metrics() if not (r["kind"] == "train" and r["step"] == 4)]
    clock = clocked_evals(records)
    assert not clock["eval_time_known"] and [e["step"] for e in clock["evals"]] == [8, 10]


def test_crossing_is_interpolated_between_evaluations():
    evals = clocked_evals(synthetic_metrics())["evals"]
    hit = crossing(evals, 1.75)  # halfway between step 4 (2.0 at 2 s) and step 8 (1.5 at 4 s)
    assert hit["interpolated"] and hit["train_seconds"] == pytest.approx(3.0) and hit["tokens"] == pytest.approx(600)
    assert hit["step"] == pytest.approx(6) and hit["eval_step"] == 8
    first = crossing(evals, 2.5)  # already below at the first evaluation: no point before it to interpolate from
    assert not first["interpolated"] and first["train_seconds"] == pytest.approx(2.0)
    assert crossing(evals, 1.0) is None
    assert crossing(evals, 1.4)["train_seconds"] == pytest.approx(5.0)  # the final value is reached at the end


def test_log_every_divides_eval_every():
    for eval_every in (1, 4, 7, 50, 64, 125, 1000):
        d = log_every_for(eval_every)
        assert eval_every % d == 0 and d <= 10
    assert log_every_for(50) == 10 and log_every_for(7) == 7 and log_every_for(64) == 8


def test_command_line_overrides_are_split_from_options():
    overrides, rest = split_overrides(["--recipes", "nanogpt", "default", "max_steps=1000", "--data", "d",
                                       "optim.lr=3e-4", "compile=false"])
    assert overrides == {"max_steps": 1000, "optim.lr": 3e-4, "compile": False}
    assert rest == ["--recipes", "nanogpt", "default", "--data", "d"]


@pytest.mark.parametrize("overrides, message", [
    ({}, "give a budget"),
    ({"max_steps": 10, "seed": 3}, "use --seed"),
    ({"max_steps": 10, "preset": "tiny"}, "name the preset in a recipe"),
])
def test_planning_errors(tmp_path, overrides, message):
    with pytest.raises(UserError, match=message):
        plan(SpeedrunArgs(recipes=["default"]), dict(overrides), tmp_path)


def test_unknown_recipe_and_duplicate_names(tmp_path):
    with pytest.raises(UserError, match="did you mean 'nanogpt'"):
        plan(SpeedrunArgs(recipes=["nanogtp"]), {"max_steps": 10}, tmp_path)
    with pytest.raises(UserError, match="share the name"):
        plan(SpeedrunArgs(recipes=["default", "default"]), {"max_steps": 10}, tmp_path)


def test_every_recipe_evaluates_the_same_validation_tokens(tmp_path, dataset):
    recipe, runs = plan(SpeedrunArgs(recipes=["nanogpt", "default"], data=str(dataset), eval_tokens=2**20,
                                     eval_every=40),
                        {"max_steps": 100}, tmp_path)
    by_name = {r.variant: r for r in runs}
    assert [r.variant for r in runs] == ["nanogpt", "default"] and recipe.baseline == {"variant": "nanogpt"}
    assert by_name["nanogpt"].preset == "gpt2-124m" and by_name["default"].preset == "modern-124m"
    # 16 × 1024 and 16 × 2048 tokens a micro-batch: 64 and 32 batches of validation
    assert by_name["nanogpt"].overrides["eval_batches"] == 64 and by_name["default"].overrides["eval_batches"] == 32
    for run in runs:
        assert run.overrides["data.path"] == str(dataset) and run.overrides["log_every"] == 10
        assert run.overrides["max_steps"] == 100 and run.seed == 1337


def test_the_command_line_wins_over_a_recipe_and_a_recipes_own_budget_over_the_command_line(tmp_path, dataset):
    short = tmp_path / "short.toml"
    short.write_text('# default, trained for 300 steps\nmax_steps = 300\npreset = "modern-124m"\n')
    _, runs = plan(SpeedrunArgs(recipes=["nanogpt", str(short)], data=str(dataset)),
                   {"max_steps": 1000, "tokens_per_step": 32768}, tmp_path)
    nanogpt, fast = runs
    assert nanogpt.overrides["tokens_per_step"] == 32768  # not the recipe's 491,520
    assert nanogpt.overrides["max_steps"] == 1000 and fast.overrides["max_steps"] == 300
    assert fast.variant == "short" and fast.overrides["tokens_per_step"] == 32768


def test_named_recipes_ship_and_nanogpt_is_nanogpts_train_py():
    assert {"nanogpt", "default", "adamw", "fast"} <= set(training_recipes())
    cfg = parse(TrainConfig, ["--recipe", "nanogpt"], prog="t", description="t")
    o = cfg.optim
    assert cfg.preset == "gpt2-124m" and cfg.model.n_layer == 12 and cfg.model.pos_emb == "learned"
    assert cfg.model.tie_embeddings and cfg.model.bias and cfg.model.dropout == 0.0
    assert (o.name, o.lr, o.beta1, o.beta2, o.weight_decay, o.schedule, o.grad_clip) == \
        ("adamw", 6e-4, 0.9, 0.95, 0.1, "cosine", 1.0)
    assert o.lr * o.min_lr_ratio == pytest.approx(6e-5) and cfg.tokens_per_step == 12 * 1024 * 40


def test_recipe_precedence(tmp_path):
    """preset < --recipe < --config file < command line."""
    override = tmp_path / "over.toml"
    override.write_text('[optim]\nlr = 1e-4\nbeta2 = 0.99\n')
    cfg = parse(TrainConfig, ["--recipe", "nanogpt", "--config", str(override), "optim.beta2=0.98"], prog="t",
                description="t")
    assert cfg.preset == "gpt2-124m" and cfg.optim.lr == 1e-4 and cfg.optim.beta2 == 0.98
    assert cfg.optim.weight_decay == 0.1  # from the named recipe
    with pytest.raises(UserError, match="shipped recipes: .*nanogpt"):
        parse(TrainConfig, ["--recipe", "nope"], prog="t", description="t")


# ----------------------------------------------------------------------------------------------------
# one real run


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    from redline.data.prepare import prepare
    from redline.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    words = "the model reads tokens and predicts the next one while the loss falls over many steps".split()
    texts = root / "texts"
    texts.mkdir()
    for i in range(20):
        (texts / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(words) for _ in range(400)) + ".\n")
    out = root / "shards"
    prepare([str(texts)], out, load_tokenizer("bytes"), val_fraction=0.1, num_workers=1)
    return out


def test_more_gpus_than_visible_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from redline.commands import speedrun

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(UserError, match="only 1 GPU"):
        speedrun.main(["--recipes", "nanogpt", "fast", "--gpus", "2", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def speedrun_tiny(tmp_path: Path, dataset: Path, lrs: dict[str, float], model: str, *args: str, timeout: int):
    """`redline speedrun` of tiny recipes that differ in their learning rate (name -> lr; the first is the
    baseline), on the CPU -> (the finished process, its JSON result, the output folder)."""
    for name, lr in lrs.items():
        (tmp_path / f"{name}.toml").write_text(f'# tiny at lr {lr}\npreset = "tiny"\n[model]\n{model}\n'
                                                f'[optim]\nlr = {lr}\nwarmup_steps = 2\n')
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "redline", "speedrun", "--recipes", *(str(tmp_path / f"{n}.toml") for n in lrs),
           "--data", str(dataset), "--out", str(out), "--eval-every", "4", *args, "device=cpu", "compile=false",
           "batch_size=4"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads(done.stdout.strip().splitlines()[-1]), out


@pytest.mark.slow
@pytest.mark.parametrize("gpus", [1, 2])
def test_two_tiny_recipes_in_one_call(tmp_path, dataset, monkeypatch, gpus):
    """gpus=2: both recipes at once (on a CPU machine the two "GPUs" are names only: device=cpu)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    done, result, out = speedrun_tiny(tmp_path, dataset, {"fast": 3e-3, "slow": 3e-4},
                                   "n_layer = 2\nn_embd = 64\nn_head = 4\nn_kv_head = 2", "--eval-tokens", "1024",
                                   "--gpus", str(gpus), "max_steps=12", "seq_len=64", timeout=300)
    assert result == json.loads((out / "speedrun.json").read_text())
    fast, slow = result["recipes"]
    assert (fast["recipe"], slow["recipe"]) == ("fast", "slow") and result["baseline"] == "fast"
    assert result["target_bpb"] == fast["final_bpb"] and result["target_from"] == "final value of fast"
    for r in (fast, slow):
        assert r["status"] == "completed" and r["steps"] == 12 and r["eval_time_known"]
        assert [p["step"] for p in r["curve"]] == [4, 8, 12]
        assert [p["tokens"] for p in r["curve"]] == [4 * 4 * 64, 8 * 4 * 64, 12 * 4 * 64]
        times = [p["train_seconds"] for p in r["curve"]]
        assert 0 < times[0] < times[1] < times[2] and r["eval_seconds"] > 0 and r["compile_and_warmup_seconds"] >= 0
    assert fast["reached"] and fast["speedup_vs_baseline"] == 1.0
    assert fast["time_to_target"] == pytest.approx(fast["train_seconds"])
    assert slow["final_bpb"] > fast["final_bpb"] and not slow["reached"]  # ten times lower lr: slower to learn
    for run in (out / "runs").iterdir():  # the same validation tokens: 1024 = 4 batches of 4 × 64
        config = json.loads((run / "config.json").read_text())
        assert config["eval_batches"] == 4 and config["data"]["path"] == str(dataset)
    assert (out / "speedrun.png").is_file() == ("plot" in result)
    windows = (json.loads((dataset / "meta.json").read_text())["splits"]["train"]["tokens"] - 1) // 64
    assert fast["epochs"] == slow["epochs"] == pytest.approx(12 * 4 / windows, abs=1e-4)
    assert f"epochs of the training data read: fast {fast['epochs']:.2f}, slow" in done.stdout


@pytest.mark.slow
def test_several_seeds_give_medians(tmp_path, dataset):
    """--seeds 3: each recipe three times; the target is the median of the baseline's finals, a recipe's time to it
    the median of its runs' own crossings, with their range."""
    from statistics import median

    done, result, _ = speedrun_tiny(tmp_path, dataset, {"fast": 3e-3, "slower": 1e-3},
                                    "n_layer = 1\nn_embd = 32\nn_head = 2\nn_kv_head = 1", "--eval-tokens", "512",
                                    "--seeds", "3", "--no-plot", "max_steps=8", "seq_len=32", timeout=600)
    fast, slower = result["recipes"]
    assert [r["seed"] for r in fast["runs"]] == [1337, 1338, 1339] and len(slower["runs"]) == 3
    assert len({r["final_bpb"] for r in fast["runs"]}) == 3  # three seeds, three runs
    assert result["target_bpb"] == median(r["final_bpb"] for r in fast["runs"])
    assert "median of 3 runs" in result["target_from"]
    for row in (fast, slower):  # a run that never reached the target counts as infinitely late
        times = sorted(r["time_to_target"] if r["reached"] else float("inf") for r in row["runs"])
        assert row["reached"] == (row["runs_reached"] >= 2)
        assert row["time_to_target"] == (times[1] if row["reached"] else None)
    # the baseline's median final is reached by its median run (at its end) and any run below it
    assert fast["reached"] and fast["runs_reached"] >= 2 and fast["speedup_vs_baseline"] == 1.0
    assert "×3" in done.stdout


@pytest.mark.slow
def test_the_speedrun_script_runs_nanogpt_and_the_fast_recipe_on_a_cpu(tmp_path, dataset):
    """scripts/gpu/speedrun.sh CPU=1: the same recipes (nanogpt; the default and fast recipes at two budgets each)
    at a CPU's size."""
    env = {**os.environ, "CPU": "1", "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", "scripts/gpu/speedrun.sh", str(dataset), "20"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["recipes"]["nanogpt"]["status"] == "completed"
    for timed in ("default", "fast"):  # TIMED's default: each at two budgets, each with its verdict
        runs = {name: r for name, r in verdict["recipes"].items() if name.startswith(timed + "-")}
        assert len(runs) == 2 and all(r["status"] == "completed" for r in runs.values()), verdict
        assert set(verdict["timed"][timed]) >= {"best", "ratio", "three_times_met"}
    assert verdict["timed_recipe"] == "default" and verdict["ratio"] == verdict["timed"]["default"]["ratio"]
