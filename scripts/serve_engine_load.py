"""`redline serve`'s engine and scheduler under a closed-loop load, in one process and without HTTP: where a
server's decode time goes when requests come and go, against the same batch decoding with every row full.

    python scripts/serve_engine_load.py CKPT [--rows 64] [--prompt-tokens 128] [--max-tokens 256]
        [--spread 0 0.5] [--prefill-wait-ms 0 4] [--prefill-stream on off] [--requests-per-row 16]
        [--sync-every 8] [--group-graphs]
        [--temperature 1 --top-p 0.9] [--host-profile 25] [--kernels] [--json-out F]

Builds the scheduler as `redline serve` does (redline/commands/serve.py: build_scheduler, warmed up), then:

1. full batch: every row prefilled with a random prompt and decoded `max_tokens` steps in groups of --sync-every
   (decode tokens/s with no row ever free: what `redline bench-infer` measures, on the server's own batch);
2. closed loops: `rows` clients that each submit their next request the moment the last one ends (from the
   scheduler's thread, so no time is lost between them), `requests-per-row` each, per --spread (each request's
   max_tokens drawn in max_tokens · [1 - s, 1 + s]), per --prefill-wait-ms and per --prefill-stream; output tokens/s
   and its share of (1), batch occupancy, wall time per decode step, where the scheduler's thread spent the load
   (admitting: prefills launched; launching decode steps; waiting for the device's tokens; handing them over:
   detokenizing, sinks) and, on a GPU, the device's time in prefills, in decode steps and idle (CUDA events around
   each, on the decode steps' stream: with the prefill stream, "prefill" is the time the decode steps waited for
   prefills);
3. prefill: the wall time of one whole-prompt prefill of n rows (prefill_many, as the scheduler admits them) and
   the host's part of it.

--host-profile N prints the scheduler thread's costliest functions over one more loop (cProfile); --kernels the
kernels of a 1-row prefill and of a full-batch decode step (torch.profiler). What the closed loops lose against
(1) with nothing but the scheduler in the way is what a server can recover; what an HTTP server loses beyond it
is the network side's (scripts/gpu/serve_bench.sh measures that). The figures mean something on a CUDA GPU; it
runs on a CPU with a tiny checkpoint (tests/test_serve_engine_load.py).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from redline.commands.serve import ServeConfig, build_scheduler  # noqa: E402
from redline.inference.sampling import SamplingParams  # noqa: E402
from redline.serve.scheduler import Sequence  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def full_batch(sched, prompt: int, steps: int, seed: int) -> dict:
    """Every row busy from one prompt each, `steps` decode steps in groups of sync_every -> decode tokens/s."""
    batch, rng, device = sched.batch, random.Random(seed), sched.device
    vocab = min(sched.vocab_size, 256)
    rows = list(range(batch.rows))
    with torch.no_grad():
        logits = batch.prefill_many(rows, [[rng.randrange(vocab) for _ in range(prompt)] for _ in rows])
        firsts = logits.argmax(-1).tolist()
        for r in rows:
            batch.start(r, firsts[r], prompt)
        group = sched.sync_every
        sync(device)
        t0 = time.perf_counter()
        done = 0
        while done < steps:
            n = min(group, steps - done)
            batch.decode_greedy(n, {n - 1: rows} if done + n >= steps else None)
            done += n
        sync(device)
        seconds = time.perf_counter() - t0
    for r in rows:
        if batch.busy[r]:
            batch.free(r)
    return {"steps": steps, "seconds": round(seconds, 4), "ms_per_step": round(seconds / steps * 1e3, 4),
            "tokens_per_s": round(batch.rows * steps / seconds, 1)}


def prefill_times(sched, prompt: int, counts: list[int], repeats: int = 10) -> dict:
    """Wall milliseconds (median of `repeats`) of one prefill_many of n rows' prompts, from its call to the device's
    end of it, per n; and the host's part (the call's own time)."""
    batch, device, out = sched.batch, sched.device, {}
    rng = random.Random(0)
    with torch.no_grad():
        for n in counts:
            if n > batch.rows:
                continue
            rows = list(range(n))
            prompts = [[rng.randrange(min(sched.vocab_size, 256)) for _ in range(prompt)] for _ in rows]
            batch.prefill_many(rows, prompts)  # captured (or compiled) before it is timed
            sync(device)
            wall_ms, host_ms = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                batch.prefill_many(rows, prompts)
                t1 = time.perf_counter()
                sync(device)
                host_ms.append((t1 - t0) * 1e3)
                wall_ms.append((time.perf_counter() - t0) * 1e3)
            out[n] = {"wall_ms": round(statistics.median(wall_ms), 4),
                      "launch_ms": round(statistics.median(host_ms), 4)}
    return out


class Timed:
    """Wraps the scheduler's turn into its parts and adds up the thread's seconds in each; on a GPU also the device's
    time in what admitting and launching queued (CUDA events around each: the stream runs its work in order, so the
    time between two events is that work's, plus any wait for the host inside it)."""

    PARTS = ("admit", "launch", "wait", "deliver")

    def __init__(self, sched):
        self.seconds = dict.fromkeys(self.PARTS, 0.0)
        self.sched = sched
        self.cuda = sched.device.type == "cuda"
        self.events: dict[str, list] = {"admit": [], "launch": []}
        for name, method in (("admit", sched._admit), ("launch", sched._launch), ("deliver", sched._deliver)):
            setattr(sched, "_" + name, self._wrap(name, method))

    def _wrap(self, name, method):
        def timed(*args):
            t0 = time.perf_counter()
            if name == "deliver":  # the wait for the device's tokens, apart from handing them over
                group = args[0]
                for event in (group.first_event, group.event):
                    if event is not None:
                        event.synchronize()
                t1 = time.perf_counter()
                self.seconds["wait"] += t1 - t0
                t0 = t1
            if self.cuda and name in self.events:
                before = torch.cuda.Event(enable_timing=True)
                before.record()
            result = method(*args)
            if self.cuda and name in self.events:
                after = torch.cuda.Event(enable_timing=True)
                after.record()
                self.events[name].append((before, after))
            self.seconds[name] += time.perf_counter() - t0
            return result
        return timed

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.PARTS, 0.0)
        self.events = {"admit": [], "launch": []}

    def device_seconds(self) -> dict:
        """Device seconds in prefills (admit) and decode steps (launch) since reset()."""
        if not self.cuda:
            return {}
        torch.cuda.synchronize()
        return {("prefill" if k == "admit" else "decode"): sum(a.elapsed_time(b) for a, b in v) / 1e3
                for k, v in self.events.items()}


