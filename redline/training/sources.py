"""What the training loop reads: a data source gives the tokenizer, the training batches (a loader with an exact
position for resume) and the evaluation. The loop (redline/training/loop.py) is the same for every source; the
objective (redline/training/objectives.py) says what a batch means.

    data = ShardData(data_dir)                     # pretraining: token shards, (inputs, targets) windows
    data = ConversationData(...)                   # SFT: packed conversations (redline/training/conversations.py)
    loader = data.train_loader(cfg, info, device)  # next_batch(), state_dict(), load_state_dict()
    result = data.evaluate(model, cfg, info, device)   # {"loss", "perplexity", "bpb", "eval_tokens"}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from redline.config import TrainConfig
from redline.distributed import DistInfo
from redline.hardware import autocast_dtype


class Loader(Protocol):
    def next_batch(self) -> Any: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class TrainingData(Protocol):
    name: str
    """Where the data comes from, for messages."""
    tokenizer: Any
    # optional: rows_cut = True for a source whose rows are cut to each micro-batch's longest (DPO pairs, GRPO
    # rollouts): a step then holds at most the plan's batch × seq_len tokens (the loop counts what it holds)

    def train_loader(self, cfg: TrainConfig, info: DistInfo, device: torch.device) -> Loader: ...

    def evaluate(self, model, cfg: TrainConfig, info: DistInfo, device: torch.device) -> dict[str, float]: ...


class ShardData:
    """Prepared token shards (redline data prepare): random windows for training, the val split for evaluation."""

    def __init__(self, data_dir: Path):
        from redline.data.prepare import load_data_tokenizer

        self.data_dir = data_dir
        self.name = str(data_dir)
        self.tokenizer = load_data_tokenizer(data_dir)
        self._val = None
        self._token_bytes = None

    def train_loader(self, cfg: TrainConfig, info: DistInfo, device: torch.device):
        """The training windows' loader (and the validation split's, so a split too small fails at the start)."""
        from redline.data.loader import TokenLoader

        train = TokenLoader(self.data_dir, "train", cfg.batch_size, cfg.effective_seq_len, seed=cfg.seed,
                            rank=info.rank, world_size=info.world_size, expected_identity=self.tokenizer.identity,
                            device=device, align_to_documents=cfg.data.align_rows)
        self._val = TokenLoader(self.data_dir, "val", cfg.batch_size, cfg.effective_seq_len, rank=info.rank,
                                world_size=info.world_size, expected_identity=self.tokenizer.identity,
                                device=device, prefetch=False)
        self._token_bytes = torch.as_tensor(self.tokenizer.token_byte_lengths(), device=device)
        return train

    def evaluate(self, model, cfg: TrainConfig, info: DistInfo, device: torch.device) -> dict[str, float]:
        """Validation loss, perplexity and bits per byte (redline/training/evaluate.py)."""
        from redline.training.evaluate import evaluate

        return evaluate(model, self._val.eval_batches(cfg.eval_batches), self._token_bytes,
                        autocast_dtype(device, cfg.precision), device)
