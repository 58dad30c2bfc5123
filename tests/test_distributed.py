"""Several processes on CPU (gloo, 2 ranks through torchrun): DDP and FSDP2 match one process with the same
global batch, and checkpoints (full, and FSDP2's sharded ones) resume across world sizes and parallel modes.
tests/test_sharded_checkpoint.py tests the sharded layout itself."""

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
def test_expert_bias_updates_on_two_ranks_match_one_process(dataset, tmp_path, parallel):  # noqa: F811
    """model.moe_bias_update under data parallelism: the choices are counted on each rank and summed before the
    update, so the routing biases, and with them the losses, follow the one-process run's (a rank that moved its
    biases by its own half of the batch would route otherwise from the second step on)."""
    moe = ("model.moe_experts=4", "model.moe_top_k=2", "model.moe_expert_bias=true", "model.moe_bias_update=0.05",
           "max_steps=6")
    single = run_train(dataset, tmp_path, "single", 1, *moe)
    double = run_train(dataset, tmp_path, "double", 2, *moe, f"parallel={parallel}")
    assert close(single, double), (single, double)


def test_warm_ups_on_two_ranks_match_one_process(dataset, tmp_path):  # noqa: F811
    """A batch-size warm-up (1 row, then 2) and a sequence-length one (rows of 8, 16, then 32 tokens): each rank
    reads its own rows of the same global batch as the one process's two micro-batches."""
    ramps = ("max_steps=6", "batch_ramp_steps=3", "batch_ramp_multiple=1", "batch_ramp_start=0.5",
             "seq_ramp_steps=4", "seq_ramp_start=8")
    single = run_train(dataset, tmp_path, "single", 1, *ramps)
    double = run_train(dataset, tmp_path, "double", 2, *ramps, "parallel=ddp")
    assert close(single, double), (single, double)


# (processes, parallel, max_steps, the layout of the checkpoint it leaves) for each leg of a hopping run
HOPS = {
    # 2 ranks → 1 process → 2 ranks; every checkpoint in the full layout
    "ddp": [(2, "ddp", 4, "full"), (1, "ddp", 8, "full"), (2, "ddp", 10, "full")],
    # sharded → FSDP2 on 2 ranks → one process (DCP reads whole tensors) → full → FSDP2 → sharded → DDP
    "fsdp2": [(2, "fsdp2", 3, "sharded"), (2, "fsdp2", 5, "sharded"), (1, "fsdp2", 7, "full"),
              (2, "fsdp2", 9, "sharded"), (2, "ddp", 10, "full")],
}


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_resume_across_world_sizes(dataset, tmp_path, parallel):  # noqa: F811
    """A run that hops between world sizes, parallel modes and checkpoint layouts, against 10 steps in one
    process: the same losses (the optimizer state and the data position carry over exactly)."""
    from redline.training import checkpoint as ckpt_io

    straight = run_train(dataset, tmp_path, "straight", 1, "max_steps=10", "optim.schedule=constant")
    seen: dict[int, float] = {}
    for i, (gpus, mode, max_steps, layout) in enumerate(HOPS[parallel]):
        extra = ("optim.schedule=constant",) if i == 0 else ("--resume",)
        losses = run_train(dataset, tmp_path, "hop", gpus, *extra, f"max_steps={max_steps}", f"parallel={mode}")
        assert seen.keys() <= losses.keys() and max(losses) == max_steps
        seen = losses
        newest = ckpt_io.list_checkpoints(tmp_path / "hop")[-1]
        meta = ckpt_io.verify_checkpoint(newest)
        assert meta["step"] == max_steps and ckpt_io.layout(meta) == layout, (max_steps, meta)
        if layout == "sharded":  # one file of shards per rank, nothing gathered
            assert sorted(p.name for p in (newest / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
            assert not (newest / "model.safetensors").exists()
    assert sorted(seen) == list(range(1, 11))
    assert close(straight, seen), (straight, seen)


def test_muon_under_fsdp2_matches_one_process_and_resumes_across_layouts(dataset, tmp_path):  # noqa: F811
    """Muon with FSDP2's sharded matrices (redline/training/muon.py: whole matrices only on their owner ranks)
    trains as one process does, and its sharded checkpoint (momentum buffers as DTensor shards) resumes in one
    process."""
    from redline.training import checkpoint as ckpt_io

    muon = ("optim.name=muon", "optim.schedule=constant", "optim.muon_momentum_warmup_steps=4")
    single = run_train(dataset, tmp_path, "single", 1, "max_steps=6", *muon)
    first = run_train(dataset, tmp_path, "hop", 2, "max_steps=3", "parallel=fsdp2", *muon)
    assert ckpt_io.layout(ckpt_io.verify_checkpoint(ckpt_io.list_checkpoints(tmp_path / "hop")[-1])) == "sharded"
    resumed = run_train(dataset, tmp_path, "hop", 1, "max_steps=6", "--resume")
    assert first.keys() == {1, 2, 3} and close(single, resumed), (single, first, resumed)


def test_peer_failure_message():
    from redline.distributed import DistInfo, peer_failure_message

    two = DistInfo(rank=0, local_rank=0, world_size=2)
    message = peer_failure_message(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"), two, 60)
    assert message.startswith("rank 0: another rank stopped answering") and "dist_timeout=60 s" in message
    assert "\n" not in message
    assert peer_failure_message(RuntimeError("shape mismatch"), two, 60) is None  # other errors keep their traceback
    assert peer_failure_message(RuntimeError("Connection closed by peer"), DistInfo(), 60) is None  # one process


@pytest.mark.parametrize("how, parallel", [("dead", "ddp"), ("hung", "ddp"), ("dead", "fsdp2")])
def test_a_dead_or_hung_rank_stops_the_job_and_keeps_the_checkpoint(dataset, tmp_path, how, parallel):  # noqa: F811
    """Rank 1 is killed (SIGKILL) or frozen (SIGSTOP: alive, never answering) mid-run: rank 0's next collective
    fails (at once, or after dist_timeout), it says so in one line, torchrun stops the job with a non-zero exit,
    and the last checkpoint still verifies. Under FSDP2 the checkpoints are sharded, saved every 2 steps, so the
    kill often lands in the middle of one: whatever is complete under a real name verifies."""
    import signal
    import time

    from redline.training import checkpoint as ckpt_io

    cmd = [sys.executable, "-m", "redline", "train", f"data.path={dataset}", f"out_dir={tmp_path}", "run_name=dead",
           "gpus=2", *COMMON, "max_steps=100000", "checkpoint_every=2", "dist_timeout=15", f"parallel={parallel}"]
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
    for ckpt in ckpt_io.list_checkpoints(tmp_path / "dead"):
        meta = ckpt_io.verify_checkpoint(ckpt)
        assert ckpt_io.layout(meta) == ("sharded" if parallel == "fsdp2" else "full")


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
