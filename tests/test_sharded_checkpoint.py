"""FSDP2's sharded checkpoints (torch.distributed.checkpoint): every rank writes its shards, the folder appears
whole or not at all, and the checkpoint loads exactly into another world size, into one process (eval, sample,
generate, resume without FSDP2) and with Muon's and AdamW's states. The ranks are
tests/sharded_checkpoint_worker.py under torchrun (gloo, CPU).

The training loop's resumes across layouts and world sizes are in tests/test_distributed.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from redline.config import OptimConfig, TrainConfig, to_dict
from redline.errors import UserError
from redline.model import GPT
from redline.presets import get_preset
from redline.tokenizer import load_tokenizer
from redline.training import checkpoint as ckpt_io
from redline.training.optim import build_optimizers

WORKER = Path(__file__).with_name("sharded_checkpoint_worker.py")
MODEL = replace(get_preset("tiny"), n_layer=2, n_embd=64, n_head=4, n_kv_head=2, vocab_size=256, context_len=32)


def torchrun(ranks: int, mode: str, run: Path) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", str(WORKER),
           mode, str(run)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for rank in range(ranks):
        assert f"rank {rank}: ok {mode}" in out, out[-4000:]
    return out


@pytest.fixture(scope="module")
def saved_on_three(tmp_path_factory) -> Path:
    """A run whose step-2 checkpoint was saved sharded by 3 ranks (uneven shards: 64 rows over 3), with the full
    state gathered at that moment as the reference; a later save failed on rank 1 (full disk)."""
    run = tmp_path_factory.mktemp("sharded") / "run"
    torchrun(3, "save", run)
    return run


@pytest.mark.slow
def test_sharded_layout_and_a_failed_save(saved_on_three):
    ckpts = ckpt_io.list_checkpoints(saved_on_three)
    assert [c.name for c in ckpts] == ["step_00000002"]  # the failed step-3 save left nothing under a real name
    assert not list((saved_on_three / "checkpoints").glob(".tmp-*"))
    ckpt = ckpts[0]
    meta = ckpt_io.verify_checkpoint(ckpt)
    assert (meta["format"], meta["layout"], meta["world_size"], meta["step"]) == (2, "sharded", 3, 2)
    files = sorted(p.name for p in (ckpt / "dcp").iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]  # one file of shards per rank
    assert set(meta["sha256"]) == {f"dcp/{name}" for name in files} | {"state.pt"}
    assert not (ckpt / "model.safetensors").exists()
    state = ckpt_io.load_state(ckpt)
    assert state["step"] == 2 and state["optimizer_types"] == ["AdamW"] and "optimizers" not in state
    assert ckpt_io.resolve_checkpoint(saved_on_three) == ckpt


@pytest.mark.slow
def test_saved_on_three_ranks_loads_exactly_on_two(saved_on_three):
    """FSDP2 on 2 ranks reads the 3 ranks' shards: the gathered weights and AdamW states equal the reference
    bit for bit (the worker asserts it on rank 0)."""
    torchrun(2, "load", saved_on_three)


@pytest.mark.slow
def test_one_process_reads_a_sharded_checkpoint_exactly(saved_on_three):
    """eval / sample / generate (load_for_inference) and a resume without FSDP2 (load_sharded into a plain model
    and optimizer) read whole tensors, no process group: the reference's weights and AdamW states exactly."""
    from redline.training.parallel import _name_keyed

    ckpt = ckpt_io.list_checkpoints(saved_on_three)[0]
    reference = torch.load(saved_on_three / "reference.pt", weights_only=False)
    model, tokenizer, cfg = ckpt_io.load_for_inference(saved_on_three)
    assert tokenizer.identity == load_tokenizer("bytes").identity and cfg.model.tie_embeddings
    weights = model.state_dict()
    assert weights.keys() == reference["model"].keys()
    for name, value in reference["model"].items():
        assert torch.equal(weights[name], value), name
    assert model.lm_head.weight is model.wte.weight  # still tied

    torch.manual_seed(5)
    plain = GPT(cfg.model)
    optimizers = build_optimizers(plain, OptimConfig(lr=1.0, weight_decay=0.5), torch.device("cpu"))
    ckpt_io.load_sharded(ckpt, plain, optimizers, ckpt_io.load_state(ckpt)["optimizer_types"])
    loaded = _name_keyed(plain, optimizers[0], optimizers[0].state_dict())
    expected = reference["optimizers"][0]
    assert loaded["state"].keys() == expected["state"].keys()
    for name, moments in expected["state"].items():
        for key, value in moments.items():
            assert torch.equal(loaded["state"][name][key], value), (name, key)
    assert loaded["param_groups"] == expected["param_groups"]  # lr, initial_lr, betas, weight decay, params

    muon = build_optimizers(GPT(cfg.model), OptimConfig(name="muon"), torch.device("cpu"))
    with pytest.raises(UserError, match="resume with the same optim.name"):
        ckpt_io.load_sharded(ckpt, GPT(cfg.model), muon, ["AdamW"])


