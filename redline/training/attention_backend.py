"""Choose the SDPA backend by measuring, for this model's attention shapes, on this GPU.

PyTorch's own choice (model.attn_backend="auto") follows a fixed priority list, not a measurement, and the
fastest backend depends on the GPU and the shapes (BENCHMARKS.md has examples). So at start-up, on CUDA, each
backend runs the model's own attention call (`Attention.attend`, including the key/value head expansion that
forced backends need under GQA) forward and backward on random q, k, v of the training shapes; the fastest wins. A backend that cannot run these shapes
(a mask, a head size, dropout) is skipped. Results are cached per GPU, torch version and shape in
`<redline cache>/attention_backends.json`, so later runs start at once.
"""

from __future__ import annotations

import dataclasses
import statistics
import warnings
from pathlib import Path

import torch

from redline.measurement_cache import cache_file, read_cache, write_cache_entry
from redline.model import Attention, ModelConfig

# "auto" is PyTorch's own pick; math is the slow reference and never wins
CANDIDATES = ("auto", "cudnn", "flash", "efficient")
# a forced backend must beat PyTorch's own pick by this much to replace it (timings carry ~1-2% noise)
MIN_GAIN = 1.02


def cache_path() -> Path:
    return cache_file("attention_backends.json")


def shape_key(cfg: ModelConfig, batch: int, seq_len: int, device_name: str, dtype: torch.dtype) -> str:
    return (f"{device_name}|torch {torch.__version__}|B={batch} T={seq_len} H={cfg.n_head} KV={cfg.kv_heads} "
            f"D={cfg.head_dim} window={cfg.sliding_window} dropout={cfg.dropout > 0} {str(dtype).replace('torch.', '')}"
            + (" alibi" if cfg.pos_emb == "alibi" else ""))  # ALiBi's float mask: flash cannot run it


def _time_attend(attn: Attention, q, k, v, mask, reps: int) -> float:
    """Median milliseconds of one forward + backward of attn.attend on CUDA."""
    grad = torch.randn(q.shape[0], q.shape[2], q.shape[1] * q.shape[3], device=q.device, dtype=q.dtype)

    def once():
        y = attn.attend(q, k, v, mask, is_causal=mask is None)
        y.backward(grad)

    for _ in range(3):
        once()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        once()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize(q.device)
    return statistics.median(s.elapsed_time(e) for s, e in times)


def measure_backends(cfg: ModelConfig, batch: int, seq_len: int, device: torch.device,
                     mask: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16,
                     reps: int = 10) -> dict[str, float | None]:
    """Milliseconds of a causal attention forward + backward per candidate backend (None: cannot run)."""
    H, KV, D = cfg.n_head, cfg.kv_heads, cfg.head_dim
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, H, seq_len, D, device=device, dtype=dtype, generator=gen, requires_grad=True)
    k = torch.randn(batch, KV, seq_len, D, device=device, dtype=dtype, generator=gen, requires_grad=True)
    v = torch.randn(batch, KV, seq_len, D, device=device, dtype=dtype, generator=gen, requires_grad=True)
    results: dict[str, float | None] = {}
    for backend in CANDIDATES:
        with torch.device("meta"):  # attend uses no weights: keep the projection matrices off the GPU
            attn = Attention(dataclasses.replace(cfg, attn_backend=backend))
        attn.train()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "backend X not available because ..." is the answer, not news
                results[backend] = _time_attend(attn, q, k, v, mask, reps)
        except (RuntimeError, ValueError, NotImplementedError):
            results[backend] = None
        finally:
            q.grad = k.grad = v.grad = None
    return results


def pick_backend(timings: dict[str, float | None]) -> str:
    """The fastest backend; PyTorch's own pick ("auto") unless a forced one beats it by MIN_GAIN."""
    ok = {name: ms for name, ms in timings.items() if ms is not None}
    if not ok:
        return "auto"
    best = min(ok, key=ok.get)
    if "auto" in ok and ok["auto"] <= ok[best] * MIN_GAIN:
        return "auto"
    return best


def choose_backend(cfg: ModelConfig, batch: int, seq_len: int, device: torch.device,
                   mask: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16,
                   use_cache: bool = True) -> tuple[str, dict[str, float | None], bool]:
    """(winner, milliseconds per backend, whether it came from the cache) for these shapes on this GPU."""
    key = shape_key(cfg, batch, seq_len, torch.cuda.get_device_name(device), dtype)
    path = cache_path()
    if use_cache:
        entry = read_cache(path).get(key)
        if isinstance(entry, dict) and entry.get("backend") in CANDIDATES:
            return entry["backend"], entry.get("ms", {}), True
    timings = measure_backends(cfg, batch, seq_len, device, mask, dtype)
    winner = pick_backend(timings)
    torch.cuda.empty_cache()
    write_cache_entry(path, key, {"backend": winner, "ms": timings})
    return winner, timings, False


def set_model_backend(model: torch.nn.Module, backend: str) -> None:
    """Make every attention layer of `model` use `backend`, without touching the config the run saves.

    The model and its layers share one ModelConfig object with the TrainConfig that goes into config.json and
    checkpoints; the measured backend is a property of this GPU, so the layers get a copy instead."""
    cfg = dataclasses.replace(model.cfg, attn_backend=backend)
    model.cfg = cfg
    for module in model.modules():
        if isinstance(module, Attention):
            module.cfg = cfg


def resolve_attention_backend(model: torch.nn.Module, batch: int, seq_len: int, device: torch.device,
                              dtype: torch.dtype | None, enabled: bool = True) -> dict:
    """Measure and set the fastest SDPA backend when on CUDA and model.attn_backend is auto.

    Returns a summary: {"backend", "source" (measured | cache | config | pytorch | failed), "ms" or "error"}."""
    cfg = model.cfg
    if cfg.attn_backend != "auto":
        return {"backend": cfg.attn_backend, "source": "config"}
    if not enabled or device.type != "cuda":
        return {"backend": "auto", "source": "pytorch"}
    mask = model.sliding_mask(seq_len, device) if hasattr(model, "sliding_mask") else None
    if cfg.pos_emb == "alibi" and hasattr(model, "attention_mask"):  # measured with the float mask it trains with
        mask = model.attention_mask(seq_len, device)
    try:
        winner, timings, cached = choose_backend(cfg, batch, seq_len, device, mask, dtype or torch.float32)
    except (RuntimeError, ValueError) as e:  # PyTorch's own choice always works: a failed measurement costs only speed
        torch.cuda.empty_cache()
        return {"backend": "auto", "source": "failed", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    if winner != "auto":
        set_model_backend(model, winner)
    return {"backend": winner, "source": "cache" if cached else "measured", "ms": timings}
