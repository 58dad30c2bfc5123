"""Fault injection: full disks, kill -9 and SIGTERM at random points, and corrupted or out-of-range inputs of
every file type redline reads. Each case checks the one-line error, the exit status, and that nothing is lost
or half-written.

A full disk is injected at the write layer (Python file objects and os.write answer ENOSPC once a byte budget
is spent; safetensors, whose writes happen in Rust, raises its own error for a full disk), and, where the OS
lets an unprivileged user mount one (a user namespace), on a real tmpfs a few hundred kB large.
Cases that fail because of the training loop are marked xfail(strict=True) with the fix they wait for."""

from __future__ import annotations

import builtins
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from redline import cli, durable
from redline.errors import UserError
from redline.model import GPT
from redline.presets import get_preset
from redline.tokenizer import load_tokenizer
from redline.training import checkpoint as ckpt_io
from tests.test_train import dataset  # noqa: F401  (a pytest fixture)

REPO = Path(__file__).resolve().parents[1]
MODEL = replace(get_preset("tiny"), n_layer=1, n_embd=32, n_head=2, n_kv_head=1, vocab_size=257, context_len=16)


def one_line_error(err: str) -> str:
    """The error line of a command's stderr; fails when there is a traceback or more than one error line."""
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if ": error: " in line]
    assert len(lines) == 1, err
    return lines[0]


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


# ----------------------------------------------------------------------------------------------------
# a full disk at the write layer


