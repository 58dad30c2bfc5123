"""The HTTP side of `redline serve`: OpenAI's chat completions, completions and models endpoints on FastAPI.

    app = create_app(Server(scheduler, tokenizer, "my-model", renderer=renderer_for(tokenizer)))
    uvicorn.run(app, host="127.0.0.1", port=8000)

Each request becomes one Sequence per choice in the scheduler (scheduler.py); the scheduler's thread hands their
text to the request's asyncio queue (through a Mailbox: one wake-up of the event loop for a group's events). With
the engine in a process of its own (engine_process.py), its reader thread does the handing, one message a turn.
Streams are server-sent events (`data: {chunk}`, then `data: [DONE]`). A client that disconnects cancels its
sequences: a stream when its response is torn down, a plain request by a task that waits for the connection to
close while the request waits for its result. GET / is the chat page (chat.html beside this module).
"""
# (no `from __future__ import annotations`: FastAPI reads the endpoints' annotations, Request among them, at run
# time; fastapi is imported inside functions, so that this module imports without the serve extra)

import asyncio
import contextlib
import hmac
import json
import os
import threading
import time
from dataclasses import dataclass, field, replace

from redline.errors import UserError
from redline.inference.text import prompt_ids
from redline.serve import protocol
from redline.serve.protocol import APIError, Job, bad
from redline.serve.scheduler import ContextTooLong, QueueFull, Scheduler, Sequence, ShuttingDown


LONE_SURROGATE = ("the text holds an unpaired UTF-16 surrogate (an escape from \\ud800 to \\udfff alone); send "
                  "valid Unicode")


