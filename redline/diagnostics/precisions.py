"""Which number formats work on this GPU: by compute capability, and by running one tiny real op in each.

A format the capability rules out is reported "not supported on this GPU" and its kernel is never called (a
missing kernel can fail inside the driver rather than raise). Each tiny op is checked against an fp32
reference computed from the same (already rounded) inputs, so "ok" means the result is right, not just that
nothing raised.

How the block-scaled formats are probed: MXFP8 (e4m3 data, one e8m0 scale per 32 values) and NVFP4 (packed
e2m1 pairs, one e4m3 scale per 16 values) expect their scales in a swizzled "blocked" layout. With every scale
1.0 the layout does not matter, so the probe needs no swizzling code; the data still goes through the real
block-scaled kernels.
"""

from __future__ import annotations

from typing import Callable

import torch

from redline.diagnostics.gpu_info import package_version

NOT_SUPPORTED = "not supported on this GPU"

# precision -> (minimum compute capability, what it needs)
REQUIRED_CAPABILITY: dict[str, tuple[tuple[int, int], str]] = {
    "fp16": ((7, 0), "tensor cores (Volta)"),
    "tf32": ((8, 0), "Ampere tensor cores"),
    "bf16": ((8, 0), "Ampere tensor cores"),
    "fp8_e4m3_tensorwise": ((8, 9), "FP8 tensor cores (Ada / Hopper)"),
    "fp8_e5m2_e4m3_tensorwise": ((8, 9), "FP8 tensor cores (Ada / Hopper)"),
    "fp8_e4m3_rowwise": ((8, 9), "FP8 tensor cores (Ada / Hopper)"),
    "torchao_float8_tensorwise": ((8, 9), "FP8 tensor cores (Ada / Hopper)"),
    "torchao_float8_rowwise": ((8, 9), "FP8 tensor cores (Ada / Hopper)"),
    "mxfp8": ((10, 0), "block-scaled tensor cores (Blackwell)"),
    "nvfp4": ((10, 0), "block-scaled tensor cores (Blackwell)"),
}


def _relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    out, reference = out.detach().float(), reference.detach().float()
    return float((out - reference).norm() / reference.norm().clamp_min(1e-12))


def _check(out: torch.Tensor, reference: torch.Tensor, tolerance: float) -> dict:
    err = _relative_error(out, reference)
    ok = err == err and err < tolerance  # err == err: not NaN
    return {"status": "ok" if ok else "wrong result", "relative_error": round(err, 5)}


def _e4m3(shape, device, generator) -> torch.Tensor:
    return torch.randn(shape, device=device, generator=generator).to(torch.float8_e4m3fn)


# -- the tiny ops: each returns {"status": ..., ...}; n = 128 keeps every shape legal for every kernel -------


def probe_fp16(device: torch.device, n: int = 128) -> dict:
    g = torch.Generator(device).manual_seed(0)
    a, b = (torch.randn(n, n, device=device, generator=g).half() for _ in range(2))
    return _check(a @ b, a.float() @ b.float(), 1e-2)


def probe_bf16(device: torch.device, n: int = 128) -> dict:
    g = torch.Generator(device).manual_seed(0)
    a, b = (torch.randn(n, n, device=device, generator=g).bfloat16() for _ in range(2))
    return _check(a @ b, a.float() @ b.float(), 2e-2)


def probe_tf32(device: torch.device, n: int = 128) -> dict:
    g = torch.Generator(device).manual_seed(0)
    a, b = (torch.randn(n, n, device=device, generator=g) for _ in range(2))
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        out = a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return _check(out, (a.double() @ b.double()).float(), 5e-3)


def probe_scaled_mm(device: torch.device, a_dtype=torch.float8_e4m3fn, rowwise: bool = False, n: int = 128) -> dict:
    """e4m3 (or e5m2) × e4m3 -> bf16 through torch._scaled_mm with tensorwise or rowwise fp32 scales."""
    g = torch.Generator(device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=g).to(a_dtype)
    b = _e4m3((n, n), device, g).t()  # column-major
    if rowwise:
        scale_a = torch.full((n, 1), 0.5, device=device)
        scale_b = torch.full((1, n), 2.0, device=device)
    else:
        scale_a, scale_b = torch.tensor(0.5, device=device), torch.tensor(2.0, device=device)
    out = torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    return _check(out, a.float() @ b.float(), 2e-2)  # 0.5 × 2.0 = 1: the reference needs no scaling


