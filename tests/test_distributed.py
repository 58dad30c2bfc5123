"""Several processes on CPU (gloo, 2 ranks through torchrun): DDP and FSDP2 match one process with the same
global batch, and checkpoints resume across world sizes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_train import dataset  # noqa: F401  (the session-scoped prepared corpus)

pytestmark = pytest.mark.slow

COMMON = ["model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.n_kv_head=2", "model.context_len=64",
          "batch_size=2", "seq_len=32", "tokens_per_step=256", "eval_batches=2", "sample_tokens=0",
          "tensorboard=False", "log_every=2", "optim.warmup_steps=2", "device=cpu", "dist_timeout=120"]


def run_train(data: Path, out: Path, name: str, gpus: int, *extra: str) -> dict[int, float]:
    cmd = [sys.executable, "-m", "redline", "train", f"data.path={data}", f"out_dir={out}", f"run_name={name}",
           f"gpus={gpus}", *COMMON, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = {}
    for line in (out / name / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train":
            losses[record["step"]] = record["loss"]
    return losses


def close(a: dict[int, float], b: dict[int, float], tol: float = 2e-4) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= tol * max(1.0, abs(a[k])) for k in a)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_ranks_match_one_process(dataset, tmp_path, parallel):  # noqa: F811
    # one process: 2 micro-batches of 2 accumulate to 256 tokens; two ranks: one micro-batch each
    single = run_train(dataset, tmp_path, "single", 1, "max_steps=6")
    double = run_train(dataset, tmp_path, "double", 2, "max_steps=6", f"parallel={parallel}")
    assert close(single, double), (single, double)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_resume_across_world_sizes(dataset, tmp_path, parallel):  # noqa: F811
    """2 ranks for steps 1-4 → 1 process for 5-8 → 2 ranks for 9-10, against 10 steps in one process."""
    straight = run_train(dataset, tmp_path, "straight", 1, "max_steps=10", "optim.schedule=constant")
    first = run_train(dataset, tmp_path, "hop", 2, "max_steps=4", "optim.schedule=constant", f"parallel={parallel}")
    second = run_train(dataset, tmp_path, "hop", 1, "--resume", "max_steps=8", f"parallel={parallel}")
    third = run_train(dataset, tmp_path, "hop", 2, "--resume", "max_steps=10", f"parallel={parallel}")
    assert sorted(third) == list(range(1, 11)) and first.keys() <= third.keys() and second.keys() <= third.keys()
    assert close(straight, third), (straight, third)


def test_peer_failure_message():
    from redline.distributed import DistInfo, peer_failure_message

    two = DistInfo(rank=0, local_rank=0, world_size=2)
    message = peer_failure_message(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"), two, 60)
    assert message.startswith("rank 0: another rank stopped answering") and "dist_timeout=60 s" in message
    assert "\n" not in message
    assert peer_failure_message(RuntimeError("shape mismatch"), two, 60) is None  # other errors keep their traceback
    assert peer_failure_message(RuntimeError("Connection closed by peer"), DistInfo(), 60) is None  # one process


@pytest.mark.parametrize("how", ["dead", "hung"])
def test_a_dead_or_hung_rank_stops_the_job_and_keeps_the_checkpoint(dataset, tmp_path, how):  # noqa: F811
    """Rank 1 is killed (SIGKILL) or frozen (SIGSTOP: alive, never answering) mid-run: rank 0's next collective
    fails (at once, or after dist_timeout), it says so in one line, torchrun stops the job with a non-zero exit,
    and the last checkpoint still verifies."""
    import signal
    import time

    from redline.training import checkpoint as ckpt_io

    cmd = [sys.executable, "-m", "redline", "train", f"data.path={dataset}", f"out_dir={tmp_path}", "run_name=dead",
           "gpus=2", *COMMON, "max_steps=100000", "checkpoint_every=2", "dist_timeout=15"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not ckpt_io.list_checkpoints(tmp_path / "dead"):
            time.sleep(0.5)
        assert ckpt_io.list_checkpoints(tmp_path / "dead"), "no checkpoint was written"
        rank1 = [pid for pid in _worker_pids(proc.pid) if _environ(pid).get("RANK") == "1"]
        assert rank1, "rank 1 not found"
        os.kill(rank1[0], signal.SIGKILL if how == "dead" else signal.SIGSTOP)
        stopped = time.time()
        out, _ = proc.communicate(timeout=180)
        assert time.time() - stopped < 150  # the 15 s timeout, then torchrun's shutdown grace period
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, out[-2000:]
    assert "another rank stopped answering" in out, out[-2000:]  # rank 0's one-line explanation
    ckpt_io.verify_checkpoint(ckpt_io.list_checkpoints(tmp_path / "dead")[-1])


def _worker_pids(root: int) -> list[int]:
    """Every descendant process of `root` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)