@pytest.mark.slow
def test_a_corrupted_shard_is_refused(saved_on_three, tmp_path):
    ckpt = tmp_path / "step_00000002"
    shutil.copytree(ckpt_io.list_checkpoints(saved_on_three)[0], ckpt)
    shard = ckpt / "dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError, match="corrupted"):
        ckpt_io.verify_checkpoint(ckpt)
    shard.write_bytes(bytes(data[:100]))  # truncated: DCP cannot read it either
    with pytest.raises(UserError, match="cannot load the sharded checkpoint"):
        ckpt_io.load_weights(ckpt, GPT(replace(MODEL, tie_embeddings=True)))


def test_muon_and_adamw_states_round_trip_in_one_process(tmp_path):
    """The sharded layout written by one process (no process group) and read back: Muon's momentum and AdamW's
    moments, steps and hyperparameters exactly, into optimizers that had no state yet."""
    cpu = torch.device("cpu")
    cfg = OptimConfig(name="muon", lr=3e-3, warmup_steps=0)
    torch.manual_seed(0)
    model = GPT(MODEL)
    optimizers = build_optimizers(model, cfg, cpu)
    x = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        model(x[:, :-1], x[:, 1:]).backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
    state = {"step": 2, "optimizer_types": [type(o).__name__ for o in optimizers]}
    config = to_dict(replace(TrainConfig(), model=MODEL))
    path = ckpt_io.save_sharded_checkpoint(tmp_path, 2, model, optimizers, state, config, load_tokenizer("bytes"), 3)
    assert ckpt_io.layout(ckpt_io.verify_checkpoint(path)) == "sharded"

    torch.manual_seed(1)
    fresh = GPT(MODEL)
    fresh_optimizers = build_optimizers(fresh, replace(cfg, lr=1.0, muon_lr=1.0, muon_momentum=0.5), cpu)
    ckpt_io.load_sharded(path, fresh, fresh_optimizers, ["Muon", "AdamW"])
    for name, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name
    for saved, loaded in zip(optimizers, fresh_optimizers):
        a, b = saved.state_dict(), loaded.state_dict()
        assert a["param_groups"] == b["param_groups"]
        assert a["state"].keys() == b["state"].keys() and a["state"]
        for index, moments in a["state"].items():
            for key, value in moments.items():
                assert torch.equal(b["state"][index][key], value), (index, key)
    assert "momentum_buffer" in fresh_optimizers[0].state_dict()["state"][0]


def test_layouts_and_formats():
    assert ckpt_io.layout({"format": 1}) == "full"  # checkpoints from before the sharded layout
    assert ckpt_io.layout({"format": 2, "layout": "sharded"}) == "sharded"
    with pytest.raises(UserError, match="format 3 is not one this redline reads"):
        ckpt_io.layout({"format": 3, "layout": "sharded"})
