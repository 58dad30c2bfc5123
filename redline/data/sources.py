"""Where documents come from: local text files, JSON lines, Parquet, and Hugging Face datasets by name.

An input is one of
- a `.txt` file: the whole file is one document;
- a `.jsonl`, `.jsonl.gz` or `.jsonl.xz` file: one JSON object per line, the document is its `text` field;
- a `.parquet` file: the `text` column, read in record batches (never the whole file at once);
- a folder: every supported file below it, recursively, in sorted path order (other files are skipped);
- `hf:NAME[:CONFIG][@SPLIT]`: a Hugging Face dataset streamed with `datasets.load_dataset(..., streaming=True)`
  (split defaults to train; needs `pip install datasets`).

`iter_documents` yields the non-empty texts in input order, so the same inputs always give the same sequence.

Text must be UTF-8. Bytes that are not (a Latin-1 file, a binary file, UTF-16) are never turned into replacement
characters silently: by default (`encoding_errors="strict"`) the first one is an error that names the file and
the byte offset; "replace" turns each bad byte into U+FFFD and "skip" leaves each document that has one out, and
both say on stderr how many documents they touched. A NUL byte counts as not UTF-8 (it is valid UTF-8, but no
text file holds one; it marks binary data or UTF-16).
"""

from __future__ import annotations

import gzip
import json
import lzma
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from redline.errors import UserError

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".jsonl.xz", ".parquet")
_PARQUET_BATCH_ROWS = 1024
ENCODING_ERRORS = ("strict", "replace", "skip")
DATA_ENCODING_FIX = ("convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`), or pass --encoding-errors replace "
                     "(each bad byte becomes U+FFFD) or skip (such documents are left out) to `redline data prepare` "
                     "or `redline tokenizer train`")
_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON's \udXXX escapes can make strings that are not Unicode text


class NotUTF8:
    """Decodes documents by one `encoding_errors` policy and counts what it replaced or left out."""

    def __init__(self, errors: str = "strict", fix: str = DATA_ENCODING_FIX):
        if errors not in ENCODING_ERRORS:
            raise UserError(f"--encoding-errors {errors!r}: use one of {', '.join(ENCODING_ERRORS)}")
        self.errors, self.fix = errors, fix
        self.replaced = self.skipped = 0

    def decode(self, raw: bytes, where: str, offset: int = 0) -> str | None:
        """`raw` as text; None when the document is to be left out. `offset`: where `raw` starts in its file."""
        try:
            text = raw.decode("utf-8")
            if "\x00" not in text:
                return text
            bad = raw.find(b"\x00")
        except UnicodeDecodeError as e:
            nul = raw.find(b"\x00", 0, e.start)
            bad = nul if nul >= 0 else e.start
        if self.errors == "strict":
            raise UserError(f"{where} is not UTF-8 text: byte 0x{raw[bad]:02x} at offset {offset + bad} "
                            f"{'is a NUL byte (binary data or UTF-16?)' if raw[bad] == 0 else 'cannot be decoded'}; "
                            f"{self.fix}")
        if self.errors == "skip":
            self.skipped += 1
            return None
        self.replaced += 1
        return raw.decode("utf-8", errors="replace").replace("\x00", "\ufffd")

    def check(self, text: str, where: str) -> str | None:
        """A string that came decoded already (JSON): lone surrogates from \\udXXX escapes are not text either."""
        match = _SURROGATE.search(text)
        if match is None:
            return text
        if self.errors == "strict":
            raise UserError(f"{where} holds {match.group()!r}, half of a UTF-16 surrogate pair, which is not text; "
                            f"{self.fix}")
        if self.errors == "skip":
            self.skipped += 1
            return None
        self.replaced += 1
        return _SURROGATE.sub("\ufffd", text)

    def report(self) -> None:
        """One line on stderr when documents were changed or left out (never silently)."""
        if self.replaced:
            print(f"redline: {self.replaced} document(s) were not UTF-8: their bad bytes became U+FFFD "
                  f"(--encoding-errors replace)", file=sys.stderr)
        if self.skipped:
            print(f"redline: left out {self.skipped} document(s) that were not UTF-8 (--encoding-errors skip)",
                  file=sys.stderr)


def decode_utf8_file(path: Path, fix: str) -> str:
    """The whole file as UTF-8 text (a leading byte-order mark dropped), or a one-line UserError naming the offset
    of the first byte that is not; `fix` says what to do about it."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    skip = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
    return NotUTF8("strict", fix).decode(raw[skip:], str(path), offset=skip)


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
    _check_libraries(files)
    return files


def _check_libraries(files: list[Path | str]) -> None:
    """The optional libraries the inputs need, checked before any document is read (a missing one would
    otherwise be found only after the files before it were read, or a tokenizer trained on them)."""
    import importlib.util

    needs = {"pyarrow": [f for f in files if isinstance(f, Path) and _kind(f) == ".parquet"],
             "datasets": [f for f in files if isinstance(f, str)]}
    for module, users in needs.items():
        if users and importlib.util.find_spec(module) is None:
            what = "the Hugging Face datasets library" if module == "datasets" else module
            raise UserError(f"{users[0]} needs {what}, which is not installed: `pip install 'redline[data]'` "
                            f"(or `pip install {module}`)")


def iter_documents(inputs: list[str] | tuple[str, ...], text_field: str = "text",
                   encoding_errors: str = "strict") -> Iterator[str]:
    """Yield each non-empty (not all-whitespace) document text of the inputs, in order.

    Raises UserError up front for a missing path, an unsupported file or a missing library (pyarrow for .parquet,
    datasets for hf:), and at the end when there was no document. encoding_errors: strict, replace or skip (see
    the module docstring).
    """
    files = list_files(inputs)  # before the first yield, so a typo fails at once
    decoder = NotUTF8(encoding_errors)
    return _iter(files, inputs, text_field, decoder)


def _iter(files, inputs, text_field: str, decoder: NotUTF8) -> Iterator[str]:
    count = 0
    for source in files:
        for text in _read(source, text_field, decoder):
            if text and not text.isspace():
                count += 1
                yield text
    decoder.report()
    if count == 0:
        raise UserError(f"no documents found in {', '.join(map(str, inputs))} "
                        f"(every file was empty, or no {text_field!r} field had text)")


def _read(source: Path | str, text_field: str, decoder: NotUTF8) -> Iterator[str]:
    if isinstance(source, str):
        yield from _read_hf(source, text_field)
        return
    kind = _kind(source)
    if kind == ".txt":
        try:
            raw = source.read_bytes()
        except OSError as e:
            raise UserError(f"cannot read {source}: {e.strerror}") from None
        bom = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
        text = decoder.decode(raw[bom:], str(source), offset=bom)
        if text is not None:
            yield text
    elif kind == ".parquet":
        yield from _read_parquet(source, text_field)
    else:
        opener = {".jsonl": open, ".jsonl.gz": gzip.open, ".jsonl.xz": lzma.open}[kind]
        yield from _read_jsonl(source, opener, text_field, decoder)


def _read_jsonl(path: Path, opener, text_field: str, decoder: NotUTF8) -> Iterator[str]:
    compressed = opener is not open
    try:
        with opener(path, "rb") as f:
            offset = 0  # of the line in the (decompressed) file, for the error message
            for line_no, raw in enumerate(f, 1):
                start, offset = offset, offset + len(raw)
                if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw, start = raw[3:], 3
                where = f"{path}:{line_no}" + (" (decompressed)" if compressed else "")
                line = decoder.decode(raw, where, offset=start)
                if line is None or not line.strip():
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
                text = decoder.check(text, f"{path}:{line_no}")
                if text is not None:
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