def closed_loop(sched, timed: Timed, prompt: int, max_tokens: int, spread: float, per_row: int,
                seed: int, profiler: cProfile.Profile | None = None,
                sampling: SamplingParams = SamplingParams()) -> dict:
    """`rows` clients, each submitting its next request when its last ends -> the load's figures. profiler: enabled
    in the scheduler's thread at the first event the load gets, disabled at its last."""
    rows, rng = sched.batch_rows, random.Random(seed)
    vocab = min(sched.vocab_size, 256)
    total = rows * per_row
    requests = []
    for _ in range(total):
        n = max_tokens if not spread else max(1, round(max_tokens * rng.uniform(1 - spread, 1 + spread)))
        requests.append(([rng.randrange(vocab) for _ in range(prompt)], n))
    lock, state = threading.Lock(), {"next": 0, "left": total, "tokens": 0, "errors": []}
    done = threading.Event()

    def submit_next() -> None:
        with lock:
            i = state["next"]
            if i >= total:
                return
            state["next"] = i + 1
        ids, n = requests[i]
        sched.submit([Sequence(ids, n, sampling, (), sink)])

    def sink(event: tuple) -> None:
        if profiler is not None and not state.get("profiling"):
            state["profiling"] = True
            profiler.enable()  # in the scheduler's thread, which calls the sinks
        if event[0] == "text":
            return
        if event[0] == "error":
            state["errors"].append(event[1])
        with lock:
            state["left"] -= 1
            finished = not state["left"]
        if finished:
            if profiler is not None:
                profiler.disable()
            done.set()
        else:
            submit_next()

    s0 = (sched.stats.steps, sched.stats.busy_row_steps, sched.stats.completion_tokens, sched.stats.ttft_count)
    timed.reset()
    t0 = time.perf_counter()
    for _ in range(rows):
        submit_next()
    if not done.wait(900):
        raise RuntimeError("the load did not finish in 15 minutes")
    wall = time.perf_counter() - t0
    time.sleep(0.1)  # the scheduler's thread ends its turn (the last group's sinks) before the batch is used again
    steps = sched.stats.steps - s0[0]
    busy = sched.stats.busy_row_steps - s0[1]
    tokens = sched.stats.completion_tokens - s0[2]
    fresh = sched.stats.ttft_count - s0[3]
    ttft = sched.stats.ttft_snapshot()[-fresh:] if fresh else []  # (the scheduler's own: submit to first token)
    parts = {k: round(v / wall, 4) for k, v in timed.seconds.items()}
    parts["other"] = round(1 - sum(parts.values()), 4)
    device = {k: round(v / wall, 4) for k, v in timed.device_seconds().items()}
    if device:
        device["idle"] = round(1 - sum(device.values()), 4)
    return {"spread": spread, "requests": total, "errors": len(state["errors"]), "wall_s": round(wall, 3),
            "tokens": tokens, "tokens_per_s": round(tokens / wall, 1), "steps": steps,
            "occupancy": round(busy / steps / rows, 4) if steps else 0.0,
            "ms_per_step": round(wall / steps * 1e3, 4) if steps else 0.0,
            "ttft_ms_p50": round(statistics.median(ttft) * 1e3, 2) if ttft else None,
            "thread_share": parts, "device_share": device}


