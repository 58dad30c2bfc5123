"""Conversations as a training data source for SFT: read, rendered with a loss mask, packed best-fit into rows.

    data = ConversationData.load("task:arithmetic" | "chats.jsonl" | "HF/name", tokenizer, seq_len, seed=...)
    loader = data.train_loader(cfg, info, device)    # batches {"inputs", "targets", "positions", "doc_ids"}
    data.evaluate(model, cfg, info, device)          # loss, perplexity, bpb on the held-out conversations

Sources: a built-in or JSONL task (`task:NAME`, its train split for training and its test split for evaluation);
a JSONL file of {"messages": [...]} (OpenAI format) or {"prompt", "completion"} lines (a held-out share is kept
for evaluation); a Hugging Face dataset by name when the `data` extra is installed and the network is there.

Each conversation is rendered by redline/chat/render.py into (inputs, targets) of its length - 1 tokens, targets
-1 where the mask is off. Packing (on by default) puts whole conversations into rows of seq_len tokens best-fit
(each, longest first, into the fullest row it fits in, a row opened when none has room: the "best-fit packing"
of Ding et al. 2024, "Fewer Truncations Improve Language Modeling"); a row carries each token's document id and
its position within its document, so the model attends only within a document and RoPE restarts at each (the
model's `doc_ids` / `positions`). Without packing a row holds one conversation and the model runs its plain
causal path; a prefix-LM (model.prefix_lm) attends the conversation up to its first trained token both ways
(prompt_lengths: PaliGemma's prompt as its prefix), which takes one conversation a row. The rest of a row is
padding: targets -1, a document of its own. A conversation longer than seq_len is dropped and counted; if every one
is, that is an error.

The order is a pure function of (seed, epoch): each epoch shuffles the conversations, packs them, and shuffles the
rows, so the loader's position (epoch, row) resumes exactly.
"""

from __future__ import annotations

import bisect
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from redline.chat.render import check_messages, renderer_for, training_example
from redline.distributed import DistInfo, all_reduce_mean
from redline.errors import UserError
from redline.hardware import autocast, autocast_dtype

Example = tuple[list[int], list[int]]  # (inputs, targets) of one conversation


# ----------------------------------------------------------------------------------------------------
# reading


def read_conversations(source: str, seed: int = 0, eval_fraction: float = 0.02, eval_max: int = 500,
                       task_seed: int = 0) -> tuple[list[list[dict]], list[list[dict]], str]:
    """(training conversations, held-out conversations, a description) from a task (its splits fixed by
    task_seed), a JSONL file or a Hugging Face dataset (seed draws the held-out share); each conversation checked
    (check_messages), a bad one a one-line error naming where it is."""
    if source.startswith("task:") or (source.endswith(".jsonl") and _is_task_file(source)):
        from redline.tasks import load_task

        task = load_task(source, seed=task_seed)
        return task.conversations("train"), task.conversations("test"), f"task {task.name}"
    if source.endswith(".jsonl") or Path(source).is_file():
        rows = _read_jsonl(Path(source))
        where = source
    else:
        rows, where = _read_hf(source), f"Hugging Face dataset {source}"
    conversations = [_conversation(row, f"{where} record {i + 1}") for i, row in enumerate(rows)]
    if not conversations:
        raise UserError(f"{where} holds no conversation")
    order = list(range(len(conversations)))
    random.Random(f"heldout:{seed}").shuffle(order)
    n_eval = min(eval_max, math.ceil(len(order) * eval_fraction)) if len(order) > 1 else 0
    held = set(order[:n_eval])
    train = [c for i, c in enumerate(conversations) if i not in held]
    if not train:
        raise UserError(f"finetune.eval_fraction={eval_fraction} holds out all {len(conversations)} conversations of "
                        f"{where}, leaving none to train on; lower it")
    return train, [conversations[i] for i in sorted(held)], where


