"""Optimizers and learning-rate schedules.

AdamW: 2-D weights decayed, norms/biases/gains not. Muon (redline/training/muon.py, batched by shape): the 2-D
weights inside the transformer blocks; AdamW for the embeddings, the head and every 1-D gain or bias, as the
source design's baseline did. Prodigy (Mishchenko & Defazio 2023, the prodigyopt package): Adam whose step size d
is estimated as it trains, so the schedule scales a peak learning rate of 1; its d is in every step's metrics
(prodigy_d). The schedule is a pure function of progress, so resuming needs only the step count.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from redline.config import OptimConfig
from redline.errors import UserError


def param_groups(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """(hidden weights of the blocks: matrices and stacked (E, rows, cols) experts; embeddings (a block's tables too)
    and head; 1-D gains and biases, the experts' stacked (E, rows) biases among them: no matrices for Muon); each
    parameter once."""
    hidden, embed_head, gains, seen = [], [], [], set()
    blocks = getattr(model, "blocks", None)
    block_params = {id(p) for p in blocks.parameters()} if blocks is not None else set()
    # a block's lookup tables (model.ngram_layers' n-gram tables) are embeddings, not matrices for Muon
    block_params -= {id(m.weight) for m in (blocks.modules() if blocks is not None else ())
                     if isinstance(m, nn.Embedding)}
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        if p.dim() < 2 or name.endswith("bias") or getattr(p, "is_gain", False):  # is_gain: a per-head norm's
            gains.append(p)  # (H, D) weight, a gain and not a matrix (model.HeadLayerNorm)
        elif id(p) in block_params:
            hidden.append(p)
        else:
            embed_head.append(p)
    return hidden, embed_head, gains


def build_optimizers(model: nn.Module, cfg: OptimConfig, device: torch.device) -> list[torch.optim.Optimizer]:
    optimizers = _build(model, cfg, device)
    for opt in optimizers:  # the peak rate each group's schedule scales (kept in the optimizer's state)
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers


def embed_head_groups(model: nn.Module, embed_head: list[nn.Parameter], cfg: OptimConfig) -> list[dict]:
    """AdamW groups of the embeddings and the head: one group at `lr` unless embed_lr or head_lr is set, then the
    head (the lm_head weight, which a tied embedding shares) and the other tables apart, each at its rate; all at
    embed_weight_decay when it is set."""
    decay = cfg.weight_decay if cfg.embed_weight_decay is None else cfg.embed_weight_decay
    if cfg.embed_lr is None and cfg.head_lr is None:
        return [{"params": embed_head, "weight_decay": decay}] if embed_head else []
    head_weight = getattr(getattr(model, "lm_head", None), "weight", None)
    head = [p for p in embed_head if p is head_weight]
    tables = [p for p in embed_head if p is not head_weight]
    rates = ((head, cfg.head_lr), (tables, cfg.embed_lr))
    return [{"params": ps, "weight_decay": decay, "lr": cfg.lr if lr is None else lr} for ps, lr in rates if ps]


def gain_group(gains: list[nn.Parameter], cfg: OptimConfig) -> dict:
    """The AdamW group of the 1-D weights: never decayed, at gain_lr when it is set (else the optimizer's lr)."""
    return {"params": gains, "weight_decay": 0.0, **({} if cfg.gain_lr is None else {"lr": cfg.gain_lr})}


def _build(model: nn.Module, cfg: OptimConfig, device: torch.device) -> list[torch.optim.Optimizer]:
    hidden, embed_head, gains = param_groups(model)
    fused = cfg.fused if cfg.fused is not None else device.type == "cuda"
    adam_kwargs = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused)
    if cfg.name in ("adamw", "prodigy"):
        if cfg.embed_lr is None and cfg.head_lr is None and cfg.embed_weight_decay is None:
            # two groups, as checkpoints of earlier versions hold
            groups = [{"params": hidden + embed_head, "weight_decay": cfg.weight_decay}]
        else:
            groups = [{"params": hidden, "weight_decay": cfg.weight_decay}, *embed_head_groups(model, embed_head, cfg)]
        groups.append(gain_group(gains, cfg))
        groups = [g for g in groups if g["params"]] or groups
        if cfg.name == "prodigy":
            return [prodigy(groups, cfg)]
        return [torch.optim.AdamW(groups, **adam_kwargs)]
    from redline.training.kernels import symmetric
    from redline.training.muon import Muon

    if cfg.muon_symmetric and not symmetric.available(device):
        raise UserError(f"optim.muon_symmetric=True needs a CUDA GPU and the triton package (training on "
                        f"{device.type}{'' if symmetric.triton else ', no triton'}); drop it or set it to False")
    # Muon orthogonalises matrices: a mixture of experts' stacked (E, rows, cols) expert weights train with AdamW
    stacked = [p for p in hidden if p.dim() > 2]
    hidden = [p for p in hidden if p.dim() == 2]
    muon = Muon(hidden, lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay,
                momentum_start=cfg.muon_momentum_start, momentum_warmup_steps=cfg.muon_momentum_warmup_steps,
                ns_steps=cfg.muon_ns_steps,
                compile=cfg.muon_compile if cfg.muon_compile is not None else device.type == "cuda",
                symmetric=cfg.muon_symmetric, cuda_graphs=cfg.muon_cuda_graphs)
    groups = [{"params": stacked, "weight_decay": cfg.weight_decay}] if stacked else []
    adam = torch.optim.AdamW(groups + embed_head_groups(model, embed_head, cfg) + [gain_group(gains, cfg)],
                             **adam_kwargs)
    return [muon, adam]


def prodigy(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    """Prodigy at lr 1 (the schedule scales it). Bias correction and, with a warmup, safeguard_warmup on, as
    prodigyopt's README advises for fine-tuning; growth_rate caps how fast d may rise (see OptimConfig)."""
    from prodigyopt import Prodigy

    # a LoRA run may have no gains to train; a group's own rate (embed_lr, head_lr, gain_lr: a Muon-trained base's,
    # say) would scale Prodigy's one estimated step size, which every group shares at lr 1
    groups = [{k: v for k, v in g.items() if k != "lr"} for g in groups if g["params"]]
    return Prodigy(groups, lr=1.0, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay,
                   decouple=True, use_bias_correction=True, safeguard_warmup=cfg.warmup_steps > 0,
                   d0=cfg.prodigy_d0, d_coef=cfg.prodigy_d_coef, growth_rate=cfg.prodigy_growth_rate)


def optimizer_metrics(optimizers: list[torch.optim.Optimizer]) -> dict[str, float]:
    """What an optimizer estimates as it trains, for metrics.jsonl: Prodigy's step size d."""
    out = {}
    for opt in optimizers:
        group = opt.param_groups[0]
        if "d" in group and "d0" in group:  # prodigyopt's groups carry d (the estimate) and d0 (its start)
            out["prodigy_d"] = float(group["d"])
    return out


def lr_multiplier(cfg: OptimConfig, step: int, progress: float) -> float:
    """Multiplier of the peak learning rate at optimizer step `step` (0-based) and budget progress in [0, 1]."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(max(progress, 0.0), 1.0)
    floor = cfg.min_lr_ratio
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "wsd":
        start = 1.0 - cfg.decay_fraction
        if progress <= start:
            return 1.0
        return 1.0 - (1.0 - floor) * (progress - start) / max(cfg.decay_fraction, 1e-9)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizers: list[torch.optim.Optimizer], multiplier: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * multiplier


def skips_on_device(optimizers: list[torch.optim.Optimizer]) -> bool:
    """True when every optimizer takes a `found_inf` tensor and skips a non-finite update on the device: fused
    Adam/AdamW (the input GradScaler drives) inside its kernel, redline's Muon in its compiled update. Then a
    non-finite step needs no host synchronisation, and the host reads the flags only at steps that wait anyway."""
    from redline.training.muon import Muon

    return all(isinstance(opt, Muon) or (isinstance(opt, torch.optim.Adam | torch.optim.AdamW)
                                         and opt.defaults.get("fused"))
               for opt in optimizers)


def step_if_finite(optimizers: list[torch.optim.Optimizer], loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
    """Apply the update only if the loss and the gradient norm are finite; returns a 0-dim float32 tensor on the
    device, 1.0 where the update was skipped. Fused AdamW and Muon skip on the device (fused AdamW's step counts
    are put back too; Muon's count, which only paces its momentum warm-up, goes on); others (for-each AdamW) need
    the answer on the host: one synchronisation."""
    bad = (~(torch.isfinite(loss) & torch.isfinite(grad_norm))).to(torch.float32)
    if skips_on_device(optimizers):
        for opt in optimizers:
            opt.found_inf = bad
            opt.step()
    elif not bad.item():
        for opt in optimizers:
            opt.step()
    return bad