def probe_mxfp8(device: torch.device, n: int = 128) -> dict:
    """e4m3 data with e8m0 scales, one per 32 values along K (all 1.0, see the module docstring)."""
    g = torch.Generator(device).manual_seed(0)
    a = _e4m3((n, n), device, g)
    b = _e4m3((n, n), device, g).t()
    scale_a = torch.ones(n * n // 32, device=device).to(torch.float8_e8m0fnu)
    scale_b = torch.ones(n * n // 32, device=device).to(torch.float8_e8m0fnu)
    out = torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    return _check(out, a.float() @ b.float(), 2e-2)


# e2m1 code -> value; bit 3 is the sign
_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E2M1_VALUES = _E2M1 + [-v for v in _E2M1]


def probe_nvfp4(device: torch.device, n: int = 128) -> dict:
    """Packed e2m1 pairs with e4m3 scales, one per 16 values along K (all 1.0).

    Each byte holds the same code in both nibbles, so the result does not depend on which nibble comes first:
    the unpacked K = 2·(n/2) dot product is twice the dot product of the per-byte values.
    """
    g = torch.Generator(device).manual_seed(0)
    codes_a = torch.randint(0, 16, (n, n // 2), device=device, generator=g, dtype=torch.uint8)
    codes_b = torch.randint(0, 16, (n, n // 2), device=device, generator=g, dtype=torch.uint8)
    a = (codes_a | (codes_a << 4)).view(torch.float4_e2m1fn_x2)  # (M, K/2) packed, row-major
    b = (codes_b | (codes_b << 4)).view(torch.float4_e2m1fn_x2).t()  # (K/2, N) packed, column-major
    scale_a = torch.ones(n * n // 16, device=device).to(torch.float8_e4m3fn)
    scale_b = torch.ones(n * n // 16, device=device).to(torch.float8_e4m3fn)
    out = torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    table = torch.tensor(E2M1_VALUES, device=device)
    reference = 2 * table[codes_a.long()] @ table[codes_b.long()].t()
    return _check(out, reference, 2e-2)


def probe_torchao_float8(device: torch.device, recipe: str) -> dict:
    """Forward and backward of a tiny Linear converted by torchao's float8 training (tensorwise or rowwise)."""
    if package_version("torchao") is None:
        return {"status": "torchao not installed", "fix": "pip install torchao"}
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False)).to(device)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False)).to(device)
    model.load_state_dict(reference.state_dict())
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
    x = torch.randn(128, 256, device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = model(x)
    out.float().sum().backward()
    result = _check(out, reference(x).detach(), 0.1)
    if model[0].weight.grad is None or not torch.isfinite(model[0].weight.grad).all():
        result["status"] = "backward failed"
    result["torchao"] = package_version("torchao")
    return result


PROBES: dict[str, Callable[[torch.device], dict]] = {
    "tf32": probe_tf32,
    "bf16": probe_bf16,
    "fp16": probe_fp16,
    "fp8_e4m3_tensorwise": lambda d: probe_scaled_mm(d),
    "fp8_e5m2_e4m3_tensorwise": lambda d: probe_scaled_mm(d, a_dtype=torch.float8_e5m2),
    "fp8_e4m3_rowwise": lambda d: probe_scaled_mm(d, rowwise=True),
    "torchao_float8_tensorwise": lambda d: probe_torchao_float8(d, "tensorwise"),
    "torchao_float8_rowwise": lambda d: probe_torchao_float8(d, "rowwise"),
    "mxfp8": probe_mxfp8,
    "nvfp4": probe_nvfp4,
}


def run_probe(name: str, device: torch.device, capability: tuple[int, int] | None) -> dict:
    """One precision: what the capability says, then the tiny op where the capability allows it.

    capability None (a CPU) skips the capability gate: used to exercise the ops themselves in tests.
    """
    need, what = REQUIRED_CAPABILITY[name]
    result: dict = {"needs_capability": f"{need[0]}.{need[1]}"}
    if capability is not None:
        result["by_capability"] = capability >= need
        if capability < need:
            result["status"] = NOT_SUPPORTED
            result["detail"] = (
                f"needs {what}, capability >= {need[0]}.{need[1]}; this GPU is {capability[0]}.{capability[1]}"
            )
            return result
    try:
        result.update(PROBES[name](device))
    except Exception as e:  # a kernel missing from this build, an unsupported layout: report, never crash
        result["status"] = "failed"
        result["detail"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result


def probe_all(device: torch.device, capability: tuple[int, int] | None) -> dict[str, dict]:
    return {name: run_probe(name, device, capability) for name in PROBES}
