"""`redline data`: turn text into token shards, and describe a prepared folder.

    redline data prepare --inputs corpus.jsonl.xz more_texts/ --out data/mycorpus --tokenizer bpe --vocab-size 32768
    redline data prepare --inputs hf:roneneldan/TinyStories --out data/tinystories --tokenizer gpt2
    redline data info data/mycorpus

`prepare` prints a table of the splits, then one JSON line (the machine-readable summary) last.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tyro

from redline.errors import UserError


@dataclass
class PrepareConfig:
    inputs: tuple[str, ...] = ()
    """Text to prepare: .txt, .jsonl[.gz|.xz] or .parquet files, folders of them, or hf:NAME[:CONFIG][@SPLIT]."""
    out: str = ""
    """Folder to create with the shards, the tokenizer and meta.json."""
    tokenizer: str = "bpe"
    """bytes, gpt2, a tokenizer.json file or folder, or bpe: train a byte-level BPE on the inputs first."""
    vocab_size: int = 32768
    """Vocabulary size of the BPE trained when tokenizer=bpe."""
    tokenizer_train_bytes: int = 1_000_000_000
    """tokenizer=bpe only: train on the inputs' first documents up to this many bytes of text."""
    val_fraction: float = 0.01
    """Share of documents held out for validation (chosen by a seeded hash of each document's index)."""
    val_inputs: tuple[str, ...] = ()
    """Inputs that make the validation split instead of --val-fraction (all of --inputs is then training data)."""
    text_field: str = "text"
    """The JSON field / Parquet column / dataset column that holds the text."""
    encoding_errors: Literal["strict", "replace", "skip"] = "strict"
    """Text that is not UTF-8: strict stops with the file and byte offset; replace turns each bad byte into U+FFFD;
    skip leaves such documents (a .txt file, a JSONL line) out. replace and skip say how many they touched."""
    shard_tokens: int = 2**26
    """Tokens per shard file (the last shard of each split is shorter)."""
    workers: int = 0
    """Tokenizer processes (0: one per core; 1: tokenize in the main process). The output does not depend on it."""
    seed: int = 0
    """Seed of the train/val split."""
    overwrite: bool = False
    """Replace --out if it already holds data (the old data stays until the new is complete)."""

    def validate(self) -> None:
        if not self.inputs:
            raise UserError("give --inputs: .txt, .jsonl[.gz|.xz] or .parquet files, folders, or hf:NAME datasets")
        if not self.out:
            raise UserError("give --out: the folder to write the shards into")
        if self.vocab_size < 257:
            raise UserError(f"--vocab-size must be at least 257, got {self.vocab_size}")
        if self.tokenizer_train_bytes <= 0 or self.shard_tokens <= 0 or self.workers < 0:
            raise UserError("--tokenizer-train-bytes and --shard-tokens must be positive, --workers >= 0")
        if not 0.0 <= self.val_fraction < 1.0:
            raise UserError(f"--val-fraction must be in [0, 1), got {self.val_fraction}")


@dataclass
class InfoConfig:
    path: tyro.conf.Positional[str] = ""
    """A folder made by `redline data prepare`."""
    verify: bool = False
    """Also read every shard and check its checksum."""


_BOOL_WORDS = {"true", "false", "1", "0", "yes", "no", "on", "off"}


def bare_bool_flags(cls, argv: list[str]) -> list[str]:
    """`--overwrite` alone means `--overwrite True` (redline's parser wants a value after every boolean)."""
    flags = {f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(cls) if f.type in (bool, "bool")}
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg in flags and (i + 1 == len(argv) or argv[i + 1].lower() not in _BOOL_WORDS):
            out.append("True")
    return out


def capped_documents(documents: Iterable[str], max_bytes: int) -> Iterator[str]:
    """The first documents, up to about `max_bytes` of UTF-8 text (the document crossing the cap is included)."""
    seen = 0
    for doc in documents:
        yield doc
        seen += len(doc.encode("utf-8"))
        if seen >= max_bytes:
            return


