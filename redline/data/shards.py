"""Token shard files: a 64-byte header, then the tokens as little-endian uint16 or uint32.

Header layout (little-endian, no padding):

    offset  size  field
    0       8     magic b"RDLNSHRD"
    8       4     format version (uint32, currently 1)
    12      4     bytes per token (uint32: 2 = uint16 when vocab_size <= 65536, 4 = uint32 otherwise)
    16      8     token count (uint64)
    24      4     vocab_size of the tokenizer (uint32)
    28      4     CRC-32 of the token payload (uint32, zlib.crc32)
    32      32    tokenizer identity (the raw sha256 digest behind `Tokenizer.identity`)

The header lets a reader reject a shard before training on garbage: a wrong magic, a newer format, a truncated
file, a flipped byte (with verify=True) or a shard made with another tokenizer all raise a one-line UserError that
names the file and the fix. `max_token` is the range check a training run makes before it reads a shard (a token
id outside the vocabulary would otherwise crash the embedding): one pass over the memory map per shard, remembered
by the shard's size and modification time in this process and in a small cache file, so reopening is free. Writes are atomic (temp file in the same folder, fsync, rename), so a crash never
leaves a half-written shard under the final name.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from redline.durable import write_atomic
from redline.errors import UserError

MAX_TOKEN_CACHE = "shard_max_tokens.json"  # in the cache folder: shard path -> [size, mtime_ns, largest token id]
_max_tokens: dict[str, tuple[int, int, int]] = {}

MAGIC = b"RDLNSHRD"
VERSION = 1
HEADER_SIZE = 64
_HEADER = struct.Struct("<8sIIQII32s")
assert _HEADER.size == HEADER_SIZE
_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
_CRC_CHUNK = 1 << 24  # bytes checksummed per step, so verifying a big memmap never copies it whole

FIX = "re-run `redline data prepare`"


@dataclass(frozen=True)
class ShardHeader:
    version: int
    dtype: np.dtype  # token dtype of the payload
    num_tokens: int
    vocab_size: int
    checksum: int  # CRC-32 of the payload bytes
    identity: str  # tokenizer identity, 64 hex characters


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else uint32."""
    return _DTYPES[2] if vocab_size <= 1 << 16 else _DTYPES[4]


def _identity_bytes(identity: str) -> bytes:
    try:
        raw = bytes.fromhex(identity)
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != 32:
        raise ValueError(f"tokenizer identity must be a sha256 hex digest (64 hex characters), got {identity!r}")
    return raw


def _crc32(buffer) -> int:
    view = memoryview(buffer).cast("B")
    crc = 0
    for start in range(0, len(view), _CRC_CHUNK):
        crc = zlib.crc32(view[start : start + _CRC_CHUNK], crc)
    return crc


def write_shard(path: str | os.PathLike, tokens: np.ndarray, tokenizer_identity: str, vocab_size: int) -> Path:
    """Write `tokens` (1-D ints in [0, vocab_size)) to `path` atomically; returns the path."""
    path = Path(path)
    dtype = token_dtype(vocab_size)
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got [{tokens.min()}, {tokens.max()}]")
    payload = np.ascontiguousarray(tokens, dtype=dtype)
    header = _HEADER.pack(MAGIC, VERSION, dtype.itemsize, payload.size, vocab_size, _crc32(payload),
                          _identity_bytes(tokenizer_identity))
    return write_atomic(path, [header, memoryview(payload).cast("B")])


def read_header(path: str | os.PathLike) -> ShardHeader:
    """Parse and check the header of a shard (magic, version, dtype, file size against the token count)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"token shard {path} does not exist; {FIX}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(HEADER_SIZE)
    if len(raw) < HEADER_SIZE:
        raise UserError(f"token shard {path} is truncated ({size} bytes, shorter than its header); {FIX}")
    magic, version, itemsize, count, vocab_size, checksum, identity = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise UserError(f"{path} is not a redline token shard (bad magic {magic!r}); {FIX}")
    if version != VERSION:
        raise UserError(f"token shard {path} has format version {version}, this redline reads version {VERSION}; "
                        f"{FIX} or use the redline that wrote it")
    if itemsize not in _DTYPES:
        raise UserError(f"token shard {path} has an unknown token size ({itemsize} bytes); {FIX}")
    expected = HEADER_SIZE + count * itemsize
    if size != expected:
        what = "truncated" if size < expected else "longer than its header says"
        raise UserError(f"token shard {path} is {what} ({size} bytes, expected {expected} for {count} tokens); {FIX}")
    return ShardHeader(version, _DTYPES[itemsize], count, vocab_size, checksum, identity.hex())


def read_shard(path: str | os.PathLike, expected_identity: str | None = None, verify: bool = False) -> np.ndarray:
    """Memory-map the tokens of a shard, shape (num_tokens,), read-only.

    expected_identity: the identity of the tokenizer this run uses; a shard made with another one is an error.
    verify: also check the payload's CRC-32 (reads the whole file once).
    """
    path = Path(path)
    header = read_header(path)
    if expected_identity is not None and header.identity != expected_identity:
        raise UserError(
            f"token shard {path} was made with tokenizer {header.identity[:12]}, this run uses "
            f"{expected_identity[:12]}; re-prepare the data with this tokenizer or pass the matching tokenizer"
        )
    if header.num_tokens == 0:
        return np.zeros(0, dtype=header.dtype)  # numpy cannot memory-map zero bytes
    tokens = np.memmap(path, dtype=header.dtype, mode="r", offset=HEADER_SIZE, shape=(header.num_tokens,))
    if verify and _crc32(tokens) != header.checksum:
        raise UserError(f"token shard {path} is corrupt (checksum mismatch); {FIX}")
    return tokens


def max_token(path: str | os.PathLike, tokens: np.ndarray) -> int:
    """The largest token id in a shard (-1 when empty); `tokens` is its memory map (read_shard). Computed once per
    shard and remembered under its size and modification time, in this process and across processes."""
    path = Path(path).resolve()
    stat = path.stat()
    key, stamp = str(path), (stat.st_size, stat.st_mtime_ns)
    known = _max_tokens.get(key)
    if known is None or known[:2] != stamp:
        cache = _read_cache()
        entry = cache.get(key)
        if isinstance(entry, list) and len(entry) == 3 and tuple(entry[:2]) == stamp and isinstance(entry[2], int):
            known = (*stamp, entry[2])
        else:
            known = (*stamp, int(tokens.max()) if tokens.size else -1)
            cache[key] = list(known)
            _write_cache(cache)
        _max_tokens[key] = known
    return known[2]


def _cache_file() -> Path:
    from redline.data.embedded import cache_root

    return cache_root() / MAX_TOKEN_CACHE


def _read_cache() -> dict:
    try:
        data = json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(cache: dict) -> None:
    """Best effort: a cache that cannot be written (read-only or full disk) costs a re-scan next time, no more."""
    cache = {key: value for key, value in cache.items() if os.path.exists(key)}  # shards since deleted
    try:
        path = _cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(cache))
    except OSError:
        pass
