"""Load generator for an OpenAI-compatible server (`redline serve`, or any other): N requests from at most C
concurrent clients, arriving as a Poisson process (or all at once), each streaming a completion.

    python scripts/serve_load.py --url http://127.0.0.1:8000 --model NAME --concurrency 64 --requests 256 \\
        --prompt-tokens 128 --max-tokens 256 [--max-tokens-spread 0.5] [--rate 20] [--json-out load.jsonl]

Prompts are random token ids in [0, 256) sent as /v1/completions' `prompt` (exact lengths whatever the tokenizer),
or with --prompt-text random printable ASCII text of that many characters, for servers that take only text
(`transformers serve`): one token a character for a byte-level tokenizer without merges, such as the one `redline
export` writes for the bytes tokenizer; the summary gives the prompt tokens the servers counted. Decoding is greedy
unless --temperature says otherwise (unseeded; a server's API defaults to 1, so most real clients sample).
Reports aggregate output tokens/s, time to first token (TTFT) and inter-token latency (ITL: a request's time from
its first token to its last over its tokens after the first) percentiles, and the gaps between stream chunks; then
one JSON line. Tokens are timed by the usage in every chunk where the server sends it
(`stream_options.continuous_usage_stats`, as redline and vLLM do), else by chunks that carry text. Standard library
only (asyncio sockets), so it runs anywhere. A stream must end with `data: [DONE]` (--done-optional: its
finish_reason is enough). Each client keeps its connection alive between its requests, as HTTP clients' connection
pools do (the `openai` client's among them); --new-connections opens one per request instead.
--shared-prefix-tokens S begins every prompt with the same S tokens (a system prompt); --turns T sends the requests
as conversations of T turns, each prompt the one before with --turn-tokens more (a chat's history sent again),
--conversations N of them in progress at once (default: one per client, carried turn after turn; 0: all of them, each
one's next turn after every other conversation's): loads that a server's prefix reuse should serve faster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Result:
    ok: bool
    start: float
    first: float | None = None
    end: float = 0.0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # the usage's prompt_tokens_details.cached_tokens, where the server sent it
    finish_reason: str | None = None
    chunk_times: list[float] = field(default_factory=list)
    error: str | None = None


async def _read_chunked(reader: asyncio.StreamReader):
    """The body of a chunked HTTP/1.1 response, piece by piece."""
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


async def stream_completion(host: str, port: int, path: str, body: dict, headers: dict,
                            require_done: bool = True, conn: tuple | None = None) -> tuple[Result, tuple | None]:
    """POST a streaming completion and time its server-sent events, on `conn` (a (reader, writer) pair kept alive
    from an earlier request, as HTTP clients pool their connections) or on a new connection. -> (the Result, the
    connection if it can take the next request: the response ended cleanly and the server keeps it open; else None,
    and it is closed). require_done=False takes a stream that ends after a choice's finish_reason as complete
    without `data: [DONE]`."""
    res = Result(ok=False, start=time.perf_counter())
    reader, writer = conn if conn is not None else (None, None)
    keep = False
    try:
        if conn is None:
            reader, writer = await asyncio.open_connection(host, port)
        keep = await _exchange(res, reader, writer, host, port, path, body, headers, require_done)
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        res.end = res.end or time.perf_counter()
        if writer is not None and not keep:
            writer.close()
    return res, (reader, writer) if keep else None


async def _exchange(res: Result, reader, writer, host: str, port: int, path: str, body: dict, headers: dict,
                    require_done: bool) -> bool:
    """One request and its streamed response into `res`. -> whether the connection can take another request."""
    payload = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json",
            f"Content-Length: {len(payload)}", "Accept: text/event-stream"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    await writer.drain()
    status = (await reader.readline()).decode().split(" ", 2)
    if len(status) < 2:
        raise ValueError("the connection closed before a response")
    response_headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        response_headers[k.strip().lower()] = v.strip()
    chunked = response_headers.get("transfer-encoding") == "chunked"
    reusable = chunked and response_headers.get("connection", "").lower() != "close"
    chunks = _read_chunked(reader) if chunked else _read_all(reader)
    if status[1] != "200":
        text = b"".join([c async for c in chunks]).decode(errors="replace")
        res.error = f"HTTP {status[1]}: {text[:200]}"
        return reusable
    buffer = b""
    async for data in chunks:
        buffer += data
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if _event(res, event.decode()):
                res.ok = res.finish_reason is not None
                res.end = time.perf_counter()
                async for _ in chunks:  # the rest of the body (its last, empty chunk): the connection is free again
                    pass
                return reusable
    if not require_done and res.finish_reason is not None:
        res.ok, res.end = True, time.perf_counter()
        return False
    res.error = "the stream ended without [DONE]"
    return False


async def _read_all(reader: asyncio.StreamReader):
    while data := await reader.read(65536):
        yield data


def _event(res: Result, event: str) -> bool:
    """Account for one server-sent event; True at `[DONE]`."""
    for line in event.splitlines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            return True
        chunk = json.loads(data)
        now = time.perf_counter()
        choices = chunk.get("choices") or []
        # with continuous usage stats every chunk says how many tokens there are so far, text or not (a model
        # with random weights makes many tokens that decode to nothing); without, a chunk with text is a token
        tokens = (chunk.get("usage") or {}).get("completion_tokens")
        if tokens is not None:
            res.completion_tokens = tokens
            res.prompt_tokens = chunk["usage"]["prompt_tokens"]
            cached = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
            res.cached_tokens = cached if cached is not None else res.cached_tokens
        if choices and (tokens or any(c.get("text") for c in choices)):
            res.first = res.first or now
            res.chunk_times.append(now)
        for choice in choices:
            if choice.get("finish_reason"):
                res.finish_reason = choice["finish_reason"]
    return False


def percentiles(values: list[float], scale: float = 1000.0) -> dict:
    """p50/p90/p99 and the mean, in ms by default."""
    if not values:
        return {}
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))] * scale  # noqa: E731
    return {"p50": round(pick(0.5), 3), "p90": round(pick(0.9), 3), "p99": round(pick(0.99), 3),
            "mean": round(statistics.fmean(s) * scale, 3)}


async def load(args) -> tuple[list[Result], float, float]:
    """Run the load -> (each request's Result, wall seconds, this process's CPU seconds)."""
    url = urlsplit(args.url)
    host, port = url.hostname, url.port or 80
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    rng = random.Random(args.seed)
    lengths = random.Random(args.seed + 1)  # its own stream: a spread leaves the prompts as they were
    limit = asyncio.Semaphore(args.concurrency)
    idle: list[tuple] = []  # open connections between requests (at most one per client: the semaphore's bound)

    shared = random.Random("shared prefix")  # the beginning every prompt shares (--shared-prefix-tokens): the
    # same in every client process and every load, as a system prompt is
    if args.prompt_text:
        beginning = "".join(chr(shared.randrange(32, 127)) for _ in range(args.shared_prefix_tokens))
    else:
        beginning = [shared.randrange(256) for _ in range(args.shared_prefix_tokens)]

    def draw(n: int):
        """n random tokens (or printable characters with --prompt-text) from the load's seeded stream."""
        if args.prompt_text:
            return "".join(chr(rng.randrange(32, 127)) for _ in range(n))
        return [rng.randrange(256) for _ in range(n)]

    async def send(prompt) -> Result:
        max_tokens = args.max_tokens
        if args.max_tokens_spread:
            max_tokens = max(1, round(args.max_tokens * lengths.uniform(1 - args.max_tokens_spread,
                                                                          1 + args.max_tokens_spread)))
        body = {"model": args.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": args.temperature,
                **({"top_p": args.top_p} if args.top_p < 1 else {}), "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        async with limit:
            conn = idle.pop() if idle and not args.new_connections else None
            result, kept = await stream_completion(host, port, "/v1/completions", body, headers,
                                                   not args.done_optional, conn)
            if conn is not None and not result.ok and result.first is None:  # the server closed the idle
                result, kept = await stream_completion(host, port, "/v1/completions", body, headers,  # one: again
                                                       not args.done_optional)
            conn = kept
            if conn is not None:
                idle.append(conn)
            return result

    # Single requests' prompts (and arrival gaps) are drawn before the clock starts, in the order the tasks below
    # once drew them: drawn by each task as it started, a closed loop's N queued tasks made the event loop draw
    # N - concurrency prompts while the first requests' connections waited, hundreds of milliseconds at 1024
    # requests, counted as the opening requests' TTFT and the load's wall time.
    prompts, gaps = [], []
    if args.turns <= 1:
        for _ in range(args.requests):
            if args.rate > 0:
                gaps.append(rng.expovariate(args.rate))
            prompts.append(beginning + draw(args.prompt_tokens - args.shared_prefix_tokens))

    async def one(i: int) -> Result:
        return await send(prompts[i])

    in_progress = asyncio.Semaphore(args.conversations or args.requests)

    async def conversation(turns: int) -> list[Result]:
        """--turns: each turn's prompt is the last one with --turn-tokens more, sent once the last has ended
        (between turns the client gives up its place: another conversation's turn may take it, and its row). At
        most --conversations of them are begun and not ended at once."""
        async with in_progress:
            prompt, results = beginning + draw(args.prompt_tokens - args.shared_prefix_tokens), []
            for t in range(turns):
                if t:
                    prompt = prompt + draw(args.turn_tokens)
                results.append(await send(prompt))
            return results

    t0, cpu0 = time.perf_counter(), time.process_time()
    tasks = []
    if args.turns > 1:  # the requests as conversations of --turns turns (the last one shorter if they do not divide)
        for c in range(0, args.requests, args.turns):
            tasks.append(asyncio.create_task(conversation(min(args.turns, args.requests - c))))
            if args.rate > 0:
                await asyncio.sleep(rng.expovariate(args.rate))
        results = [r for turns in await asyncio.gather(*tasks) for r in turns]
    else:
        for i in range(args.requests):
            tasks.append(asyncio.create_task(one(i)))
            if args.rate > 0:
                await asyncio.sleep(gaps[i])
        results = await asyncio.gather(*tasks)
    for _, writer in idle:
        writer.close()
    return list(results), time.perf_counter() - t0, time.process_time() - cpu0


async def run(args) -> dict:
    results, wall, cpu = await load(args)
    return summarize(args, results, wall, cpu)


def run_processes(args) -> dict:
    """The load split over args.processes client processes (this script again, each with its share of the
    clients, requests and rate, and prompts of its own), started together; their results merged into one summary,
    whose client_cpu_share is the busiest process's. One Python process parsing every stream's events can become
    what delays the tokens it times; several share that work."""
    import subprocess
    import tempfile
    from dataclasses import fields

    n = args.processes
    start_at = time.perf_counter() + 1.0  # CLOCK_MONOTONIC: the same clock in every process of the machine
    with tempfile.TemporaryDirectory() as tmp:
        procs, outs = [], []
        for i in range(n):
            spec = {**vars(args), "concurrency": args.concurrency // n + (i < args.concurrency % n),
                    "conversations": args.conversations and max(1, args.conversations // n
                                                                + (i < args.conversations % n)),
                    "requests": args.requests // n + (i < args.requests % n), "rate": args.rate / n,
                    "seed": args.seed + 7919 * i, "processes": 1, "start_at": start_at,
                    "out": f"{tmp}/worker{i}.json"}
            outs.append(spec["out"])
            with open(f"{tmp}/spec{i}.json", "w") as f:
                json.dump(spec, f)
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", f"{tmp}/spec{i}.json"]))
        if any(p.wait() != 0 for p in procs):
            raise SystemExit("serve_load.py: a client process failed (its error is above)")
        results, shares = [], []
        for out in outs:
            with open(out) as f:
                done = json.load(f)
            names = {f.name for f in fields(Result)}
            results += [Result(**{k: v for k, v in r.items() if k in names}) for r in done["results"]]
            shares.append(done["cpu"] / max(done["wall"], 1e-9))
    wall = max(r.end for r in results) - start_at
    summary = summarize(args, results, wall)
    summary["client_cpu_share"], summary["client_processes"] = round(max(shares), 3), n
    return summary


def worker(spec_path: str) -> int:
    """One client process of run_processes: its share of the load from the common start time, raw results out."""
    from dataclasses import asdict

    with open(spec_path) as f:
        spec = json.load(f)
    args = argparse.Namespace(**spec)
    time.sleep(max(0.0, spec["start_at"] - time.perf_counter()))
    results, wall, cpu = asyncio.run(load(args))
    with open(spec["out"], "w") as f:
        json.dump({"results": [asdict(r) for r in results], "wall": wall, "cpu": cpu}, f)
    return 0


def summarize(args, results: list[Result], wall: float, cpu: float = 0.0) -> dict:
    """The load's figures; client_cpu_share is this process's CPU seconds over the wall time: near 1, the client
    (one Python process) may be what limits the figures, not the server. With --requests-out, one JSON line per
    request is appended there (seconds from the load's first start: start, first token, end; tokens; error)."""
    if getattr(args, "requests_out", None):
        t0 = min((r.start for r in results), default=0.0)
        with open(args.requests_out, "a") as f:
            for r in sorted(results, key=lambda r: r.start):
                f.write(json.dumps({"start": round(r.start - t0, 6),
                                    "first": None if r.first is None else round(r.first - t0, 6),
                                    "end": round(r.end - t0, 6) if r.end else None,
                                    "completion_tokens": r.completion_tokens, "error": r.error}) + "\n")
    ok = [r for r in results if r.ok]
    tokens = sum(r.completion_tokens for r in ok)
    ttft = [r.first - r.start for r in ok if r.first is not None]
    # the requests after the opening wave (the first `concurrency` to start: in a closed loop they arrive together,
    # on connections not yet open, and wait for each other's prefills): what a client meets once the load runs
    later = sorted((r for r in ok if r.first is not None), key=lambda r: r.start)[args.concurrency:]
    itl = [(r.end - r.first) / (r.completion_tokens - 1) for r in ok if r.first and r.completion_tokens > 1]
    gaps = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    errors = sorted({r.error for r in results if not r.ok and r.error})
    counted = [r.prompt_tokens for r in ok if r.prompt_tokens]  # from the usage the server sent, where it did
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    return {"concurrency": args.concurrency, "requests": args.requests, "completed": len(ok),
            "failed": len(results) - len(ok), "rate": args.rate or None, "prompt_tokens": args.prompt_tokens,
            "server_prompt_tokens": round(statistics.fmean(counted), 2) if counted else None,
            "shared_prefix_tokens": args.shared_prefix_tokens,
            "turns": getattr(args, "turns", 1), "turn_tokens": getattr(args, "turn_tokens", 0),
            "conversations": getattr(args, "conversations", 0),
            "cached_prompt_tokens": round(statistics.fmean(cached), 2) if cached else None,
            "max_tokens": args.max_tokens, "max_tokens_spread": args.max_tokens_spread,
            "temperature": args.temperature, "top_p": args.top_p,
            "new_connections": bool(getattr(args, "new_connections", False)), "wall_s": round(wall, 3),
            "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
            "requests_per_s": round(len(ok) / wall, 3) if wall > 0 else None,
            "ttft_ms": percentiles(ttft), "ttft_ms_after_opening": percentiles([r.first - r.start for r in later]),
            "itl_ms": percentiles(itl), "chunk_gap_ms": percentiles(gaps),
            "finish_reasons": {k: sum(r.finish_reason == k for r in ok) for k in ("stop", "length")},
            "client_cpu_share": round(cpu / wall, 3) if wall > 0 else None, "errors": errors[:5]}


def read_counters(url: str, api_key: str | None) -> dict[str, float]:
    """The unlabelled series of a server's Prometheus /metrics (name -> value)."""
    request = urllib.request.Request(url.rstrip("/") + "/metrics",
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if line.startswith("#") or "{" in name:
            continue
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def check_fits(args) -> None:
    """Exit with a one-line error before the load when its longest request cannot fit the model's context, as the
    server lists it at /v1/models (redline's `context_length`): every such request would fail with a 400. A server
    that does not list the model or its context is not checked."""
    request = urllib.request.Request(args.url.rstrip("/") + "/v1/models",
                                     headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            models = json.loads(response.read().decode()).get("data", [])
    except (OSError, ValueError) as e:
        sys.exit(f"serve_load.py: cannot read {args.url}/v1/models ({e}); is the server up at --url?")
    context = next((m.get("context_length") for m in models if m.get("id") == args.model), None)
    prompt = args.prompt_tokens + (args.turns - 1) * args.turn_tokens
    new = math.ceil(args.max_tokens * (1 + args.max_tokens_spread))
    if isinstance(context, int) and prompt + new > context:
        sys.exit(f"serve_load.py: a request of up to {prompt} prompt and {new} new tokens does not fit {args.model}'s "
                 f"context_length {context}; lower --prompt-tokens or --max-tokens")


def server_figures(before: dict[str, float], after: dict[str, float], wall: float) -> dict:
    """What `redline serve` counted during the load: decode steps, the batch's mean occupancy in them (rows
    decoding / rows), the wall time per step, and its own mean time to first token (from queueing to the first
    token's reaching the host: the rest of the client's TTFT is HTTP and the API process), and the prompt shapes it
    captured as CUDA graphs during the load (each a stall of the batch)."""
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    steps, rows = delta.get("redline_decode_steps_total", 0.0), after.get("redline_batch_rows", 0.0)
    first = delta.get("redline_time_to_first_token_seconds_count", 0.0)
    return {"decode_steps": int(steps),
            "occupancy": round(delta.get("redline_batch_busy_row_steps_total", 0.0) / (steps * rows), 4)
            if steps and rows else None,
            "ms_per_step": round(wall * 1000 / steps, 4) if steps else None,
            "ttft_ms_mean": round(delta["redline_time_to_first_token_seconds_sum"] * 1000 / first, 3)
            if first else None,
            "prefill_graphs_captured": int(delta.get("redline_prefill_graphs", 0.0))}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="the model name the server lists at /v1/models")
    p.add_argument("--concurrency", type=int, default=16, help="most requests in flight at once")
    p.add_argument("--requests", type=int, default=64, help="requests in all")
    p.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (0: all at once)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--shared-prefix-tokens", type=int, default=0,
                   help="the first this many tokens of every prompt are the same (a shared system prompt); the "
                        "summary's cached_prompt_tokens is the mean the server reported reusing")
    p.add_argument("--turns", type=int, default=1,
                   help="send the requests as conversations of this many turns: each turn's prompt is the one "
                        "before with --turn-tokens more (the answer is not sent back: prompts are token ids and "
                        "answers text), so a server that keeps a finished request's cache can copy it")
    p.add_argument("--turn-tokens", type=int, default=32, help="tokens each turn adds to the prompt (--turns)")
    p.add_argument("--conversations", type=int, default=None,
                   help="--turns: conversations in progress at once (default: --concurrency, each client carrying "
                        "one turn after turn; 0: all of them, each one's next turn after every other's)")
    p.add_argument("--prompt-text", action="store_true",
                   help="send prompts as random printable ASCII text of --prompt-tokens characters, not token ids")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--max-tokens-spread", type=float, default=0.0,
                   help="each request asks for max_tokens × a uniform draw in [1 - S, 1 + S] (seeded; 0: all the "
                        "same). With equal lengths a closed-loop load runs in waves: every client ends and asks "
                        "again at once")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="every request's temperature (0: greedy; above 0 the server samples, unseeded)")
    p.add_argument("--top-p", type=float, default=1.0, help="every request's top_p (1: not sent)")
    p.add_argument("--done-optional", action="store_true",
                   help="count a stream that ends after its finish_reason without `data: [DONE]` as complete "
                        "(transformers serve's /v1/completions sends none)")
    p.add_argument("--new-connections", action="store_true",
                   help="a new connection for every request (by default a client keeps its connection alive and "
                        "sends its next request on it, as HTTP clients' connection pools do)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None, help="append the summary as one JSON line to this file")
    p.add_argument("--requests-out", default=None,
                   help="append one JSON line per request to this file (when it started, its first token and its "
                        "end, in seconds from the load's start): where in a load the slow first tokens are")
    p.add_argument("--processes", type=int, default=1,
                   help="client processes sharing the load (each its share of the clients, requests and rate): "
                        "one Python process parsing every stream's events may itself delay what it times")
    p.add_argument("--redline-metrics", action="store_true",
                   help="read `redline serve`'s /metrics before and after the load and add what the server counted "
                        "(decode steps, batch occupancy, ms per step, its own mean TTFT) as \"server\"")
    args = p.parse_args(argv)
    if min(args.concurrency, args.requests, args.prompt_tokens, args.max_tokens) < 1 or args.rate < 0:
        p.error("--concurrency, --requests, --prompt-tokens and --max-tokens must be >= 1, --rate >= 0")
    if not 0 <= args.temperature <= 2 or not 0 < args.top_p <= 1:
        p.error(f"--temperature must be in [0, 2] and --top-p in (0, 1], got {args.temperature} and {args.top_p}")
    if not 0 <= args.max_tokens_spread < 1:
        p.error(f"--max-tokens-spread must be in [0, 1), got {args.max_tokens_spread}")
    if not 0 <= args.shared_prefix_tokens <= args.prompt_tokens:
        p.error(f"--shared-prefix-tokens must be in [0, --prompt-tokens], got {args.shared_prefix_tokens}")
    if args.turns < 1 or args.turn_tokens < 1:
        p.error(f"--turns and --turn-tokens must be >= 1, got {args.turns} and {args.turn_tokens}")
    if args.conversations is None:
        args.conversations = args.concurrency
    if args.conversations < 0:
        p.error(f"--conversations must be >= 0 (0: all), got {args.conversations}")
    if not 1 <= args.processes <= min(args.concurrency, args.requests):
        p.error(f"--processes must be in [1, min(--concurrency, --requests)], got {args.processes}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1])
    args = parse_args(argv)
    check_fits(args)
    before = read_counters(args.url, args.api_key) if args.redline_metrics else None
    summary = run_processes(args) if args.processes > 1 else asyncio.run(run(args))
    if before is not None:
        summary["server"] = server_figures(before, read_counters(args.url, args.api_key), summary["wall_s"])
    print(f"{'concurrency':>11} {'done':>5} {'failed':>6} {'tok/s':>10} {'TTFT p50':>9} {'p90':>8} {'p99':>8} "
          f"{'ITL p50':>8} {'p90':>7} {'p99':>7}  (ms)")
    t, i = summary["ttft_ms"], summary["itl_ms"]
    print(f"{args.concurrency:>11} {summary['completed']:>5} {summary['failed']:>6} "
          f"{summary['output_tokens_per_s'] or 0:>10,.0f} {t.get('p50', 0):>9.1f} {t.get('p90', 0):>8.1f} "
          f"{t.get('p99', 0):>8.1f} {i.get('p50', 0):>8.2f} {i.get('p90', 0):>7.2f} {i.get('p99', 0):>7.2f}  "
          f"(client CPU {summary['client_cpu_share'] or 0:.0%})")
    if (a := summary["ttft_ms_after_opening"]):
        print(f"TTFT after the first {args.concurrency} requests (the opening wave): p50 {a['p50']:.1f}, "
              f"p90 {a['p90']:.1f}, p99 {a['p99']:.1f} ms")
    if args.turns > 1 or args.shared_prefix_tokens:
        print(f"prompt tokens the server copied (prefix reuse): {summary['cached_prompt_tokens']} of "
              f"{summary['server_prompt_tokens']} a request (mean)")
    if "server" in summary:
        srv = summary["server"]
        print(f"the server counted: {srv['decode_steps']} decode steps, batch occupancy {srv['occupancy']}, "
              f"{srv['ms_per_step']} ms of the load per step, its own TTFT {srv['ttft_ms_mean']} ms (mean), "
              f"{srv['prefill_graphs_captured']} prefill graphs captured")
    for error in summary["errors"]:
        print(f"error: {error}", file=sys.stderr)
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(json.dumps(summary) + "\n")
    print(json.dumps(summary))
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
