"""Sweeps: matrix expansion, crashing runs, resuming after a kill or Ctrl-C, and one real tiny run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from redline.errors import UserError
from redline.experiments.recipes import (
    builtin_recipes,
    expand,
    load_recipe,
    recipe_from_dict,
    resolve_train_config,
    train_has_field,
)
from redline.experiments.processes import SweepLock, error_line
from redline.experiments.sweep import Sweep

FAKE_TRAIN = Path(__file__).parent / "fixtures" / "fake_train.py"
REPO = Path(__file__).resolve().parent.parent


def fake_recipe(tmp_path: Path, *, seeds=(1, 2), step_seconds=0.0, steps=20, crash=False, extra="") -> Path:
    """A recipe whose runner is tests/fixtures/fake_train.py (no torch: a fraction of a second per run)."""
    text = f"""
name = "fake"
presets = ["tiny"]
seeds = {list(seeds)}
budget = {{ max_steps = {steps} }}
command = ["{{python}}", "{FAKE_TRAIN}"]
{extra}
[set]
"fake.step_seconds" = {step_seconds}

[[variants]]
name = "baseline"

[[variants]]
name = "mqa"
set = {{ "model.n_kv_head" = 1 }}
"""
    if crash:
        text += '\n[[variants]]\nname = "oom"\nset = { "optim.lr" = 99.0 }\n'
    path = tmp_path / "fake.toml"
    path.write_text(text)
    return path


def records(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def sweep_cmd(recipe: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "redline", "sweep", str(recipe), "--out", str(out), "--no-report", *extra]


# ----------------------------------------------------------------------------------------------------
# matrix expansion


def test_matrix_expansion_counts_order_and_precedence():
    recipe = recipe_from_dict({
        "name": "m", "presets": ["tiny", "gpt2-124m"], "precision": ["bf16", "fp32"], "batch": [[4, 64], [8, 128]],
        "seeds": [3, 1], "budget": {"max_steps": 10}, "set": {"optim": {"lr": 1e-3}, "eval_every": 5},
        "variants": [{"name": "baseline"},
                     {"name": "lr", "set": {"optim.lr": 2e-3}},
                     {"name": "fp8", "precision": ["fp8"], "batch": [[8, 128]], "seeds": [1]}],
    })
    with pytest.raises(UserError, match="--seeds"):
        expand(recipe, extra_set={"seed": 5})
    runs = expand(recipe, extra_set={"eval_every": 7})
    # 2 presets × 2 precisions × 2 batches × 2 seeds × 2 variants, plus fp8: 2 presets × 1 × 1 × 1 seed
    assert len(runs) == 32 + 2 and len({r.run_id for r in runs}) == len(runs)
    assert [r.seed for r in runs[:16]] == [3] * 16  # seeds outermost, in the recipe's order
    by_id = {r.run_id: r for r in runs}
    lr = by_id["lr__tiny__fp32__8x128__s1"]
    assert lr.overrides["optim.lr"] == 2e-3  # the variant wins over the recipe's common set
    assert lr.overrides["eval_every"] == 7  # --set wins over both
    assert (lr.overrides["precision"], lr.overrides["batch_size"], lr.overrides["seq_len"], lr.overrides["max_steps"],
            lr.overrides["seed"]) == ("fp32", 8, 128, 10, 1)
    fp8 = by_id["fp8__gpt2-124m__fp8__8x128__s1"]
    assert fp8.overrides["fp8"] == "all" and fp8.overrides["precision"] == "bf16"
    assert by_id["baseline__tiny__bf16__4x64__s3"].cell == {"variant": "baseline", "preset": "tiny", "precision": "bf16",
                                                             "batch_size": 4, "seq_len": 64}
    contents = by_id["baseline__tiny__bf16__4x64__s3"].config_file_contents(Path("/tmp/out"))
    assert contents["run_name"] == "baseline__tiny__bf16__4x64__s3" and contents["preset"] == "tiny"
    assert ("fp8" in contents) == train_has_field("fp8")  # bf16 turns FP8 off only where the option exists


def test_batch_size_and_seq_len_lists_cross():
    recipe = recipe_from_dict({"presets": ["tiny"], "batch_size": [4, 8], "seq_len": [64, 128], "budget": {"max_time": 1}})
    assert sorted((r.batch_size, r.seq_len) for r in expand(recipe)) == [(4, 64), (4, 128), (8, 64), (8, 128)]


@pytest.mark.parametrize("data, message", [
    ({"presets": ["tiny"], "budget": {"max_steps": 1}, "seedz": [1]}, "did you mean 'seeds'"),
    ({"presets": ["tiny"]}, "needs a budget"),
    ({"presets": ["tiny"], "budget": {"max_step": 1}}, "unknown budget key"),
    ({"presets": ["tiny"], "budget": {"max_steps": 1}, "precision": ["bf61"]}, "did you mean 'bf16'"),
    ({"presets": ["tiny"], "budget": {"max_steps": 1}, "variants": [{"name": "a"}, {"name": "a"}]}, "appears twice"),
    ({"presets": ["tiny"], "budget": {"max_steps": 1}, "variants": [{"name": "a/b"}]}, "letters, digits"),
    ({"presets": ["tiny"], "budget": {"max_steps": 1}, "batch": [16]}, "pairs"),
    ({"presets": ["tiny"], "budget": {"max_steps": 1}, "variants": [{"name": "a", "set": {"batch_size": 8}}]}, "axis"),
])
def test_bad_recipes_are_user_errors(data, message):
    with pytest.raises(UserError, match=message):
        recipe_from_dict(data)


def test_builtin_recipes_expand_to_valid_train_configs(tmp_path):
    names = builtin_recipes()
    assert set(names) >= {"ablations", "sizes", "batch", "smoke"}
    ablations = expand(load_recipe("ablations"))
    assert len(ablations) == 13 * 3  # 13 configurations × 3 seeds
    assert len({r.variant for r in ablations}) == 13
    for name in names:
        for run in expand(load_recipe(name)):
            contents = run.config_file_contents(tmp_path)
            if "fp8" in contents and not train_has_field("fp8"):
                continue  # the fp8 option is not in this TrainConfig yet: such a run fails as a run, by design
            cfg = resolve_train_config(contents)  # a typo in a built-in recipe fails here
            assert cfg.seed == run.seed and cfg.preset == run.preset


def test_yaml_recipe_matches_its_toml_twin(tmp_path):
    toml = tmp_path / "r.toml"
    toml.write_text('presets = ["tiny"]\nseeds = [1, 2]\nbudget = { max_time = 0.5 }\n'
                    '[[variants]]\nname = "baseline"\n[[variants]]\nname = "mqa"\nset = { model = { n_kv_head = 1 } }\n')
    yaml_path = tmp_path / "r.yaml"
    yaml_path.write_text("presets: [tiny]\nseeds: [1, 2]\nbudget: {max_time: 0.5}\n"
                         "variants:\n  - name: baseline\n  - name: mqa\n    set: {model.n_kv_head: 1}\n")
    from_toml, from_yaml = expand(load_recipe(str(toml))), expand(load_recipe(str(yaml_path)))
    assert [(r.run_id, r.overrides) for r in from_toml] == [(r.run_id, r.overrides) for r in from_yaml]
    assert from_yaml[1].overrides["model.n_kv_head"] == 1 and from_yaml[1].overrides["max_time"] == 0.5
    bad = tmp_path / "bad.yaml"
    bad.write_text("presets: [tiny\n")
    with pytest.raises(UserError, match="cannot parse recipe"):
        load_recipe(str(bad))


def test_unknown_recipe_name_suggests_the_closest():
    with pytest.raises(UserError, match="did you mean 'ablations'"):
        load_recipe("ablation")


def test_error_line_finds_the_exception():
    log = "step 1 | loss 3.0\nTraceback (most recent call last):\n  File x\ntorch.OutOfMemoryError: CUDA out of memory.\n"
    assert error_line(log) == "torch.OutOfMemoryError: CUDA out of memory."
    assert error_line("redline train: error: unknown config key 'fp8'\n") == "redline train: error: unknown config key 'fp8'"


# ----------------------------------------------------------------------------------------------------
# running (with the fake trainer)


def test_a_crashing_run_does_not_stop_the_sweep(tmp_path):
    recipe = load_recipe(str(fake_recipe(tmp_path, seeds=[1], crash=True)))
    out = tmp_path / "out"
    counts = Sweep(recipe, expand(recipe), out).execute()
    assert (counts["completed"], counts["failed"]) == (2, 1)
    by_variant = {r["variant"]: r for r in records(out)}
    assert by_variant["oom"]["status"] == "failed" and by_variant["oom"]["error_kind"] == "out_of_memory"
    assert "CUDA out of memory" in by_variant["oom"]["error"] and by_variant["oom"]["returncode"] == 1
    for name in ("baseline", "mqa"):
        run = by_variant[name]
        assert run["status"] == "completed" and run["tokens_per_second"] > 0 and run["final_val_bpb"] is not None
        assert run["params"] > 0 and run["wall_time"] > 0 and len(run["eval_curve"]) == 2
    status = json.loads((out / "status.json").read_text())
    assert (status["state"], status["done"], status["failed"]) == ("finished", 2, 1)
    # a second run of the same sweep skips everything, failed runs included; --retry-failed retries those
    again = Sweep(recipe, expand(recipe), out).execute()
    assert (again["ran"], again["skipped"]) == (0, 3)
    retried = Sweep(recipe, expand(recipe), out).execute(retry_failed=True)
    assert (retried["ran"], retried["failed"]) == (1, 1)
    assert len(records(out)) == 4 and len({r["run_id"] for r in records(out)}) == 3


@pytest.mark.slow
def test_killed_sweep_resumes_without_running_anything_twice(tmp_path):
    recipe = fake_recipe(tmp_path, seeds=[1, 2], step_seconds=0.03, steps=20)  # 4 runs of ~0.6 s + startup
    out, ledger = tmp_path / "out", tmp_path / "ledger.txt"
    env = {**os.environ, "FAKE_TRAIN_LEDGER": str(ledger)}
    proc = subprocess.Popen(sweep_cmd(recipe, out), env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(records(out)) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    while "start" not in (ledger.read_text().splitlines()[-1] if ledger.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.02)  # wait until the next run is in the middle of its steps
    time.sleep(0.2)
    proc.kill()  # SIGKILL: no cleanup at all in the sweep process
    proc.wait()
    assert len(records(out)) == 1
    interrupted = ledger.read_text().splitlines()[-1].split()[1]
    time.sleep(0.5)  # its child got SIGTERM from the kernel when the sweep died

    done = subprocess.run(sweep_cmd(recipe, out), env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["skipped"], summary["ran"], summary["completed"]) == (1, 3, 3)
    finished = records(out)
    assert sorted(r["run_id"] for r in finished) == sorted(r.run_id for r in expand(load_recipe(str(recipe))))
    assert all(r["status"] == "completed" for r in finished)
    events = Counter(tuple(line.split()) for line in ledger.read_text().splitlines())
    assert all(count == 1 for (kind, _), count in events.items() if kind == "end")  # nothing finished twice
    assert [run for (kind, run), count in events.items() if kind == "start" and count > 1] == [interrupted]
    # the interrupted run started again from an empty directory: one end record in its metrics
    metrics = (out / "runs" / interrupted / "metrics.jsonl").read_text()
    assert metrics.count('"event": "end"') == 1

    before = ledger.read_text()
    third = subprocess.run(sweep_cmd(recipe, out), env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert third.returncode == 0 and ledger.read_text() == before  # all finished: nothing starts
    assert json.loads(third.stdout.strip().splitlines()[-1])["skipped"] == 4


@pytest.mark.parametrize("gpus", [1, 2])
def test_ctrl_c_leaves_no_partial_record(tmp_path, gpus):
    recipe = fake_recipe(tmp_path, seeds=[1], step_seconds=0.1, steps=50)
    out, ledger = tmp_path / "out", tmp_path / "ledger.txt"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1", "FAKE_TRAIN_LEDGER": str(ledger)}
    # SIGINT as in a terminal even when the tests run as a background job (which starts with SIGINT ignored,
    # and Python then never raises KeyboardInterrupt)
    proc = subprocess.Popen(sweep_cmd(recipe, out, "--gpus", str(gpus)), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    while len(list((out / "runs").glob("*/metrics.jsonl"))) < gpus and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert records(out) == []
    assert json.loads((out / "status.json").read_text())["state"] == "interrupted"
    time.sleep(0.3)
    started = ledger.read_text().splitlines()
    assert len(started) == gpus and all(line.startswith("start") for line in started)  # none went on to its end


def test_changed_recipe_is_refused_unless_redone(tmp_path):
    recipe = load_recipe(str(fake_recipe(tmp_path, seeds=[1])))
    out = tmp_path / "out"
    Sweep(recipe, expand(recipe), out).execute()
    changed = expand(recipe, extra_set={"optim.lr": 5e-4})
    with pytest.raises(UserError, match="--redo-changed"):
        Sweep(recipe, changed, out).execute()
    counts = Sweep(recipe, changed, out).execute(redo_changed=True)
    assert counts["ran"] == 2 and all(r["overrides"]["optim.lr"] == 5e-4 for r in records(out)[-2:])


def test_one_sweep_per_directory(tmp_path):
    recipe = load_recipe(str(fake_recipe(tmp_path, seeds=[1])))
    out = tmp_path / "out"
    out.mkdir()
    with SweepLock(out / ".sweep.lock"), pytest.raises(UserError, match="another `redline sweep`"):
        Sweep(recipe, expand(recipe), out).execute()


def test_stop_after_leaves_the_rest_for_the_next_call(tmp_path):
    recipe = load_recipe(str(fake_recipe(tmp_path, seeds=[1, 2])))
    out = tmp_path / "out"
    first = Sweep(recipe, expand(recipe), out).execute(stop_after_minutes=1e-9)
    assert first["ran"] == 1 and first["left"] == 3
    assert json.loads((out / "status.json").read_text())["state"] == "stopped"
    assert Sweep(recipe, expand(recipe), out).execute()["ran"] == 3


def test_runs_go_at_once_one_on_each_gpu(tmp_path, monkeypatch):
    """--gpus: as many runs at once as GPUs, each seeing its own alone; every run recorded once, with its GPU."""
    from redline.experiments.processes import visible_gpus

    recipe = load_recipe(str(fake_recipe(tmp_path, seeds=[1, 2], step_seconds=0.02, steps=15)))
    out, ledger = tmp_path / "out", tmp_path / "ledger.txt"
    monkeypatch.setenv("FAKE_TRAIN_LEDGER", str(ledger))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    gpus = visible_gpus(2)
    assert gpus == ["3", "5"] and visible_gpus(0) == ["3", "5", "6"]
    counts = Sweep(recipe, expand(recipe), out).execute(gpus=gpus)
    assert (counts["ran"], counts["completed"], counts["failed"]) == (4, 4, 0)
    finished = records(out)
    assert sorted(r["run_id"] for r in finished) == sorted(r.run_id for r in expand(recipe))
    for r in finished:
        env = json.loads((out / "runs" / r["run_id"] / "environment.json").read_text())
        assert r["gpu"] in gpus and env["cuda_visible_devices"] == r["gpu"]
    # two at a time: the second run starts before the first ends, and never more than two run at once
    running, most = 0, 0
    for line in ledger.read_text().splitlines():
        running += 1 if line.startswith("start") else -1
        most = max(most, running)
    assert most == 2
    seeds = {r["run_id"]: r["seed"] for r in finished}
    starts = [seeds[line.split()[1]] for line in ledger.read_text().splitlines() if line.startswith("start")]
    assert starts == [1, 1, 2, 2]  # every variant's first seed first (its compilation then serves the others)
    status = json.loads((out / "status.json").read_text())
    assert (status["state"], status["done"], status["children"]) == ("finished", 4, [])


def test_a_run_that_starts_from_another_waits_for_it(tmp_path, monkeypatch):
    """With several GPUs, a fine-tune whose init_from is a run of the same sweep starts only after that run ends,
    while runs that need nothing go on beside it."""
    recipe_path = fake_recipe(tmp_path, seeds=[1], step_seconds=0.02, steps=15, extra="")
    text = recipe_path.read_text().replace('[[variants]]\nname = "mqa"', '[[variants]]\nname = "tune"\n'
                                           'set = { init_from = "{runs}/baseline__{preset}__{precision}__{batch}__s{seed}" }'
                                           '\n\n[[variants]]\nname = "mqa"')
    recipe_path.write_text(text)
    recipe = load_recipe(str(recipe_path))
    runs = expand(recipe)
    ids = {r.cell["variant"]: r.run_id for r in runs}
    out, ledger = tmp_path / "out", tmp_path / "ledger.txt"
    sweep = Sweep(recipe, runs, out)
    assert ids["baseline"] in str(runs[[r.run_id for r in runs].index(ids["tune"])].config_file_contents(out / "runs"))
    monkeypatch.setenv("FAKE_TRAIN_LEDGER", str(ledger))
    counts = sweep.execute(gpus=["0", "1"])
    assert counts["completed"] == 3
    events = ledger.read_text().splitlines()
    assert events.index(f"end {ids['baseline']}") < events.index(f"start {ids['tune']}")
    assert events.index(f"start {ids['mqa']}") < events.index(f"end {ids['baseline']}")  # beside it


@pytest.mark.parametrize("visible, count, message", [
    ("0,1", 3, "only 2 GPU"), ("", 2, "no GPU is visible"), ("0", -1, "1 or more")])
def test_gpus_beyond_those_visible_are_refused(monkeypatch, visible, count, message):
    from redline.experiments.processes import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(UserError, match=message):
        visible_gpus(count)


def test_list_and_dry_run_commands(tmp_path, capsys):
    from redline.commands import sweep

    assert sweep.main(["--list"]) == 0
    listing = capsys.readouterr().out
    for name in ("ablations", "sizes", "batch", "smoke"):
        assert name in listing
    assert sweep.main(["smoke", "--out", str(tmp_path / "s"), "--dry-run", "--seeds", "7"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["runs"] == 3 and out["todo"] == 3
    assert not (tmp_path / "s").exists()  # a dry run writes nothing


# ----------------------------------------------------------------------------------------------------
# one real run


@pytest.mark.slow
def test_real_tiny_run_through_the_sweep(tmp_path):
    recipe = tmp_path / "real.toml"
    recipe.write_text("""
