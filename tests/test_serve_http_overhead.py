"""scripts/serve_http_overhead.py: the API over its stand-in engine, loaded through HTTP by serve_load.py, runs a
tiny load to the end, every request complete, and reports the share of the stand-in's full rate with the server's
own counters."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "serve_http_overhead.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_tiny_load_through_http_over_the_stand_in():
    out = subprocess.run([sys.executable, str(SCRIPT), "--rows", "4", "--requests", "12", "--max-tokens", "24",
                          "--group-ms", "5", "--port", str(free_port())], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["failed"] == 0 and summary["full_rate"] == round(4 * 8 / 0.005)
    assert 0 < summary["share"] <= 1.05  # a rate measured over the load's wall time, never far above the clock's
    assert 0 < summary["occupancy"] <= 1 and summary["engine_ttft_ms_mean"] is not None