def host_profile(sched, timed: Timed, args, spread: float, top: int) -> str:
    """cProfile of the scheduler's thread over one more closed loop -> its `top` costliest functions (own time)."""
    profiler = cProfile.Profile()
    closed_loop(sched, timed, args.prompt_tokens, args.max_tokens, spread, max(2, args.requests_per_row // 4),
                args.seed + 200, profiler, SamplingParams(temperature=args.temperature, top_p=args.top_p))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def kernel_counts(sched, prompt: int) -> dict:
    """torch.profiler over a 1-row prefill and a full-batch decode step, each captured before (ten calls) -> kernels
    per call, their summed device time and the costliest kernels."""
    from torch.profiler import ProfilerActivity, profile

    batch, rows = sched.batch, list(range(sched.batch.rows))

    def profiled(call) -> dict:
        call()
        sync(sched.device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                call()
            sync(sched.device)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        by_name: dict[str, float] = {}
        for e in kernels:
            by_name[e.name[:60]] = by_name.get(e.name[:60], 0.0) + e.time_range.elapsed_us() / 10
        return {"kernels": len(kernels) / 10,
                "device_us": round(sum(e.time_range.elapsed_us() for e in kernels) / 10, 1),
                "top": sorted(((round(v, 1), k) for k, v in by_name.items()), reverse=True)[:8]}

    with torch.no_grad():
        out = {"prefill_1_row": profiled(lambda: batch.prefill_many([0], [[1] * prompt]))}
        logits = batch.prefill_many(rows, [[1] * prompt] * len(rows))
        for r in rows:
            batch.start(r, logits[r].argmax(), prompt)
        out["decode_step"] = profiled(lambda: batch.decode_greedy(1))
        for r in rows:
            batch.free(r)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--spread", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument("--requests-per-row", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="closed loops per spread (median reported)")
    parser.add_argument("--sync-every", type=int, default=0)
    parser.add_argument("--prefill-tokens", type=int, default=2048)
    parser.add_argument("--prefill-wait-ms", type=float, nargs="+", default=[0.0],
                        help="the scheduler's prefill_wait_ms; several: each in turn on the same scheduler")
    parser.add_argument("--group-graphs", action="store_true")
    parser.add_argument("--prefill-stream", nargs="+", choices=("on", "off"), default=["on"],
                        help="prefill on a CUDA stream of its own beside the decode steps, or not; both: each in turn")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="every request's temperature (0: greedy; above 0 the rows sample, unseeded)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--no-warmup", action="store_true", help="skip the server's warm-up (CPU tests)")
    parser.add_argument("--host-profile", type=int, default=0,
                        help="print the scheduler thread's N costliest functions over a closed loop (cProfile)")
    parser.add_argument("--kernels", action="store_true", help="kernels of a prefill and of a decode step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    if not 0 <= min(args.spread) and max(args.spread) < 1:
        parser.error("--spread values must be in [0, 1)")
    if args.kernels and not torch.cuda.is_available():
        parser.error("--kernels needs a CUDA GPU")
    context = -(-(args.prompt_tokens + round(args.max_tokens * (1 + max(args.spread))) + 1) // 64) * 64
    cfg = ServeConfig(checkpoint=args.checkpoint, max_batch=args.rows, context=context, sync_every=args.sync_every,
                      prefill_tokens=args.prefill_tokens, prefill_wait_ms=args.prefill_wait_ms[0],
                      group_graphs=args.group_graphs, warmup=not args.no_warmup)
    if args.device:
        cfg.runtime.device = args.device
    t0 = time.perf_counter()
    sched, _ = build_scheduler(cfg)
    timed = Timed(sched)
    result = {"checkpoint": args.checkpoint, "rows": args.rows, "prompt_tokens": args.prompt_tokens,
              "max_tokens": args.max_tokens, "context": context, "sync_every": sched.sync_every,
              "group_graphs": args.group_graphs, "temperature": args.temperature, "top_p": args.top_p,
              "engine": sched.describe(), "build_s": round(time.perf_counter() - t0, 1)}
    # a first loop captures the prefill shapes that arrivals make (not recorded), as serve_bench.sh's warm-up load
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p)
    closed_loop(sched, timed, args.prompt_tokens, args.max_tokens, max(args.spread), 2, args.seed + 50,
                sampling=sampling)
    # the full batch and the loads take turns, so that a drift of the machine shows in both
    result["full_batch"], result["loads"] = [], []
    for r in range(args.repeats):
        result["full_batch"].append(full_batch(sched, args.prompt_tokens, args.max_tokens, args.seed + r))
        for stream, wait in ((p, w) for p in args.prefill_stream for w in args.prefill_wait_ms):
            sched.prefill_wait_s, sched.prefill_stream = wait / 1000, stream == "on"
            for spread in args.spread:
                load = closed_loop(sched, timed, args.prompt_tokens, args.max_tokens, spread, args.requests_per_row,
                                   args.seed + r, sampling=sampling)
                result["loads"].append(dict(load, prefill_wait_ms=wait, prefill_stream=stream))
    sched.prefill_wait_s, sched.prefill_stream = args.prefill_wait_ms[0] / 1000, args.prefill_stream[0] == "on"
    result["prefill_ms"] = prefill_times(sched, args.prompt_tokens, [1, 2, 4, 8, 16, 64])
    full = statistics.median(f["tokens_per_s"] for f in result["full_batch"])
    print(f"full batch ({args.rows} rows): {full:,.0f} decode tokens/s "
          f"({statistics.median(f['ms_per_step'] for f in result['full_batch']):.3f} ms a step)")
    summary = {}
    for stream, wait, spread in ((p, w, s) for p in args.prefill_stream for w in args.prefill_wait_ms
                                 for s in args.spread):
        loads = [x for x in result["loads"]
                 if x["spread"] == spread and x["prefill_wait_ms"] == wait and x["prefill_stream"] == stream]
        med = statistics.median(x["tokens_per_s"] for x in loads)
        mid = min(loads, key=lambda x: abs(x["tokens_per_s"] - med))
        summary[f"spread {spread}, wait {wait:g} ms, prefill stream {stream}"] = {
            "tokens_per_s": med, "share": round(med / full, 4), "occupancy": mid["occupancy"],
            "ms_per_step": mid["ms_per_step"], "ttft_ms_p50": mid["ttft_ms_p50"],
            "thread_share": mid["thread_share"], "device_share": mid["device_share"]}
        print(f"closed loop, spread {spread}, prefill wait {wait:g} ms, prefill stream {stream}: {med:,.0f} tokens/s = {med / full:.1%} of the full batch; occupancy "
              f"{mid['occupancy']:.3f}, {mid['ms_per_step']:.3f} ms a step; scheduler thread: "
              + ", ".join(f"{k} {v:.0%}" for k, v in mid["thread_share"].items())
              + ("; device: " + ", ".join(f"{k} {v:.0%}" for k, v in mid["device_share"].items())
                 if mid["device_share"] else ""))
    for n, t in result["prefill_ms"].items():
        print(f"prefill of {n} row(s) x {args.prompt_tokens} tokens: {t['wall_ms']:.3f} ms "
              f"(launch {t['launch_ms']:.3f} ms)")
    result["summary"] = summary
    if args.host_profile:
        for spread in args.spread:
            print(f"--- scheduler thread, closed loop of spread {spread} (cProfile, own time) ---")
            print(host_profile(sched, timed, args, spread, args.host_profile))
    if args.kernels:
        result["kernels"] = kernel_counts(sched, args.prompt_tokens)
        for name, k in result["kernels"].items():
            print(f"{name}: {k['kernels']:.0f} kernels, {k['device_us']:.0f} us of kernel time; top: {k['top']}")
    sched.close()
    errors = sum(x["errors"] for x in result["loads"])
    if errors:
        print(f"serve_engine_load: {errors} requests ended in an error", file=sys.stderr)
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(json.dumps(result) + "\n")
    print(json.dumps({"summary": summary, "full_batch_tokens_per_s": full, "prefill_ms": result["prefill_ms"]}))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
