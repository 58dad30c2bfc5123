"""Where metrics go: metrics.jsonl (one record per step or eval), TensorBoard event files, and the console.

Only rank 0 creates a MetricsLogger that writes; other ranks get one that does nothing. The record schema
(`kind` = "train" | "eval" | "event") is what `redline report` reads; it never writes back.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console


class MetricsLogger:
    def __init__(self, run_dir: Path | None, tensorboard: bool = True, enabled: bool = True):
        self.enabled = enabled and run_dir is not None
        self.console = Console(stderr=False, highlight=False, soft_wrap=True)  # log lines never wrap mid-number
        self._file = None
        self._tb = None
        if not self.enabled:
            return
        self._file = open(run_dir / "metrics.jsonl", "a", buffering=1 << 16)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
            except ImportError:
                self.console.print("[yellow]tensorboard is not installed: no event files (pip install tensorboard)")

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"time": time.time(), **record}
        self._file.write(json.dumps(record) + "\n")
        if self._tb is not None and "step" in record:
            prefix = record.get("kind", "train")
            for key, value in record.items():
                if key not in ("step", "kind", "time") and isinstance(value, (int, float)) and value == value:
                    self._tb.add_scalar(f"{prefix}/{key}", value, record["step"])

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        if self._tb is not None:
            self._tb.flush()

    def print(self, *args, **kwargs) -> None:
        if self.enabled:
            self.console.print(*args, **kwargs)

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def is_tty() -> bool:
    return sys.stdout.isatty()