def _is_task_file(path: str) -> bool:
    """A JSONL task file (question/choices/answer or prompt/answer lines) rather than conversations."""
    try:
        with open(path, encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        obj = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(obj, dict) and "answer" in obj and "messages" not in obj and "completion" not in obj


def _read_jsonl(path: Path) -> list:
    if not path.is_file():
        raise UserError(f"data file {path} not found; give a .jsonl of {{\"messages\": [...]}} or "
                        f"{{\"prompt\", \"completion\"}} lines, task:NAME, or a Hugging Face dataset name")
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise UserError(f"{path} line {n} is not valid JSON ({e})") from None
    return rows


def _read_hf(name: str) -> list:
    try:
        import datasets
    except ImportError:
        raise UserError(f"{name!r} is neither a file nor task:NAME; a Hugging Face dataset by name needs the data "
                        f"extra: pip install 'redline[data]'") from None
    try:
        return list(datasets.load_dataset(name, split="train"))
    except Exception as e:  # offline, unknown name: the library's message says which
        raise UserError(f"cannot load Hugging Face dataset {name!r}: {str(e).splitlines()[0][:200]}") from None


def _conversation(row, where: str) -> list[dict]:
    if isinstance(row, dict) and "messages" in row:
        return check_messages(row["messages"], where=where)
    if isinstance(row, dict) and "prompt" in row and "completion" in row:
        prompt, completion = row["prompt"], row["completion"]
        if isinstance(prompt, list) and isinstance(completion, list):  # conversational prompt/completion
            return check_messages(prompt + completion, where=where)
        return check_messages([{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}],
                              where=where)
    raise UserError(f"{where} has neither \"messages\" nor \"prompt\" and \"completion\"; give one of the two forms")


def prompt_lengths(targets: torch.Tensor) -> torch.Tensor:
    """targets (B, T), -1 where not trained -> each row's prompt length (B,): the tokens up to the one whose target
    is the first trained token (PaliGemma's prefix: its labels leave the prefix out, and its last token predicts the
    suffix's first); the whole row where nothing is trained."""
    trained = targets >= 0
    first = torch.where(trained.any(dim=1), trained.int().argmax(dim=1), targets.shape[1] - 1)
    return first + 1


# ----------------------------------------------------------------------------------------------------
# packing


def pack_best_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """Rows of indices into `lengths` (each <= capacity), best-fit decreasing: each item, longest first, goes into
    the row with the least room that still fits it (a sorted list of (room, row) makes that a bisect)."""
    rows: list[list[int]] = []
    rooms: list[tuple[int, int]] = []  # (room left, row index), sorted
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        at = bisect.bisect_left(rooms, (n, -1))
        if at < len(rooms):
            room, row = rooms.pop(at)
        else:
            room, row = capacity, len(rows)
            rows.append([])
        rows[row].append(i)
        if room - n > 0:
            bisect.insort(rooms, (room - n, row))
    return rows


def build_rows(examples: list[Example], rows: list[list[int]], seq_len: int, packed: bool) -> dict[str, np.ndarray]:
    """Arrays (R, seq_len) of inputs, targets (-1: not trained), positions and doc ids for the given rows."""
    R = len(rows)
    inputs = np.zeros((R, seq_len), dtype=np.int64)
    targets = np.full((R, seq_len), -1, dtype=np.int64)
    positions = np.zeros((R, seq_len), dtype=np.int64)
    doc_ids = np.zeros((R, seq_len), dtype=np.int64)
    for r, members in enumerate(rows):
        at = 0
        for d, i in enumerate(members):
            x, y = examples[i]
            n = len(x)
            inputs[r, at:at + n], targets[r, at:at + n] = x, y
            positions[r, at:at + n] = np.arange(n)
            doc_ids[r, at:at + n] = d
            at += n
        doc_ids[r, at:] = len(members)  # the padding is a document of its own
    out = {"inputs": inputs, "targets": targets}
    if packed:
        out.update(positions=positions, doc_ids=doc_ids)
    return out


@dataclass
class ConversationData:
    """Rendered conversations for training and evaluation, and how they are packed (see the module docstring)."""

    name: str
    tokenizer: object
    train: list[Example]
    heldout: list[Example]
    seq_len: int
    packing: bool = True
    dropped: int = 0
    heldout_dropped: int = 0

    @classmethod
    def load(cls, source: str, tokenizer, seq_len: int, *, seed: int = 0, template: str = "auto",
             packing: bool = True, eval_fraction: float = 0.02, task_seed: int = 0) -> ConversationData:
        train, heldout, where = read_conversations(source, seed, eval_fraction, task_seed=task_seed)
        renderer = renderer_for(tokenizer, template)
        render = lambda convs: [training_example(renderer.render(c)) for c in convs]  # noqa: E731
        train_ex, heldout_ex = render(train), render(heldout)
        fits = [e for e in train_ex if len(e[0]) <= seq_len]
        if not fits:
            longest = min(len(e[0]) for e in train_ex)
            raise UserError(f"every conversation of {where} is longer than seq_len {seq_len} (the shortest is "
                            f"{longest + 1} tokens); raise seq_len (up to model.context_len) or shorten them")
        held_fits = [e for e in heldout_ex if len(e[0]) <= seq_len]
        return cls(where, tokenizer, fits, held_fits, seq_len, packing, dropped=len(train_ex) - len(fits),
                   heldout_dropped=len(heldout_ex) - len(held_fits))

    def rows_for_epoch(self, seed: int, epoch: int) -> list[list[int]]:
        order = list(range(len(self.train)))
        rng = random.Random(f"sft:{seed}:{epoch}")
        rng.shuffle(order)
        if not self.packing:
            return [[i] for i in order]
        rows = pack_best_fit([len(self.train[i][0]) for i in order], self.seq_len)
        rows = [[order[j] for j in row] for row in rows]
        rng.shuffle(rows)
        return rows

    def describe(self, seed: int = 0) -> str:
        rows = self.rows_for_epoch(seed, 0)
        tokens = sum(len(x) for x, _ in self.train)
        trained = sum(sum(t >= 0 for t in y) for _, y in self.train)
        dropped = f", {self.dropped} longer than seq_len dropped" if self.dropped else ""
        return (f"{len(self.train):,} conversations from {self.name}{dropped}: {tokens:,} tokens ({trained:,} trained "
                f"on) in {len(rows):,} rows of {self.seq_len} ({tokens / (len(rows) * self.seq_len):.0%} filled"
                f"{', packed best-fit' if self.packing else ', one per row'}); {len(self.heldout)} held out"
                + (f" ({self.heldout_dropped} more longer than seq_len left out)" if self.heldout_dropped else ""))

    def train_loader(self, cfg, info: DistInfo, device: torch.device) -> PackedLoader:
        return PackedLoader(self, cfg.batch_size, cfg.seed, info.rank, info.world_size, device)

    @torch.no_grad()
    def evaluate(self, model, cfg, info: DistInfo, device: torch.device) -> dict[str, float]:
        """Loss, perplexity and bits per byte over the trained (assistant) tokens of the held-out conversations."""
        if not self.heldout:
            return {"loss": float("nan"), "perplexity": float("nan"), "bpb": float("nan"), "eval_tokens": 0}
        rows = pack_best_fit([len(x) for x, _ in self.heldout], self.seq_len) if self.packing else \
            [[i] for i in range(len(self.heldout))]
        arrays = build_rows(self.heldout, rows, self.seq_len, self.packing)
        token_bytes = torch.as_tensor(self.tokenizer.token_byte_lengths(), device=device).double()
        amp = autocast_dtype(device, cfg.precision)
        sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, trained tokens, their bytes
        B = cfg.batch_size
        mine = list(range(info.rank * B, len(rows), info.world_size * B))[:cfg.eval_batches]
        for start in mine:
            batch = {k: torch.as_tensor(v[start:start + B], device=device) for k, v in arrays.items()}
            prefix = prompt_lengths(batch["targets"]) if cfg.model.prefix_lm else None
            with autocast(device, amp):
                loss = model(batch["inputs"], batch["targets"], reduction="none", positions=batch.get("positions"),
                             doc_ids=batch.get("doc_ids"), prefix_len=prefix).double()
            trained = batch["targets"] >= 0
            sums += torch.stack([loss[trained].sum(), trained.sum().double(),
                                 token_bytes[batch["targets"][trained]].sum()])
        loss_sum, count, nbytes = all_reduce_mean(sums).tolist()
        mean = loss_sum / max(count, 1)
        return {"loss": mean, "perplexity": math.exp(min(mean, 50.0)),
                "bpb": loss_sum / (math.log(2) * nbytes) if nbytes else float("nan"),
                "eval_tokens": int(count * info.world_size)}


class PackedLoader:
    """Batches of packed rows: each step takes world_size × batch rows of the epoch's order, this rank its slice;
    an epoch's tail shorter than that is skipped. Position: (epoch, rows taken), saved in checkpoints."""

    def __init__(self, data: ConversationData, batch: int, seed: int, rank: int, world_size: int,
                 device: torch.device):
        self.data, self.batch, self.seed, self.rank, self.world = data, batch, seed, rank, world_size
        self.device = device
        self.epoch, self.taken = 0, 0
        self._epoch_rows: tuple[int, dict[str, np.ndarray]] | None = None
        if len(data.rows_for_epoch(seed, 0)) < batch * world_size:
            raise UserError(f"{data.name} packs into {len(data.rows_for_epoch(seed, 0))} rows, fewer than one "
                            f"step's batch_size × processes = {batch * world_size}; lower batch_size or give more "
                            f"conversations")

    def _arrays(self) -> dict[str, np.ndarray]:
        if self._epoch_rows is None or self._epoch_rows[0] != self.epoch:
            rows = self.data.rows_for_epoch(self.seed, self.epoch)
            self._epoch_rows = (self.epoch, build_rows(self.data.train, rows, self.data.seq_len, self.data.packing))
        return self._epoch_rows[1]

    def next_batch(self) -> dict[str, torch.Tensor]:
        step = self.batch * self.world
        if self.taken + step > len(self._arrays()["inputs"]):
            self.epoch, self.taken = self.epoch + 1, 0
        arrays = self._arrays()
        first = self.taken + self.rank * self.batch
        self.taken += step
        return {k: torch.from_numpy(v[first:first + self.batch]).to(self.device, non_blocking=True)
                for k, v in arrays.items()}

    def rows_per_epoch(self) -> int:
        return len(self._arrays()["inputs"])

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "taken": self.taken, "seed": self.seed, "rows": self.rows_per_epoch(),
                "seq_len": self.data.seq_len}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seq_len") != self.data.seq_len or state.get("seed") != self.seed:
            raise UserError("the checkpoint's data position is from another seq_len or seed; resume with the same "
                            "settings, or start a new run")
        self.epoch, self.taken = int(state["epoch"]), int(state["taken"])
        if self.rows_per_epoch() != state.get("rows"):
            raise UserError(f"the conversations pack into {self.rows_per_epoch()} rows, the checkpoint's into "
                            f"{state.get('rows')}: the data changed; resume with the same data or start a new run")