@dataclass
class Server:
    """What the endpoints serve: the scheduler, the tokenizer, the model's name and chat template, the limits."""

    scheduler: Scheduler
    """The Scheduler in a thread of this process, or engine_process.py's EngineProcess (the same interface) for
    one in a process of its own."""
    tokenizer: object
    model: str
    renderer: object | None = None
    """redline/chat/render.py's renderer of conversations (prompt(messages) -> ids, stop_ids); None: chat requests
    answer 400 with `no_chat` (why there is none)."""
    no_chat: str = "this model has no chat template: use /v1/completions"
    sampling_defaults: dict = field(default_factory=dict)
    """The model's recommended temperature / top_p / top_k (its generation_config.json) for requests that leave
    them out."""
    api_key: str | None = None
    max_tokens: int | None = None  # the most a request may ask for (None: the context)
    max_body_bytes: int = 1 << 20
    created: int = 0
    mailboxes: dict = field(default_factory=dict, repr=False)  # event loop -> its Mailbox
    token_texts: dict = field(default_factory=dict, repr=False)  # token id -> its text alone (logprobs)
    token_bytes_of: dict = field(default_factory=dict, repr=False)  # token id -> its bytes (logprobs)

    def token_text(self, token: int) -> str:
        """A token's text on its own, as logprobs name it (part of a UTF-8 character decodes to U+FFFD)."""
        text = self.token_texts.get(token)
        if text is None:
            text = self.token_texts[token] = self.tokenizer.decode([token])
        return text

    def token_bytes(self, token: int) -> bytes:
        data = self.token_bytes_of.get(token)
        if data is None:
            data = self.token_bytes_of[token] = self.tokenizer.token_bytes(token)
        return data

    def logprobs(self, job: Job, entries: list[tuple], offsets: protocol.TextOffsets | None = None) -> dict:
        """The choice's logprobs object for entries (scheduler.logprob_entries), in the job's API's shape;
        offsets: the choice's text offsets so far (completions; None: the entries start its text)."""
        if job.kind == "chat":
            return protocol.chat_logprobs(entries, self.token_text, self.token_bytes)
        return protocol.completion_logprobs(entries, self.token_text, self.token_bytes,
                                            offsets or protocol.TextOffsets())

    def mailbox(self, loop: asyncio.AbstractEventLoop) -> "Mailbox":
        if loop not in self.mailboxes:
            self.mailboxes[loop] = Mailbox(loop)
            self.scheduler.flushes.append(self.mailboxes[loop].flush)
        return self.mailboxes[loop]

    def prompt_ids(self, job: Job) -> list[list[int]]:
        """Token ids of each prompt of the job (chat: the conversation through the model's chat template)."""
        if job.kind == "chat":
            if self.renderer is None:
                raise bad(self.no_chat, "messages", "no_chat_template")
            try:
                return [self.renderer.prompt(job.messages)]
            except UserError as e:
                raise bad(str(e), "messages") from None
            except UnicodeEncodeError:  # JSON's "\ud800" escapes decode to lone surrogates, which are not text
                raise bad(LONE_SURROGATE, "messages") from None
        vocab = self.scheduler.vocab_size
        out = []
        for p in job.prompts:
            if isinstance(p, str):
                try:
                    out.append(prompt_ids(self.tokenizer, p))  # an imported model's BOS too, as `redline generate`
                except UnicodeEncodeError:
                    raise bad(LONE_SURROGATE, "prompt") from None
            elif all(isinstance(t, int) and 0 <= t < vocab for t in p):
                out.append(p)
            else:
                raise bad(f"prompt token ids must be integers in [0, {vocab})", "prompt")
        return out

    def sequences(self, job: Job, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> tuple[list, int]:
        """(the job's sequences, choice i being sequences[i]; its prompt tokens), checked, not yet queued."""
        prompts = self.prompt_ids(job)
        if any(not p for p in prompts):
            raise bad("a prompt encodes to no tokens; give some text", "prompt")
        head = self.scheduler.head_width  # the ids the model generates (below vocab_size with model.head_vocab)
        if any(t >= head for t, _ in job.logit_bias):
            raise bad(f"logit_bias names a token id outside the ids the model generates [0, {head})", "logit_bias")
        seqs = []
        stop_ids = frozenset(self.renderer.stop_ids) if job.kind == "chat" else None
        for p, ids in enumerate(prompts):
            max_tokens = job.max_tokens
            if max_tokens is None:
                max_tokens = self.scheduler.capacity - len(ids)
                if self.max_tokens is not None:
                    max_tokens = min(max_tokens, self.max_tokens)
            elif self.max_tokens is not None and max_tokens > self.max_tokens:
                raise bad(f"{job.max_tokens_name} is {max_tokens}; this server allows at most {self.max_tokens}",
                          job.max_tokens_name)
            try:
                self.scheduler.check(len(ids), max(max_tokens, 1))
            except ContextTooLong as e:
                raise bad(str(e), "messages" if job.kind == "chat" else "prompt", "context_length_exceeded")
            for j in range(job.n):
                sampling = job.sampling
                if sampling.seed is not None and j:  # each choice its own stream of random numbers
                    sampling = replace(sampling, seed=sampling.seed + j)
                index = len(seqs)
                sink = self.mailbox(loop).sink(queue, index)
                seqs.append(self.scheduler.sequence_type(
                    ids, max_tokens, sampling, job.stop, sink, stop_ids=stop_ids, logprobs=job.logprobs,
                    prompt_logprobs=job.logprobs if job.echo else None, penalties=job.penalties,
                    logit_bias=job.logit_bias))
        return seqs, sum(len(ids) for ids in prompts)


class Mailbox:
    """Events from the scheduler's thread to one event loop's request queues, with one wake-up of the loop per turn
    of the scheduler: a group of decode steps ends in an event for each of its sequences, and a
    call_soon_threadsafe per event (a write to the loop's wake-up socket, and a fight for the GIL with the
    scheduler's thread) costs more than the rest of the group's bookkeeping. The scheduler calls flush() at the end
    of each turn (Scheduler.flushes)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue, tuple]] = []

    def sink(self, queue: asyncio.Queue, index: int):
        """A Sequence's sink: its events reach `queue` as (index, event) at the next flush."""
        def put(event: tuple) -> None:
            with self._lock:
                self._items.append((queue, (index, event)))

        return put

    def flush(self) -> None:
        """Wake the loop once to hand out every event put since the last flush."""
        with self._lock:
            items, self._items = self._items, []
        if items:
            try:
                self.loop.call_soon_threadsafe(self._deliver, items)
            except RuntimeError:  # the event loop is gone (the server is shutting down): nobody is listening
                pass

    @staticmethod
    def _deliver(items: list) -> None:
        for queue, item in items:
            queue.put_nowait(item)


PUBLIC_PATHS = ("/health", "/")


def chat_page() -> str:
    """The chat page served at / (chat.html beside this module: self-contained, no CDN)."""
    from importlib.resources import files

    return files("redline.serve").joinpath("chat.html").read_text(encoding="utf-8")


def _event_error(event: tuple) -> APIError:
    """The APIError of a sequence's ("error", message[, status]) event: 503 for a shutdown, else 500."""
    if len(event) > 2 and event[2] == 503:
        return APIError(503, event[1], code="shutting_down", type="server_error")
    return APIError(500, f"generation failed: {event[1]}", type="server_error")


def _finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _echoes(server: Server, job: Job, seqs: list[Sequence]) -> list[str]:
    """What each choice's text starts with: its prompt's text with echo (a prompt of ids decoded), else ""."""
    if not job.echo:
        return [""] * len(seqs)
    per_prompt = len(seqs) // len(job.prompts)
    return [p if isinstance(p, str) else server.tokenizer.decode(p)
            for p in job.prompts for _ in range(per_prompt)]


def _usage(prompt_tokens: int, seqs: list[Sequence]) -> dict:
    """A finished request's usage: its prompt once, every choice's output; the prompt's cached tokens are those no
    choice computed (the choices after the first copy the prompt from it)."""
    return protocol.usage(prompt_tokens, sum(s.completion_tokens for s in seqs),
                          min(s.cached_tokens for s in seqs))


def _sse(data) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _error_response(e: APIError, headers: dict | None = None):
    from fastapi.responses import JSONResponse

    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def _key_check(server: Server):
    """A plain ASGI middleware (Starlette's BaseHTTPMiddleware would hide a client's disconnect from the
    endpoints): every path but /health and the chat page (static, no data; it asks for the key and sends it with
    each of its requests) needs the API key, when there is one."""

    def middleware(inner):
        async def check(scope, receive, send):
            if scope["type"] == "http" and server.api_key and scope["path"] not in PUBLIC_PATHS:
                scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").strip().partition(b" ")
                # the scheme is case-insensitive (RFC 9110); the key is compared in constant time
                if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(),
                                                                          server.api_key.encode()):
                    response = _error_response(APIError(
                        401, "missing or wrong API key: send `Authorization: Bearer KEY`", code="invalid_api_key"))
                    await response(scope, receive, send)
                    return
            await inner(scope, receive, send)

        return check

    return middleware


