"""Direct preference optimisation: the losses, the objective, and the reference log-probabilities.

A pair is one prompt with a chosen and a rejected reply, rendered by the chat renderer (redline/chat/render.py)
into two training sequences whose targets are the reply's tokens only. With π the policy (the model being trained)
and π_ref the frozen starting model, each sequence's log-probability is the sum over its reply tokens, and

    h = (log π(chosen) - log π(rejected)) - (log π_ref(chosen) - log π_ref(rejected))

    sigmoid (DPO, Rafailov et al. 2023):      loss = -log σ(β h)
    ipo (Azar et al. 2023):                   loss = (h - 1 / (2β))²   (log-probabilities averaged per token, as trl)
    hinge (SLiC, Zhao et al. 2023):           loss = max(0, 1 - β h)
    apo_zero (APO, D'Oosterlinck et al. 2024): loss = 1 - σ(β c) + σ(β r),  c, r = log π - log π_ref of the chosen
                                              and of the rejected reply: raises the chosen reply's likelihood and
                                              lowers the rejected one's, each on its own (for chosen replies better
                                              than the model's own, as a task's reference answers are)

as trl's `DPOTrainer.dpo_loss` writes them. The implicit rewards β (log π - log π_ref) of the chosen and the
rejected reply, their margin and the fraction of pairs where the chosen one wins (preference accuracy) are logged.

nll_weight α > 0 adds α times the chosen replies' negative log-likelihood per token (RPO, Pang et al. 2024; trl's
`rpo_alpha`): the sigmoid loss alone can lower the chosen reply's probability as long as the rejected one falls
faster, which on a small model shows as worse greedy answers; the NLL term holds the chosen reply up.

The reference log-probabilities are computed once, from the starting model before the first step
(`reference_logps`), and travel in the objective's state (so in every checkpoint): no second model is kept
during training, and a resumed run uses the same numbers.

Batches (`PairBatches`): `batch_size` pairs per micro-batch, drawn in a seeded order that is reshuffled every
epoch; its position is part of the checkpoint, so a resumed run sees the pairs it would have seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from redline.hardware import autocast
from redline.posttrain.logprobs import pad_rows, sequence_logps

if TYPE_CHECKING:
    from redline.training.step import TrainStep

LOSS_TYPES = ("sigmoid", "ipo", "hinge", "apo_zero")


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float, loss_type: str = "sigmoid"
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities (B,) of the chosen and rejected replies under the policy and the reference ->
    (per-pair losses (B,), chosen rewards (B,), rejected rewards (B,)); the rewards carry no gradient."""
    h = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * h)
    elif loss_type == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * h)
    elif loss_type == "apo_zero":
        losses = (1 - torch.sigmoid(beta * (policy_chosen - ref_chosen))
                  + torch.sigmoid(beta * (policy_rejected - ref_rejected)))
    else:
        raise ValueError(f"unknown DPO loss {loss_type!r}; one of {', '.join(LOSS_TYPES)}")
    chosen_rewards = beta * (policy_chosen - ref_chosen).detach()
    rejected_rewards = beta * (policy_rejected - ref_rejected).detach()
    return losses, chosen_rewards, rejected_rewards


def reward_metrics(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> dict[str, torch.Tensor]:
    """The logged means: rewards of each side, their margin, and preference accuracy (chosen reward higher)."""
    return {"rewards_chosen": chosen_rewards.mean(), "rewards_rejected": rejected_rewards.mean(),
            "reward_margin": (chosen_rewards - rejected_rewards).mean(),
            "preference_accuracy": (chosen_rewards > rejected_rewards).float().mean()}


# ----------------------------------------------------------------------------------------------------
# pairs and their batches


@dataclass(frozen=True)
class Pair:
    """One preference pair as two training sequences: (inputs, targets) each, targets -1 outside the reply."""

    chosen: tuple[list[int], list[int]]
    rejected: tuple[list[int], list[int]]

    @property
    def longest(self) -> int:
        return max(len(self.chosen[0]), len(self.rejected[0]))


def collate(pairs: list[Pair], indices: list[int], device: torch.device) -> dict[str, torch.Tensor]:
    """Pairs -> {"inputs", "targets": (2B, T), chosen rows first then rejected; "index": (B,) the pairs' ids},
    right-padded to the longest sequence (padding targets are -1)."""
    rows = [pairs[i].chosen for i in indices] + [pairs[i].rejected for i in indices]
    T = max(len(r[0]) for r in rows)
    inputs = pad_rows([r[0] for r in rows], 0, T)
    targets = pad_rows([r[1] for r in rows], -1, T)
    return {"inputs": inputs.to(device, non_blocking=True), "targets": targets.to(device, non_blocking=True),
            "index": torch.as_tensor(indices, dtype=torch.long).to(device, non_blocking=True)}


class PairBatches:
    """Micro-batches of `batch_size` pairs in a seeded order, reshuffled each epoch; state_dict is its position."""

    def __init__(self, pairs: list[Pair], batch_size: int, device: torch.device, seed: int = 0):
        self.pairs, self.batch_size, self.device, self.seed = pairs, batch_size, device, seed
        self.epoch, self.position = 0, 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.pairs), generator=generator).tolist()

    def next_indices(self) -> list[int]:
        out: list[int] = []
        while len(out) < self.batch_size:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._shuffled(self.epoch)
            take = self._order[self.position:self.position + self.batch_size - len(out)]
            out += take
            self.position += len(take)
        return out

    def next_batch(self) -> dict[str, torch.Tensor]:
        return collate(self.pairs, self.next_indices(), self.device)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._order = self._shuffled(self.epoch)


