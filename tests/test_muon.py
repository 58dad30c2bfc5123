"""redline's Muon (redline/training/muon.py): orthogonalisation quality, equality with a plain per-matrix Muon
written here, exact resume, the device-side skip, the 2-rank sharded step equal to one process (gloo), and a
tiny model whose loss falls."""

from __future__ import annotations

import importlib.util
import io
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from redline.config import OptimConfig
from redline.errors import UserError
from redline.model import GPT
from redline.presets import get_preset
from redline.training.muon import NS_COEFFICIENTS, Muon, newton_schulz
from redline.training.optim import build_optimizers, lr_multiplier, set_lr

SHAPES = [(48, 32), (32, 32), (32, 96), (48, 32), (32, 96), (48, 32)]  # tall, square, wide; repeats make stacks
TINY = replace(get_preset("tiny"), n_layer=2, n_embd=64, n_head=4, n_kv_head=2, vocab_size=256, context_len=32)


def reference_orthogonalize(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """One matrix at a time, in float64: the quintic Newton–Schulz iteration as Keller Jordan describes it."""
    a, b, c = NS_COEFFICIENTS
    x = g.double()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / max(x.norm().item(), 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def reference_muon(params, grads_per_step, lr, momentum, weight_decay, momentum_start=None, warmup=0, lrs=None):
    """A plain per-matrix Muon: Nesterov momentum, decoupled weight decay, the max(1, rows/cols)^½ scale."""
    params = [p.detach().double().clone() for p in params]
    buffers = [torch.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_per_step):
        step_lr = lrs[t] if lrs else lr
        mu = momentum
        if warmup:
            frac = min(t / warmup, 1.0)
            mu = (1 - frac) * momentum_start + frac * momentum
        for p, g, buf in zip(params, grads, buffers):
            g = g.double()
            buf.mul_(mu).add_(g, alpha=1 - mu)
            update = reference_orthogonalize((1 - mu) * g + mu * buf)
            rows, cols = p.shape
            p.mul_(1 - step_lr * weight_decay).add_(update, alpha=-step_lr * max(1, rows / cols) ** 0.5)
    return params


def random_params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=gen) * 0.1) for s in SHAPES]


def random_grads(steps: int, seed: int = 1) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(*s, generator=gen) for s in SHAPES] for _ in range(steps)]


def run_muon(params, grads_per_step, lrs=None, **kwargs) -> Muon:
    opt = Muon(params, **kwargs)
    for t, grads in enumerate(grads_per_step):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        if lrs:
            opt.param_groups[0]["lr"] = lrs[t]
        opt.step()
    return opt


# ----------------------------------------------------------------------------------------------------
# orthogonalisation


@pytest.mark.parametrize("shape", [(4, 48, 32), (3, 32, 32), (2, 32, 96)])
def test_newton_schulz_brings_singular_values_into_its_band(shape):
    """Matrices with singular values spread over two decades come out with every singular value in the
    quintic's band (about 0.7-1.2) and the input's singular vectors: Uᵀ·O·V is diagonal."""
    gen = torch.Generator().manual_seed(0)
    batch, m, n = shape
    r = min(m, n)
    u = torch.linalg.qr(torch.randn(batch, m, r, generator=gen))[0]
    v = torch.linalg.qr(torch.randn(batch, n, r, generator=gen))[0]
    s = torch.logspace(0, -2, r).expand(batch, r)
    g = u @ torch.diag_embed(s) @ v.mT
    out = newton_schulz(g)
    assert out.shape == g.shape and out.dtype == torch.bfloat16
    sv = torch.linalg.svdvals(out.float())
    assert sv.min() > 0.6 and sv.max() < 1.25, (sv.min(), sv.max())
    core = u.mT @ out.float() @ v  # (B, r, r): diagonal if O shares G's singular vectors
    off = core - torch.diag_embed(torch.diagonal(core, dim1=-2, dim2=-1))
    assert off.norm() / core.norm() < 0.05
    assert torch.linalg.svdvals(g).min() < 0.011  # the input really was far from orthogonal


