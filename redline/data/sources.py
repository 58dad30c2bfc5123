"""Where documents come from: local text files, JSON lines, Parquet, and Hugging Face datasets by name.

An input is one of
- a `.txt` file: the whole file is one document;
- a `.jsonl`, `.jsonl.gz` or `.jsonl.xz` file: one JSON object per line, the document is its `text` field;
- a `.parquet` file: the `text` column, read in record batches (never the whole file at once);
- a folder: every supported file below it, recursively, in sorted path order (other files are skipped);
- `hf:NAME[:CONFIG][@SPLIT]`: a Hugging Face dataset streamed with `datasets.load_dataset(..., streaming=True)`
  (split defaults to train; needs `pip install datasets`).

`iter_documents` yields the non-empty texts in input order, so the same inputs always give the same sequence.
"""

from __future__ import annotations

import gzip
import json
import lzma
from collections.abc import Iterator
from pathlib import Path

from redline.errors import UserError

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".jsonl.xz", ".parquet")
_PARQUET_BATCH_ROWS = 1024


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):  # .jsonl.gz before .jsonl
        if name.endswith(suffix):
            return suffix
    return None


def parse_hf_spec(spec: str) -> tuple[str, str | None, str]:
    """"hf:NAME[:CONFIG][@SPLIT]" -> (name, config or None, split)."""
    rest = spec[len("hf:"):]
    rest, _, split = rest.partition("@")
    name, _, config = rest.partition(":")
    if not name:
        raise UserError(f"{spec!r}: give a dataset name, e.g. hf:roneneldan/TinyStories@train")
    return name, config or None, split or "train"


def list_files(inputs: list[str] | tuple[str, ...]) -> list[Path | str]:
    """Expand folders into their supported files (sorted); check that every path exists. hf: specs pass through."""
    if not inputs:
        raise UserError("no inputs given; name .txt, .jsonl[.gz|.xz] or .parquet files, folders, or hf:NAME datasets")
    files: list[Path | str] = []
    for item in inputs:
        item = str(item)
        if item.startswith("hf:"):
            parse_hf_spec(item)
            files.append(item)
            continue
        path = Path(item).expanduser()
        if not path.exists():
            raise UserError(f"data path {item} does not exist")
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _kind(p) and not p.name.startswith("."))
            files += found
        elif _kind(path):
            files.append(path)
        else:
            raise UserError(f"{item}: unsupported file type; use one of {', '.join(SUFFIXES)}, a folder, or hf:NAME")
    return files


def iter_documents(inputs: list[str] | tuple[str, ...], text_field: str = "text") -> Iterator[str]:
    """Yield each non-empty (not all-whitespace) document text of the inputs, in order.

    Raises UserError up front for a missing path or unsupported file, and at the end when there was no document.
    """
    files = list_files(inputs)  # before the first yield, so a typo fails at once
    return _iter(files, inputs, text_field)


def _iter(files, inputs, text_field: str) -> Iterator[str]:
    count = 0
    for source in files:
        for text in _read(source, text_field):
            if text and not text.isspace():
                count += 1
                yield text
    if count == 0:
        raise UserError(f"no documents found in {', '.join(map(str, inputs))} "
                        f"(every file was empty, or no {text_field!r} field had text)")


def _read(source: Path | str, text_field: str) -> Iterator[str]:
    if isinstance(source, str):
        yield from _read_hf(source, text_field)
        return
    kind = _kind(source)
    if kind == ".txt":
        yield source.read_text(encoding="utf-8", errors="replace")
    elif kind == ".parquet":
        yield from _read_parquet(source, text_field)
    else:
        opener = {".jsonl": open, ".jsonl.gz": gzip.open, ".jsonl.xz": lzma.open}[kind]
        yield from _read_jsonl(source, opener, text_field)


def _read_jsonl(path: Path, opener, text_field: str) -> Iterator[str]:
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise UserError(f"{path}:{line_no}: not valid JSON ({e.msg}); "
                                    f"each line must be one JSON object") from None
                if not isinstance(row, dict) or text_field not in row:
                    raise UserError(f"{path}:{line_no}: no {text_field!r} field; pass the right field name "
                                    f"(--text-field) or fix the file")
                text = row[text_field]
                if text is None:
                    continue
                if not isinstance(text, str):
                    raise UserError(f"{path}:{line_no}: field {text_field!r} is a {type(text).__name__}, not text")
                yield text
    except (OSError, EOFError, lzma.LZMAError) as e:
        raise UserError(f"cannot read {path}: {e}") from None


def _read_parquet(path: Path, text_field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"reading {path} needs pyarrow: `pip install 'redline[data]'` "
                        f"(or `pip install pyarrow`)") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow's message says what is wrong with the file
        raise UserError(f"cannot read {path} as Parquet: {e}") from None
    if text_field not in pf.schema_arrow.names:
        raise UserError(f"{path} has no column {text_field!r} (columns: {', '.join(pf.schema_arrow.names)}); "
                        f"pass the right one with --text-field")
    for batch in pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=[text_field]):
        for text in batch.column(0).to_pylist():
            if isinstance(text, str):
                yield text


def _read_hf(spec: str, text_field: str) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise UserError(f"{spec} needs the Hugging Face datasets library: `pip install 'redline[data]'` "
                        f"(or `pip install datasets`)") from None
    name, config, split = parse_hf_spec(spec)
    try:
        ds = datasets.load_dataset(name, config, split=split, streaming=True)
    except Exception as e:  # network, unknown name, unknown config or split: the library says which
        raise UserError(f"cannot load {spec}: {type(e).__name__}: {e}") from None
    features = getattr(ds, "features", None)
    if features is not None and text_field not in features:
        raise UserError(f"{spec} has no column {text_field!r} (columns: {', '.join(features)}); "
                        f"pass the right one with --text-field")
    for row in ds:
        text = row.get(text_field)
        if isinstance(text, str):
            yield text

