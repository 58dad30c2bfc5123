"""The on-disk cache of start-up measurements (SDPA backend timings, FP8 Linear timings), one JSON file each.

Each file maps a key that names everything the measurement depends on (GPU, versions, shapes) to its result,
under `<redline cache>/` (REDLINE_CACHE, default ~/.cache/redline). Entries are merged in atomically, since
several processes (ranks, bench points) may measure at once; a cache that cannot be read or written only costs
a new measurement.
"""

from __future__ import annotations

import json
from pathlib import Path

from redline.durable import write_atomic
from redline.hardware import doctor_json_path


def cache_file(name: str) -> Path:
    """`<redline cache>/<name>`: next to doctor.json."""
    return doctor_json_path().parent / name


def read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_cache_entry(path: Path, key: str, value: dict) -> None:
    """Merge one entry into a JSON cache file atomically (several processes may write at once)."""
    data = read_cache(path)
    data[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass  # a read-only cache folder only costs a re-measurement next time