def test_newton_schulz_matches_the_per_matrix_iteration():
    gen = torch.Generator().manual_seed(3)
    for shape in [(5, 48, 32), (5, 32, 96)]:
        g = torch.randn(*shape, generator=gen)
        batched = newton_schulz(g, dtype=torch.float32)
        for i in range(shape[0]):
            torch.testing.assert_close(batched[i].double(), reference_orthogonalize(g[i]), atol=2e-5, rtol=0)
        assert newton_schulz(torch.zeros(2, 8, 4)).abs().max() == 0  # the zero padding of a shared stack


# ----------------------------------------------------------------------------------------------------
# the optimizer


@pytest.mark.parametrize("warmup", [0, 3])
def test_muon_equals_the_plain_per_matrix_reference(warmup):
    """Several shapes in stacks, weight decay, a changing learning rate, momentum warm-up: the same weights as
    a per-matrix float64 Muon (float32 Newton–Schulz here, so the comparison is tight)."""
    params, grads = random_params(), random_grads(5)
    lrs = [0.02, 0.03, 0.01, 0.02, 0.005]
    kwargs = dict(lr=0.02, momentum=0.95, weight_decay=0.1, momentum_start=0.85, momentum_warmup_steps=warmup)
    expected = reference_muon(params, grads, lrs=lrs, **{k: v for k, v in kwargs.items() if k != "momentum_warmup_steps"},
                              warmup=warmup)
    run_muon(params, grads, lrs=lrs, ns_dtype=torch.float32, **kwargs)
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.detach().double(), e, atol=2e-6, rtol=0)
    # in bfloat16 (the default) the same within bfloat16's rounding of the orthogonalised update
    bf16 = random_params()
    run_muon(bf16, grads, lrs=lrs, **kwargs)
    for p, e, start in zip(bf16, expected, random_params()):
        moved = (e - start.detach().double()).abs().max()
        assert (p.detach().double() - e).abs().max() < 0.1 * moved


def test_momentum_warms_up_and_is_counted_in_the_state():
    opt = Muon(random_params(), momentum=0.95, momentum_start=0.85, momentum_warmup_steps=4)
    group = opt.param_groups[0]
    seen = []
    for grads in random_grads(6):
        seen.append(Muon.momentum_at(group))
        for p, g in zip(group["params"], grads):
            p.grad = g
        opt.step()
    assert seen == pytest.approx([0.85, 0.875, 0.9, 0.925, 0.95, 0.95])
    assert opt.state_dict()["param_groups"][0]["step_count"] == 6


def test_state_dict_resumes_exactly():
    """N steps straight == N/2, save, load into fresh parameters and optimizer, N/2 — bit for bit."""
    grads = random_grads(6)
    kwargs = dict(lr=0.02, weight_decay=0.1, momentum_warmup_steps=4)
    straight = random_params()
    run_muon(straight, grads, **kwargs)

    first = random_params()
    opt = run_muon(first, grads[:3], **kwargs)
    blob = io.BytesIO()
    torch.save({"params": [p.detach() for p in first], "opt": opt.state_dict()}, blob)
    blob.seek(0)
    saved = torch.load(blob)
    resumed = [torch.nn.Parameter(p.clone()) for p in saved["params"]]
    fresh = Muon(resumed, lr=1.0, momentum=0.5)  # the state's hyperparameters win
    fresh.load_state_dict(saved["opt"])
    for t, step_grads in enumerate(grads[3:]):
        for p, g in zip(resumed, step_grads):
            p.grad = g.clone()
        fresh.step()
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)


def test_a_torch_optim_muon_state_loads():
    params = random_params()
    torch_muon = torch.optim.Muon(params, lr=0.02, weight_decay=0.1)
    for p, g in zip(params, random_grads(1)[0]):
        p.grad = g
    torch_muon.step()
    ours = Muon(params)
    ours.load_state_dict(torch_muon.state_dict())
    group = ours.param_groups[0]
    assert group["step_count"] == 0 and group["momentum_warmup_steps"] == 0 and group["lr"] == 0.02
    assert torch.equal(ours.state[params[0]]["momentum_buffer"], torch_muon.state[params[0]]["momentum_buffer"])
    ours.step()  # runs on the loaded state
    assert all(torch.isfinite(p).all() for p in params)