name = "real"
presets = ["tiny"]
precision = ["fp32"]
batch = [[4, 64]]
seeds = [1]
budget = { max_steps = 8 }
[set]
device = "cpu"
compile = false
eval_every = 4
eval_batches = 2
log_every = 2
"optim.warmup_steps" = 2
"model.n_layer" = 2
""")
    out = tmp_path / "out"
    done = subprocess.run(sweep_cmd(recipe, out), cwd=REPO, capture_output=True, text=True, timeout=300)
    run = records(out)[0]
    assert done.returncode == 0 and run["status"] == "completed", (run.get("error"), done.stdout[-2000:])
    assert run["steps"] == 8 and run["tokens_per_second"] > 0 and run["params"] > 0
    assert [p["step"] for p in run["eval_curve"]] == [4, 8] and run["final_val_bpb"] > 0
    assert [p["tokens"] for p in run["eval_curve"]] == [4 * 4 * 64, 8 * 4 * 64]  # training tokens at each eval
    assert run["config"]["model"]["n_layer"] == 2 and run["config"]["seed"] == 1
    assert not (out / "runs" / run["run_id"] / "checkpoints").exists()  # deleted: keep_checkpoints is off
    assert (out / "runs" / run["run_id"] / "train.log").read_text().count("step") > 0


# ----------------------------------------------------------------------------------------------------
# optional libraries are checked before the first run


def real_recipe(tmp_path: Path, extra_set: str) -> Path:
    recipe = tmp_path / "needs.toml"
    recipe.write_text(f"""
