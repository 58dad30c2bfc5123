"""TokenLoader: shuffled, rank-sharded, exactly resumable batches from a prepared folder's shards.

How it works:
- all shards of a split are memory-mapped and read as one token stream of N tokens;
- the stream is cut into W = (N - 1) // T windows of T + 1 tokens with stride T (window w covers tokens
  [w·T, w·T + T]); x is a window's first T tokens and y its last T, so tokens 1 .. W·T are each a target
  exactly once per epoch (token 0 and the fewer than T tokens after W·T never are);
- epoch e visits the windows in the permutation `default_rng([seed, e]).permutation(W)`; the permutations of
  epochs 0, 1, 2, ... are laid end to end into one endless sequence of windows;
- global batch i takes the positions [i·B·world + rank·B, i·B·world + rank·B + B) of that sequence, so the
  ranks never read the same position, and no window is skipped: the windows left at the end of an epoch that do
  not fill a whole global batch roll over into the first batch of the next epoch (nothing is dropped);
- the whole state is one integer, `position` (windows consumed by all ranks together), so `state_dict()` /
  `load_state_dict()` resume exactly, even with another world size as long as B·world is the same;
- with align_to_documents, the windows start where documents start instead of every T tokens: at the
  end-of-text token before each document (the first at token 0), so a row opens with that separator as its
  beginning-of-sequence token and the first target is the document's first token (as modded-nanogpt and
  nanochat start their rows); a document longer than T also gets a window every T tokens after its start, so
  all of it is read; a window runs on into the next documents when its own is shorter than T, so the tokens
  of a short document can be a target more than once per epoch;
- on CUDA the next batch is gathered and pinned by a background thread while the current step runs, then
  copied with non_blocking=True: building a batch on the host takes a sizeable part of a small model's step,
  and the thread hides it behind the GPU's work instead of adding it to every step.

`eval_batches(n)` reads the split in order, unshuffled, and gives the same n batches every call, for a validation
loss that is comparable between evaluations. It reads the split at most once: a split of fewer than n global
batches gives fewer, and the rows of its last batch past the split's end have every target -1 (ignored), so each
window is scored once and every rank still runs the same batches of the same shape.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from redline.data.prepare import load_meta
from redline.data.shards import FIX, max_token, read_shard
from redline.errors import UserError


class TokenLoader:
    def __init__(
        self,
        data_dir: str | os.PathLike,
        split: str,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        expected_identity: str | None = None,
        device: str | torch.device = "cpu",
        prefetch: bool | None = None,
        align_to_documents: bool = False,
    ):
        """expected_identity: the identity of the tokenizer this run uses (None: trust the folder's own).
        prefetch: build the next batch in a background thread while the current one is in use (None: on for
            CUDA, where the batch is also pinned and copied asynchronously).
        align_to_documents: windows start at document starts (module docstring); reads every token once here."""
        if batch_size <= 0 or seq_len <= 0:
            raise UserError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
        if not 0 <= rank < world_size:
            raise UserError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.data_dir = Path(data_dir).expanduser()
        self.meta = load_meta(self.data_dir)
        if split not in self.meta["splits"]:
            raise UserError(f"{self.data_dir} has no split {split!r}; it has {', '.join(self.meta['splits'])}")
        identity = self.meta["tokenizer"]["identity"]
        if expected_identity is not None and expected_identity != identity:
            raise UserError(
                f"{self.data_dir} was prepared with tokenizer {identity[:12]}, this run uses {expected_identity[:12]}; "
                f"re-prepare the data with this tokenizer or pass the matching tokenizer"
            )
        self.split, self.batch_size, self.seq_len = split, batch_size, seq_len
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.device = torch.device(device)
        self.prefetch = self.device.type == "cuda" if prefetch is None else prefetch

        # every shard is checked against the folder's tokenizer identity (and its header against its size), and
        # its token ids against the vocabulary: an id past it would crash the embedding mid-run
        vocab = self.meta["tokenizer"]["vocab_size"]
        self.shards = []
        for name in self.meta["splits"][split]["shards"]:
            tokens = read_shard(self.data_dir / name, identity)
            top = max_token(self.data_dir / name, tokens)
            if top >= vocab:
                raise UserError(f"token shard {self.data_dir / name} holds token id {top}, outside the vocabulary of "
                                f"its tokenizer ({vocab} ids): it is corrupted or was not made by this tokenizer; {FIX}")
            self.shards.append(tokens)
        sizes = [s.size for s in self.shards]
        self.offsets = np.cumsum([0] + sizes)  # (num_shards + 1,): where each shard starts in the stream
        self.total_tokens = int(self.offsets[-1])
        if self.total_tokens < seq_len + 1:
            raise UserError(too_small_message(self.data_dir, self.meta, split, seq_len))
        self.aligned = align_to_documents
        # (W,) int64 token index where each window starts; None: window w starts at w·T
        self.starts = self._document_windows(int(self.meta["tokenizer"]["eot_id"])) if align_to_documents else None
        self.num_windows = (self.total_tokens - 1) // seq_len if self.starts is None else int(self.starts.size)
        self.position = 0  # windows consumed so far by all ranks together
        self._perms: dict[int, np.ndarray] = {}
        self._next: tuple[int, int, Future] | None = None  # (position, rows, the host batch being built for them)
        self._executor: ThreadPoolExecutor | None = None

    def _document_windows(self, eot_id: int) -> np.ndarray:
        """The start of each document-aligned window: every end-of-text token (and token 0), then every T tokens
        after it up to the next one; only windows whose T + 1 tokens lie inside the stream."""
        T = self.seq_len
        separators = [np.flatnonzero(shard == eot_id) + offset for shard, offset in zip(self.shards, self.offsets)]
        doc_starts = np.unique(np.concatenate([np.zeros(1, np.int64), *[s.astype(np.int64) for s in separators]]))
        ends = np.append(doc_starts[1:], self.total_tokens)  # each start's next separator
        counts = np.maximum(1, -(-(ends - doc_starts) // T))  # ceil(length / T) windows per document
        first = np.repeat(np.cumsum(counts) - counts, counts)  # index of each window's document's first window
        starts = np.repeat(doc_starts, counts) + T * (np.arange(counts.sum()) - first)
        return starts[starts + T + 1 <= self.total_tokens]

    # ------------------------------------------------------------------------------------------------
    # sizes

    @property
    def global_batch(self) -> int:
        """Windows per step over all ranks."""
        return self.batch_size * self.world_size

    @property
    def epoch(self) -> float:
        """Fractional epochs consumed (1.0 = every window seen once)."""
        return self.position / self.num_windows

    @property
    def batches_per_epoch(self) -> float:
        return self.num_windows / self.global_batch

    # ------------------------------------------------------------------------------------------------
    # reading

    def _permutation(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}  # keep at most two
            self._perms[epoch] = perm
        return perm

    def _window(self, index: int) -> np.ndarray:
        """Tokens [s, s + T] of the stream, s = index·T (or the index-th document-aligned start), (T + 1,) int64,
        across shard boundaries if needed."""
        start = index * self.seq_len if self.starts is None else int(self.starts[index])
        stop = start + self.seq_len + 1
        shard = int(np.searchsorted(self.offsets, start, side="right")) - 1
        pieces = []
        while start < stop:
            local = start - int(self.offsets[shard])
            take = min(stop - start, self.shards[shard].size - local)
            pieces.append(self.shards[shard][local : local + take])
            start += take
            shard += 1
        return np.concatenate(pieces).astype(np.int64) if len(pieces) > 1 else pieces[0].astype(np.int64)

    def _host_batch(self, windows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y on the CPU (pinned when the batch is bound for a GPU), contiguous, (B, T) int64 each."""
        data = np.stack([self._window(w) for w in windows])  # (B, T + 1) int64
        x, y = torch.from_numpy(np.ascontiguousarray(data[:, :-1])), torch.from_numpy(np.ascontiguousarray(data[:, 1:]))
        if self.device.type == "cuda":
            # pinned host memory lets the copy to the GPU run asynchronously with the GPU's current work
            x, y = x.pin_memory(), y.pin_memory()
        return x, y

    def _to_device(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.device.type == "cpu":
            return batch
        return tuple(t.to(self.device, non_blocking=self.device.type == "cuda") for t in batch)

    def _build(self, position: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's host batch (rows windows) of the global batch that starts at `position` of the endless
        window sequence."""
        windows = []
        for p in range(position + self.rank * rows, position + (self.rank + 1) * rows):
            epoch, offset = divmod(p, self.num_windows)
            windows.append(int(self._permutation(epoch)[offset]))
        return self._host_batch(windows)

    def _worker(self) -> ThreadPoolExecutor:
        if self._executor is None:
            init = None
            if self.device.type == "cuda":  # pin through this process's GPU, not a new context on GPU 0
                index = self.device.index if self.device.index is not None else torch.cuda.current_device()
                init = lambda: torch.cuda.set_device(index)
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="redline-loader", initializer=init)
        return self._executor

    def next_batch(self, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), int64, shape (rows, seq_len) each (rows: batch_size unless given, as a batch-size warm-up asks),
        on `device`; y is x shifted left by one token."""
        rows = rows or self.batch_size
        if self._next is not None and self._next[:2] == (self.position, rows):
            batch = self._next[2].result()
        else:
            batch = self._build(self.position, rows)
        self._next = None
        self.position += rows * self.world_size
        if self.prefetch:
            # gather (and pin) the next batch in a thread while the caller trains on this one; numpy's copies
            # release the GIL, so this overlaps even with a loop that waits for the GPU every step
            self._next = (self.position, rows, self._worker().submit(self._build, self.position, rows))
        return self._to_device(batch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def eval_batches(self, n: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The first n batches of this rank in stream order (no shuffle; the same on every call), at most one pass
        over the split (module docstring): y is -1 in the rows past its end."""
        for i in range(min(n, -(-self.num_windows // self.global_batch))):
            rows = i * self.global_batch + self.rank * self.batch_size + np.arange(self.batch_size)
            x, y = self._host_batch((rows % self.num_windows).tolist())
            y[torch.from_numpy(rows >= self.num_windows)] = -1
            yield self._to_device((x, y))

    # ------------------------------------------------------------------------------------------------
    # resuming

    def state_dict(self) -> dict:
        epoch, index = divmod(self.position, self.num_windows)
        return {"position": self.position, "epoch": epoch, "index": index, "seed": self.seed,
                "num_windows": self.num_windows, "seq_len": self.seq_len, "global_batch": self.global_batch,
                "align_to_documents": self.aligned}

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state` was taken (same data, seq_len and seed are required)."""
        if bool(state.get("align_to_documents", False)) != self.aligned:
            raise UserError(f"the data loader state was made with data.align_rows={not self.aligned}, this run has "
                            f"{self.aligned}; resume with the same setting")
        if state.get("num_windows") != self.num_windows or state.get("seq_len") != self.seq_len:
            raise UserError(
                f"the data loader state is from other data or another seq_len ({state.get('num_windows')} windows of "
                f"{state.get('seq_len')} tokens; now {self.num_windows} of {self.seq_len}); resume with the same "
                f"data and seq_len, or start a new run"
            )
        if state.get("seed", self.seed) != self.seed:
            raise UserError(f"the data loader state was made with seed {state['seed']}, this run uses {self.seed}; "
                            f"resume with the same seed")
        self.position = int(state["position"])
        self._next = None


def too_small_message(data_dir: Path, meta: dict, split: str, seq_len: int) -> str:
    """Why a split cannot give one window of seq_len + 1 tokens, with the sizes of both splits and what to do."""
    sizes = {name: meta["splits"][name].get("tokens", 0) for name in ("train", "val") if name in meta["splits"]}
    total = sum(sizes.values())
    if total < 2 * (seq_len + 1):
        fix = (f"the data is too small for seq_len {seq_len}: each split needs {seq_len + 1} tokens; give more text "
               f"or a shorter seq_len")
    elif split == "val":
        fix = ("re-prepare it with a larger --val-fraction or --val-inputs (a split that leaves val short tops it up "
               "from the end of the training text), or use a shorter seq_len")
    else:
        fix = "re-prepare it with a smaller --val-fraction, or use a shorter seq_len"
    parts = ", ".join(f"{name} {tokens:,}" for name, tokens in sizes.items())
    return (f"the {split} split of {data_dir} has {sizes.get(split, 0):,} tokens ({parts}), fewer than one window "
            f"of seq_len + 1 = {seq_len + 1}; {fix}")