async def read_body(server: Server, request) -> dict:
    """The request's JSON object, within the size limit and naming the served model."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > server.max_body_bytes:
        raise APIError(413, f"the request body is {declared} bytes; the limit is {server.max_body_bytes}")
    # counted as it arrives: a chunked body declares no length, and reading it whole first would hold any size
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > server.max_body_bytes:
            raise APIError(413, f"the request body is over {server.max_body_bytes} bytes, the limit "
                                f"(--max-body-kib)")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except ValueError as e:
        raise bad(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise bad("the request body is not valid JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model is required: the name GET /v1/models lists", "model")
    if model != server.model:
        raise APIError(404, f"the model {model!r} does not exist; this server serves {server.model!r}",
                       "model", "model_not_found")
    return body


async def run(server: Server, request, job: Job):
    """Queue the job's sequences; -> a streaming response, or the whole response once every choice is done."""
    from fastapi.responses import StreamingResponse

    loop, queue = asyncio.get_running_loop(), asyncio.Queue()
    seqs, prompt_tokens = server.sequences(job, loop, queue)
    try:
        server.scheduler.submit(seqs)
    except ShuttingDown as e:
        raise APIError(503, str(e), code="shutting_down", type="server_error") from None
    except QueueFull as e:
        raise APIError(429, str(e), code="rate_limit_exceeded", type="rate_limit_error") from None
    except UserError as e:
        raise bad(str(e)) from None
    rid = protocol.new_id(job.kind)
    echoes = _echoes(server, job, seqs)
    if job.stream:
        return StreamingResponse(stream(server, job, rid, seqs, queue, prompt_tokens, echoes),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    texts = [[text] for text in echoes]
    entries = [[] for _ in seqs]
    watcher = asyncio.create_task(cancel_on_disconnect(request, seqs))
    try:
        remaining = len(seqs)
        while remaining:
            index, event = await queue.get()
            if event[0] == "text":
                texts[index].append(event[1])
                if len(event) > 3:
                    entries[index] += event[3]
            elif event[0] == "prompt":
                entries[index] = event[1] + entries[index]
            elif event[0] == "error":
                raise _event_error(event)
            elif event[0] == "done":
                remaining -= 1
    finally:
        watcher.cancel()
        for seq in seqs:
            if not seq.done:
                seq.cancel()
    use = _usage(prompt_tokens, seqs)
    logprobs = None if job.logprobs is None else [server.logprobs(job, e) for e in entries]
    return protocol.response(job, rid, server.model, ["".join(t) for t in texts],
                             [_finish_reason(s.finish_reason) for s in seqs], use, logprobs)


async def cancel_on_disconnect(request, seqs: list[Sequence]) -> None:
    """Wait for the client to go away (the body has been read: the next message is the disconnect) and cancel its
    sequences; the cancelled ones end with ("done", "cancelled"), which ends the wait for the result."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    for seq in seqs:
        seq.cancel()


def _drain(first, queue: asyncio.Queue) -> list:
    """first and every event already waiting in queue, a choice's adjacent text events merged into one (the text
    joined, the last token count). When the event loop falls behind the scheduler, the events that waited go out as
    one chunk: a loaded server writes fewer chunks per token, where a chunk per event would let it fall further
    behind."""
    items = [first]
    while not queue.empty():
        items.append(queue.get_nowait())
    merged: list = []
    for index, event in items:
        if merged and event[0] == "text" and merged[-1][1][0] == "text" and merged[-1][0] == index:
            last = merged[-1][1]
            entries = [last[3] + event[3]] if len(event) > 3 else []  # a choice with logprobs: its entries too
            merged[-1] = (index, ("text", last[1] + event[1], event[2], *entries))
        else:
            merged.append((index, event))
    return merged


async def stream(server: Server, job: Job, rid: str, seqs: list[Sequence], queue: asyncio.Queue,
                 prompt_tokens: int, echoes: list[str]):
    """The server-sent events of a streamed job; a client that goes away tears this down, which cancels. What has
    arrived since the last write goes out as one write (see _drain)."""
    model = server.model
    text_chunk = protocol.TextChunks(job, rid, model)  # the hot path: one per client per group of tokens
    offsets = [protocol.TextOffsets() for _ in seqs]  # each choice's text so far (completions' text_offset)
    try:
        if job.kind == "chat":
            yield b"".join(_sse(protocol.chunk(job, rid, model, i, role=True)) for i in range(len(seqs)))
        elif job.echo and job.logprobs is None:  # with logprobs, the prompt's text goes with its logprobs (below)
            yield b"".join(_sse(protocol.chunk(job, rid, model, i, text=t)) for i, t in enumerate(echoes))
        remaining = len(seqs)
        while remaining:
            out = []
            for index, event in _drain(await queue.get(), queue):
                if event[0] == "prompt":
                    out.append(_sse(protocol.chunk(job, rid, model, index, text=echoes[index],
                                                   logprobs=server.logprobs(job, event[1], offsets[index]))))
                elif event[0] == "text" and len(event) > 3 and (event[1] or event[3] or job.continuous_usage):
                    logprobs = server.logprobs(job, event[3], offsets[index])
                    progress = (protocol.usage(len(seqs[index].prompt), event[2]) if job.continuous_usage else None)
                    out.append(_sse(protocol.chunk(job, rid, model, index, text=event[1], progress=progress,
                                                   logprobs=logprobs)))
                elif event[0] == "text" and (event[1] or job.continuous_usage):
                    out.append(_sse(text_chunk(index, event[1], len(seqs[index].prompt), event[2])))
                elif event[0] == "error":
                    yield b"".join(out) + _sse(_event_error(event).body())
                    return
                elif event[0] == "done":
                    remaining -= 1
                    progress = (protocol.usage(len(seqs[index].prompt), seqs[index].completion_tokens)
                                if job.continuous_usage else None)
                    out.append(_sse(protocol.chunk(job, rid, model, index, text="" if job.kind != "chat" else None,
                                                   reason=_finish_reason(event[1]), progress=progress)))
            if out:
                yield b"".join(out)
        if job.include_usage:
            use = _usage(prompt_tokens, seqs)
            yield _sse(protocol.chunk(job, rid, model, 0, use=use))
        yield _sse("[DONE]")
    finally:  # finished, or the client went away (the response is torn down mid-stream)
        for seq in seqs:
            if not seq.done:
                seq.cancel()


def create_app(server: Server):
    """The FastAPI application serving `server`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import PlainTextResponse
    from starlette.exceptions import HTTPException

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        # the server is stopping (its requests finished or were cancelled): stop the scheduler's thread, before
        # uvicorn re-raises the signal that stopped it
        await asyncio.get_running_loop().run_in_executor(None, server.scheduler.close)

    app = FastAPI(title="redline serve", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    server.created = server.created or int(time.time())
    app.add_middleware(_key_check(server))

    @app.exception_handler(APIError)
    async def api_error(request, e: APIError):
        return _error_response(e)

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return _error_response(APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", None,
                                        code), getattr(e, "headers", None))  # a 405's Allow

    @app.exception_handler(Exception)
    async def internal_error(request, e: Exception):
        return _error_response(APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error"))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await read_body(server, request)
        return await run(server, request, protocol.chat_job(body, server.sampling_defaults))

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await read_body(server, request)
        return await run(server, request, protocol.completion_job(body, server.sampling_defaults))

    def model_card() -> dict:
        return {"id": server.model, "object": "model", "created": server.created, "owned_by": "redline",
                "context_length": server.scheduler.capacity}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != server.model:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {server.model!r}",
                           "model", "model_not_found")
        return model_card()

    @app.get("/")
    async def page():
        from fastapi.responses import HTMLResponse

        return HTMLResponse(chat_page())

    @app.get("/health")
    async def health():
        if server.scheduler.failure:
            raise APIError(503, server.scheduler.failure, code="engine_failed", type="server_error")
        return {"status": "ok", "model": server.model}

    @app.get("/metrics")
    async def metrics():
        await asyncio.get_running_loop().run_in_executor(None, server.scheduler.refresh_stats)
        return PlainTextResponse(metrics_text(server.scheduler), media_type="text/plain; version=0.0.4")

    return app


