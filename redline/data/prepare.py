"""`prepare`: documents -> token shards + meta.json, the folder every training run reads.

How it works:
1. documents stream from `sources.iter_documents` in batches, read by a background thread so that reading and
   decompressing overlap with tokenizing;
2. batches are tokenized by a pool of processes, one thread each, and come back as flat numpy arrays in input
   order; the end-of-text token is appended after every document. (Processes, not the tokenizer library's own
   threads in one process: there the one Python side that hands out the texts and collects the ids becomes the
   bottleneck);
3. each document goes to train or val by a seeded hash of its index (so the split does not depend on batching or
   worker count), or by which inputs it came from when `val_inputs` are given. When that leaves val with fewer
   than `min_val_tokens` tokens (a single .txt file is one document; a few documents rarely draw one), the end
   of the training stream tops it up: the last documents, and the last tokens of the document before them, move
   to val (at most half the tokens), and one line on stderr says so;
4. each split's tokens fill fixed-size shards `train_000000.bin`, ... (a document may continue in the next shard:
   the loader reads the shards as one stream);
5. everything is written into a temporary folder next to `out_dir` that is renamed into place at the end, so an
   interrupted prepare leaves no half-written data set under the final name.

The folder holds the tokenizer too (`load_tokenizer(out_dir)` works), and meta.json records the tokenizer's
identity, vocab size, and per split the shards, tokens, documents and UTF-8 bytes of text (for bits per byte).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import json
import math
import os
import queue
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from redline.data.shards import token_dtype, write_shard
from redline.data.sources import iter_documents
from redline.durable import disk_full_error, is_disk_full, replace_folder, write_atomic
from redline.errors import UserError
from redline.tokenizer import META_FILE as TOKENIZER_FILE
from redline.tokenizer import Tokenizer, load_tokenizer

META_FILE = "meta.json"
FORMAT = "redline-token-shards"
FORMAT_VERSION = 1
SPLITS = ("train", "val")
_BATCH_DOCS = 256  # documents per task handed to a tokenizer process
_BATCH_BYTES = 1 << 20  # ... or fewer, when they add up to this many characters
_IN_FLIGHT_PER_WORKER = 2  # tasks queued per process: keeps them busy without reading the corpus into memory
# val gets at least this many tokens when there are twice as many in all: one window of the longest preset
# context (2048) and its next-token targets, so a single long document is enough to train any preset on
DEFAULT_MIN_VAL_TOKENS = 2049


def _is_val(index: int, seed: int, fraction: float) -> bool:
    """Deterministic coin flip per document: hash(seed, index) mapped to [0, 1) compared with the fraction."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64 < fraction


class _SplitWriter:
    """Collects one split's tokens into a fixed-size buffer and writes a shard whenever it fills."""

    def __init__(self, folder: Path, split: str, tokenizer: Tokenizer, shard_tokens: int):
        self.folder, self.split, self.tokenizer = folder, split, tokenizer
        self.buffer = np.empty(shard_tokens, dtype=token_dtype(tokenizer.vocab_size))  # pages are touched lazily
        self.fill = 0
        self.eot = np.array([tokenizer.eot_id], dtype=self.buffer.dtype)
        self.shards: list[str] = []
        self.tokens = self.documents = self.bytes = 0

    def add(self, ids: np.ndarray, text_bytes: int, end: bool = True) -> None:
        """Append one document's tokens and (end=True) the end-of-text token after them; end=False for the start
        of a document whose end went to the other split."""
        self._append(ids)
        if end:
            self._append(self.eot)
        self.documents += 1
        self.bytes += text_bytes

    def _append(self, ids: np.ndarray) -> None:
        self.tokens += ids.size
        while ids.size:
            take = min(ids.size, self.buffer.size - self.fill)
            self.buffer[self.fill : self.fill + take] = ids[:take]
            self.fill += take
            ids = ids[take:]
            if self.fill == self.buffer.size:
                self._flush()

    def _flush(self) -> None:
        name = f"{self.split}_{len(self.shards):06d}.bin"
        write_shard(self.folder / name, self.buffer[: self.fill], self.tokenizer.identity, self.tokenizer.vocab_size)
        self.shards.append(name)
        self.fill = 0

    def close(self) -> dict:
        if self.fill:
            self._flush()
        return {"shards": self.shards, "num_shards": len(self.shards), "tokens": self.tokens,
                "documents": self.documents, "bytes": self.bytes}