def test_found_inf_skips_the_step_on_the_device():
    params = random_params()
    opt = run_muon(params, random_grads(2), weight_decay=0.1)
    weights = [p.detach().clone() for p in params]
    buffers = [opt.state[p]["momentum_buffer"].clone() for p in params]
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    opt.found_inf = torch.tensor(1.0)
    opt.step()
    assert all(torch.equal(w, p) for w, p in zip(weights, params))
    assert all(torch.equal(b, opt.state[p]["momentum_buffer"]) for b, p in zip(buffers, params))

    # found_inf = 0: exactly the ordinary step
    twin = random_params()
    twin_opt = run_muon(twin, random_grads(2), weight_decay=0.1)
    grads = random_grads(1, seed=9)[0]
    for p, q, g in zip(params, twin, grads):
        p.grad, q.grad = g.clone(), g.clone()
    opt.found_inf = torch.tensor(0.0)
    opt.step()
    twin_opt.step()
    assert all(torch.equal(p, q) for p, q in zip(params, twin))


def test_only_matrices_are_accepted():
    with pytest.raises(ValueError, match="2-D"):
        Muon([torch.nn.Parameter(torch.zeros(4))])


@pytest.mark.slow
def test_compiled_step_equals_eager():
    """torch.compile (Inductor's CPU backend here) of the three step functions: the same weights within
    bfloat16 rounding, and no recompilation when the learning rate and the momentum change."""
    from torch._dynamo.utils import counters

    grads = random_grads(4)
    lrs = [0.02, 0.01, 0.03, 0.02]
    eager, compiled = random_params(), random_params()
    run_muon(eager, grads, lrs=lrs, momentum_warmup_steps=3, weight_decay=0.1)
    torch._dynamo.reset()
    counters.clear()
    run_muon(compiled, grads, lrs=lrs, momentum_warmup_steps=3, weight_decay=0.1, compile=True)
    for a, b in zip(eager, compiled):
        assert (a - b).abs().max() < 2e-3
    shapes = len(set(SHAPES))
    assert 0 < counters["stats"]["unique_graphs"] <= 3 * shapes  # once per function and shape, not per step


# ----------------------------------------------------------------------------------------------------
# training


def test_tiny_model_loss_falls_with_muon_and_adamw():
    torch.manual_seed(0)
    model = GPT(TINY)
    cfg = OptimConfig(name="muon", lr=3e-3, muon_lr=0.02, warmup_steps=5, muon_momentum_warmup_steps=10)
    optimizers = build_optimizers(model, cfg, torch.device("cpu"))
    assert type(optimizers[0]) is Muon and len(optimizers[0].param_groups[0]["params"]) == 4 * TINY.n_layer
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (8, 33), generator=gen)
    losses = []
    for step in range(40):
        set_lr(optimizers, lr_multiplier(cfg, step, step / 40))
        loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses[::5]
    assert all(math.isfinite(v) for v in losses)


# ----------------------------------------------------------------------------------------------------
# several processes


