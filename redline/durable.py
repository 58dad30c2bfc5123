"""Durable file writes, shared by everything that must never leave a half-written file behind
(shards, tokenizers, checkpoints, sweep state, reports).

A file is written to a temporary name in the same folder, flushed and fsynced, renamed over the real name,
and the folder is fsynced so the rename itself survives a crash. A write that fails leaves the old file (if
any) as it was and removes the temporary one; a full disk becomes one `DiskFullError` line that names the file.

A full disk reaches Python in several shapes: `OSError(ENOSPC)` from plain writes, safetensors' own
`SafetensorError("... No space left on device (os error 28)")`, and torch.save's `RuntimeError("unexpected
pos ...")`, whose `__context__` is the OSError its file's write raised. `is_disk_full` recognises all of them.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from pathlib import Path

from redline.errors import UserError

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# how the errors above read where a library turned them into text (Rust's io::Error, C++ enforce messages)
_DISK_FULL_TEXT = ("no space left on device", "disk quota exceeded", "os error 28", "os error 122")


class DiskFullError(UserError, OSError):
    """The disk (or the user's quota) filled up during a write. A UserError, so the CLI prints one line and
    exits 2; also an OSError(ENOSPC), so code that already handles OSError keeps handling it."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or an exception it was raised from or while handling, says the disk or quota is full."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DiskFullError):
            return True
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            return True
        if any(text in str(error).lower() for text in _DISK_FULL_TEXT):
            return True
        error = error.__cause__ or error.__context__
    return False


def disk_full_error(what: str, kept: str, fix: str = "free space or write to a larger disk, then run it again"
                    ) -> DiskFullError:
    """The one-line error of a full disk: what was being written, what is still intact, and the fix."""
    return DiskFullError(f"disk full while writing {what}; {kept}. {fix[0].upper()}{fix[1:]}")


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


def check_output_file(path: str, option: str) -> None:
    """Before any work: a UserError when `path` (an output file) cannot be written, a folder or in no folder."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise UserError(f"{option} {path} is a folder; give the path of a file to write")
    if not p.parent.is_dir():
        raise UserError(f"{option} {path}: folder {p.parent} does not exist; create it or write elsewhere")


def write_atomic(path: str | os.PathLike, data: str | bytes | list) -> Path:
    """Replace `path` with `data` (str is written as UTF-8; a list of bytes-like parts is written one after the
    other, without joining them in memory) all at once: readers see the old or the new file. A full disk raises
    DiskFullError with the old file untouched."""
    path = Path(path)
    existed = path.exists()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for part in data if isinstance(data, list) else [data]:
                f.write(part.encode("utf-8") if isinstance(part, str) else part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, Exception) and not isinstance(e, DiskFullError) and is_disk_full(e):
            raise disk_full_error(str(path), "the previous file is unchanged" if existed else "nothing was written"
                                  ) from None
        raise
    fsync_dir(path.parent)
    return path


def append_line(path: str | os.PathLike, line: str, sync: bool = True) -> None:
    """Append one line (a JSONL record; or several, joined) and fsync it (sync=False: hand it to the OS only,
    which a killed process does not lose). A failed write is undone: the file is cut back to its previous
    length, so a full disk never leaves a torn record that the next append would run into."""
    path = Path(path)
    data = memoryview((line if line.endswith("\n") else line + "\n").encode("utf-8"))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            while data:  # unbuffered: nothing is left in a buffer to be written again on close
                data = data[os.write(fd, data):]
            if sync:
                os.fsync(fd)
        except BaseException as e:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass  # then the reader skips the torn last line (experiments/results.read_jsonl)
            if isinstance(e, Exception) and is_disk_full(e):
                raise disk_full_error(str(path), "its earlier records are intact") from None
            raise
    finally:
        os.close(fd)


def replace_folder(tmp: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Put the finished folder `tmp` at `out` (same file system), replacing whatever folder is there: the old one
    is renamed aside first and deleted after, so at every moment `out` is the old folder, nothing, or the new one."""
    tmp, out = Path(tmp), Path(out)
    old = None
    if out.is_dir():
        if any(out.iterdir()):
            old = out.with_name(f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
            os.replace(out, old)
        else:
            out.rmdir()
    os.replace(tmp, out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out
