"""Group relative policy optimisation: advantages within groups of samples, the token-level loss, pass@k.

GRPO (Shao et al. 2024, DeepSeekMath) samples G completions of each prompt, scores each with a verifiable reward
r, and weighs every token of completion i by its group-relative advantage

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)        scale_rewards="group" (GRPO, DAPO)
    A_i =  r_i - mean(r_group)                                scale_rewards="none"  (Dr. GRPO, Liu et al. 2025)
    A_i = (r_i - mean(r_group)) / mean(r_group)                scale_rewards="mean"  (MaxRL, Tajwar et al. 2026)

With 0/1 rewards and p the chance that a sample of a prompt is right, the expected update of "none" is
(G - 1) ∇p, that of the expected reward, and of "mean" G (1 - (1 - p)^(G-1)) ∇log p, that of the log-likelihood
of a right answer (SFT's, every prompt weighing the same) truncated where G samples rarely find one; "group" is
between them (about ∇p / sqrt(p (1 - p))). ∇p = p ∇log p weighs a prompt by how often it is already right, so
the expected reward can rise while greedy decoding, decided by prompts whose right answer is not yet sure, gets
worse (docs/posttraining.md, Measured).

The loss of a step is a sum over every completion token t of every sample, divided by one normaliser for the
whole step rather than per sequence (so long completions are not down-weighted):

    loss = Σ_i Σ_t [ -A_i · ρ_it + β · KL_it ] / N
    ρ_it = π(y_it) / π_old(y_it)       (π_old: the weights that sampled; with one update per rollout ρ = 1 with the
                                        gradient of log π, and PPO's clipping never acts: it is left out)

With updates_per_rollout μ > 1 (trl's num_iterations) the rollout's batches train μ steps; π_old's per-token
log-probabilities come with the batches ("old_logps", one forward before the first update) and the term is PPO's
clipped one, -min(ρ A, clip(ρ, 1 - ε, 1 + ε) A) (ε = clip_eps).
    KL_it = exp(q) - q - 1, q = log π_ref(y_it) - log π(y_it)   (Schulman's k3 estimator; β = kl_coef, 0: off)
    N = completion tokens of the step             loss_norm="token"    (DAPO, Yu et al. 2025)
    N = sequences × max_new_tokens                loss_norm="constant" (Dr. GRPO)

A micro-batch's loss is its part of that sum over N / accum: the step averages its micro-batches, so the step's
loss is exactly the sum over N. Rollouts (redline/posttrain/rollouts.py) put N and the reference
log-probabilities into the batches.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from redline.posttrain.logprobs import token_logps

if TYPE_CHECKING:
    from redline.training.step import TrainStep

SCALE_REWARDS = ("group", "none", "mean")
LOSS_NORMS = ("token", "constant")


def group_advantages(rewards: torch.Tensor, scale_rewards: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """rewards (P, G): G samples of each of P prompts -> advantages (P, G). A group whose rewards are all equal
    has advantages 0 (it teaches nothing). std is the sample standard deviation (unbiased), as trl's; "mean" needs
    rewards >= 0 (a group whose rewards are all 0 has advantages 0)."""
    mean = rewards.mean(dim=1, keepdim=True)
    centred = rewards - mean
    if scale_rewards == "none":
        return centred
    if scale_rewards == "mean":
        if (rewards < 0).any():
            raise ValueError("scale_rewards='mean' divides by the group's mean reward: rewards must be >= 0")
        return centred / mean.clamp(min=eps)
    if scale_rewards != "group":
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALE_REWARDS)}, got {scale_rewards!r}")
    std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(centred)
    return centred / (std + eps)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k samples drawn from n, of which c are correct, is correct: the unbiased
    estimator 1 - C(n-c, k) / C(n, k) of Chen et al. 2021 (Codex)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token KL(π || π_ref) estimate exp(q) - q - 1 with q = log π_ref - log π (>= 0, unbiased)."""
    q = ref_logps - logps
    return torch.exp(q) - q - 1


class GRPO:
    """The GRPO objective (see the module docstring). A batch is a dict: "inputs", "targets" (B, T) with targets
    -1 outside the completions, "advantages" (B,), "norm" () the step's normaliser divided by accum,
    "ref_logps" (B, T) when kl_coef > 0, "old_logps" (B, T) when a rollout trains several steps, and rollout
    statistics ("stats": name -> 0-dim tensor) to log."""

    name = "grpo"
    shapes_vary = True  # batches padded to their longest sequence: no CUDA graphs by default (objectives.py)

    def __init__(self, kl_coef: float = 0.0, clip_eps: float = 0.2):
        self.kl_coef, self.clip_eps = kl_coef, clip_eps

    def attach(self, step: TrainStep) -> None:
        self.step = step

    def per_token(self, logps: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probabilities (B, T) -> (per-token loss (B, T), per-token KL (B, T) or zeros)."""
        mask = (batch["targets"] != -1).float()
        advantages = batch["advantages"][:, None]
        if "old_logps" in batch:  # a later update on the same rollout: PPO's clipped ratio to the sampling weights
            ratio = torch.exp(logps - batch["old_logps"])
            clipped = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps)
            loss = -torch.minimum(ratio * advantages, clipped * advantages)
        else:
            ratio = torch.exp(logps - logps.detach())  # 1, with the gradient of log π
            loss = -advantages * ratio
        kl = torch.zeros_like(logps)
        if self.kl_coef > 0:
            kl = k3_kl(logps, batch["ref_logps"])
            loss = loss + self.kl_coef * kl
        return loss * mask, kl * mask

    def compute(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logps = token_logps(model, batch["inputs"], batch["targets"])
        loss, kl = self.per_token(logps, batch)
        tokens = (batch["targets"] != -1).sum().clamp(min=1)
        metrics = {"kl": kl.sum().detach() / tokens, **batch.get("stats", {})}
        return loss.sum() / batch["norm"], metrics

    def state_dict(self) -> dict[str, Any]:
        return {"kl_coef": self.kl_coef, "clip_eps": self.clip_eps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass  # the configuration comes from the command line; nothing is learned
