"""What the HTTP side of `redline serve` leaves of a full batch, with no model: the API (redline/serve/api.py on
uvicorn, with `redline serve`'s thread switch interval) over a stand-in engine that hands every busy row
`--sync-every` tokens each `--group-ms` (the GPU's pace: 8 steps of 64 rows of modern-124m take about 2.9 ms on an
H100), loaded by scripts/serve_load.py's closed loop of streaming clients in a process of its own.

    python scripts/serve_http_overhead.py [--rows 64] [--group-ms 2.9] [--sync-every 8] [--max-tokens 256] \\
        [--requests 1024] [--json-out FILE]

The stand-in admits waiting requests at each group boundary into free rows and sends each its first token at once
(no prefill), so what the load loses against `rows × sync_every / group time` is the round trip alone: a stream's
last events through the API to its client, the client's next request back, and the wait for the next boundary.
Prints the share of the full rate, the client's TTFT against the stand-in's own (its wait for a boundary), the
occupancy, and the server process's CPU share; then one JSON line. Standard library and the serve extra only.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class StandInEngine:
    """The engine interface api.py uses (as engine_process.py's EngineProcess), producing tokens on a clock."""

    failure = None

    def __init__(self, rows: int, group_s: float, sync_every: int, capacity: int = 4096, vocab: int = 256):
        from redline.serve.scheduler import Sequence, Stats

        class Counted(Sequence):
            made = 0

            @property
            def completion_tokens(self) -> int:
                return self.made

        self.sequence_type = Counted
        self.capacity, self.vocab_size, self.head_width, self.batch_rows = capacity, vocab, vocab, rows
        self.group_s, self.sync_every = group_s, sync_every
        self.flushes, self.stats = [], Stats()
        self.waiting: collections.deque = collections.deque()
        self.running: list = []
        self.lock = threading.Lock()
        threading.Thread(target=self._run, name="stand-in-engine", daemon=True).start()

    def describe(self) -> dict:
        return {"engine": "stand-in (no model)"}

    def check(self, prompt_tokens: int, max_tokens: int) -> None:
        pass

    def queue_depth(self) -> int:
        return len(self.waiting)

    def refresh_stats(self, timeout: float = 2.0) -> None:
        """Its stats are its own, always current."""

    def busy_rows(self) -> int:
        return len(self.running)

    def submit(self, sequences: list) -> None:
        with self.lock:
            self.waiting.extend(sequences)
            self.stats.requests += len(sequences)

    def drain(self, timeout: float) -> bool:
        return True

    def close(self, timeout: float = 1.0) -> None:
        pass

    def _run(self) -> None:
        due = time.perf_counter()
        while True:
            due += self.group_s
            time.sleep(max(0.0, due - time.perf_counter()))
            now = time.perf_counter()
            with self.lock:
                fresh = []
                while self.waiting and len(self.running) + len(fresh) < self.batch_rows:
                    fresh.append(self.waiting.popleft())
            busy = len(self.running)
            ended = []
            for seq in self.running:  # a group of decode steps: sync_every tokens each, fewer at the end
                n = min(self.sync_every, seq.max_tokens - seq.made)
                seq.made += n
                seq.sink(("text", "x" * n, seq.made))
                if seq.made >= seq.max_tokens:
                    ended.append(seq)
            for seq in ended:
                self.running.remove(seq)
                seq.finish_reason = "length"
                seq.sink(("done", "length"))
            for seq in fresh:  # admitted at this boundary: the first token at once
                seq.made = 1
                self.stats.add_ttft(now - seq.submitted_s)
                seq.sink(("text", "x", 1))
                self.running.append(seq)
            self.stats.steps += self.sync_every
            self.stats.busy_row_steps += busy * self.sync_every
            self.stats.completion_tokens += busy * self.sync_every + len(fresh)
            for flush in self.flushes:
                flush()


def serve(port: int, rows: int, group_ms: float, sync_every: int, switch_interval_ms: float) -> None:
    import uvicorn

    from redline.serve.api import Server, create_app
    from redline.tokenizer import load_tokenizer

    sys.setswitchinterval(switch_interval_ms / 1000)  # as `redline serve` sets it
    engine = StandInEngine(rows, group_ms / 1000, sync_every)
    app = create_app(Server(engine, load_tokenizer("bytes"), "stand-in"))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--group-ms", type=float, default=2.9, help="the stand-in's time for sync_every decode steps")
    p.add_argument("--sync-every", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--concurrency", type=int, default=0, help="closed-loop clients (0: --rows)")
    p.add_argument("--switch-interval-ms", type=float, default=0.5)
    p.add_argument("--port", type=int, default=8479)
    p.add_argument("--new-connections", action="store_true", help="serve_load.py's: a connection per request")
    p.add_argument("--json-out", default=None)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the server process itself
    args = p.parse_args(argv)
    if args.serve:
        serve(args.port, args.rows, args.group_ms, args.sync_every, args.switch_interval_ms)
        return 0
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--port", str(args.port), "--rows",
                              str(args.rows), "--group-ms", str(args.group_ms), "--sync-every", str(args.sync_every),
                              "--switch-interval-ms", str(args.switch_interval_ms)])
    try:
        url = f"http://127.0.0.1:{args.port}"
        for _ in range(300):  # up within a minute
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).read()
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit("serve_http_overhead.py: the server process ended while starting")
                time.sleep(0.2)
        cpu0, t0 = cpu_seconds(server.pid), time.perf_counter()
        load = subprocess.run([sys.executable, str(ROOT / "scripts" / "serve_load.py"), "--url", url, "--model",
                               "stand-in", "--concurrency", str(args.concurrency or args.rows), "--requests",
                               str(args.requests), "--max-tokens", str(args.max_tokens), "--redline-metrics",
                               *(["--new-connections"] if args.new_connections else [])],
                              capture_output=True, text=True, check=True)
        server_cpu = (cpu_seconds(server.pid) - cpu0) / (time.perf_counter() - t0)
    finally:
        server.terminate()
        server.wait(10)
    figures = json.loads(load.stdout.strip().splitlines()[-1])
    full = args.rows * args.sync_every / (args.group_ms / 1000)
    metrics = figures.get("server") or {}
    summary = {"script": "serve_http_overhead", "rows": args.rows, "group_ms": args.group_ms,
               "new_connections": args.new_connections,
               "sync_every": args.sync_every, "max_tokens": args.max_tokens, "full_rate": round(full),
               "tokens_per_s": figures["output_tokens_per_s"], "share": round(figures["output_tokens_per_s"] / full, 4),
               "client_ttft_ms": figures["ttft_ms"], "engine_ttft_ms_mean": metrics.get("ttft_ms_mean"),
               "occupancy": metrics.get("occupancy"), "server_cpu_share": round(server_cpu, 3),
               "client_cpu_share": figures.get("client_cpu_share"), "failed": figures["failed"]}
    print(f"{args.rows} rows, {args.sync_every} tokens every {args.group_ms} ms (full rate {full:,.0f} tokens/s): "
          f"{figures['output_tokens_per_s']:,.0f} tokens/s through HTTP = {summary['share']:.1%}; occupancy "
          f"{summary['occupancy']}; client TTFT p50 {figures['ttft_ms'].get('p50')} ms against the stand-in's "
          f"{summary['engine_ttft_ms_mean']} ms (mean); server CPU {server_cpu:.0%} of a core, client "
          f"{figures.get('client_cpu_share', 0):.0%}")
    line = json.dumps(summary)
    print(line)
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(line + "\n")
    return 1 if figures["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
