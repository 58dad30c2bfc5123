"""The embedded default corpus: ~1 MB of English from the docstrings of the running Python's standard library.

`redline train` with no data must work on any machine, offline, with nothing to download. Every Python install
carries megabytes of carefully written English prose in the docstrings of its standard library, so the corpus is
built from those: the stdlib's .py files are parsed with `ast` (nothing is imported, so no module's import-time
side effects run and nothing slow or platform-specific is touched) and the module, class and function docstrings
are collected in sorted path order. One document is a module docstring, a top-level class with the docstrings of
its methods, or a top-level function. The result depends only on the Python version, so it is deterministic.

`prepare_embedded()` trains a small BPE on that text and writes prepared shards with a val split, once, under the
cache folder ($REDLINE_CACHE, else $XDG_CACHE_HOME/redline, else ~/.cache/redline); later calls return the cached
folder at once. A file lock makes concurrent first calls build it once; the atomic rename in `prepare` means a
killed build never leaves a half-written folder behind.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path

from redline.data.prepare import FORMAT_VERSION, is_prepared, prepare_documents
from redline.tokenizer import Tokenizer, train_bpe

EMBEDDED_VERSION = 1  # bump when the corpus recipe changes, so old caches are not reused
_SKIP_DIRS = {"test", "tests", "idlelib", "tkinter", "turtledemo", "site-packages", "dist-packages", "__pycache__",
              "lib2to3", "ensurepip", "pydoc_data", "encodings", "venv"}
_MIN_DOCSTRING = 40  # characters; shorter ones ("Return self.") are mostly boilerplate


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, dirs, names in os.walk(root):
        # prune in place so os.walk does not descend; sorted for a deterministic order
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith(("config-", ".")))
        files += [Path(folder, n) for n in sorted(names) if n.endswith(".py") and not n.startswith("test_")]
    return files


def _docstring(node) -> str | None:
    text = ast.get_docstring(node, clean=True)
    return text if text and len(text) >= _MIN_DOCSTRING else None


def _file_documents(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):  # a stray file for another Python version
        return []
    docs = []
    if module_doc := _docstring(tree):
        docs.append(module_doc)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if text := _docstring(node):
                docs.append(text)
        elif isinstance(node, ast.ClassDef):
            parts = [_docstring(node)]
            parts += [_docstring(m) for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if text := "\n\n".join(p for p in parts if p):
                docs.append(text)
    return docs


def embedded_documents(max_bytes: int = 1_000_000) -> list[str]:
    """Docstring documents of the stdlib in sorted path order, up to `max_bytes` of UTF-8 in total."""
    docs, total = [], 0
    for path in _stdlib_files():
        for doc in _file_documents(path):
            size = len(doc.encode("utf-8"))
            if total + size > max_bytes:
                return docs
            docs.append(doc)
            total += size
    return docs


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("REDLINE_CACHE"):
        return Path(os.environ["REDLINE_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "redline"


def embedded_key(max_bytes: int = 1_000_000, vocab_size: int = 4096, val_fraction: float = 0.1) -> str:
    """Names the cached folder: everything the corpus and its preparation depend on."""
    recipe = (f"{sys.version}|{sysconfig.get_paths()['stdlib']}|{max_bytes}|{vocab_size}|{val_fraction}|"
              f"{EMBEDDED_VERSION}|{FORMAT_VERSION}")
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive advisory lock (POSIX flock); elsewhere nothing, and the atomic rename alone protects."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # blocks while another process builds the same folder
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare_embedded(cache_dir: str | os.PathLike | None = None, vocab_size: int = 4096,
                     max_bytes: int = 1_000_000, val_fraction: float = 0.1, verbose: bool = True,
                     tokenizer: Tokenizer | None = None) -> Path:
    """The prepared folder of the embedded corpus (BPE of `vocab_size` + train/val shards), built on first use.
    tokenizer: the same documents and split tokenized with it instead (a folder of its own, by its identity)."""
    root = cache_root(cache_dir)
    out = root / f"embedded-{embedded_key(max_bytes, vocab_size, val_fraction)}"
    if tokenizer is not None:
        out = out.with_name(f"{out.name}-{tokenizer.identity[:16]}")
    if is_prepared(out):
        return out
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f"{out.name}.lock"):
        if is_prepared(out):  # another process finished it while we waited for the lock
            return out
        for stale in root.glob(f".{out.name}.tmp-*"):  # left by a killed build; we hold the lock, so none is live
            shutil.rmtree(stale, ignore_errors=True)
        start = time.perf_counter()
        if verbose:
            print(f"redline: building the embedded corpus (stdlib docstrings) into {out} (once)", file=sys.stderr)
        docs = embedded_documents(max_bytes)
        if tokenizer is None:
            tokenizer = train_bpe(docs, vocab_size=vocab_size)
        prepare_documents(docs, out, tokenizer, val_fraction=val_fraction, sources=["embedded:stdlib-docstrings"],
                          overwrite=True, progress=False)
        if verbose:
            print(f"redline: embedded corpus ready in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return out