def metrics_text(scheduler: Scheduler) -> str:
    """Prometheus text format: requests, tokens, queue depth, batch occupancy (the mean since start, and the
    counters of decode steps and of rows busy in them, whose increase over any span gives that span's), time to
    first token (quantiles of the last 1,024; _count and _sum of all)."""
    s = scheduler.stats
    ttft = sorted(scheduler.stats.ttft_snapshot())
    lines = ["# TYPE redline_requests_total counter", f"redline_requests_total {s.requests}",
             "# TYPE redline_requests_finished_total counter"]
    lines += [f'redline_requests_finished_total{{reason="{r}"}} {n}' for r, n in sorted(s.finished.items())]
    lines += ["# TYPE redline_prompt_tokens_total counter", f"redline_prompt_tokens_total {s.prompt_tokens}",
              "# HELP redline_prompt_tokens_cached_total Prompt tokens copied from a row holding them (prefix reuse).",
              "# TYPE redline_prompt_tokens_cached_total counter",
              f"redline_prompt_tokens_cached_total {s.cached_tokens}",
              "# TYPE redline_completion_tokens_total counter",
              f"redline_completion_tokens_total {s.completion_tokens}",
              "# TYPE redline_queue_depth gauge", f"redline_queue_depth {scheduler.queue_depth()}",
              "# TYPE redline_batch_rows_busy gauge", f"redline_batch_rows_busy {scheduler.busy_rows()}",
              "# TYPE redline_batch_rows gauge", f"redline_batch_rows {scheduler.batch_rows}",
              "# TYPE redline_decode_steps_total counter", f"redline_decode_steps_total {s.steps}",
              "# TYPE redline_batch_busy_row_steps_total counter",
              f"redline_batch_busy_row_steps_total {s.busy_row_steps}",
              "# HELP redline_prefill_graphs Prompt shapes captured as CUDA graphs (each capture stalls the batch once).",
              "# TYPE redline_prefill_graphs gauge", f"redline_prefill_graphs {s.prefill_graphs}",
              "# TYPE redline_batch_occupancy gauge",
              f"redline_batch_occupancy {s.busy_row_steps / s.steps / scheduler.batch_rows if s.steps else 0:.4f}",
              "# TYPE redline_time_to_first_token_seconds summary"]
    for q in (0.5, 0.9, 0.99):
        value = ttft[min(len(ttft) - 1, int(q * len(ttft)))] if ttft else float("nan")
        lines.append(f'redline_time_to_first_token_seconds{{quantile="{q}"}} {value:.6f}')
    lines += [f"redline_time_to_first_token_seconds_count {s.ttft_count}",
              f"redline_time_to_first_token_seconds_sum {s.ttft_sum_s:.6f}",
              "# HELP redline_api_process The HTTP process that answered (--api-processes: each counts its own "
              "requests).", "# TYPE redline_api_process gauge", f'redline_api_process{{pid="{os.getpid()}"}} 1']
    return "\n".join(lines) + "\n"
