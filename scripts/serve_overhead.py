"""Host overhead of `redline serve`'s scheduler per decode step, on the CPU: everything the scheduler's loop does
outside the model's own calls (bookkeeping per row and per step, reading tokens back, detokenizing, handing
events to the asyncio side), which on a GPU runs while the device waits unless it is small.

    python scripts/serve_overhead.py [--requests 64] [--rows 64] [--prompt-tokens 128] [--max-tokens 256]
        [--sync-every 8] [--repeats 3] [--profile 25] [--engine-process]

Drives the Scheduler directly (no HTTP) with a deliberately tiny model (one layer, 32 wide), so the model's calls
are cheap, and times them: host time = wall time of a run - time inside the engine's prefill and decode step
calls. The requests' events go through the API's own sink into asyncio queues that consumer tasks drain on an event
loop in the main thread, as the server's do (so the wake-ups and the GIL the two threads share are counted). Wall
time on a shared machine counts other processes too, so it also reports host CPU time: the CPU seconds of both
threads outside the model's calls (the scheduler's thread's and the event loop's). Prints a table, then one JSON
line. --profile N prints cProfile's N costliest functions of the scheduler's thread.

--preset NAME --device cuda drives a preset's model (random weights, compiled and captured, one warm-up run) on
a GPU instead: the tokens/s column is then the scheduler's own rate without HTTP, to set against `redline serve`'s
under the same load (scripts/gpu/serve_bench.sh) and bench-infer's (on a GPU the "model" time is the launches').

--engine-process runs the scheduler in an engine process of its own (redline/serve/engine_process.py, as
`redline serve --engine-process`): its host CPU per step is then the engine's alone (its scheduler thread,
sending each turn's events included), which is what a GPU waits for; the event loop and the reader thread that
receives the events run in this process, beside it (their CPU per step is reported apart).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from redline.inference import InferenceEngine, SamplingParams  # noqa: E402
from redline.inference.batch import DecodeBatch  # noqa: E402
from redline.model import GPT, ModelConfig  # noqa: E402
from redline.serve import protocol  # noqa: E402
from redline.serve.api import Mailbox, _sse  # noqa: E402
from redline.serve.scheduler import Scheduler  # noqa: E402


class ModelClock:
    """Wraps the engine's prefill and decode step calls and sums the seconds spent inside them."""

    def __init__(self, engine: InferenceEngine):
        self.seconds = self.cpu_seconds = 0.0
        for name in ("_prefill", "_step"):
            setattr(engine, name, self._timed(getattr(engine, name)))

    def _timed(self, fn):
        def call(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.cpu_seconds += time.thread_time() - c0

        return call


class PrintableTokenizer:
    """Token i is one printable ASCII character: a random model's greedy bytes are mostly broken UTF-8, which no
    trained model emits and which would make every stream hold its text back; this decodes as cheaply as the bytes
    tokenizer, in whole characters."""

    name = "printable"

    def decode(self, ids) -> str:
        return "".join([chr(32 + i % 95) for i in ids])


class TimedScheduler(Scheduler):
    """The scheduler, its thread's CPU time measured, and profiled by cProfile if asked (cProfile sees one thread
    only, so it starts inside the scheduler's)."""

    profiling = False
    profile: cProfile.Profile | None = None
    cpu_seconds = 0.0

    def _run(self) -> None:
        c0 = time.thread_time()
        if self.profiling:
            self.profile = cProfile.Profile()
            self.profile.enable()
        try:
            super()._run()
        finally:
            if self.profile is not None:
                self.profile.disable()
            self.cpu_seconds = time.thread_time() - c0


class ProfiledScheduler(TimedScheduler):
    profiling = True


async def drive(sched: Scheduler, prompts: list[list[int]], max_tokens: int) -> tuple[float, float, int]:
    """Submit every prompt at once and drain their events as the server would -> (seconds, CPU seconds of the
    event loop's thread, tokens generated)."""
    loop = asyncio.get_running_loop()
    queues, mailbox = [asyncio.Queue() for _ in prompts], Mailbox(loop)
    sched.flushes.append(mailbox.flush)
    seqs = [sched.sequence_type(p, max_tokens, SamplingParams(temperature=0.0), (), mailbox.sink(q, 0))
            for p, q in zip(prompts, queues)]

    # each text event becomes the server-sent event a streaming client with continuous usage stats gets (the JSON
    # the event loop's thread builds per chunk; the socket write is left out)
    job = protocol.completion_job({"model": "m", "prompt": "x", "stream": True,
                                   "stream_options": {"continuous_usage_stats": True}})

    text_chunk = protocol.TextChunks(job, "cmpl-0", "m")  # as api.stream builds each text chunk

    async def consume(q: asyncio.Queue) -> None:
        while True:
            _, event = await q.get()
            if event[0] != "text":
                return
            _sse(text_chunk(0, event[1], 128, event[2]))

    t0, c0 = time.perf_counter(), time.thread_time()
    sched.submit(seqs)
    await asyncio.gather(*(consume(q) for q in queues))
    seconds, loop_cpu = time.perf_counter() - t0, time.thread_time() - c0
    assert all(s.finish_reason == "length" and s.completion_tokens == max_tokens for s in seqs), "a request fell short"
    return seconds, loop_cpu, sum(s.completion_tokens for s in seqs)


class ReportingScheduler(TimedScheduler):
    """In the engine process: writes its thread's CPU time and the model's time to `report` when its thread ends."""

    report: str = ""
    clock: ModelClock | None = None

    def _run(self) -> None:
        try:
            super()._run()
        finally:
            Path(self.report).write_text(json.dumps({
                "cpu_seconds": self.cpu_seconds, "model_seconds": self.clock.seconds,
                "model_cpu_seconds": self.clock.cpu_seconds, "steps": self.stats.steps}))


def engine_scheduler(args: argparse.Namespace, report: str) -> Scheduler:
    """The engine process's scheduler (EngineProcess.start's builder): the same model, built from the same seed."""
    torch.set_num_threads(args.threads)
    engine = InferenceEngine(tiny_model(args))
    batch = DecodeBatch(engine, rows=args.rows, capacity=args.prompt_tokens + args.max_tokens + 1)
    clock = ModelClock(engine)
    sched = ReportingScheduler(batch, PrintableTokenizer(), [], max_queue=args.requests,
                               prefill_tokens=args.prompt_tokens * args.rows, sync_every=args.sync_every)
    sched.report, sched.clock = report, clock
    return sched


def measure_engine_process(args) -> dict:
    """measure() with the scheduler in an engine process: host time per step from the engine's own clocks."""
    import tempfile

    from redline.serve.engine_process import EngineProcess

    with tempfile.TemporaryDirectory() as tmp:
        report = str(Path(tmp) / "engine.json")
        engine = EngineProcess.start(engine_scheduler, args, report, max_queue=args.requests)
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, 256, (args.requests, args.prompt_tokens), generator=gen).tolist()
        try:
            c0 = time.process_time()
            seconds, loop_cpu, _ = asyncio.run(drive(engine, prompts, args.max_tokens))
            api_cpu = time.process_time() - c0  # the event loop's thread and the reader thread
        finally:
            engine.close()
        r = json.loads(Path(report).read_text())
    steps, tokens = r["steps"], args.requests * args.max_tokens
    host = seconds - r["model_seconds"]
    return {"seconds": seconds, "model_seconds": r["model_seconds"], "host_seconds": host, "steps": steps,
            "tokens": tokens, "host_us_per_step": 1e6 * host / steps, "host_us_per_token": 1e6 * host / tokens,
            "host_cpu_us_per_step": 1e6 * (r["cpu_seconds"] - r["model_cpu_seconds"]) / steps,
            "loop_cpu_us_per_step": 1e6 * api_cpu / steps}


