"""scripts/serve_host_overhead.py still drives the Scheduler as it is (it reaches into the engine process's outbox
and the scheduler's group reads): a tiny load runs to the end and every request gets all its tokens."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "serve_host_overhead.py"


def test_script_runs_a_tiny_load_to_the_end():
    out = subprocess.run([sys.executable, str(SCRIPT), "--rows", "4", "--max-tokens", "16", "--repeats", "1",
                          "--stop", "User:"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    head = re.search(r"(\d+) steps, (\d+) tokens, events digest ([0-9a-f]{16})", out.stdout)
    assert head, out.stdout
    assert int(head[2]) == 4 * 16  # the fixed table holds no stop token, and its text no "User:": all run to max_tokens
    assert int(head[1]) >= 15  # the first token comes from the prefill, the other 15 from decode steps
    assert re.search(r"host per decode step: +\d+\.\d us", out.stdout)