name = "needs"
presets = ["tiny"]
seeds = [1]
budget = {{ max_steps = 2 }}
[set]
device = "cpu"
{extra_set}
""")
    return recipe


@pytest.mark.parametrize("extra_set, missing, message", [
    ('"data.tokenizer" = "gpt2"', "tiktoken", "needs tiktoken (the gpt2 tokenizer), which is not installed: "
                                              "`pip install 'redline[gpt2]'`"),
    ('fp8 = "auto"', "torchao", "needs torchao (FP8 training on a GPU), which is not installed: "
                                "`pip install 'redline[gpu]'`"),
    ('"data.path" = "DATA/corpus.parquet"', "pyarrow", "needs pyarrow, which is not installed: "
                                                        "`pip install 'redline[data]'`"),
])
def test_a_missing_library_stops_the_sweep_before_any_run(tmp_path, monkeypatch, extra_set, missing, message):
    import importlib.util

    import torch

    (tmp_path / "corpus.parquet").write_bytes(b"PAR1")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else real_find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # FP8 needs torchao only where it can run
    recipe = load_recipe(str(real_recipe(tmp_path, extra_set.replace("DATA", str(tmp_path)))))
    out = tmp_path / "out"
    with pytest.raises(UserError) as exc:
        Sweep(recipe, expand(recipe), out).execute()
    assert message in str(exc.value) and "nothing was run" in str(exc.value) and "\n" not in str(exc.value)
    assert records(out) == [] and not (out / "runs").exists()
