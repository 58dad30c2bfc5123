"""Objectives: what the training step optimises. The step (redline/training/step.py) knows nothing of batches.

An objective turns one micro-batch into a loss: `compute(model, batch)` returns the micro-batch's loss (a 0-dim
tensor: the mean over the tokens it counts) and a dict of extra 0-dim device tensors to log (named as they
appear in metrics.jsonl); the step averages both over the micro-batches of an accumulation, under autocast,
without a host sync. `model` is the wrapped model (compiled, DDP or FSDP2): call it, do not change it.

A batch is whatever the objective's data source yields: language modeling takes (inputs, targets); an objective
that needs more (loss masks, packed documents' positions, chosen/rejected pairs, reference log-probs) takes a
dict of tensors. An objective may keep state of its own: `attach(step)` hands it the TrainStep once built (the
plain model, the device, `step.converters.disabled()` for a reference model: LoRA adapters off), and
state_dict/load_state_dict carry that state through checkpoints. An objective whose batches change shape from step
to step (DPO's pairs padded to the longest, GRPO's rollouts) sets `shapes_vary = True`: CUDA graphs, which record
graphs for each shape, then stay off unless the run asks for them (cuda_graphs=True).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from redline.training.step import TrainStep

Metrics = dict[str, torch.Tensor]


class Objective(Protocol):
    name: str

    def attach(self, step: TrainStep) -> None: ...

    def compute(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, Metrics]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class LanguageModeling:
    """Next-token prediction: batch = (inputs, targets), each (B, T) token ids (targets of -1 are not counted);
    the loss is the model's own cross-entropy, the mean over the counted targets."""

    name = "language_modeling"

    def attach(self, step: TrainStep) -> None:
        pass  # stateless

    def compute(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, Metrics]:
        inputs, targets = batch
        return model(inputs, targets), {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class SupervisedFineTuning:
    """SFT: the next-token loss on the trained tokens alone (assistant text and the end of each turn).

    batch: {"inputs": (B, T), "targets": (B, T) with -1 where not trained, and, for packed rows, "positions" and
    "doc_ids" (B, T): each conversation attends only to itself and its positions restart at 0
    (redline/training/conversations.py)}. The loss is the mean over the micro-batch's trained tokens; the extra
    metric `trained_fraction` is the share of the row slots that are trained on. A prefix-LM (model.prefix_lm) takes
    each row's prompt, up to its first trained token, as its prefix (conversations.prompt_lengths)."""

    name = "sft"
    prefix_lm = False

    def attach(self, step: TrainStep) -> None:
        self.prefix_lm = step.cfg.model.prefix_lm

    def compute(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Metrics]:
        from redline.training.conversations import prompt_lengths

        targets = batch["targets"]
        prefix = prompt_lengths(targets) if self.prefix_lm else None
        loss = model(batch["inputs"], targets, positions=batch.get("positions"), doc_ids=batch.get("doc_ids"),
                     prefix_len=prefix)
        return loss, {"trained_fraction": (targets >= 0).float().mean()}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