class FullDisk:
    """Every write through Python file objects opened for writing (in the modules given) and every os.write to a
    file under `root` fails with ENOSPC once `budget` bytes are written: a disk that fills up part-way."""

    def __init__(self, monkeypatch, root: Path, budget: int, modules=(durable,)):
        self.root, self.left = Path(root).resolve(), budget
        real_open, real_write = builtins.open, os.write

        def full_open(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            if any(c in mode for c in "wax+") and self._mine(file):
                return _FullFile(f, self)
            return f

        def full_write(fd, data):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                target = ""
            if self._mine(target):
                self._spend(len(data))
            return real_write(fd, data)

        for module in modules:
            monkeypatch.setattr(module, "open", full_open, raising=False)
        monkeypatch.setattr(os, "write", full_write)

    def _mine(self, file) -> bool:
        try:
            return Path(os.fspath(file)).resolve().is_relative_to(self.root)
        except TypeError:  # a file descriptor
            return False

    def _spend(self, n: int) -> None:
        if n > self.left:
            self.left = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.left -= n


class _FullFile:
    """A file object whose writes spend the FullDisk's budget (everything else goes to the real file)."""

    def __init__(self, f, disk: FullDisk):
        self.f, self.disk = f, disk

    def write(self, data) -> int:
        self.disk._spend(len(data.encode()) if isinstance(data, str) else len(memoryview(data).cast("B")))
        return self.f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def __getattr__(self, name):
        return getattr(self.f, name)


def tiny_checkpoint_parts():
    torch.manual_seed(0)
    model = GPT(MODEL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = {"step": 1, "optimizers": [optimizer.state_dict()], "padding": torch.zeros(20_000)}
    return model, state, load_tokenizer("bytes")


def assert_previous_checkpoint_kept(run: Path, previous: list[Path]) -> None:
    assert ckpt_io.list_checkpoints(run) == previous
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")], "a temporary folder was left"
    for ckpt in previous:
        ckpt_io.verify_checkpoint(ckpt)


@pytest.mark.parametrize("where", ["weights", "state", "tokenizer"])
def test_checkpoint_save_on_a_full_disk(tmp_path, monkeypatch, where):
    """The README's one line; the temporary folder removed; the previous checkpoint intact and verified."""
    from safetensors import SafetensorError

    model, state, tok = tiny_checkpoint_parts()
    run = tmp_path / "run"
    previous = [ckpt_io.save_checkpoint(run, 1, model, state, {"step": 1}, tok, keep=3)]
    if where == "weights":  # safetensors writes from Rust: its error for a full disk, after a partial file
        def full_save_file(tensors, filename, metadata=None):
            Path(filename).write_bytes(b"\0" * 100)
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

        monkeypatch.setattr("safetensors.torch.save_file", full_save_file)
    else:  # torch.save's own RuntimeError ("unexpected pos"), or the tokenizer's files, on a disk that fills up
        budget, modules = (2_000, (ckpt_io, durable)) if where == "state" else (10, (durable,))
        FullDisk(monkeypatch, run, budget, modules)
    with pytest.raises(UserError) as exc:
        ckpt_io.save_checkpoint(run, 2, model, state, {"step": 2}, tok, keep=3)
    message = str(exc.value)
    assert message.startswith(f"disk full while saving the checkpoint to {run / 'checkpoints' / 'step_00000002'}")
    assert "previous checkpoint is intact" in message and "\n" not in message
    assert_previous_checkpoint_kept(run, previous)


def test_checkpoint_save_leftovers_of_a_killed_save_are_removed(tmp_path):
    """A save killed part-way leaves `.tmp-step_N` (and a discard `.old-step_N`): never taken for a checkpoint,
    and removed by the next save."""
    model, state, tok = tiny_checkpoint_parts()
    run = tmp_path / "run"
    first = ckpt_io.save_checkpoint(run, 1, model, state, {}, tok, keep=3)
    (run / "checkpoints" / ".tmp-step_00000002").mkdir()
    (run / "checkpoints" / ".tmp-step_00000002" / "model.safetensors").write_bytes(b"half")
    shutil.copytree(first, run / "checkpoints" / ".old-step_00000001-abcd")
    assert ckpt_io.list_checkpoints(run) == [first]
    assert ckpt_io.resolve_checkpoint(run) == first
    ckpt_io.save_checkpoint(run, 3, model, state, {}, tok, keep=3)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000001", "step_00000003"]


def test_shards_on_a_full_disk(tmp_path, monkeypatch, capsys):
    """`data prepare` onto a disk that fills up: one line, exit 2, no folder under --out and no temporary one,
    and with --overwrite the old data set intact."""
    from redline.data import prepare as prepare_module

    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(8):
        (texts / f"d{i}.txt").write_text(f"document {i} " * 300)
    old = tmp_path / "out" / "old"
    argv = ["data", "prepare", "--inputs", str(texts), "--tokenizer", "bytes", "--workers", "1",
            "--shard-tokens", "4000"]
    assert run_cli(argv + ["--out", str(old)], capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in old.iterdir() if p.is_file()}
    FullDisk(monkeypatch, tmp_path / "out", budget=10_000, modules=(durable, prepare_module))
    for out, extra in ((tmp_path / "out" / "new", []), (old, ["--overwrite"])):
        code, _, err = run_cli(argv + ["--out", str(out), *extra], capsys)
        assert code == 2 and "disk full while writing" in one_line_error(err), err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["old"]  # no new folder, no temporary one
    assert {p.name: p.read_bytes() for p in old.iterdir() if p.is_file()} == before


def test_tokenizer_save_on_a_full_disk(tmp_path, monkeypatch, capsys):
    texts = tmp_path / "t.txt"
    texts.write_text("some words to learn merges from " * 200)
    out = tmp_path / "tok"
    argv = ["tokenizer", "train", "--inputs", str(texts), "--vocab-size", "300", "--out", str(out)]
    assert run_cli(argv, capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    FullDisk(monkeypatch, tmp_path, budget=5_000)
    code, _, err = run_cli(argv[:-2] + ["--vocab-size", "320", "--out", str(out), "--overwrite"], capsys)
    assert code == 2 and "disk full while writing" in one_line_error(err)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the previous tokenizer, whole
    code, _, err = run_cli(argv[:-1] + [str(tmp_path / "fresh")], capsys)
    assert code == 2 and "disk full" in one_line_error(err)
    assert not (tmp_path / "fresh").exists() or not any((tmp_path / "fresh").iterdir())


def test_sweep_results_on_a_full_disk(tmp_path, monkeypatch):
    """A run's record that does not fit is not written at all (no torn line): the sweep stops with one line, and
    the next call runs that run again; every finished run is recorded exactly once."""
    from redline.experiments.recipes import expand, load_recipe
    from redline.experiments.results import read_jsonl
    from redline.experiments.sweep import Sweep

    from tests.test_sweep import fake_recipe

    recipe = load_recipe(str(fake_recipe(tmp_path, seeds=[1], steps=5)))
    out = tmp_path / "out"
    runs = expand(recipe)
    Sweep(recipe, runs[:1], out).execute()  # one run recorded
    before = (out / "results.jsonl").read_bytes()
    disk = FullDisk(monkeypatch, out / "results.jsonl", budget=0)
    with pytest.raises(UserError, match="disk full while writing .*results.jsonl; its earlier records are intact"):
        Sweep(recipe, runs, out).execute()
    assert (out / "results.jsonl").read_bytes() == before
    disk.left = 10**9  # space again
    counts = Sweep(recipe, runs, out).execute()
    assert counts["ran"] == 1 and sorted(r["run_id"] for r in read_jsonl(out / "results.jsonl")) == sorted(
        r.run_id for r in runs)


def test_report_on_a_full_disk_keeps_the_previous_files(tmp_path, monkeypatch, capsys):
    from redline.experiments import report as report_module

    root = tmp_path / "sweep"
    shutil.copytree(REPO / "tests" / "fixtures" / "sweep_small", root)
    assert run_cli(["report", str(root)], capsys)[0] == 0
    names = ("report.md", "results.json", "results.csv", "dashboard.html")
    before = {n: (root / n).read_bytes() for n in names}
    FullDisk(monkeypatch, root, budget=20_000, modules=(durable, report_module))
    code, _, err = run_cli(["report", str(root)], capsys)
    assert code == 2 and "disk full while writing" in one_line_error(err)
    assert {n: (root / n).read_bytes() for n in names} == before
    assert not [p for p in root.rglob(".*.tmp")]


def test_tokenizer_half_saved_never_mixes_old_and_new(tmp_path, monkeypatch, capsys):
    """The disk fills after the new tokenizer.json but before redline_tokenizer.json: the folder is still the old
    tokenizer, both files."""
    texts = tmp_path / "t.txt"
    texts.write_text("some words to learn merges from " * 200)
    out = tmp_path / "tok"
    argv = ["tokenizer", "train", "--inputs", str(texts), "--out", str(out)]
    assert run_cli(argv + ["--vocab-size", "300"], capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    from redline.tokenizer import train_bpe

    new_size = len(train_bpe([texts.read_text()], 320).hf.to_str(pretty=True).encode())  # the same training
    FullDisk(monkeypatch, tmp_path, budget=new_size + 10)  # room for tokenizer.json, not for redline_tokenizer.json
    code, _, err = run_cli(argv + ["--vocab-size", "320", "--overwrite"], capsys)
    assert code == 2 and "disk full" in one_line_error(err)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt", "tok"]


def _safetensors_full_disk():
    from safetensors import SafetensorError

    return SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                           'message: "No space left on device" })')


def _torch_save_full_disk():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:783] . PytorchStreamWriter failed writing file")
    except RuntimeError as e:
        return e


@pytest.mark.parametrize("error", [_safetensors_full_disk, _torch_save_full_disk,
                                   lambda: OSError(errno.ENOSPC, "No space left on device")])
def test_model_folder_on_a_full_disk(tmp_path, error):
    """`redline import` and `export` fill a temporary folder and rename it: a full disk, whichever library's error
    says so, is one line, and neither the folder nor the temporary one is left."""
    from redline.interop.hf import write_atomic_folder

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        (tmp / "model.safetensors").write_bytes(b"\0" * 1000)
        raise error()

    out = tmp_path / "model"
    with pytest.raises(durable.DiskFullError, match=r"^disk full while writing .*model; nothing was left there\. Free"):
        write_atomic_folder(out, write)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------------------
# input files of the newer commands: task files (evaluate), fine-tuning data (sft, dpo, grpo)


def test_task_file_that_is_not_utf8_is_one_line(tmp_path):
    from redline.tasks import load_task

    path = tmp_path / "latin.jsonl"
    path.write_bytes(json.dumps({"prompt": "1+1?", "answer": "2"}).encode() + b"\n"
                     + '{"prompt": "caf\xe9?", "answer": "1"}\n'.encode("latin-1"))
    with pytest.raises(UserError, match=r"latin\.jsonl line 2 is not UTF-8 text .* save it as UTF-8") as e:
        load_task(str(path))
    assert "\n" not in str(e.value)


def test_task_file_keeps_line_separators_inside_json_strings(tmp_path):
    """A JSON string may hold U+2028 (and U+0085) unescaped: the file is split at newlines only."""
    from redline.tasks import load_task

    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "a\u2028b\x85?", "answer": "2"}\n', encoding="utf-8")
    task = load_task(str(path))
    assert [e.prompt for e in task.examples("test")] == ["a\u2028b\x85?"]


def test_finetuning_data_that_is_not_utf8_is_one_line(tmp_path):
    from redline.posttrain.data import read_jsonl

    path = tmp_path / "chats.jsonl"
    path.write_bytes('{"prompt": "caf\xe9", "response": "x"}\n'.encode("latin-1"))
    with pytest.raises(UserError, match=r"chats\.jsonl.* not UTF-8"):
        read_jsonl(path)


@pytest.mark.slow
def test_evaluate_on_a_full_disk_keeps_earlier_records_whole(dataset, tmp_path, monkeypatch, capsys):  # noqa: F811
    """evaluations.jsonl gets one whole record or none: a full disk is one line, exit 2, earlier records intact."""
    from redline.commands import evaluate
    from tests.test_sft import _pretrain

    run = _pretrain(dataset, tmp_path)
    task = tmp_path / "t.jsonl"
    task.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    argv = ["evaluate", str(run), "--tasks", str(task), "--max-new-tokens", "2"]
    assert run_cli(argv, capsys)[0] == 0
    before = (run / "evaluations.jsonl").read_bytes()
    FullDisk(monkeypatch, run, budget=10, modules=(durable, evaluate))
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "disk full while writing" in one_line_error(err) and "evaluations.jsonl" in err
    assert (run / "evaluations.jsonl").read_bytes() == before


# ----------------------------------------------------------------------------------------------------
# kill -9 at random points of training, saving and sweeping


def _killed_after_a_random_delay(cmd: list[str], rng: random.Random, started, env=None, max_delay: float = 1.5,
                                 timeout: float = 120) -> int:
    """Run `cmd`, wait until `started()` says its work is under way, then SIGKILL it after a seeded random delay
    (unless it ended first). -> its exit status."""
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not started() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(rng.uniform(0, max_delay))
    if proc.poll() is None:
        proc.kill()
    return proc.wait()


def _metric_records(run: Path) -> list[dict]:
    """metrics.jsonl's records; only its last line may be torn (a write cut by the kill), and it is skipped."""
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if (run / "metrics.jsonl").exists() else []
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            assert number == len(lines), f"metrics.jsonl line {number} is torn and not the last: {line!r}"
    return records


def _assert_run_consistent(run: Path) -> list[Path]:
    """Every checkpoint the run shows is whole (a killed save is never listed), and no step is recorded twice."""
    checkpoints = ckpt_io.list_checkpoints(run)
    for ckpt in checkpoints:
        ckpt_io.verify_checkpoint(ckpt)
    steps = [r["step"] for r in _metric_records(run) if r["kind"] == "train"]
    assert len(steps) == len(set(steps)), f"duplicate step records: {sorted(s for s in steps if steps.count(s) > 1)}"
    return checkpoints


@pytest.mark.slow
def test_training_killed_at_random_points_resumes_consistently(dataset, tmp_path):  # noqa: F811
    """kill -9 at seeded random moments of a run that checkpoints often (so some kills land in a save): after
    each kill the checkpoints shown are whole and no step is recorded twice; `--resume` picks up every time, and
    the finished run holds each of its steps once, or names it in a metrics_gap event."""
    rng = random.Random(27)
    steps = 300  # several kills of at most 0.8 s after each attempt is under way, on a fast CPU too
    run = tmp_path / "runs" / "k"
    cmd = [sys.executable, "-m", "redline", "train", f"data.path={dataset}", f"out_dir={tmp_path / 'runs'}",
           "run_name=k", "model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.n_kv_head=2",
           "model.context_len=64", "batch_size=4", "seq_len=32", f"max_steps={steps}", "checkpoint_every=10",
           "keep_checkpoints=3", "log_every=7", "eval_every=50", "eval_batches=1", "sample_tokens=0",
           "tensorboard=False", "resume=auto"]
    kills = 0
    for attempt in range(4):
        before = len(_metric_records(run))
        first = attempt == 0  # the first attempt is killed only once it has a checkpoint to resume from
        code = _killed_after_a_random_delay(
            cmd, rng, lambda: bool(ckpt_io.list_checkpoints(run)) if first else len(_metric_records(run)) > before,
            max_delay=0.8)
        kills += code == -signal.SIGKILL
        assert code in (0, -signal.SIGKILL), code
        _assert_run_consistent(run)
        if code == 0:
            break
    assert kills >= 1, "the run ended before any kill: make it longer"
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoints = _assert_run_consistent(run)
    assert ckpt_io.read_meta(checkpoints[-1])["step"] == steps
    recorded = {r["step"] for r in _metric_records(run) if r["kind"] == "train"}
    reported = {s for r in _metric_records(run) if r.get("event") == "metrics_gap"
                for first, last in r["ranges"] for s in range(first, last + 1)}
    assert recorded | reported == set(range(1, steps + 1)) and not recorded & reported


@pytest.mark.slow
def test_sweep_killed_at_random_points_runs_each_cell_once(tmp_path):
    """kill -9 of a sweep at seeded random moments (between runs, in a run, while a result is written): the
    resumed sweep finishes every run and records each once; a run whose result was recorded never starts again
    (one that finished but was not yet recorded when the sweep died may run again: its result was not kept)."""
    from redline.experiments.recipes import expand, load_recipe
    from tests.test_sweep import fake_recipe, records, sweep_cmd

    rng = random.Random(27)
    recipe = fake_recipe(tmp_path, seeds=[1, 2, 3], step_seconds=0.02, steps=15)  # 6 runs of ~0.3 s + startup
    out, ledger = tmp_path / "out", tmp_path / "ledger.txt"
    env = {"FAKE_TRAIN_LEDGER": str(ledger)}
    recorded_at = {}  # run_id -> ledger lines written by the time its result was seen recorded
    for _ in range(3):
        _killed_after_a_random_delay(sweep_cmd(recipe, out), rng, ledger.exists, env=env, max_delay=2.0)
        time.sleep(0.3)  # the killed sweep's child gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and stops
        finished = [r["run_id"] for r in records(out)]
        assert len(finished) == len(set(finished)), finished
        for run_id in finished:
            recorded_at.setdefault(run_id, len(ledger.read_text().splitlines()))
    done = subprocess.run(sweep_cmd(recipe, out), cwd=REPO, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(r["run_id"] for r in records(out)) == sorted(r.run_id for r in expand(load_recipe(str(recipe))))
    assert all(r["status"] == "completed" for r in records(out))
    events = [line.split() for line in ledger.read_text().splitlines()]
    for run_id, seen in recorded_at.items():
        assert ["start", run_id] not in events[seen:], f"{run_id} ran again after its result was recorded"


@pytest.mark.parametrize("name", ["prompts.txt", "prompts.jsonl"])
def test_generate_prompt_file_that_is_not_utf8_is_one_line(tmp_path, name):
    from redline.commands.generate import GenerateConfig, read_prompts

    path = tmp_path / name
    path.write_bytes('{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(UserError, match=rf"{name} is not UTF-8 text: byte 0xe9 at offset 15.*iconv") as e:
        read_prompts(GenerateConfig(prompt_file=str(path)))
    assert "\n" not in str(e.value)


def test_bench_json_out_on_a_full_disk_keeps_earlier_records_whole(tmp_path, monkeypatch, capsys):
    """`bench --json-out FILE` appends its record whole or not at all (the file is a results log that later
    benches and `plan --bench-json` read)."""
    from redline.commands import bench

    path = tmp_path / "bench.jsonl"
    bench.emit({"tokens_per_second": 1.0}, str(path))
    before = path.read_bytes()
    FullDisk(monkeypatch, tmp_path, budget=10, modules=(durable, bench))
    with pytest.raises(durable.DiskFullError, match=r"^disk full while writing .*bench\.jsonl; its earlier records "):
        bench.emit({"tokens_per_second": 2.0, "name": "x" * 40}, str(path))
    assert path.read_bytes() == before


@pytest.mark.slow
def test_generate_jsonl_on_a_full_disk_keeps_whole_records(dataset, tmp_path, monkeypatch, capsys):  # noqa: F811
    """`generate --jsonl FILE` appends each record whole: a full disk part-way is one line, exit 2, and the
    records before it are readable (no torn last line)."""
    from tests.test_sft import _pretrain

    run = _pretrain(dataset, tmp_path / "runs")
    out = tmp_path / "gen" / "out.jsonl"
    out.parent.mkdir()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in "abc"))
    argv = ["generate", "--checkpoint", str(run), "--prompt-file", str(prompts), "--stream", "False",
            "--batch-size", "1", "--max-new-tokens", "3", "--jsonl", str(out)]
    assert run_cli(argv, capsys)[0] == 0
    one_record = len(out.read_text(encoding="utf-8").splitlines()[0].encode()) + 1
    FullDisk(monkeypatch, out.parent, budget=one_record + 20)
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "disk full while writing" in one_line_error(err) and "out.jsonl" in err, (err, out.read_text())
    assert [json.loads(line)["prompt"] for line in out.read_text(encoding="utf-8").splitlines()] == ["a"]


def test_a_folder_of_runs_given_for_a_checkpoint_names_the_runs_inside(tmp_path):
    model, state, tok = tiny_checkpoint_parts()
    for name in ("b", "a"):
        ckpt_io.save_checkpoint(tmp_path / "runs" / name, 1, model, state, {}, tok, keep=1)
    with pytest.raises(UserError, match=r"runs holds runs, not a checkpoint: give one of them, e\.g\. .*a \(a, b\)"):
        ckpt_io.resolve_checkpoint(tmp_path / "runs")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no checkpoint in"):
        ckpt_io.resolve_checkpoint(tmp_path / "empty")
