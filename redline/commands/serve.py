"""`redline serve CKPT`: an OpenAI-compatible HTTP server for a checkpoint, with continuous batching.

Endpoints: POST /v1/chat/completions (messages through the model's chat template), POST /v1/completions,
GET /v1/models, GET /health, GET /metrics (Prometheus text). Streams are server-sent events ending with
`data: [DONE]`. Requests share one static batch of --max-batch rows: a request takes a free row as soon as one
is free, and gives it back the moment it finishes, stops or its client disconnects. Listens on loopback unless
--host says otherwise; --api-key (or REDLINE_API_KEY) makes every endpoint but /health need it. See docs/serve.md.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import tyro

from redline.errors import UserError
from redline.inference.runtime import RuntimeOptions

API_KEY_ENV = "REDLINE_API_KEY"


@dataclass
class ServeConfig:
    checkpoint: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="CKPT")]
    """A checkpoint folder or a run directory (its newest checkpoint)."""
    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0: every interface; then set --api-key)."""
    port: int = 8000
    """Port to listen on."""
    max_batch: int = 32
    """Rows of the static decode batch: requests decoding at once (more wait in the queue)."""
    max_queue: int = 256
    """Requests (choices) that may wait for a row; beyond it the server answers 429."""
    context: int = 0
    """Most prompt plus generated tokens per request (0: the model's context_len); the KV cache holds
    max_batch × context tokens."""
    max_tokens: int = 0
    """The most tokens a request may ask for (0: up to the context)."""
    prefill_tokens: int = 2048
    """Prompt tokens prefilled between two groups of decode steps while other requests decode (waiting prompts
    that fit go through together, padded to the longest): a long prompt enters in spans of this many, so running
    streams pause for one span at a time."""
    sync_every: int = 0
    """Decode steps launched between two reads of their tokens on the host (0: 8 on a GPU, 1 on a CPU)."""
    prefill_wait_ms: float = 0.0
    """While other requests decode, let a new request wait up to this many milliseconds for more to arrive, so that
    they are prefilled together (one forward for several prompts) rather than one forward each between decode
    steps; a request that finds no other decoding, or takes the last free row, is prefilled at once (docs/serve.md:
    it paid before prefills were CUDA graphs, not since)."""
    prefix_min_tokens: int = 128
    """Prefix reuse: a prompt whose first N or more tokens a row of the batch still holds from an earlier request
    (a chat's history sent again with one more turn, a shared system prompt, the other choices of n > 1) copies
    their keys and values from that row and computes only the rest (0: off; docs/serve.md). Shorter beginnings are
    not worth the bookkeeping."""
    prefix_parked_rows: int = 0
    """Prefix reuse: cache rows beyond the batch's that keep finished requests' prompts and answers when their rows
    are given to others, least recently used first out, so a conversation's next turn finds its history however
    busy the batch was meanwhile (each costs a row of KV-cache memory; e.g. --max-batch's count doubles it; 0: only
    what the batch's own rows still hold). Opt in: not measured on a GPU yet (docs/serve.md)."""
    group_graphs: bool = False
    """Capture each group of --sync-every greedy decode steps as one CUDA graph (one launch per group instead of
    one per step; rows that finish inside a group are freed by the graph). Experimental: opt in."""
    prefill_stream: bool = True
    """On a GPU, prefill admitted prompts on a CUDA stream of their own, beside the decode steps already queued
    (a 124M model's decode step leaves most of the GPU idle), instead of after them; False: one stream, as
    before (for comparison)."""
    freeze_heap: bool = True
    """Once warm, move what start-up left in each serving process (torch, the compiled model) out of the garbage
    collector's reach, so that no full collection stalls every stream under load; False: leave the collector as
    Python sets it (for comparison)."""
    switch_interval_ms: float = 0.5
    """Python's thread switch interval in this process (sys.setswitchinterval), milliseconds: how long the event
    loop's thread may hold the GIL while the scheduler's thread waits to launch the next decode step."""
    model_name: str | None = None
    """The model's name in the API (None: the checkpoint's folder name)."""
    chat_template: str | None = None
    """A Jinja chat template file for /v1/chat/completions, for a Hugging Face tokenizer (default: the tokenizer's
    own template, else redline's chat format for a model `redline sft` fine-tuned)."""
    api_key: str | None = None
    """Require `Authorization: Bearer KEY` on every endpoint but /health (default: $REDLINE_API_KEY, if set)."""
    max_body_kib: int = 1024
    """Largest request body accepted (larger: 413)."""
    shutdown_timeout: float = 10.0
    """On SIGTERM or Ctrl-C: seconds to let requests in flight (running or queued) finish before cancelling them;
    new connections are refused from the signal on."""
    engine_process: bool | None = None
    """Run the engine (model, batch, scheduler, detokenizing) in a process of its own, so that its Python runs
    beside the HTTP side's instead of taking turns with it for one GIL (default: on for CUDA, off on a CPU; see
    docs/serve.md)."""
    api_processes: int = 1
    """HTTP processes sharing the port, each with its own event loop, over one engine process (vLLM's
    --api-server-count), for loads where one Python process parsing requests and writing every stream's events is
    the limit (on an H100 at 124M it was not: no gain measured, docs/serve.md). Each process's /metrics counts its
    own requests (the engine's counters are the engine's). More than 1 runs the engine in its own process."""
    warmup: bool = True
    """Compile and capture every decode width before listening (GPU), so no request waits for it."""
    tokenizer: str | None = None
    """Tokenizer override; it must be the checkpoint's own."""
    runtime: tyro.conf.OmitArgPrefixes[RuntimeOptions] = field(default_factory=RuntimeOptions)
    """Device, precision, compilation and CUDA graphs."""

    def validate(self) -> None:
        for name in ("max_batch", "max_queue", "prefill_tokens", "max_body_kib"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.prefix_min_tokens < 0:
            raise UserError(f"--prefix-min-tokens must be >= 0 (0: no prefix reuse), got {self.prefix_min_tokens}")
        if self.prefix_parked_rows < 0:
            raise UserError(f"--prefix-parked-rows must be >= 0 (0: none), got {self.prefix_parked_rows}")
        for name in ("context", "max_tokens", "sync_every"):
            if getattr(self, name) < 0:
                raise UserError(f"--{name.replace('_', '-')} must be >= 0 (0: automatic), got {getattr(self, name)}")
        if not 0 < self.switch_interval_ms <= 100:
            raise UserError(f"--switch-interval-ms must be in (0, 100], got {self.switch_interval_ms}")
        if not 0 <= self.prefill_wait_ms <= 10_000:
            raise UserError(f"--prefill-wait-ms must be in [0, 10000], got {self.prefill_wait_ms}")
        if self.shutdown_timeout < 0:
            raise UserError(f"--shutdown-timeout must be >= 0 seconds, got {self.shutdown_timeout}")
        if not 0 < self.port < 65536:
            raise UserError(f"--port must be in 1..65535, got {self.port}")
        if not 1 <= self.api_processes <= 64:
            raise UserError(f"--api-processes must be in 1..64, got {self.api_processes}")
        if self.api_processes > 1 and self.engine_process is False:
            raise UserError("--api-processes above 1 needs the engine in its own process: drop --engine-process "
                            "False")


def require_serve_extra() -> None:
    """A clear error, before any model loads, when fastapi or uvicorn is missing."""
    missing = []
    for module in ("fastapi", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise UserError(f"redline serve needs {' and '.join(missing)}: pip install 'redline[serve]'")


def require_free_port(host: str, port: int) -> None:
    """A one-line error, before the model loads (and compiles) for nothing, when host:port cannot be listened on."""
    import errno
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise UserError(f"--host {host}: not an address of this machine ({e.strerror}); give e.g. 127.0.0.1") \
            from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
        try:
            sock.bind(address)
        except OSError as e:
            hint = ("another process listens there: pick another --port or stop it" if e.errno == errno.EADDRINUSE
                    else "pick another --host or --port")
            raise UserError(f"cannot listen on {host}:{port} ({e.strerror}); {hint}") from None


def served_name(path: str) -> str:
    """The model's name in the API when --model-name gives none: the folder given, a run directory's own name (so
    clients keep their `model` when the run writes a newer checkpoint), or a checkpoint folder's."""
    from redline.training.checkpoint import resolve_checkpoint

    given, checkpoint = Path(path).resolve(), resolve_checkpoint(path).resolve()
    if given == checkpoint or not given.is_dir():
        return checkpoint.name
    return given.parent.name if given.name == "checkpoints" else given.name


def chat_renderer(path: str | None, tokenizer):
    """(the renderer of chat requests or None, why there is none): redline/chat/render.py's for the tokenizer
    (its Jinja template, else redline's chat tokens), or a Jinja template file given for a Hugging Face one."""
    from redline.chat.render import JinjaRenderer, renderer_for

    if path is not None:
        from redline.chat import ChatTemplate

        p = Path(path)
        if not p.is_file():
            raise UserError(f"--chat-template {path}: no such file")
        if not hasattr(tokenizer, "encode_with_specials"):
            raise UserError(f"--chat-template needs a Hugging Face tokenizer (tokenizer.json); this checkpoint's is "
                            f"{tokenizer.name}: fine-tune it with `redline sft` for redline's own chat format")
        specials = tokenizer.special_tokens_map()
        return JinjaRenderer(tokenizer, ChatTemplate(p.read_text(encoding="utf-8"), specials)), ""
    try:
        return renderer_for(tokenizer), ""
    except UserError as e:
        return None, f"{e}; or use /v1/completions"


def warm_up(batch) -> None:
    """Compile the prefill (whole prompts, spans after a prefix and rows' rests after a copied beginning, on one row
    and several, of one token and of several: the compiled code specialises on size 1; prompts longer than a
    sliding window) and capture the decode step at every width, greedy and sampled (the logits' step, and
    decode_sampled's with and without top-p), so that no request waits for it. Leaves every row free."""
    import torch

    room = batch.capacity - 1
    ids = [0] * min(16, room - 1)
    with torch.no_grad():
        batch.prefill(1, ids[:1])
        if batch.rows > 2:  # several rows' whole prompts together (the batch dimension specialises on 1, too)
            batch.prefill_many([1, 2], [ids[:8], ids[:5]])
            batch.prefill_many([2, 1, min(3, batch.rows - 1)], [ids[:3], ids[:9], ids[:4]])
            # the rests of prompts after a copied beginning (prefix reuse): rows at a slot past 0, several and one
            # (the compiled code specialises on one row, and on a rest of one token where prefills are not graphed)
            batch.prefill_many([1, 2], [ids[4:9], ids[3:6]], 3)
            batch.prefill_many([1], [ids[4:9]], 3)
            batch.prefill_many([1], [ids[3:4]], 3)
            batch.prefill_many([1, 2], [ids[3:4], ids[3:4]], 3)
            window = batch.engine.cfg.sliding_window
            if 0 < window < room - 1:  # prompts longer than a sliding window attend under a mask from slot 0 on
                longer = [0] * (window + 1)
                batch.prefill_many([1, 2], [longer, longer[:-1]])
                batch.prefill_many([1], [longer])
        batch.prefill(0, ids[:8])
        batch.prefill(0, ids[8:9], start=8)
        logits = batch.prefill(0, ids[9:], start=9)
        batch.start(0, int(logits.argmax()), len(ids), temperature=1.0)
        for i in range(room - len(ids)):  # the row walks through every width: greedy, logits, sampled steps
            if i % 4 in (0, 2) and batch.captured_draw:  # decode_sampled's graphs, without and with top-p
                try:
                    batch.decode_sampled(1, top_p=i % 4 == 2)
                    continue
                except Exception as e:  # noqa: BLE001 - a device or library that cannot capture the draw
                    batch.captured_draw = False
                    print(f"redline serve: the sampling step could not be captured ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); sampled requests draw after each step "
                          f"instead", file=sys.stderr, flush=True)
            if i % 2:
                batch.step()
            else:
                batch.advance(batch.step(greedy=False).argmax(-1))
        batch.free(0)
        if batch.group_steps:  # and each width's group graph (a row walked through the widths a group at a time)
            batch.start(0, 0, 1)
            for _ in range((room - 1) // batch.group_steps):
                batch.decode_greedy(batch.group_steps)
    batch.free(0)


def draining_server(uvicorn, scheduler, timeout: float):
    """uvicorn's Server, whose shutdown (SIGTERM, Ctrl-C) first closes the listening sockets, then lets the
    scheduler finish what is running and queued for up to `timeout` seconds and cancels the rest with an error
    event (503: the server shut down), so that every response ends properly before uvicorn waits for its
    connections to close (it would cancel their tasks after its own timeout, mid-response)."""

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets=None):
            import asyncio

            for listener in self.servers:
                listener.close()
            drained = await asyncio.get_running_loop().run_in_executor(None, scheduler.drain, timeout)
            if not drained:
                print(f"redline serve: cancelled the requests still running after --shutdown-timeout {timeout:g} s",
                      file=sys.stderr, flush=True)
            await super().shutdown(sockets)

    return DrainingServer


def build_scheduler(cfg: ServeConfig):
    """(the Scheduler, its thread running, the tokenizer) for a checkpoint, the model loaded and warmed up: in
    this process, or in the engine process (engine_process.py calls it there)."""
    from redline.inference.batch import DecodeBatch
    from redline.inference.runtime import load_generator
    from redline.inference.text import stop_token_ids
    from redline.serve.scheduler import Scheduler, default_sync_every

    generator, _ = load_generator(cfg.checkpoint, cfg.tokenizer, cfg.runtime)
    engine, tokenizer = generator.engine, generator.tokenizer
    context = cfg.context or engine.cfg.context_len
    sync_every = cfg.sync_every or default_sync_every(engine.device)
    batch = DecodeBatch(engine, rows=cfg.max_batch, capacity=context,
                        group_steps=sync_every if cfg.group_graphs else 0, parked_rows=parked_rows(cfg))
    if cfg.warmup and (engine.plan.compile or engine.plan.cuda_graphs):
        print("redline serve: compiling and capturing the decode step...", file=sys.stderr, flush=True)
        warm_up(batch)
    scheduler = Scheduler(batch, tokenizer, stop_token_ids(tokenizer), max_queue=cfg.max_queue,
                          prefill_tokens=cfg.prefill_tokens, sync_every=sync_every,
                          prefill_wait_ms=cfg.prefill_wait_ms, prefix_min_tokens=cfg.prefix_min_tokens,
                          prefill_stream=cfg.prefill_stream)
    return scheduler, tokenizer


def parked_rows(cfg: ServeConfig) -> int:
    """The cache rows kept for finished requests' prefixes (none without prefix reuse)."""
    return cfg.prefix_parked_rows if cfg.prefix_min_tokens else 0


def engine_scheduler(cfg: ServeConfig):
    """The engine process's scheduler (EngineProcess.start's builder)."""
    scheduler = build_scheduler(cfg)[0]
    freeze_startup_heap(cfg)
    return scheduler


def freeze_startup_heap(cfg: ServeConfig) -> None:
    """Move every object alive after start-up (torch's and the compiler's, the model's, the captured graphs') out
    of the garbage collector's reach. A process that has imported torch and compiled a model holds some hundreds of
    thousands of objects that a full collection walks, a stall of a few hundred milliseconds that every running
    stream and every waiting first token sits through, triggered at whatever moment the requests' own objects
    tip the collector's count. Frozen, a collection walks only what was made since. (vLLM freezes its heap after
    capturing its CUDA graphs for the same reason.)"""
    if cfg.freeze_heap:
        gc.collect()
        gc.freeze()


def uses_engine_process(cfg: ServeConfig) -> bool:
    """--engine-process, or by default: on for CUDA, where the scheduler's Python and the HTTP side's would take
    turns for one GIL while the device waits (measured on an H100 at 64 streams: 62% and 60% of bench-infer's
    batch-64 decode with it, 50% and 45% without; docs/serve.md), off on a CPU (the device is the host: nothing to
    overlap)."""
    if cfg.engine_process is not None or cfg.api_processes > 1:
        return cfg.engine_process is not False
    if cfg.runtime.device != "auto":
        return cfg.runtime.device == "cuda"
    import torch

    # not resolve_device(): it selects the GPU, which creates a CUDA context in this process (memory on the device
    # for a process that never uses it); is_available() does not
    return torch.cuda.is_available()


def build(cfg: ServeConfig):
    """(Server, the FastAPI app) for a checkpoint, the model loaded and warmed up: the scheduler in a thread of
    this process, or in an engine process of its own (--engine-process)."""
    if uses_engine_process(cfg):
        from redline.serve.engine_process import EngineProcess

        # the tokenizer and chat template first: a bad one fails at once, not after the engine compiled (the engine
        # checks that the tokenizer is the checkpoint's)
        tokenizer = checkpoint_tokenizer(cfg)
        renderer = chat_renderer(cfg.chat_template, tokenizer)
        scheduler = EngineProcess.start(engine_scheduler, cfg, max_queue=cfg.max_queue,
                                        switch_interval_s=cfg.switch_interval_ms / 1000,
                                        frontends=cfg.api_processes)
    else:
        scheduler, tokenizer = build_scheduler(cfg)
        renderer = chat_renderer(cfg.chat_template, tokenizer)
    return frontend(cfg, scheduler, tokenizer, renderer)


def checkpoint_tokenizer(cfg: ServeConfig):
    """The tokenizer the API renders and counts with: --tokenizer, else the checkpoint's."""
    from redline.tokenizer import load_tokenizer
    from redline.training.checkpoint import resolve_checkpoint

    return load_tokenizer(cfg.tokenizer or str(resolve_checkpoint(cfg.checkpoint) / "tokenizer"))


def frontend(cfg: ServeConfig, scheduler, tokenizer, renderer: tuple):
    """(Server, the FastAPI app) over a scheduler (a Scheduler, or an EngineProcess); renderer: chat_renderer's."""
    from redline.inference.runtime import recommended_sampling
    from redline.serve.api import Server, create_app

    recommended = recommended_sampling(cfg.checkpoint)
    server = Server(scheduler, tokenizer, cfg.model_name or served_name(cfg.checkpoint), renderer=renderer[0],
                    no_chat=renderer[1], api_key=cfg.api_key or os.environ.get(API_KEY_ENV) or None,
                    max_tokens=cfg.max_tokens or None, max_body_bytes=cfg.max_body_kib * 1024,
                    sampling_defaults={k: v for k, v in recommended.items() if k != "repetition_penalty"})
    return server, create_app(server)


def api_process(cfg: ServeConfig, conn, sock) -> None:
    """Another HTTP process (--api-processes): its own Server over the engine process's pipe `conn`, serving the
    listening socket `sock` that the first process bound (the kernel spreads the connections)."""
    import uvicorn

    from redline.serve.engine_process import EngineProcess

    sys.setswitchinterval(cfg.switch_interval_ms / 1000)
    tokenizer = checkpoint_tokenizer(cfg)
    renderer = chat_renderer(cfg.chat_template, tokenizer)
    engine = EngineProcess.attach(conn, cfg.max_queue)
    _, app = frontend(cfg, engine, tokenizer, renderer)
    freeze_startup_heap(cfg)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    try:
        draining_server(uvicorn, engine, cfg.shutdown_timeout)(config).run(sockets=[sock])
    finally:
        engine.close()


def main(argv: list[str]) -> int:
    from redline.config import parse
    from redline.inference.runtime import expand_bool_flags

    # --warmup False, --no-warmup, a bare --group-graphs
    argv = expand_bool_flags(argv, ("warmup", "group-graphs", "engine-process", "prefill-stream", "freeze-heap"))
    cfg = parse(ServeConfig, argv, prog="redline serve", description=__doc__.strip())
    require_serve_extra()
    require_free_port(cfg.host, cfg.port)
    import uvicorn

    # the scheduler's thread launches a decode step every few hundred microseconds and shares the GIL with the
    # event loop's thread (HTTP, JSON): Python's default 5 ms switch interval would let one event-loop burst hold
    # the device idle for a whole interval
    sys.setswitchinterval(cfg.switch_interval_ms / 1000)
    server, app = build(cfg)
    freeze_startup_heap(cfg)
    if cfg.host not in ("127.0.0.1", "localhost", "::1") and not server.api_key:
        print(f"redline serve: warning: listening on {cfg.host} without --api-key: anyone who can reach this "
              f"port can use the model", file=sys.stderr)
    desc = server.scheduler.describe()
    pid = getattr(server.scheduler, "pid", None)
    print(f"redline serve: {server.model} on http://{cfg.host}:{cfg.port}/v1 ({desc.get('device')}, "
          f"{cfg.max_batch} rows × {server.scheduler.capacity} tokens"
          f"{f' (and {parked_rows(cfg)} parked)' if parked_rows(cfg) else ''}, chat template: "
          f"{server.renderer.name if server.renderer else 'none'}, engine: "
          f"{f'process {pid}' if pid else 'in this process'}"
          f"{f', {cfg.api_processes} HTTP processes' if cfg.api_processes > 1 else ''})", file=sys.stderr, flush=True)
    if server.sampling_defaults:
        settings = ", ".join(f"{k} {v:g}" for k, v in server.sampling_defaults.items())
        print(f"redline serve: requests that leave them out sample with {settings} (the model's "
              f"generation_config.json)", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning", timeout_graceful_shutdown=5)
    workers, sockets = [], None
    if cfg.api_processes > 1:  # the others serve the same listening socket, each over a pipe of its own
        import multiprocessing

        sockets = [config.bind_socket()]
        ctx = multiprocessing.get_context("spawn")
        for conn in server.scheduler.spare:
            workers.append(ctx.Process(target=api_process, args=(cfg, conn, sockets[0]), name="redline-api"))
            workers[-1].start()
            conn.close()  # the worker holds its own copy: when it ends, the engine sees its pipe close
    # uvicorn raises the signal that stopped it again once it has shut down: by default SIGTERM would then end this
    # process at once, leaving the other HTTP processes unreaped and the engine unclosed; an exit runs the cleanup
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        draining_server(uvicorn, server.scheduler, cfg.shutdown_timeout)(config).run(sockets=sockets)
    finally:
        for worker in workers:  # a signal to the group reached them already; one to this process alone did not
            if worker.is_alive():
                worker.terminate()
        for worker in workers:
            worker.join(cfg.shutdown_timeout + 15)
            if worker.is_alive():
                worker.kill()
        server.scheduler.close()
    return 0
