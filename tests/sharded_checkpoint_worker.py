"""One rank of tests/test_sharded_checkpoint.py, started by torchrun (gloo, CPU):

    save RUN     train a tiny FSDP2 model 2 steps, save a sharded checkpoint (step 2) and, on rank 0, the full state
                 gathered as the reference (RUN/reference.pt); then a save that fails on rank 1 (a full disk)
                 must fail on every rank and leave no step_3 folder; and the shared-folder probe
    load RUN     a fresh FSDP2 model and optimizer on this world size load step 2; the gathered state must equal
                 the reference exactly
    fp8 RUN      FP8 (emulated, tensorwise) with FSDP2's FP8 all-gather: the BF16 path and the FP8 path run, FP8
                 losses match one process's, the scales are precomputed, and a sharded save stores plain tensors
    fp8-compiled RUN  the same model compiled: BF16 steps, FP8 steps and a BF16 evaluation equal the eager model's

Each rank prints `rank R: ok MODE` at the end; an assertion error fails the launch.
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from redline.config import OptimConfig, TrainConfig, to_dict
from redline.distributed import dist_info, init_distributed
from redline.errors import UserError
from redline.model import GPT
from redline.presets import get_preset
from redline.tokenizer import load_tokenizer
from redline.training import checkpoint as ckpt_io
from redline.training.optim import build_optimizers
from redline.training.parallel import apply_data_parallel, full_state

CPU = torch.device("cpu")
MODEL = replace(get_preset("tiny"), n_layer=2, n_embd=64, n_head=4, n_kv_head=2, vocab_size=256, context_len=32)
GLOBAL_BATCH = 4


def build(seed: int, tie: bool = True, param_dtype=None, before_sharding=None, lr: float = 3e-3):
    torch.manual_seed(seed)
    model = GPT(replace(MODEL, tie_embeddings=tie))
    if before_sharding:
        before_sharding(model)
    apply_data_parallel(model, model, "fsdp2", CPU, dist_info(), param_dtype=param_dtype)
    return model, build_optimizers(model, OptimConfig(lr=lr, warmup_steps=0), CPU)


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of the global batch of `step` (the same global batch on any world size)."""
    tokens = torch.randint(0, 256, (GLOBAL_BATCH, 33), generator=torch.Generator().manual_seed(step))
    rows = tokens[rank * GLOBAL_BATCH // world:(rank + 1) * GLOBAL_BATCH // world]
    return rows[:, :-1], rows[:, 1:]


def train_step(model, optimizers, step: int, autocast: bool = False) -> float:
    info = dist_info()
    x, y = batch(step, info.rank, info.world_size)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(x, y)
    loss.backward()
    for opt in optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return mean.item() / info.world_size


def save(run: Path) -> None:
    from torch.distributed.checkpoint import FileSystemWriter

    info = dist_info()
    model, optimizers = build(seed=0)
    for step in range(2):
        train_step(model, optimizers, step)
    state = {"step": 2, "world_size": info.world_size, "optimizer_types": [type(o).__name__ for o in optimizers]}
    config = to_dict(replace(TrainConfig(), model=replace(MODEL, tie_embeddings=True)))
    tokenizer = load_tokenizer("bytes")
    path = ckpt_io.save_sharded_checkpoint(run, 2, model, optimizers, state, config, tokenizer, keep=3)
    assert path == run / "checkpoints" / "step_00000002"
    model_state, optimizer_states = full_state(model, optimizers)  # the reference, gathered
    if info.is_main:
        torch.save({"model": model_state, "optimizers": optimizer_states}, run / "reference.pt")

    # rank 1's disk fills up while it writes its shards: every rank raises, nothing appears under step_3
    real_write = FileSystemWriter.write_data

    def full_disk(self, plan, planner):
        raise OSError(errno.ENOSPC, "No space left on device")

    if info.rank == 1:
        FileSystemWriter.write_data = full_disk
    try:
        ckpt_io.save_sharded_checkpoint(run, 3, model, optimizers, state, config, tokenizer, keep=3)
        raise AssertionError("the save with a full disk on rank 1 did not fail")
    except UserError as e:
        assert "disk full" in str(e), e
    finally:
        FileSystemWriter.write_data = real_write
    dist.barrier()
    assert not (run / "checkpoints" / "step_00000003").exists()
    assert not list((run / "checkpoints").glob(".tmp-*"))
    assert [p.name for p in ckpt_io.list_checkpoints(run)] == ["step_00000002"]

    # node-local disks (simulated: each rank its own folder) are told apart from a shared folder
    assert ckpt_io.every_rank_sees(run / "checkpoints")
    assert not ckpt_io.every_rank_sees(run / f"local-{info.rank}")


def load(run: Path) -> None:
    info = dist_info()
    model, optimizers = build(seed=1, lr=1.0)  # other weights and learning rate, optimizers without state
    ckpt = ckpt_io.list_checkpoints(run)[0]
    state = ckpt_io.load_state(ckpt)
    ckpt_io.load_sharded(ckpt, model, optimizers, state["optimizer_types"])
    model_state, optimizer_states = full_state(model, optimizers)
    if info.is_main:
        reference = torch.load(run / "reference.pt", weights_only=False)
        assert_same(model_state, reference["model"])
        assert_same(optimizer_states, reference["optimizers"])
    # and training goes on from there: the same loss on every rank, finite
    assert torch.isfinite(torch.tensor(train_step(model, optimizers, 2)))


def assert_same(a, b, where: str = "") -> None:
    """Exactly equal nested states (tensors bit for bit)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (where, sorted(set(a) ^ set(b))[:5])
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def fp8(run: Path) -> None:
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    from redline.converters import float8 as f8

    info = dist_info()
    names = ["blocks.0.attn.qkv", "blocks.0.mlp.fc", "blocks.1.mlp.proj"]

    def convert(model):
        f8.convert_linears(model, names, emulate=True, enabled=False, fsdp_float8_all_gather=True)

    model, optimizers = build(seed=0, tie=False, before_sharding=convert)
    assert f8.uses_fsdp_float8_all_gather(model)
    weight = model.get_submodule("blocks.0.attn.qkv").weight
    assert isinstance(weight._local_tensor, WeightWithDynamicFloat8CastTensor)
    # one process, the same layers in FP8 without FSDP: the reference
    torch.manual_seed(0)
    single = GPT(replace(MODEL, tie_embeddings=False))
    f8.convert_linears(single, names, emulate=True, enabled=False)
    single_opt = build_optimizers(single, OptimConfig(lr=3e-3, warmup_steps=0), CPU)

    losses, single_losses = [], []
    for step in range(4):
        on = step != 1  # step 1 runs the BF16 path (as a warm-up step would): FSDP2 still gathers the weights in FP8
        f8.set_float8_enabled(model, on)
        f8.set_float8_enabled(single, on)
        losses.append(train_step(model, optimizers, step))
        f8.precompute_fsdp_float8_scales(model)
        x, y = batch(step, 0, 1)
        loss = single(x, y)
        loss.backward()
        for opt in single_opt:
            opt.step()
            opt.zero_grad(set_to_none=True)
        single_losses.append(loss.item())
    # step 0, from the same weights: the FP8 weights gathered from the shards are those of one process (one scale
    # over the whole weight), so the loss is the same up to float rounding
    assert abs(losses[0] - single_losses[0]) < 2e-5 * single_losses[0], (losses, single_losses)
    # the BF16 step computes from FP8-rounded weights: close to one process's BF16 step, not equal
    assert abs(losses[1] - single_losses[1]) < 0.02 * single_losses[1], (losses, single_losses)
    # later FP8 steps: the gradients' FP8 scales are per rank (as under DDP), so the weights drift apart a little
    for a, b in zip(losses[2:], single_losses[2:]):
        assert abs(a - b) < 2e-3 * b, (losses, single_losses)
    # the precomputed scale is the one of the whole (gathered) weight
    amax = f8.plain_weight(weight).full_tensor().abs().max().double()
    expected = (torch.finfo(torch.float8_e4m3fn).max / amax).float()
    assert torch.allclose(weight._local_tensor._precomputed_scale, expected), (weight._local_tensor._precomputed_scale,
                                                                               expected)

    # a sharded checkpoint of this model holds plain tensors: it loads into one process without torchao's subclass
    state = {"step": 4, "world_size": info.world_size, "optimizer_types": [type(o).__name__ for o in optimizers]}
    config = to_dict(replace(TrainConfig(), model=replace(MODEL, tie_embeddings=False)))
    ckpt_io.save_sharded_checkpoint(run, 4, model, optimizers, state, config, load_tokenizer("bytes"), keep=1)
    model_state, _ = full_state(model, optimizers)
    if info.is_main:
        torch.save({"model": model_state}, run / "reference.pt")


def fp8_compiled(run: Path) -> None:
    """The same FP8 all-gather model compiled: a BF16 step (the warm-up path, which dequantizes the gathered FP8
    weights outside the graph), FP8 steps, and a BF16 evaluation forward must run and equal the eager model's."""
    from redline.converters import float8 as f8

    info = dist_info()
    names = ["blocks.0.attn.qkv", "blocks.0.mlp.fc", "blocks.1.mlp.proj"]

    def convert(model):
        f8.convert_linears(model, names, emulate=True, enabled=False, fsdp_float8_all_gather=True)

    results = []
    for compiled in (False, True):
        model, optimizers = build(seed=0, tie=False, before_sharding=convert)
        run_model = torch.compile(model) if compiled else model
        losses = []
        for step in range(3):
            f8.set_float8_enabled(model, step != 0)
            x, y = batch(step, info.rank, info.world_size)
            loss = run_model(x, y)
            loss.backward()
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
            f8.precompute_fsdp_float8_scales(model)
            losses.append(loss.item())
        f8.set_float8_enabled(model, False)
        with torch.no_grad():
            losses.append(run_model(x, y).item())
        results.append(losses)
    eager, compiled = results
    assert all(abs(a - b) <= 1e-4 * abs(a) for a, b in zip(eager, compiled)), (eager, compiled)


if __name__ == "__main__":
    mode, run = sys.argv[1], Path(sys.argv[2])
    init_distributed(dist_info(), CPU, timeout_s=120)
    {"save": save, "load": load, "fp8": fp8, "fp8-compiled": fp8_compiled}[mode](run)
    dist.barrier()
    print(f"rank {dist_info().rank}: ok {mode}", flush=True)
    dist.destroy_process_group()
    # skip the interpreter's finalization: a gloo worker thread that drops its last reference to a finished
    # collective's Python-made tensors while the interpreter finalizes cannot take the GIL and aborts the process
    sys.stderr.flush()
    os._exit(0)