def _exit_worker() -> None:
    """End a spawned worker that succeeded without the interpreter's finalization: a gloo thread that drops its
    last reference to a collective's tensors while the interpreter finalizes cannot take the GIL and aborts the
    process ("terminate called without an active exception"; as tests/sharded_checkpoint_worker.py ends)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _sharded_worker(rank: int, world: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        params = random_params()
        run_muon(params, random_grads(3), weight_decay=0.1, momentum_warmup_steps=2)
        if rank == 0:
            torch.save([p.detach() for p in params], out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    _exit_worker()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_sharded_step_equals_one_process(tmp_path, world):
    """DDP's layout (whole matrices on every rank, identical gradients): each rank orthogonalises its share of
    each stack (3 matrices of 48×32 over 2 or 4 ranks: zero-padded), the shares are all-gathered, and the
    weights equal those of one process bit for bit."""
    out = tmp_path / "sharded.pt"
    mp.spawn(_sharded_worker, args=(world, str(tmp_path / "store"), str(out)), nprocs=world, join=True)
    single = random_params()
    run_muon(single, random_grads(3), weight_decay=0.1, momentum_warmup_steps=2)
    for a, b in zip(single, torch.load(out)):
        assert torch.equal(a.detach(), b)


def _fsdp_worker(rank: int, world: int, init_file: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        params = [torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])) for p in random_params()]
        opt = Muon(params, weight_decay=0.1, momentum_warmup_steps=2)
        for grads in random_grads(3):
            for p, g in zip(params, grads):
                p.grad = distribute_tensor(g, mesh, [Shard(0)])
            opt.step()
        full = [p.detach().full_tensor() for p in params]
        buffers = [opt.state[p]["momentum_buffer"].full_tensor() for p in params]
        if rank == 0:
            torch.save({"params": full, "buffers": buffers,
                        "local_rows": [p.to_local().shape[0] for p in params]}, out)
        dist.barrier()  # no rank tears gloo down while another is still in it (one aborted, now and then)
    finally:
        dist.destroy_process_group()
    _exit_worker()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_fsdp2_sharded_step_equals_one_process(tmp_path, world):
    """FSDP2's layout (each rank holds its rows of each matrix, as DTensors sharded on dim 0; 3 ranks split 32
    rows as 11, 11, 10): the shards go to each matrix's owner and back by all-to-all, and the weights and
    momentum equal one process's bit for bit."""
    out = tmp_path / "fsdp.pt"
    mp.spawn(_fsdp_worker, args=(world, str(tmp_path / "store"), str(out)), nprocs=world, join=True)
    single = random_params()
    opt = run_muon(single, random_grads(3), weight_decay=0.1, momentum_warmup_steps=2)
    got = torch.load(out)
    assert got["local_rows"][0] == math.ceil(SHAPES[0][0] / world)  # rank 0 held a shard, not the matrix
    for a, b in zip(single, got["params"]):
        assert torch.equal(a.detach(), b)
    for a, b in zip(single, got["buffers"]):
        assert torch.equal(opt.state[a]["momentum_buffer"], b)


def test_a_dtensor_sharded_otherwise_is_refused(tmp_path):
    class Fake(torch.nn.Parameter):
        pass

    p = Fake(torch.zeros(4, 4))
    p.device_mesh = type("Mesh", (), {"ndim": 2})()
    p.placements = ()
    with pytest.raises(Exception, match="sharded by rows over one mesh dimension"):
        Muon([p])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_cuda_step_never_waits_and_equals_eager():
    """On a GPU: compiled, with and without Newton–Schulz replayed as CUDA graphs, a step that never synchronises
    with the host (set_sync_debug_mode raises on any), with the device-side skip armed and a new learning rate,
    and the same weights as the eager step within bfloat16 rounding."""
    cuda = torch.device("cuda")
    grads = [[g.to(cuda) for g in step] for step in random_grads(4)]
    results = []
    for compile, graphs in ((False, False), (True, False), (True, True)):
        params = [torch.nn.Parameter(p.detach().to(cuda)) for p in random_params()]
        opt = run_muon(params, grads[:3], momentum_warmup_steps=3, weight_decay=0.1, compile=compile,
                       cuda_graphs=graphs)
        recorded = sum(len(g.graphs) for g in opt._graphs.values())
        assert recorded == (len(set(SHAPES)) if graphs else 0)  # a graph a stack, recorded at its first step
        for p, g in zip(params, grads[3]):
            p.grad = g.clone()
        opt.found_inf = torch.zeros((), device=cuda)
        opt.param_groups[0]["lr"] = 0.01  # a new learning rate: no recompile, no copy that waits
        torch.cuda.set_sync_debug_mode("error")
        try:
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        results.append(params)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert (a - b).abs().max().item() < 2e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_steps_resume_exactly():
    """With Newton–Schulz replayed as CUDA graphs, 2 steps, the state saved and loaded into a new optimizer, and 2
    more give the bits of 4 steps in one go (every call of a stack replays its graph, a resumed run's first too)."""
    cuda = torch.device("cuda")
    grads = [[g.to(cuda) for g in step] for step in random_grads(4)]
    straight = [torch.nn.Parameter(p.detach().to(cuda)) for p in random_params()]
    run_muon(straight, grads, compile=True, cuda_graphs=True, weight_decay=0.1)
    resumed = [torch.nn.Parameter(p.detach().to(cuda)) for p in random_params()]
    state = run_muon(resumed, grads[:2], compile=True, cuda_graphs=True, weight_decay=0.1).state_dict()
    fresh = Muon(resumed, compile=True, cuda_graphs=True, weight_decay=0.1)
    fresh.load_state_dict(state)
    for step in grads[2:]:
        for p, g in zip(resumed, step):
            p.grad = g.clone()
        fresh.step()
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------------------------------
# the symmetric products' kernel (redline/training/kernels/symmetric.py)