class _TrainTail:
    """The last training documents, held back from the train writer while they are all that trail the stream's
    end by fewer than `keep` tokens, so that the end of the training text can still become validation data once
    the whole stream is known. Each held document is (ids, UTF-8 bytes); it counts len(ids) + 1 tokens (its EOT)."""

    def __init__(self, writer: _SplitWriter, keep: int):
        self.writer, self.keep = writer, keep
        self.docs: collections.deque = collections.deque()
        self.tokens = 0

    def add(self, ids: np.ndarray, text_bytes: int) -> None:
        self.docs.append((ids, text_bytes))
        self.tokens += ids.size + 1
        while len(self.docs) > 1 and self.tokens - (self.docs[0][0].size + 1) >= self.keep:
            first = self.docs.popleft()
            self.tokens -= first[0].size + 1
            self.writer.add(*first)

    def move_to(self, val: _SplitWriter, count: int, byte_lengths) -> int:
        """Move the last `count` tokens of the held stream to `val` (whole documents, then the end of the one
        before them); returns the tokens moved. byte_lengths() gives UTF-8 bytes per token id, to split a
        document's byte count."""
        moved: list[tuple[np.ndarray, int]] = []
        count = min(count, self.tokens)
        taken = 0
        while taken < count:
            ids, nbytes = self.docs[-1]
            if ids.size + 1 <= count - taken:
                self.docs.pop()
                moved.append((ids, nbytes))
                taken += ids.size + 1
                continue
            cut = ids.size + 1 - (count - taken)  # the head ids[:cut] stays; ids[cut:] and the EOT move
            head_bytes = int(byte_lengths()[ids[:cut]].sum())
            self.docs[-1] = (ids[:cut], head_bytes, False)
            moved.append((ids[cut:], nbytes - head_bytes))
            taken = count
        self.tokens -= taken
        for ids, nbytes in reversed(moved):
            val.add(ids, nbytes)
        return taken

    def flush(self) -> None:
        for doc in self.docs:
            self.writer.add(*doc)
        self.docs.clear()


_worker_tokenizer: Tokenizer | None = None  # set in each tokenizer process by _init_worker


def _init_worker(tokenizer: Tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def _encode_texts(texts: list[str], dtype: np.dtype, tokenizer: Tokenizer | None = None):
    """(flat ids, tokens per text, UTF-8 bytes per text) of a batch; one thread (the processes are the parallelism).

    Returning flat numpy arrays rather than lists of lists keeps the trip back to the parent process cheap.
    """
    tok = tokenizer or _worker_tokenizer
    encoded = [tok.encode(t) for t in texts]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=dtype, count=int(lengths.sum()))
    nbytes = np.fromiter((len(t.encode("utf-8")) for t in texts), dtype=np.int64, count=len(texts))
    return flat, lengths, nbytes


def _start_pool(tokenizer: Tokenizer, workers: int):
    """Tokenizer processes: forked on Linux (starts in milliseconds, nothing pickled), spawned elsewhere."""
    import multiprocessing

    fork = sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if fork else "spawn")
    # Hugging Face tokenizers warns in every forked child once its thread pool was used (train_bpe does);
    # saying "no parallelism" while the children start silences that, and each child is one thread anyway
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        return context.Pool(workers, initializer=_init_worker, initargs=(tokenizer,))
    finally:
        if saved is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def _encoded_batches(batches: Iterator[list[tuple[str, str]]], tokenizer: Tokenizer, workers: int, dtype):
    """Yield (tags, flat ids, lengths, bytes) per batch, in input order, tokenized by `workers` processes."""
    if workers <= 1:
        for batch in _prefetch(batches):
            yield [tag for tag, _ in batch], *_encode_texts([t for _, t in batch], dtype, tokenizer)
        return
    with _start_pool(tokenizer, workers) as pool:  # before the reader thread starts: fork with one thread
        pending: collections.deque = collections.deque()
        for batch in _prefetch(batches):
            pending.append(([tag for tag, _ in batch], pool.apply_async(_encode_texts, ([t for _, t in batch], dtype))))
            if len(pending) >= workers * _IN_FLIGHT_PER_WORKER:
                tags, result = pending.popleft()
                yield tags, *result.get()
        while pending:
            tags, result = pending.popleft()
            yield tags, *result.get()


