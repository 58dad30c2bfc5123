"""Muon for the hidden matrices, batched by shape: one Newton–Schulz run per shape, not per matrix.

Muon (Keller Jordan, kellerjordan.github.io/posts/muon) replaces each 2-D weight's update by the nearest
semi-orthogonal matrix to its Nesterov momentum. How one step works, for each group of B parameters that
share a shape (m, n) (in a transformer: every block's qkv, every block's output projection, ...):

1. momentum, on every matrix (a lerp, as torch.optim.Muon and modded-nanogpt write it):
       M ← μ·M + (1 − μ)·G,   U = (1 − μ)·G + μ·M     (Nesterov)
   stacked into one (B, m, n) bfloat16 tensor;
2. orthogonalise the whole stack at once: scale each matrix to Frobenius norm 1, then five quintic
   Newton–Schulz iterations X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ, as batched matmuls in bfloat16; when
   m > n, X ← X·(a·I + b·A + c·A²) with A = Xᵀ·X instead (the same iteration on Xᵀ, as P(A) is symmetric), so
   A is the smaller Gram matrix and X keeps the parameter's layout (no transposed copy, and step 3 reads it
   in order). On a CUDA GPU with triton, A and P(A) = a·I + b·A + c·A² (both symmetric) are computed a
   triangle at a time by redline's kernel (training/kernels/symmetric.py), about a quarter of the
   iteration's arithmetic saved;
3. W ← (1 − lr·λ)·W − lr·s·O, with decoupled weight decay λ and the shape scale s = max(1, m/n)^½
   (modded-nanogpt's and torch.optim.Muon's default convention: the update's RMS is then about that of an
   n×n orthogonal matrix, so one learning rate (0.02) suits every shape; Moonlight's 0.2·√max(m, n), which
   matches AdamW's update RMS, is not used).

Steps 1 and 3 are one function call each for every stack of the step, and step 2 one call a stack; torch.compile
compiles each once (dynamic=False) on a GPU. Every hyperparameter reaches them as one (stacks, 4) device tensor, sent
from pinned memory in one copy, so a new learning rate or momentum never recompiles and `step()` never waits for the
GPU. On a GPU each stack's Newton–Schulz run is also recorded as a CUDA graph at its first step and replayed
(`cuda_graphs`): the host's cost of a step is then a few calls, not some hundred kernel launches, which matters where
the host sets the pace (small batches a GPU, as under DDP). The momentum μ may warm up linearly (`momentum_start` → `momentum`
over `momentum_warmup_steps` steps, as modded-nanogpt does), counted by the optimizer itself (`step_count` in each
param group, so it is saved and resumed with the state).

Under DDP (a process group of more than one rank, whole parameters on every rank) every rank keeps the
momentum of every matrix (the gradients are already all-reduced, so the states stay identical and a
checkpoint written by rank 0 is complete), orthogonalises only its share of each stack (B/world matrices,
the stack zero-padded to a multiple of the world size), and the shares are all-gathered before every rank
applies the same update (modded-nanogpt spreads the Newton–Schulz work over its GPUs the same way).

Under FSDP2 (DTensor parameters sharded on dim 0, torch.chunk's layout: S = ceil(m / world) rows on each rank
but the last ones) no rank holds a whole matrix, and none gathers them all. Each matrix of a stack has an owner
rank (matrix i: rank i mod world). The momentum is taken on the local shards (it is elementwise); one all-to-all
sends every shard of the Nesterov updates to its matrix's owner, which orthogonalises its whole matrices (about
B/world of them) as one batch; a second all-to-all sends each rank its rows of every result, and each rank
updates its own shards. Each rank sends and receives about its share of the stack's elements twice, in
bfloat16 (a reduce-scatter's volume), and the result equals one process's.

A non-finite step can be skipped on the device as with fused AdamW: set `found_inf` (a 0-dim float tensor,
nonzero to skip) before `step()`; the momentum and the weights are then left as they were.
`grad_scale` (a 0-dim float tensor, as fused AdamW takes from torch's GradScaler) divides the gradients inside the
momentum's kernel: the training step clips the gradient norm that way, without a pass of its own over them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor

from redline.errors import UserError

if TYPE_CHECKING:
    from redline.inference.graphs import StepGraphs

# The quintic's coefficients from Keller Jordan's Muon (modded-nanogpt): chosen to maximise the slope at zero,
# so small singular values grow fast; after five iterations the singular values lie roughly in [0.7, 1.2]
# instead of exactly at 1, which trains as well as an exact orthogonalisation.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def newton_schulz(update: Tensor, steps: int = 5, dtype: torch.dtype = torch.bfloat16,
                  symmetric: bool = False) -> Tensor:
    """(B, m, n) -> (B, m, n) in `dtype`, contiguous: each matrix's approximate orthogonalisation U·Vᵀ (of U·S·Vᵀ).

    symmetric: the Gram matrix A and the polynomial P(A) (both symmetric) computed a triangle at a time by
    redline's Triton kernel (training/kernels/symmetric.py; a CUDA GPU), P(A) rounded to `dtype` once from fp32;
    else by torch.matmul."""
    a, b, c = NS_COEFFICIENTS
    norm = torch.linalg.vector_norm(update, dim=(-2, -1), keepdim=True, dtype=torch.float32)  # (B, 1, 1)
    x = (update.float() / norm.clamp_min(NS_EPS)).to(dtype)  # spectral norm <= Frobenius norm = 1
    tall = x.size(-2) > x.size(-1)
    r = min(x.shape[-2:])
    identity = None if symmetric else torch.eye(r, device=x.device, dtype=torch.float32)
    for _ in range(steps):
        rows = x.mT if tall else x  # (B, r, k): the Gram matrix is taken on the smaller side, A = rows·rowsᵀ
        if symmetric:
            gram = torch.ops.redline.symmetric_product(rows, None, 1.0, 0.0, 0.0)
            poly = torch.ops.redline.symmetric_product(gram, gram, c, b, a)  # A·A = A·Aᵀ: A is symmetric
        else:
            gram = rows @ rows.mT  # (B, r, r), r = min(m, n)
            # a·X folded into the product, X ← (a·I + b·A + c·A²)·X: one plain batched product, where a·X + P·X
            # takes a product whose epilogue adds X and first copies all of X (B, m, n) into its output. a·I + P
            # is rounded to `dtype` once: on 768×3072 stacks of random matrices the result's distance to the
            # float64 iteration grows from 1.02% to 1.15% of its norm, where the iteration itself leaves the
            # singular values in [0.7, 1.2]
            poly = (c * (gram @ gram).float() + b * gram.float() + a * identity).to(dtype)
        x = x @ poly if tall else poly @ x
    return x


def nesterov_momentum(grads: list[list[Tensor]], buffers: list[list[Tensor]], scalars: Tensor, found_inf: Tensor,
                      grad_scale: Tensor, dtype: torch.dtype = torch.bfloat16) -> list[Tensor]:
    """For each stack s (a list of same-shape gradients and their momentum buffers): update each buffer in place
    and return the Nesterov updates stacked, (B, m, n) in `dtype`. One call covers every stack of a step, so the
    host pays one compiled call for all of them.

    scalars: (S, 4) [μ, 1 − μ, decay, step] per stack (columns 2-3 are apply_update's). found_inf (0-dim, nonzero:
    skip the step) ignores the gradients, maybe non-finite, and leaves the buffers as they were; the gradients are
    divided by grad_scale (0-dim; 1 unless a clipped step's factor) first."""
    keep = 1 - found_inf.float().clamp(0, 1)
    factor = grad_scale.float().reciprocal()
    out = []
    for s, (stack, bufs) in enumerate(zip(grads, buffers)):
        momentum, one_minus = scalars[s, 0], scalars[s, 1]
        rows = []
        for grad, buf in zip(stack, bufs):
            grad = torch.where(keep > 0, grad * factor, torch.zeros_like(grad))
            buf.lerp_(grad, one_minus * keep)
            rows.append(grad.lerp(buf, momentum).to(dtype))  # cast before the stack: compiled, one pass writes it
        out.append(torch.stack(rows))
    return out


def apply_update(params: list[list[Tensor]], updates: list[Tensor], scalars: Tensor, found_inf: Tensor) -> None:
    """W ← decay·W + step·O for each parameter of each stack s and its slice of updates[s] (B, m, n).

    scalars: (S, 4) as nesterov_momentum's, decay = 1 − lr·λ and step = −lr·s in columns 2-3; found_inf
    (nonzero) leaves the weights as they were."""
    keep = 1 - found_inf.float().clamp(0, 1)
    for s, (stack, update) in enumerate(zip(params, updates)):
        decay = torch.where(keep > 0, scalars[s, 2], torch.ones_like(scalars[s, 2]))
        step = scalars[s, 3] * keep
        for i, param in enumerate(stack):
            param.mul_(decay).add_(update[i].to(param.dtype) * step)


class Muon(torch.optim.Optimizer):
    """Muon over 2-D parameters, batched by shape (see the module docstring). Its state per parameter is
    `momentum_buffer`, as torch.optim.Muon's, so checkpoints of either load into the other."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 0.02, momentum: float = 0.95,
                 weight_decay: float = 0.0, momentum_start: float | None = None, momentum_warmup_steps: int = 0,
                 ns_steps: int = 5, compile: bool = False, ns_dtype: torch.dtype = torch.bfloat16,
                 symmetric: bool | None = None, cuda_graphs: bool = False):
        if lr < 0 or weight_decay < 0:
            raise ValueError(f"Muon: lr and weight_decay must be >= 0, got {lr} and {weight_decay}")
        for name, value in (("momentum", momentum), ("momentum_start", momentum_start)):
            if value is not None and not 0 <= value < 1:
                raise ValueError(f"Muon: {name} must be in [0, 1), got {value}")
        if momentum_warmup_steps < 0 or ns_steps < 1:
            raise ValueError("Muon: momentum_warmup_steps must be >= 0 and ns_steps >= 1")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                        momentum_start=momentum if momentum_start is None else momentum_start,
                        momentum_warmup_steps=momentum_warmup_steps, ns_steps=ns_steps, step_count=0,
                        differentiable=False)  # torch.optim.Optimizer adds this default anyway; every group carries it
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon takes 2-D parameters only, got one of shape {tuple(p.shape)}")
                if hasattr(p, "device_mesh"):  # a DTensor (FSDP2): sharded by rows over one mesh dimension
                    _check_row_sharded(p)
        self.ns_dtype = ns_dtype
        self.symmetric = symmetric
        """Newton–Schulz's symmetric products by redline's Triton kernel (None: where it can run, a CUDA GPU with
        triton; True there only)."""
        self.found_inf: Tensor | None = None
        self.grad_scale: Tensor | None = None
        self.cuda_graphs = cuda_graphs
        """Replay each stack's Newton–Schulz run as a CUDA graph (tensors on a CUDA GPU only). The graphs keep each
        stack's input and output allocated, twice the stack in bfloat16."""
        self._compile = compile
        self._kernels: dict[str, Callable] = {}
        self._graphs: dict[torch.device, StepGraphs] = {}  # Newton–Schulz's graphs, keyed by a stack's shape, ...
        self._inputs: dict[tuple, Tensor] = {}  # (device, that key) -> the graph's input
        self._constants: dict[tuple, Tensor] = {}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # a torch.optim.Muon checkpoint lacks this optimizer's extra keys
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    def _kernel(self, name: str) -> Callable:
        """One of the three step functions, compiled (once per shape: dynamic=False) when asked."""
        if name not in self._kernels:
            fn = {"momentum": nesterov_momentum, "newton_schulz": newton_schulz, "apply": apply_update}[name]
            self._kernels[name] = torch.compile(fn, dynamic=False) if self._compile else fn
        return self._kernels[name]

    def _orthogonalize(self, stack: Tensor, ns_steps: int) -> Tensor:
        """newton_schulz on a (B, m, n) stack, with the symmetric kernel where it is asked for and can run."""
        can = False
        if self.symmetric is not False and stack.device.type == "cuda":
            from redline.training.kernels import symmetric  # registers torch.ops.redline.symmetric_product

            can = symmetric.available(stack.device) and self.ns_dtype in symmetric.DTYPES
        if self.symmetric and not can:
            raise UserError(f"Muon: the symmetric Newton–Schulz kernel needs a CUDA GPU, the triton package and "
                            f"bf16 or fp16 iterations (tensors on {stack.device.type}, {self.ns_dtype}); set "
                            f"optim.muon_symmetric=False or leave it unset")
        use = can if self.symmetric is None else self.symmetric
        run = self._kernel("newton_schulz")
        if not self.cuda_graphs or stack.device.type != "cuda":
            return run(stack, ns_steps, self.ns_dtype, use)
        from redline.inference.graphs import StepGraphs  # noqa: F811 (here: loaded only where graphs are used)

        if stack.device not in self._graphs:
            self._graphs[stack.device] = StepGraphs(stack.device)
        graphs = self._graphs[stack.device]
        key = (tuple(stack.shape), stack.stride(), stack.dtype, ns_steps, use)
        if key not in graphs:  # recorded at its first call, so that every step (a resumed run's too) replays
            # the graph's own input, into which each call copies its stack; its output is overwritten by the next
            # replay: Muon consumes it (or waits for the collective that reads it) within the step
            static = self._inputs[(stack.device, key)] = torch.empty_strided(
                stack.shape, stack.stride(), dtype=stack.dtype, device=stack.device).copy_(stack)
            ns = lambda: run(static, ns_steps, self.ns_dtype, use)  # noqa: E731
            graphs.capture(key, ns, ns, capture_error_mode="thread_local")
        self._inputs[(stack.device, key)].copy_(stack)
        return graphs.replay(key)

    @staticmethod
    def momentum_at(group: dict) -> float:
        warmup = group["momentum_warmup_steps"]
        if warmup <= 0:
            return group["momentum"]
        frac = min(group["step_count"] / warmup, 1.0)
        return (1 - frac) * group["momentum_start"] + frac * group["momentum"]

    def _stacks(self) -> list[tuple[int, dict, list[Tensor]]]:
        """(group index, group, parameters) for each shape (and dtype, device) within each param group."""
        out = []
        for index, group in enumerate(self.param_groups):
            by_shape: dict[tuple, list[Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    by_shape.setdefault((tuple(p.shape), p.dtype, p.device), []).append(p)
            out += [(index, group, params) for params in by_shape.values()]
        return out

    def _constant(self, value: float, device: torch.device) -> Tensor:
        """A 0-dim float32 device tensor holding `value`, made once."""
        key = (value, device)
        if key not in self._constants:
            self._constants[key] = torch.full((), value, device=device)
        return self._constants[key]

    def _scalars(self, stacks: list[tuple[int, dict, list[Tensor]]], device: torch.device) -> Tensor:
        """(S, 4) float32 on `device`: [μ, 1 − μ, 1 − lr·λ, −lr·s] for each stack, sent in one copy (from pinned
        memory on a GPU: the host does not wait for it, and torch keeps that memory until the copy has run)."""
        rows = []
        for _, group, params in stacks:
            m, n = params[0].shape
            lr, momentum = group["lr"], self.momentum_at(group)
            rows.append([momentum, 1 - momentum, 1 - lr * group["weight_decay"], -lr * max(1.0, m / n) ** 0.5])
        host = torch.tensor(rows, dtype=torch.float32)
        if device.type != "cuda":
            return host.to(device)
        return host.pin_memory().to(device, non_blocking=True)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        by_device: dict[torch.device, list] = {}
        for stack in self._stacks():
            by_device.setdefault(stack[2][0].device, []).append(stack)
        for device, stacks in by_device.items():
            self._step_stacks(stacks, device)
        for group in self.param_groups:
            group["step_count"] += 1
        return loss

    def _step_stacks(self, stacks: list[tuple[int, dict, list[Tensor]]], device: torch.device) -> None:
        """One step of every stack on one device: the momentum of all of them in one call, each stack's
        orthogonalisation (under DDP a share of it on each rank, gathered; under FSDP2 whole matrices on their
        owners), then the weights of all of them in one call."""
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        rank = dist.get_rank() if world > 1 else 0
        scalars = self._scalars(stacks, device)
        # never None in the compiled calls (a run that sets them later would recompile): 0 and 1 do nothing
        found_inf = self.found_inf if self.found_inf is not None else self._constant(0.0, device)
        grad_scale = self.grad_scale if self.grad_scale is not None else self._constant(1.0, device)
        buffers = []
        for _, _, params in stacks:
            for p in params:
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
            buffers.append([_local(self.state[p]["momentum_buffer"]) for p in params])
        stacked = self._kernel("momentum")([[_local(p.grad) for p in params] for _, _, params in stacks], buffers,
                                           scalars, found_inf, grad_scale, self.ns_dtype)  # (B, rows here, n)
        pending = []  # (local params, update (B', rows, n) or a callable giving it, collective handle or None)
        for (_, group, params), update in zip(stacks, stacked):
            m, n = params[0].shape
            if hasattr(params[0], "device_mesh"):  # FSDP2: whole matrices only on their owner ranks
                update, handle = self._orthogonalize_sharded(update, m, n, params[0].device_mesh.get_group(),
                                                             group["ns_steps"])
                pending.append(([_local(p) for p in params], update, handle))
                continue
            if world == 1:
                pending.append((params, self._orthogonalize(update, group["ns_steps"]), None))
                continue
            share = math.ceil(len(params) / world)  # this rank orthogonalises matrices [rank·share, (rank+1)·share)
            mine = update[rank * share:(rank + 1) * share]
            if mine.size(0) < share:  # the stack's tail: zero matrices stay zero
                mine = torch.cat([mine, mine.new_zeros(share - mine.size(0), m, n)])
            mine = self._orthogonalize(mine, group["ns_steps"])
            gathered = mine.new_empty(share * world, m, n)
            handle = dist.all_gather_into_tensor(gathered, mine.contiguous(), async_op=True)
            pending.append((params, gathered, handle))  # the collectives overlap the next stacks' iterations
        updates = []
        for _, update, handle in pending:
            if handle is not None:
                handle.wait()
            updates.append(update() if callable(update) else update)
        self._kernel("apply")([params for params, _, _ in pending], updates, scalars, found_inf)

    def _orthogonalize_sharded(self, local: Tensor, m: int, n: int, process_group, ns_steps: int):
        """local: (B, r, n), this rank's rows of B matrices of shape (m, n) -> (this rank's rows of each
        orthogonalised matrix, as a callable to run once the returned all-to-all handle is done; the handle)."""
        world, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
        B, S = local.size(0), math.ceil(m / world)
        rows = max(0, min(S, m - rank * S))  # torch.chunk's layout: full chunks first
        if local.size(1) != rows:
            raise UserError(f"Muon under FSDP2 expects {rows} rows of each {m}×{n} matrix on rank {rank} "
                            f"(dim 0 split into chunks of {S}), got {local.size(1)}")
        k = math.ceil(B / world)  # matrices per owner; matrix i = j·world + o is owned by rank o
        padded = local.new_zeros(k * world, S, n)
        padded[:B, :rows] = local
        send = padded.view(k, world, S, n).transpose(0, 1).contiguous()  # send[o, j]: my rows of matrix j·world + o
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=process_group)  # recv[r, j]: rank r's rows of my matrix j
        whole = recv.permute(1, 0, 2, 3).reshape(k, world * S, n)[:, :m]  # (k, m, n): padding rows at the end
        ortho = self._orthogonalize(whole.contiguous(), ns_steps)
        back = ortho.new_zeros(k, world * S, n)
        back[:, :m] = ortho
        send = back.view(k, world, S, n).transpose(0, 1).contiguous()  # send[r, j]: rank r's rows of my matrix j
        recv = torch.empty_like(send)
        handle = dist.all_to_all_single(recv, send, group=process_group, async_op=True)
        # recv[o, j]: my rows of matrix j·world + o -> (B, rows, n) in matrix order
        return (lambda: recv.transpose(0, 1).reshape(k * world, S, n)[:B, :rows]), handle


def _local(t: Tensor) -> Tensor:
    """A DTensor's local shard (FSDP2), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _check_row_sharded(p: Tensor) -> None:
    from torch.distributed.tensor import Shard

    if p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
        raise UserError(f"Muon under FSDP2 takes matrices sharded by rows over one mesh dimension, got placements "
                        f"{tuple(p.placements)} on a {p.device_mesh.ndim}-D mesh; use parallel=fsdp2 as redline "
                        f"applies it, or ddp")