# ----------------------------------------------------------------------------------------------------
# the reference and the objective


@torch.no_grad()
def reference_logps(model: nn.Module, pairs: list[Pair], batch_size: int, device: torch.device,
                    amp: torch.dtype | None = None) -> torch.Tensor:
    """The frozen model's summed reply log-probabilities of every pair -> (N, 2) fp32 on the CPU, [:, 0] the
    chosen reply's, [:, 1] the rejected one's. Run once, in eval mode, under the training precision."""
    was_training = model.training
    model.eval()
    out = torch.empty(len(pairs), 2)
    try:
        for start in range(0, len(pairs), batch_size):
            indices = list(range(start, min(start + batch_size, len(pairs))))
            batch = collate(pairs, indices, device)
            with autocast(device, amp):
                logps, _ = sequence_logps(model, batch["inputs"], batch["targets"])
            out[start:start + len(indices)] = logps.view(2, -1).t().float().cpu()
    finally:
        model.train(was_training)
    return out


class DPO:
    """The DPO objective (see the module docstring). reference: (N, 2) from `reference_logps`, indexed by the
    pair ids of the batches; None until load_state_dict gives it (a resumed run)."""

    name = "dpo"
    shapes_vary = True  # batches padded to their longest sequence: no CUDA graphs by default (objectives.py)

    def __init__(self, beta: float = 0.1, loss_type: str = "sigmoid", reference: torch.Tensor | None = None,
                 heldout_reference: torch.Tensor | None = None, nll_weight: float = 0.0):
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown DPO loss {loss_type!r}; one of {', '.join(LOSS_TYPES)}")
        self.beta, self.loss_type, self.nll_weight = beta, loss_type, nll_weight
        self.reference, self.heldout_reference = reference, heldout_reference  # (N, 2) each, on the CPU
        self._on_device: torch.Tensor | None = None

    def attach(self, step: TrainStep) -> None:
        self.device, self.step = step.device, step  # the step: LoRA's reference pass (PairData.reference_from_base)

    def _reference(self, device: torch.device) -> torch.Tensor:
        if self.reference is None:
            raise RuntimeError("DPO needs the reference log-probabilities (reference_logps) before the first step")
        if self._on_device is None or self._on_device.device != device:
            self._on_device = self.reference.to(device)
        return self._on_device

    def loss_from_logps(self, logps: torch.Tensor, counts: torch.Tensor, index: torch.Tensor
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The policy's summed log-probabilities (2B,) and target counts (2B,) of a collated batch, and its pair
        ids (B,) -> (mean loss, metrics)."""
        B = index.shape[0]
        ref = self._reference(logps.device)[index]  # (B, 2)
        nll = -logps[:B].sum() / counts[:B].sum().clamp(min=1)  # the chosen replies' NLL per token (RPO)
        policy_chosen, policy_rejected = logps[:B], logps[B:]
        ref_chosen, ref_rejected = ref[:, 0], ref[:, 1]
        if self.loss_type == "ipo":  # per-token averages (trl's IPO)
            counts = counts.clamp(min=1).float()
            policy_chosen, policy_rejected = policy_chosen / counts[:B], policy_rejected / counts[B:]
            ref_chosen, ref_rejected = ref_chosen / counts[:B], ref_rejected / counts[B:]
        losses, chosen_rewards, rejected_rewards = dpo_loss(policy_chosen, policy_rejected, ref_chosen,
                                                            ref_rejected, self.beta, self.loss_type)
        metrics = reward_metrics(chosen_rewards, rejected_rewards)
        if self.nll_weight:
            metrics["chosen_nll"] = nll.detach()
            return losses.mean() + self.nll_weight * nll, metrics
        return losses.mean(), metrics

    def compute(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # chosen and rejected in one forward (2B, T): one pass over the weights, as trl's concatenated_forward
        logps, counts = sequence_logps(model, batch["inputs"], batch["targets"])
        return self.loss_from_logps(logps, counts, batch["index"])

    def state_dict(self) -> dict[str, Any]:
        return {"beta": self.beta, "loss_type": self.loss_type, "nll_weight": self.nll_weight,
                "reference": self.reference, "heldout_reference": self.heldout_reference}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("reference") is not None:
            self.reference, self._on_device = state["reference"].float().cpu(), None
        if state.get("heldout_reference") is not None:
            self.heldout_reference = state["heldout_reference"].float().cpu()


@torch.no_grad()
def evaluate_pairs(model: nn.Module, objective: DPO, pairs: list[Pair], reference: torch.Tensor, batch_size: int,
                   device: torch.device, amp: torch.dtype | None = None) -> dict[str, float]:
    """Held-out pairs (with their own reference log-probabilities (N, 2)) -> mean loss, rewards, margin and
    preference accuracy, weighted by pairs."""
    held_out = DPO(objective.beta, objective.loss_type, reference, nll_weight=objective.nll_weight)
    sums: dict[str, float] = {}
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(pairs), batch_size):
            indices = list(range(start, min(start + batch_size, len(pairs))))
            batch = collate(pairs, indices, device)
            with autocast(device, amp):
                logps, counts = sequence_logps(model, batch["inputs"], batch["targets"])
            loss, metrics = held_out.loss_from_logps(logps.float(), counts, batch["index"])
            for name, value in {"loss": loss, **metrics}.items():
                sums[name] = sums.get(name, 0.0) + float(value) * len(indices)
    finally:
        model.train(was_training)
    return {name: total / len(pairs) for name, total in sums.items()}
