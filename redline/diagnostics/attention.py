"""Which scaled-dot-product-attention backends run here, and how long each takes forward + backward.

Each backend is forced in turn with the same context manager the model uses (`redline.model.sdpa_context`);
a backend that cannot take the shape raises "No available kernel", and the warnings PyTorch emits on the way
say why. Those become the "unavailable" detail instead of an error.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from redline.diagnostics.microbench import cuda_time_ms
from redline.model import sdpa_context

BACKENDS = ("cudnn", "flash", "efficient", "math")
TYPICAL_SHAPE = (16, 12, 1024, 64)  # (B, H, T, D): GPT-2 124M at T=1024
SMALL_SHAPE = (1, 2, 128, 64)  # --quick: availability only


# warnings that say only that a backend is off or that nothing ran, not why the asked-for one cannot run
_UNINFORMATIVE = ("runtime disabled", "No available kernel", "No viable backend", "not used because")


def _first_reason(caught: list[warnings.WarningMessage], error: Exception) -> str:
    for w in caught:
        for line in str(w.message).strip().splitlines():
            if line.strip() and not any(u in line for u in _UNINFORMATIVE):
                return line.strip()[:200]
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def attention_backends(device: torch.device, shape: tuple[int, int, int, int] = TYPICAL_SHAPE,
                       time_it: bool = True, dtype: torch.dtype = torch.bfloat16) -> dict[str, dict]:
    """{backend: {"available", "fwd_bwd_ms" (median, causal) or None, "detail"}} for q, k, v of `shape`."""
    B, H, T, D = shape
    g = torch.Generator(device).manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype, generator=g).requires_grad_() for _ in range(3))
    grad = torch.randn(B, H, T, D, device=device, dtype=dtype, generator=g)
    results: dict[str, dict] = {}
    for backend in BACKENDS:

        def step():
            with sdpa_context(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(grad)
            q.grad = k.grad = v.grad = None

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                step()
            except RuntimeError as e:
                results[backend] = {"available": False, "fwd_bwd_ms": None, "detail": _first_reason(caught, e)}
                continue
        ms = None
        if time_it and device.type == "cuda":
            ms = round(cuda_time_ms(step, warmup_s=0.1, repeats=10, inner=3), 3)
        results[backend] = {
            "available": True,
            "fwd_bwd_ms": ms,
            "detail": f"B={B} H={H} T={T} D={D} causal {str(dtype)[6:]}",
        }
    return results
