"""`redline tokenizer`: train a byte-level BPE tokenizer, or describe one.

    redline tokenizer train --inputs corpus.jsonl.xz --vocab-size 32768 --out tokenizers/mycorpus
    redline tokenizer info gpt2

`train` prints the vocabulary size, the identity hash and the compression (UTF-8 bytes per token) measured on
the start of the training text, then one JSON line last. Use the folder with `--tokenizer DIR` elsewhere.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Literal

import tyro

from redline.errors import UserError

_COMPRESSION_SAMPLE_BYTES = 10_000_000  # compression is measured on the first this-many bytes of the text


@dataclass
class TrainTokenizerConfig:
    inputs: tuple[str, ...] = ()
    """Text to train on: .txt, .jsonl[.gz|.xz] or .parquet files, folders of them, or hf:NAME[:CONFIG][@SPLIT]."""
    out: str = ""
    """Folder to save the tokenizer into (tokenizer.json + redline_tokenizer.json)."""
    vocab_size: int = 32768
    """Vocabulary size, <|endoftext|> included."""
    max_bytes: int = 1_000_000_000
    """Train on the inputs' first documents up to this many bytes of text."""
    min_frequency: int = 2
    """Merge only pairs seen at least this many times."""
    text_field: str = "text"
    """The JSON field / Parquet column / dataset column that holds the text."""
    encoding_errors: Literal["strict", "replace", "skip"] = "strict"
    """Text that is not UTF-8: strict stops with the file and byte offset; replace turns each bad byte into U+FFFD;
    skip leaves such documents (a .txt file, a JSONL line) out. replace and skip say how many they touched."""
    overwrite: bool = False
    """Replace a tokenizer already saved in --out."""

    def validate(self) -> None:
        if not self.inputs:
            raise UserError("give --inputs: .txt, .jsonl[.gz|.xz] or .parquet files, folders, or hf:NAME datasets")
        if not self.out:
            raise UserError("give --out: the folder to save the tokenizer into")
        if self.vocab_size < 257:
            raise UserError(f"--vocab-size must be at least 257 (256 bytes + <|endoftext|>), got {self.vocab_size}")
        if self.max_bytes <= 0:
            raise UserError(f"--max-bytes must be positive, got {self.max_bytes}")


@dataclass
class InfoTokenizerConfig:
    spec: tyro.conf.Positional[str] = ""
    """bytes, gpt2, a tokenizer.json file, or a folder holding a tokenizer (e.g. a prepared data folder)."""


def train_main(argv: list[str]) -> int:
    from pathlib import Path

    from redline.commands.data import bare_bool_flags, capped_documents
    from redline.config import parse
    from redline.data.sources import iter_documents
    from redline.tokenizer import HF_FILE, META_FILE, train_bpe

    cfg = parse(TrainTokenizerConfig, bare_bool_flags(TrainTokenizerConfig, argv), prog="redline tokenizer train",
                description=TRAIN_HELP)
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {cfg.out} is a file; give a folder to save the tokenizer into")
    if ((out / HF_FILE).exists() or (out / META_FILE).exists()) and not cfg.overwrite:
        raise UserError(f"{out} already holds a tokenizer; pass --overwrite to replace it, or choose another --out")
    docs = iter_documents(cfg.inputs, cfg.text_field, cfg.encoding_errors)
    start = time.perf_counter()
    sample: list[str] = []  # the first documents, kept to measure compression afterwards
    sample_bytes = 0

    def remember(stream):
        nonlocal sample_bytes
        for doc in stream:
            if sample_bytes < _COMPRESSION_SAMPLE_BYTES:
                sample.append(doc)
                sample_bytes += len(doc.encode("utf-8"))
            yield doc

    tokenizer = train_bpe(remember(capped_documents(docs, cfg.max_bytes)), cfg.vocab_size, cfg.min_frequency)
    seconds = time.perf_counter() - start
    save_whole(tokenizer, out)
    tokens = sum(len(ids) for ids in tokenizer.encode_batch(sample))
    record = {"out": str(out), "kind": tokenizer.name, "vocab_size": tokenizer.vocab_size,
              "eot_id": tokenizer.eot_id, "identity": tokenizer.identity,
              "bytes_per_token": round(sample_bytes / max(tokens, 1), 4), "measured_on_bytes": sample_bytes,
              "seconds": round(seconds, 3)}
    print(f"saved a {tokenizer.vocab_size:,}-token BPE to {out} in {seconds:.1f} s | "
          f"identity {tokenizer.identity[:12]} | "
          f"{record['bytes_per_token']:.3f} bytes/token on the first {sample_bytes / 1e6:,.1f} MB of the text")
    sys.stdout.flush()
    print(json.dumps(record))
    return 0


def save_whole(tokenizer, out) -> None:
    """The tokenizer's files into `out` as one step, so a failure (a full disk) leaves the previous tokenizer whole:
    they are saved into a temporary folder beside `out`, which then replaces `out` where it holds nothing but a
    tokenizer; where it holds other files too, the new files are moved in one by one, redline_tokenizer.json last
    (so a half-moved folder still loads its tokenizer.json, as a plain Hugging Face tokenizer)."""
    import os
    import secrets
    import shutil

    from redline.durable import fsync_dir, replace_folder
    from redline.tokenizer import HF_FILE, META_FILE

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        tokenizer.save(tmp)
        if not out.exists() or {p.name for p in out.iterdir()} <= {HF_FILE, META_FILE}:
            replace_folder(tmp, out)
        else:
            for name in (HF_FILE, META_FILE):
                if (tmp / name).exists():
                    os.replace(tmp / name, out / name)
            fsync_dir(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.spec = str(out.resolve()) if tokenizer.name == "bpe" else tokenizer.spec


def info_main(argv: list[str]) -> int:
    from redline.config import parse
    from redline.tokenizer import load_tokenizer

    cfg = parse(InfoTokenizerConfig, argv, prog="redline tokenizer info", description=INFO_HELP)
    if not cfg.spec:
        raise UserError("give a tokenizer: `redline tokenizer info bytes|gpt2|PATH`")
    tokenizer = load_tokenizer(cfg.spec)
    record = {"spec": cfg.spec, "kind": tokenizer.name, "vocab_size": tokenizer.vocab_size,
              "eot_id": tokenizer.eot_id, "identity": tokenizer.identity}
    print(f"{cfg.spec}: {tokenizer.name}, {tokenizer.vocab_size:,} tokens, <|endoftext|> = {tokenizer.eot_id}, "
          f"identity {tokenizer.identity}")
    print(json.dumps(record))
    return 0


TRAIN_HELP = "Train a byte-level BPE tokenizer on text and save it to a folder."
INFO_HELP = "Show a tokenizer's kind, vocabulary size, end-of-text id and identity hash."
SUBCOMMANDS = {"train": (train_main, TRAIN_HELP), "info": (info_main, INFO_HELP)}


def usage() -> str:
    lines = ["usage: redline tokenizer SUBCOMMAND [ARGS...]", "", "subcommands:"]
    lines += [f"  {name:<6}  {summary}" for name, (_, summary) in SUBCOMMANDS.items()]
    lines += ["", "`redline tokenizer SUBCOMMAND --help` lists its options."]
    return "\n".join(lines)


def main(argv: list[str]) -> int | None:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] not in SUBCOMMANDS:
        raise UserError(f"unknown subcommand {argv[0]!r}; use one of: {', '.join(SUBCOMMANDS)}")
    return SUBCOMMANDS[argv[0]][0](argv[1:])