def tiny_model(args) -> GPT:
    """One layer, 32 wide: its calls are cheap next to the host's work."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=261, context_len=args.prompt_tokens + args.max_tokens + 1, n_layer=1, n_embd=32,
                      n_head=2, n_kv_head=1)
    return GPT(cfg).eval()


def preset_model(args) -> GPT:
    """--preset's model with random weights on --device: the scheduler as it serves a real model, without HTTP."""
    from redline.presets import get_preset

    torch.manual_seed(0)
    return GPT(get_preset(args.preset)).to(args.device).eval()


def measure(args, model: GPT, tokenizer, profile: bool, engine: InferenceEngine | None = None) -> dict:
    engine = engine or InferenceEngine(model)
    batch = DecodeBatch(engine, rows=args.rows, capacity=args.prompt_tokens + args.max_tokens + 1)
    clock = ModelClock(engine)
    cls = ProfiledScheduler if profile else TimedScheduler
    sched = cls(batch, tokenizer, [], max_queue=args.requests, prefill_tokens=args.prompt_tokens * args.rows,
                sync_every=args.sync_every)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 256, (args.requests, args.prompt_tokens), generator=gen).tolist()
    try:
        seconds, loop_cpu, tokens = asyncio.run(drive(sched, prompts, args.max_tokens))
    finally:
        sched.close()
    steps = sched.stats.steps
    host = seconds - clock.seconds
    # CPU time of both threads outside the model's calls: unlike wall time, not inflated by other processes
    host_cpu = sched.cpu_seconds - clock.cpu_seconds + loop_cpu
    if profile:
        stats = pstats.Stats(sched.profile, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(args.profile)
    return {"seconds": seconds, "model_seconds": clock.seconds, "host_seconds": host, "steps": steps,
            "tokens": tokens, "host_us_per_step": 1e6 * host / steps, "host_us_per_token": 1e6 * host / tokens,
            "host_cpu_us_per_step": 1e6 * host_cpu / steps, "loop_cpu_us_per_step": 1e6 * loop_cpu / steps}


def trace(args, model: GPT, tokenizer, engine: InferenceEngine) -> None:
    """One run under torch.profiler: is the device waiting for the host (idle gaps between kernels) or the host for
    the device? Prints the GPU's busy share of the span from its first kernel to its last, the idle gaps over 20 µs
    (count and sum), and the kernels taking the most time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        measure(args, model, tokenizer, profile=False, engine=engine)
    kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    if not kernels:
        print("trace: no GPU kernels recorded")
        return
    busy, gaps, end = 0.0, [], kernels[0][0]
    for start, stop in kernels:  # union of intervals (us), and the gaps between them
        if start > end:
            gaps.append(start - end)
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = end - kernels[0][0]
    big = [g for g in gaps if g > 20]
    print(f"trace: GPU busy {busy / 1e3:.1f} of {span / 1e3:.1f} ms ({busy / span:.0%}); idle gaps > 20 us: "
          f"{len(big)}, {sum(big) / 1e3:.1f} ms in all, longest {max(big, default=0) / 1e3:.2f} ms")
    # what the host did during the longest gaps: the CPU-side ops (torch ops, CUDA runtime calls) that began in them
    cpu_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    ends = sorted(((start - gap, start) for (start, _), gap in zip(kernels[1:], gaps_before(kernels))), reverse=True,
                  key=lambda g: g[1] - g[0])
    for lo, hi in ends[:3]:
        inside = sorted((e for e in cpu_events if lo <= e.time_range.start < hi), key=lambda e: -e.cpu_time_total)
        print(f"gap of {(hi - lo) / 1e3:.2f} ms; the longest host ops begun in it: " + ", ".join(
            f"{e.name} {e.cpu_time_total / 1e3:.2f} ms" for e in inside[:8]))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))


def phases(args, model: GPT, tokenizer, engine: InferenceEngine | None) -> None:
    """One run with the wall time of each of the scheduler's methods summed (the first call is the admission of
    every request at once, which no later one repeats)."""
    times: dict[str, list[float]] = {}
    names = ("_drop_cancelled", "_admit", "_first_tokens", "_launch", "_deliver_firsts", "_deliver")

    def timed(name, fn):
        def call(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return fn(self, *a, **k)
            finally:
                times.setdefault(name, []).append(time.perf_counter() - t0)
        return call

    originals = {name: getattr(Scheduler, name) for name in names}
    for name, fn in originals.items():
        setattr(Scheduler, name, timed(name, fn))
    try:
        run = measure(args, model, tokenizer, profile=False, engine=engine)
    finally:
        for name, fn in originals.items():
            setattr(Scheduler, name, fn)
    print(f"phases of one run ({run['seconds'] * 1e3:.1f} ms):")
    for name, t in times.items():
        print(f"  {name:<16} calls {len(t):>4}  first {t[0] * 1e3:8.2f} ms  longest {max(t) * 1e3:8.2f} ms  "
              f"sum {sum(t) * 1e3:8.1f} ms")


def gaps_before(kernels: list[tuple[float, float]]) -> list[float]:
    """For each kernel after the first (start, end in us, sorted by start), the idle time before it (0 if the
    kernels before it still ran)."""
    out, end = [], kernels[0][1]
    for start, stop in kernels[1:]:
        out.append(max(0.0, start - end))
        end = max(end, stop)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--sync-every", type=int, default=8, help="decode steps per read of their tokens")
    p.add_argument("--repeats", type=int, default=3, help="runs; the fastest counts (a shared CPU is noisy)")
    p.add_argument("--profile", type=int, default=0, help="print cProfile's N costliest functions (one more run)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--preset", default="", help="a preset's model (random weights) instead of the tiny one: with "
                   "--device cuda, the scheduler's tokens/s on a GPU without HTTP, against the server's")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where --preset's model runs")
    p.add_argument("--trace", action="store_true",
                   help="with --device cuda: one more run under torch.profiler, printing how busy the GPU was (the "
                        "union of its kernels' intervals over the run's span), its idle gaps, and the top kernels")
    p.add_argument("--phases", action="store_true",
                   help="one more run timing each part of the scheduler's turn (admit, launch, deliver, ...): calls, "
                        "the first call's ms, the longest, the sum")
    p.add_argument("--engine-process", action="store_true",
                   help="the scheduler in an engine process of its own, as `redline serve --engine-process`")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not args.preset:
        p.error("--device cuda needs --preset (the tiny model's steps are all launch overhead on a GPU)")
    if args.engine_process and (args.profile or args.preset):
        p.error("--engine-process measures the tiny model in this process's terms: drop --profile and --preset")
    model = preset_model(args) if args.preset else tiny_model(args)
    tokenizer = PrintableTokenizer()
    engine = None
    if args.preset:  # one engine for every run (compiled and captured once), its first run a warm-up
        engine = InferenceEngine(model)
        measure(args, model, tokenizer, profile=False, engine=engine)
    if args.engine_process:
        runs = [measure_engine_process(args) for _ in range(args.repeats)]
    else:
        runs = [measure(args, model, tokenizer, profile=False, engine=engine) for _ in range(args.repeats)]
    best = min(runs, key=lambda r: r["host_us_per_step"])
    where = "in its own process" if args.engine_process else "in a thread"
    print(f"{args.requests} requests on {args.rows} rows, {args.prompt_tokens}-token prompts, {args.max_tokens} "
          f"new tokens, sync_every {args.sync_every}, {args.preset or 'tiny model'} on {args.device} "
          f"({torch.get_num_threads()} torch thread(s)), engine {where}")
    # in an engine process the host CPU is the engine's alone, and the API process's runs beside it
    cpu, loop = ("engine CPU us/step", "API proc CPU/step") if args.engine_process else ("host CPU us/step",
                                                                                          "of it event loop")
    print(f"{'run':>4} {'wall s':>8} {'model s':>8} {'host s':>8} {'steps':>6} {'host us/step':>13} "
          f"{'host us/token':>14} {cpu:>18} {loop:>18} {'tokens/s':>10}")
    for i, r in enumerate(runs):
        print(f"{i:>4} {r['seconds']:>8.3f} {r['model_seconds']:>8.3f} {r['host_seconds']:>8.3f} {r['steps']:>6} "
              f"{r['host_us_per_step']:>13.1f} {r['host_us_per_token']:>14.2f} {r['host_cpu_us_per_step']:>18.1f} "
              f"{r['loop_cpu_us_per_step']:>18.1f} {r['tokens'] / r['seconds']:>10,.0f}")
    if args.profile:
        measure(args, model, tokenizer, profile=True, engine=engine)
    if args.trace:
        trace(args, model, tokenizer, engine)
    if args.phases:
        phases(args, model, tokenizer, engine)
    print(json.dumps({"engine_process": args.engine_process, "requests": args.requests, "rows": args.rows,
                      "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens, "sync_every": args.sync_every,
                      "host_us_per_step": round(best["host_us_per_step"], 1),
                      "host_us_per_token": round(best["host_us_per_token"], 2),
                      "host_cpu_us_per_step": round(min(r["host_cpu_us_per_step"] for r in runs), 1),
                      "median_host_us_per_step": round(statistics.median(r["host_us_per_step"] for r in runs), 1),
                      "preset": args.preset or None, "device": args.device,
                      "tokens_per_s": round(max(r["tokens"] / r["seconds"] for r in runs), 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
