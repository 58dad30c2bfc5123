"""Auxiliary-loss-free load balancing of a mixture of experts (model.moe_bias_update; DeepSeek-V3's, arXiv
2412.19437 §2.1.2): each expert's routing bias (model.moe_expert_bias: added to the scores that choose the top k,
not to those that weight the chosen) moves after every optimizer step by ±moe_bias_update, up for an expert that
took fewer than the mean of the step's token choices, down for one that took more. An overloaded expert is chosen
less from the next step on, without a loss term that pulls on the router's gradients (model.moe_aux_loss's).

The MoE layers count their choices on the device while training, into a tensor this converter hands each of them
(MoE.expert_load); after each update it sums the counts over the processes (data parallelism: every process then
moves its biases alike, by the whole batch's load) and clears them. No host synchronisation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn as nn

from redline.errors import UserError


class ExpertBalanceConverter:
    """moe_bias_update > 0: the experts' routing biases follow their loads (see the module docstring)."""

    name = "expert_balance"

    def __init__(self, rate: float):
        self.rate = rate
        self.layers: list[nn.Module] = []

    def convert(self, model: nn.Module) -> None:
        self.layers = [m for m in model.modules() if getattr(m, "expert_bias", None) is not None]
        if not self.layers:
            raise UserError("model.moe_bias_update needs mixture-of-experts layers with a routing bias "
                            "(model.moe_experts, model.moe_expert_bias=true)")
        for layer in self.layers:
            layer.expert_load = torch.zeros(layer.expert_bias.shape, device=layer.expert_bias.device)

    def before_step(self, step: int) -> None:
        return None

    @torch.no_grad()
    def after_optimizer_step(self, step: int) -> None:
        """Each layer's bias += rate · sign(mean load − load), the load summed over the processes, then its counts
        cleared: all on the device."""
        loads = torch.stack([layer.expert_load for layer in self.layers])  # (layers, E)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(loads)
        for layer, load in zip(self.layers, loads):
            layer.expert_bias += self.rate * torch.sign(load.mean() - load).to(layer.expert_bias.dtype)
            layer.expert_load.zero_()
        return None

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        yield  # evaluation runs the layers in eval mode, which count nothing; the biases route as trained

    def state_dict(self) -> dict:
        return {}  # the biases are model buffers (in the checkpoint); the counts are cleared every step

    def load_state_dict(self, state: dict) -> None:
        return None

    def describe(self) -> dict:
        return {"rate": self.rate, "layers": len(self.layers)}