SYMMETRIC_CHECK = r"""
import torch
from redline.training.kernels import symmetric
from redline.training.muon import newton_schulz

device = torch.device("{device}")
dtype = {dtype}
gen = torch.Generator().manual_seed(0)
worst = 0.0
# (B, r, k, tall): 64-wide tiles (r < 512) and 128-wide, r and k not multiples of a tile, the tall case a view
for B, r, k, tall in [(2, 130, 72, False), (3, 96, 200, True), (1, 520, 40, False), (2, 64, 64, True)]:
    x = torch.randn(B, k, r, generator=gen) if tall else torch.randn(B, r, k, generator=gen)
    x = x.to(device, dtype)
    rows = x.mT if tall else x
    ref = rows.double() @ rows.double().mT
    out = torch.ops.redline.symmetric_product(rows, None, 1.0, 0.0, 0.0)
    assert out.shape == (B, r, r) and out.dtype == dtype and out.is_contiguous()
    assert torch.equal(out, out.mT)  # both triangles written, the same bits
    worst = max(worst, ((out.double() - ref).abs().max() / ref.abs().max()).item())
    a = out
    ref = -4.775 * (a.double() @ a.double()) + 2.0315 * a.double() + 3.4445 * torch.eye(r, dtype=torch.float64,
                                                                                       device=device)
    poly = torch.ops.redline.symmetric_product(a, a, -4.775, 2.0315, 3.4445)
    assert torch.equal(poly, poly.mT)
    worst = max(worst, ((poly.double() - ref).abs().max() / ref.abs().max()).item())
assert worst < {tol}, worst
for shape in [(3, 96, 40), (2, 40, 160)]:  # a whole iteration, tall and wide
    g = torch.randn(*shape, generator=gen).to(device)
    kernel = newton_schulz(g, dtype=dtype, symmetric=True).double()
    plain = newton_schulz(g, dtype=dtype, symmetric=False).double()
    assert ((kernel - plain).norm() / plain.norm()).item() < {ns_tol}
print("ok", worst)
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="needs the triton package (its interpreter runs the kernel on a CPU)")
def test_symmetric_kernel_in_the_triton_interpreter():
    """The kernel's indexing (the triangle's tiles, the mirror store, masks at the edges, strided views) and its
    epilogue, run by Triton's interpreter on a CPU in fp32 against float64 products."""
    code = SYMMETRIC_CHECK.format(device="cpu", dtype="torch.float32", tol=1e-5, ns_tol=1e-4)
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_symmetric_kernel_on_the_gpu():
    """The compiled kernel in bfloat16 against float64 products (within bf16 rounding of the output), and a whole
    Newton–Schulz run with it against torch.matmul's."""
    namespace: dict = {}
    exec(SYMMETRIC_CHECK.format(device="cuda", dtype="torch.bfloat16", tol=1e-2, ns_tol=2e-2), namespace)


def test_symmetric_kernel_refused_where_it_cannot_run():
    model = GPT(TINY)
    with pytest.raises(UserError, match="muon_symmetric"):
        build_optimizers(model, OptimConfig(name="muon", muon_symmetric=True), torch.device("cpu"))
    opt = build_optimizers(model, OptimConfig(name="muon"), torch.device("cpu"))[0]  # unset: torch.matmul here
    assert opt.symmetric is None
