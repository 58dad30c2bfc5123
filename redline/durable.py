"""Durable file writes, shared by everything that must never leave a half-written file behind
(shards, tokenizers, checkpoints, sweep state).

A file is written to a temporary name in the same folder, flushed and fsynced, renamed over the real name,
and the folder is fsynced so the rename itself survives a crash.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make renames in `folder` durable (a no-op where folders cannot be opened or synced)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: str | bytes | list) -> Path:
    """Replace `path` with `data` (str is written as UTF-8; a list of bytes-like parts is written one after the
    other, without joining them in memory) all at once: readers see the old or the new file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for part in data if isinstance(data, list) else [data]:
                f.write(part.encode("utf-8") if isinstance(part, str) else part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path