def prepare_main(argv: list[str]) -> int:
    from redline.config import parse
    from redline.data.prepare import prepare
    from redline.data.sources import iter_documents
    from redline.tokenizer import load_tokenizer, train_bpe

    cfg = parse(PrepareConfig, bare_bool_flags(PrepareConfig, argv), prog="redline data prepare",
                description=PREPARE_HELP)
    out = Path(cfg.out)
    if out.is_dir() and any(out.iterdir()) and not cfg.overwrite:  # fail before a long tokenizer training
        raise UserError(f"{out} already exists and is not empty; pass --overwrite to replace it, "
                        f"or choose another --out")
    start = time.perf_counter()
    if cfg.tokenizer == "bpe":
        docs = iter_documents(cfg.inputs, cfg.text_field, cfg.encoding_errors)
        print(f"training a {cfg.vocab_size}-token BPE on up to {cfg.tokenizer_train_bytes / 1e6:,.0f} MB of the inputs",
              file=sys.stderr)
        tokenizer = train_bpe(capped_documents(docs, cfg.tokenizer_train_bytes), vocab_size=cfg.vocab_size)
    else:
        tokenizer = load_tokenizer(cfg.tokenizer)
    summary = prepare(cfg.inputs, out, tokenizer, val_fraction=cfg.val_fraction, val_inputs=cfg.val_inputs or None,
                      shard_tokens=cfg.shard_tokens, num_workers=cfg.workers or None, seed=cfg.seed,
                      overwrite=cfg.overwrite, text_field=cfg.text_field, encoding_errors=cfg.encoding_errors)
    summary["seconds"] = round(time.perf_counter() - start, 3)  # tokenizer training included
    print_summary(summary)
    return 0


def print_summary(meta: dict) -> None:
    """A table of the splits, then the one-line JSON summary (last line of stdout)."""
    from rich.console import Console
    from rich.table import Table

    tok = meta["tokenizer"]
    table = Table(title=f"{meta.get('out_dir', '')}: tokenizer {tok['kind']}, vocab {tok['vocab_size']:,}, "
                        f"identity {tok['identity'][:12]}")
    for column in ("split", "shards", "documents", "tokens", "MB of text", "bytes/token"):
        table.add_column(column, justify="left" if column == "split" else "right")
    splits = {}
    for name, split in meta["splits"].items():
        ratio = split["bytes"] / split["tokens"] if split["tokens"] else 0.0
        table.add_row(name, f"{split['num_shards']:,}", f"{split['documents']:,}", f"{split['tokens']:,}",
                      f"{split['bytes'] / 1e6:,.2f}", f"{ratio:.3f}")
        splits[name] = {k: split[k] for k in ("num_shards", "tokens", "documents", "bytes")}
        splits[name]["bytes_per_token"] = round(ratio, 4)
    console = Console()
    console.print(table)
    tokens = sum(s["tokens"] for s in meta["splits"].values())
    record = {"out_dir": meta.get("out_dir"), "tokenizer": tok, "splits": splits, "tokens": tokens}
    if "seconds" in meta:
        record["seconds"] = meta["seconds"]
        record["tokens_per_second"] = round(tokens / max(meta["seconds"], 1e-9))
        console.print(f"{tokens:,} tokens in {meta['seconds']:.1f} s ({record['tokens_per_second']:,} tokens/s)")
    sys.stdout.flush()
    print(json.dumps(record))


def info_main(argv: list[str]) -> int:
    from redline.config import parse
    from redline.data.prepare import load_meta
    from redline.data.shards import read_shard

    cfg = parse(InfoConfig, bare_bool_flags(InfoConfig, argv), prog="redline data info", description=INFO_HELP)
    if not cfg.path:
        raise UserError("give the folder: `redline data info DIR`")
    meta = load_meta(cfg.path)
    meta["out_dir"] = cfg.path
    for split in meta["splits"].values():
        for name in split["shards"]:
            # checks every header (and with --verify every checksum) against the folder's tokenizer
            read_shard(Path(cfg.path) / name, meta["tokenizer"]["identity"], verify=cfg.verify)
    meta.pop("seconds", None)  # the preparation's time: not a rate of this command
    print_summary(meta)
    return 0


INFO_HELP = "Describe a prepared folder (splits, tokens, tokenizer); --verify checks every shard."
PREPARE_HELP = "Tokenize text into train/val token shards (plus the tokenizer and meta.json) in a new folder."
SUBCOMMANDS = {
    "prepare": (prepare_main, PREPARE_HELP),
    "info": (info_main, INFO_HELP),
}


def usage() -> str:
    lines = ["usage: redline data SUBCOMMAND [ARGS...]", "", "subcommands:"]
    lines += [f"  {name:<8}  {summary}" for name, (_, summary) in SUBCOMMANDS.items()]
    lines += ["", "`redline data SUBCOMMAND --help` lists its options."]
    return "\n".join(lines)


def main(argv: list[str]) -> int | None:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name = argv[0]
    if name not in SUBCOMMANDS:
        raise UserError(f"unknown subcommand {name!r}; use one of: {', '.join(SUBCOMMANDS)}")
    return SUBCOMMANDS[name][0](argv[1:])