def _batches(docs: Iterable[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    batch, size = [], 0
    for item in docs:
        batch.append(item)
        size += len(item[1])
        if len(batch) >= _BATCH_DOCS or size >= _BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _prefetch(iterator: Iterator, depth: int = 2) -> Iterator:
    """Run `iterator` in a daemon thread, `depth` items ahead; its exceptions re-raise here."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def worker():
        try:
            for item in iterator:
                while not stop.is_set():
                    try:
                        q.put(("item", item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(("done", done))
        except BaseException as e:  # handed to the consumer, which raises it
            q.put(("error", e))

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    try:
        while True:
            kind, item = q.get()
            if kind == "done":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()


def _tagged(documents: Iterable[str], val_documents: Iterable[str] | None) -> Iterator[tuple[str, str]]:
    """(split or "", text): "" means 'decide by hash' (no separate val documents given)."""
    tag = "train" if val_documents is not None else ""
    for text in documents:
        yield tag, text
    if val_documents is not None:
        for text in val_documents:
            yield "val", text


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder path")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(f"{out} already exists and is not empty; pass --overwrite to replace it, "
                        f"or choose another --out")


def _replace_dir(tmp: Path, out: Path, overwrite: bool) -> None:
    """Move the finished temp folder to `out` (replacing an old data set only when allowed)."""
    _check_out_dir(out, overwrite)  # again: another process may have written it meanwhile
    replace_folder(tmp, out)


def prepare(
    inputs: list[str] | tuple[str, ...],
    out_dir: str | os.PathLike,
    tokenizer: Tokenizer | str,
    *,
    val_fraction: float = 0.01,
    val_inputs: list[str] | tuple[str, ...] | None = None,
    shard_tokens: int = 2**26,
    num_workers: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
    text_field: str = "text",
    progress: bool | None = None,
    min_val_tokens: int = DEFAULT_MIN_VAL_TOKENS,
    encoding_errors: str = "strict",
) -> dict:
    """Tokenize the documents of `inputs` (see sources.py) into train/val shards under `out_dir`.

    Returns the summary that is also written to meta.json (plus "out_dir").
    val_fraction: share of documents sent to val by a seeded hash (ignored when val_inputs are given).
    min_val_tokens: when val_fraction is positive and the hashed split gives val fewer tokens than this (a single
        document gives it none), the end of the training text tops val up to max(val_fraction of the tokens,
        min_val_tokens), at most half of all tokens; meta.json's "val_tokens_from_train_end" says how many moved.
    val_inputs: inputs whose documents make the val split instead (all of `inputs` is then train).
    encoding_errors: what to do with text that is not UTF-8: strict (an error naming the file and offset),
        replace or skip (see sources.py).
    num_workers: tokenizer processes (None: one per core; 1: tokenize in this process). The output does not
        depend on it.
    progress: show a progress line on stderr (None: only when stderr is a terminal).
    """
    _check_out_dir(Path(out_dir).expanduser(), overwrite)  # before reading anything
    documents = iter_documents(inputs, text_field, encoding_errors)  # raises now for a missing path
    val_documents = iter_documents(val_inputs, text_field, encoding_errors) if val_inputs else None
    return prepare_documents(documents, out_dir, tokenizer, val_documents=val_documents, val_fraction=val_fraction,
                             sources=list(inputs), val_sources=list(val_inputs or []), shard_tokens=shard_tokens,
                             num_workers=num_workers, seed=seed, overwrite=overwrite, progress=progress,
                             min_val_tokens=min_val_tokens,
                             extra_meta={"text_field": text_field, "encoding_errors": encoding_errors})


def prepare_documents(
    documents: Iterable[str],
    out_dir: str | os.PathLike,
    tokenizer: Tokenizer | str,
    *,
    val_documents: Iterable[str] | None = None,
    val_fraction: float = 0.01,
    sources: list[str] | None = None,
    val_sources: list[str] | None = None,
    shard_tokens: int = 2**26,
    num_workers: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool | None = None,
    min_val_tokens: int = DEFAULT_MIN_VAL_TOKENS,
    extra_meta: dict | None = None,
) -> dict:
    """`prepare` for documents already in hand (an iterable of texts); `sources` only go into meta.json."""
    start = time.perf_counter()
    if not 0.0 <= val_fraction < 1.0:
        raise UserError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if min_val_tokens < 0:
        raise UserError(f"min_val_tokens must be >= 0, got {min_val_tokens}")
    if shard_tokens <= 0:
        raise UserError(f"shard_tokens must be positive, got {shard_tokens}")
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    num_workers = num_workers or os.cpu_count() or 1
    out = Path(out_dir).expanduser()
    _check_out_dir(out, overwrite)
    use_val_documents = val_documents is not None
    tagged = _tagged(documents, val_documents)

    created = first_missing(out.parent)  # removed again if this fails: no empty run directory is left behind
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        tmp.mkdir()
        splits, moved = _write_splits(tmp, tagged, tok, shard_tokens, num_workers, seed, progress,
                                      val_fraction if not use_val_documents else 0.0, min_val_tokens)
        if moved:
            print(f"redline: val split: the last {moved:,} tokens of the training text (the document split gave "
                  f"{splits['val']['tokens'] - moved:,} val tokens, fewer than {min_val_tokens:,}); train keeps "
                  f"{splits['train']['tokens']:,}", file=sys.stderr)

        tok.save(tmp)
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "tokenizer": {
                "kind": tok.name,
                # what load_tokenizer() takes; "." means this folder (the tokenizer files are saved here)
                "spec": tok.spec if tok.name in ("bytes", "gpt2") else ".",
                "identity": tok.identity,
                "vocab_size": tok.vocab_size,
                "eot_id": tok.eot_id,
                "dtype": token_dtype(tok.vocab_size).name,
            },
            "splits": splits,
            "inputs": [str(i) for i in sources or []],
            "val_inputs": [str(i) for i in val_sources or []],
            "val_fraction": 0.0 if use_val_documents else val_fraction,
            "min_val_tokens": min_val_tokens,
            "val_tokens_from_train_end": moved,
            "seed": seed,
            "shard_tokens": shard_tokens,
            **(extra_meta or {}),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - start, 3),
            "redline_version": _version(),
        }
        write_atomic(tmp / META_FILE, json.dumps(meta, indent=2) + "\n")
        _replace_dir(tmp, out, overwrite)
        if tok.name == "bpe":
            tok.spec = str(out.resolve())  # save() pointed it at the temp folder, renamed away just now
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(out.parent, created)
        if isinstance(e, Exception) and not isinstance(e, UserError) and is_disk_full(e):
            raise disk_full_error(f"the token shards of {out}", "nothing was written under that name") from None
        raise
    return {"out_dir": str(out), **meta}


def _write_splits(tmp: Path, tagged, tok: Tokenizer, shard_tokens: int, num_workers: int, seed: int,
                  progress: bool | None, val_fraction: float, min_val_tokens: int) -> tuple[dict, int]:
    """Tokenize the (tag, text) documents into `tmp`'s train and val shards. val_fraction 0: the tags alone say
    which split (given validation documents). -> (each split's summary, tokens moved from train's end to val)."""
    writers = {split: _SplitWriter(tmp, split, tok, shard_tokens) for split in SPLITS}
    tail = _TrainTail(writers["train"], min_val_tokens)
    index = 0
    # closing(): on an error the pool of tokenizer processes is shut down now, not when garbage is collected
    with _Progress(progress) as bar, contextlib.closing(
            _encoded_batches(_batches(tagged), tok, num_workers, token_dtype(tok.vocab_size))) as encoded:
        for tags, flat, lengths, nbytes in encoded:
            ends = np.cumsum(lengths)
            for k, tag in enumerate(tags):
                doc = (flat[ends[k] - lengths[k] : ends[k]], int(nbytes[k]))
                split = tag or ("val" if _is_val(index, seed, val_fraction) else "train")
                index += 1
                (writers["val"] if split == "val" else tail).add(*doc)
            bar.advance(len(tags), flat.size + len(tags), int(nbytes.sum()))
    moved = _top_up_val(writers, tail, tok, val_fraction, min_val_tokens) if val_fraction > 0 else 0
    tail.flush()
    return {split: w.close() for split, w in writers.items()}, moved


def _top_up_val(writers: dict[str, _SplitWriter], tail: _TrainTail, tok: Tokenizer, val_fraction: float,
                min_val_tokens: int) -> int:
    """Move the end of the training stream to val when the document split gave val fewer than min_val_tokens
    tokens (or none): up to max(val_fraction of all tokens, min_val_tokens), never more than half of them."""
    val = writers["val"].tokens
    total = writers["train"].tokens + tail.tokens + val
    floor = min(min_val_tokens, total // 2)
    if val >= floor and val > 0:
        return 0
    target = min(max(math.ceil(val_fraction * total), floor), total // 2)
    lengths = None

    def byte_lengths():
        nonlocal lengths
        if lengths is None:
            lengths = tok.token_byte_lengths()
        return lengths

    return tail.move_to(writers["val"], target - val, byte_lengths) if target > val else 0


def first_missing(path: Path) -> Path | None:
    """The highest of `path` and its parents that does not exist yet (None: `path` exists): what to remove again
    when a failure must leave nothing behind."""
    missing = None
    for candidate in [path, *path.parents]:
        if candidate.exists():
            break
        missing = candidate
    return missing


def _remove_empty(folder: Path, up_to: Path | None) -> None:
    """Remove `folder` and its parents up to `up_to` (inclusive) while they are empty; nothing when up_to is None."""
    if up_to is None:
        return
    for path in [folder, *folder.parents]:
        try:
            path.rmdir()
        except OSError:
            return
        if path == up_to:
            return


def _version() -> str:
    try:
        from redline import __version__

        return __version__
    except ImportError:
        return "unknown"


class _Progress:
    """A rich progress line (documents, tokens, MB of text, rate) on stderr, or nothing."""

    def __init__(self, enabled: bool | None):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.docs = self.tokens = self.chars = 0

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                     console=Console(stderr=True), transient=False)
            self.progress.__enter__()
            self.task = self.progress.add_task("tokenizing", total=None)
            self.start = time.perf_counter()
        return self

    def advance(self, docs: int, tokens: int, chars: int) -> None:
        self.docs += docs
        self.tokens += tokens
        self.chars += chars
        if self.enabled:
            rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
            self.progress.update(self.task, description=(
                f"tokenizing: {self.docs:,} documents, {self.tokens:,} tokens, "
                f"{self.chars / 1e6:,.1f} M chars, {rate / 1e6:.2f} M tokens/s"))

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.__exit__(*exc)
        return False


# ----------------------------------------------------------------------------------------------------
# reading a prepared folder


def is_prepared(data_dir: str | os.PathLike) -> bool:
    """True for a folder made by `prepare` (it has a meta.json of our format); never raises."""
    path = Path(data_dir).expanduser() / META_FILE
    try:
        return path.is_file() and json.loads(path.read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def check_prepared(data_dir: str | os.PathLike) -> bool:
    """True for a prepared folder (its meta.json checked by load_meta), False for raw text. A meta.json beside
    shards or a tokenizer file that `prepare` writes makes a prepared folder even when it is damaged: load_meta
    then names it, where reading the folder as raw text would find "no documents" in it."""
    folder = Path(data_dir).expanduser()
    if not (folder / META_FILE).is_file():
        return False
    written_by_prepare = (folder / TOKENIZER_FILE).is_file() or any(folder.glob("train_*.bin")) or \
        any(folder.glob("val_*.bin"))
    if not (is_prepared(folder) or written_by_prepare):
        return False
    load_meta(folder)
    return True


def load_meta(data_dir: str | os.PathLike) -> dict:
    """meta.json of a prepared folder, checked; UserError when the folder is not one."""
    folder = Path(data_dir).expanduser()
    command = f"redline data prepare --inputs TEXT... --out {folder}"
    if not folder.is_dir():
        raise UserError(f"data folder {folder} does not exist; run `{command}`")
    path = folder / META_FILE
    if not path.is_file():
        raise UserError(f"{folder} is not a prepared data folder (no {META_FILE}); run `{command}`")
    remake = f"re-run `{command} --overwrite`"
    try:
        meta = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise UserError(f"{path} is damaged ({' '.join(str(e).split())}); {remake}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(f"{path} is damaged or was not written by `redline data prepare` (its \"format\" is not "
                        f"{FORMAT!r}); {remake}")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise UserError(f"{folder} has data format {meta['format_version']}, newer than this redline reads "
                        f"({FORMAT_VERSION}); upgrade redline or {remake}")
    splits = meta.get("splits")
    for split in SPLITS:
        if not isinstance(splits, dict) or split not in splits:
            raise UserError(f"{path} is damaged (it lists no {split!r} split); {remake}")
        entry = splits[split]
        if not (isinstance(entry, dict) and isinstance(entry.get("shards"), list)
                and all(isinstance(n, str) and "/" not in n and n not in ("", ".", "..") for n in entry["shards"])
                and _count(entry.get("tokens"))):
            raise UserError(f"{path} is damaged (its {split!r} split has no list of shard files and token count); "
                            f"{remake}")
    tok = meta.get("tokenizer")
    if not (isinstance(tok, dict) and isinstance(tok.get("identity"), str) and isinstance(tok.get("spec"), str)
            and _count(tok.get("vocab_size")) and tok["vocab_size"] > 0):
        raise UserError(f"{path} is damaged (no tokenizer identity, spec and vocab_size); {remake}")
    return meta


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load_data_tokenizer(data_dir: str | os.PathLike) -> Tokenizer:
    """The tokenizer a prepared folder was made with, checked against the identity in its meta.json."""
    meta = load_meta(data_dir)
    info = meta["tokenizer"]
    spec = str(Path(data_dir).expanduser()) if info["spec"] == "." else info["spec"]
    tok = load_tokenizer(spec)
    if tok.identity != info["identity"]:
        raise UserError(f"the tokenizer loaded from {spec} ({tok.identity[:12]}) is not the one {data_dir} was "
                        f"prepared with ({info['identity'][:12]}); re-run `redline data prepare`")
    return tok
