"""`redline serve --engine-process`: the engine in a spawned process of its own (redline/serve/engine_process.py),
against the in-thread server on the same checkpoint through the official `openai` client: the same greedy and
seeded completions, streamed and not, alone and concurrent; a bounded load loses nothing; a disconnected client
frees its row; an engine that dies ends its requests with an error and fails /health; shutdown leaves no process
behind."""

import collections
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from redline.commands.serve import ServeConfig, build, uses_engine_process
from redline.config import TrainConfig, to_dict
from redline.errors import UserError
from redline.inference.runtime import RuntimeOptions
from redline.model import GPT, ModelConfig
from redline.tokenizer import load_tokenizer
from tests.test_serve import Live as ServedApp, free_port, wait_until

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

# a long context: a request of a few hundred tokens runs long enough (milliseconds a token) to be cut off
CFG = ModelConfig(vocab_size=261, context_len=512, n_layer=2, n_embd=64, n_head=4, n_kv_head=2)
MODEL = "tiny-test"
LONG = 450  # tokens of a request that is still running when the test acts on it (this model emits no stop in it)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from redline.training.checkpoint import save_checkpoint

    torch.manual_seed(0)
    tok = load_tokenizer("bytes")
    tok.add_chat_tokens()  # redline's chat format: chat requests render
    return save_checkpoint(tmp_path_factory.mktemp("run"), 1, GPT(CFG), {}, to_dict(TrainConfig(model=CFG)), tok,
                           keep=1)


def serve_config(checkpoint, engine_process: bool, **kwargs) -> ServeConfig:
    kwargs = {"runtime": RuntimeOptions(cpu_threads=1), **kwargs}
    return ServeConfig(checkpoint=str(checkpoint), engine_process=engine_process, model_name=MODEL,
                       max_batch=4, prefill_tokens=8, **kwargs)


class Live(ServedApp):
    """`redline serve`'s Server and app (commands/serve.py's build) under uvicorn in a thread, on a free port."""

    def __init__(self, cfg: ServeConfig):
        super().__init__(*build(cfg))

    @property
    def scheduler(self):
        return self.server.scheduler


@pytest.fixture(scope="module")
def in_thread(checkpoint):
    live = Live(serve_config(checkpoint, False))
    yield live
    live.close()


@pytest.fixture(scope="module")
def in_process(checkpoint):
    live = Live(serve_config(checkpoint, True))
    yield live
    live.close()
    assert not live.scheduler.process.is_alive()


@pytest.fixture
def own_engine(checkpoint):
    """A server with an engine process of its own, for a test that ends it."""
    live = Live(serve_config(checkpoint, True))
    yield live
    live.close()


def completion(live, prompt: str, max_tokens: int, stream: bool, **kwargs) -> tuple[list[str], list[str], tuple]:
    """(each choice's text, each choice's finish reason, (prompt, completion) tokens)."""
    args = dict(model=MODEL, prompt=prompt, max_tokens=max_tokens, **kwargs)
    if stream:
        chunks = list(live.client.completions.create(stream=True, stream_options={"include_usage": True}, **args))
        n = 1 + max(c.choices[0].index for c in chunks if c.choices)
        texts = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in range(n)]
        reasons = [[c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].index == i][-1]
                   for i in range(n)]
        usage = chunks[-1].usage
    else:
        out = live.client.completions.create(**args)
        texts, reasons, usage = [c.text for c in out.choices], [c.finish_reason for c in out.choices], out.usage
    return texts, reasons, (usage.prompt_tokens, usage.completion_tokens)


def test_the_engine_runs_in_another_process_by_default_only_on_a_gpu(in_process, checkpoint):
    engine = in_process.scheduler
    assert engine.pid != os.getpid() and engine.process.is_alive()
    assert engine.describe()["device"] == "cpu" and engine.capacity == CFG.context_len and engine.batch_rows == 4
    default = {device: uses_engine_process(ServeConfig(checkpoint=str(checkpoint), runtime=RuntimeOptions(device)))
               for device in ("auto", "cpu", "cuda")}
    assert default == {"auto": torch.cuda.is_available(), "cpu": False, "cuda": True}  # in a thread on a CPU
    assert not uses_engine_process(ServeConfig(checkpoint=str(checkpoint), engine_process=False,
                                               runtime=RuntimeOptions("cuda")))


def test_parked_rows_are_opt_in_and_need_prefix_reuse(checkpoint):
    from redline.commands.serve import build_scheduler

    for kwargs, parked in (({}, []), ({"prefix_parked_rows": 3}, [4, 5, 6]),
                           ({"prefix_parked_rows": 3, "prefix_min_tokens": 0}, [])):
        scheduler, _ = build_scheduler(serve_config(checkpoint, False, **kwargs))
        try:
            assert scheduler.batch.parked == parked and scheduler.batch.rows == 4
        finally:
            scheduler.close()


def test_the_engine_process_freezes_its_start_up_heap_once_the_scheduler_runs(checkpoint, monkeypatch):
    """What start-up left (torch, the compiled model) is frozen, so that no full collection walks it under load:
    after the scheduler is built, before it serves."""
    import gc

    from redline.commands.serve import engine_scheduler

    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(gc.get_count()))
    for freeze_heap, calls in ((True, 1), (False, 1)):  # --no-freeze-heap: left as Python sets it
        scheduler = engine_scheduler(serve_config(checkpoint, True, freeze_heap=freeze_heap))
        try:
            assert len(frozen) == calls and scheduler.alive and scheduler.batch.rows == 4
        finally:
            scheduler.close()


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_and_seeded_completions_equal_the_in_thread_server(in_thread, in_process, stream):
    for prompt, max_tokens, sampling in [("Once upon a time", 24, dict(temperature=0)),
                                         ("Hello", 40, dict(temperature=0)),
                                         ("Hi", 16, dict(temperature=1.0, top_p=0.9, seed=3, n=2))]:
        want = completion(in_thread, prompt, max_tokens, stream, **sampling)
        assert completion(in_process, prompt, max_tokens, stream, **sampling) == want
        assert want[2] == (len(prompt), max_tokens * len(want[0]))


def test_logprobs_penalties_and_biases_cross_from_the_engine_process_as_in_a_thread(in_thread, in_process):
    args = dict(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, logprobs=2)
    a, b = (live.client.completions.create(**args).choices[0].logprobs for live in (in_thread, in_process))
    assert a.tokens == b.tokens and len(a.tokens) == 6 and a.top_logprobs == b.top_logprobs
    assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-6)
    scored = [live.client.completions.create(model=MODEL, prompt="Score this text", max_tokens=0, echo=True,
                                             logprobs=1).choices[0] for live in (in_thread, in_process)]
    assert scored[0].text == scored[1].text == "Score this text"
    assert scored[0].logprobs.token_logprobs[0] is None and len(scored[0].logprobs.tokens) == len("Score this text")
    assert scored[0].logprobs.token_logprobs[1:] == pytest.approx(scored[1].logprobs.token_logprobs[1:], abs=1e-6)
    adjusted = dict(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0, frequency_penalty=1.5,
                    presence_penalty=0.5, logit_bias={"101": 3})
    texts = [live.client.completions.create(**adjusted).choices[0].text for live in (in_thread, in_process)]
    assert texts[0] == texts[1] != completion(in_thread, "Once upon a time", 8, False, temperature=0)[0][0]


def test_a_prompt_beginning_as_an_earlier_one_reports_its_copied_tokens_in_both_modes(in_thread, in_process):
    """Prefix reuse at the server's default minimum (128 tokens): the second prompt copies the first's 160 whole
    tokens from its row; the count crosses from the engine process into the usage, and the text is the same."""
    beginning = "A shared system prompt that many requests start with, long enough to be worth copying. " * 2
    texts = []
    for live in (in_thread, in_process):
        live.client.completions.create(model=MODEL, prompt=beginning + "First.", max_tokens=4, temperature=0)
        out = live.client.completions.create(model=MODEL, prompt=beginning + "Second.", max_tokens=4, temperature=0)
        assert out.usage.prompt_tokens_details.cached_tokens == len(beginning) // 16 * 16 == 160
        texts.append(out.choices[0].text)
    assert texts[0] == texts[1]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_equals_the_in_thread_server(in_thread, in_process, stream):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]

    def ask(live):
        out = live.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0,
                                                  stream=stream)
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in out)
        return out.choices[0].message.content, out.usage.prompt_tokens, out.usage.completion_tokens

    assert ask(in_process) == ask(in_thread)


def test_concurrent_requests_equal_the_in_thread_server(in_thread, in_process):
    """More requests than rows, of different lengths, half streamed: each one's text is the in-thread server's."""
    prompts = [f"{i} " + "abcdefghij"[: 1 + i] * (1 + i % 3) for i in range(10)]
    lengths = [5 + 3 * i for i in range(10)]
    want = [completion(in_thread, p, n, False, temperature=0)[0][0] for p, n in zip(prompts, lengths)]
    with ThreadPoolExecutor(10) as pool:
        got = list(pool.map(lambda i: completion(in_process, prompts[i], lengths[i], i % 2 == 0, temperature=0)[0][0],
                            range(10)))
    assert got == want
    wait_until(lambda: in_process.scheduler.busy_rows() == 0)


def test_bounded_load_loses_nothing(in_process, capsys, monkeypatch):
    """scripts/serve_load.py against the engine-process server: Poisson arrivals, more clients than rows, a time
    limit; every request completes, and the server counts every token the clients got."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "serve_load.py"
    spec = importlib.util.spec_from_file_location("serve_load", path)
    load = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "serve_load", load)  # its dataclasses look their module up
    spec.loader.exec_module(load)
    before = in_process.scheduler.stats.completion_tokens
    t0 = time.time()
    code = load.main(["--url", in_process.url, "--model", MODEL, "--concurrency", "8", "--requests", "24",
                      "--rate", "200", "--prompt-tokens", "10", "--max-tokens", "12"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and time.time() - t0 < 30
    assert summary["completed"] == 24 and summary["failed"] == 0 and sum(summary["finish_reasons"].values()) == 24
    wait_until(lambda: in_process.scheduler.stats.completion_tokens - before == summary["output_tokens"])
    wait_until(lambda: in_process.scheduler.busy_rows() == 0 and in_process.scheduler.queue_depth() == 0)


def test_limits_and_metrics_answer_from_the_api_process(in_process, monkeypatch):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 512"):
        in_process.client.completions.create(model=MODEL, prompt="Hi", max_tokens=511)
    with monkeypatch.context() as patch:  # a queue holding its one sequence: retry later
        patch.setattr(in_process.scheduler, "max_queue", 1)
        patch.setattr(in_process.scheduler, "queue_depth", lambda: 1)
        with pytest.raises(openai.RateLimitError):
            in_process.client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
        with pytest.raises(openai.BadRequestError, match="--max-queue"):  # more than it ever holds: no retry
            in_process.client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, n=2)
    in_process.client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, temperature=0)
    metrics = httpx.get(in_process.url + "/metrics").text
    requests = int(re.search(r"^redline_requests_total (\d+)$", metrics, re.M).group(1))
    steps = int(re.search(r"^redline_decode_steps_total (\d+)$", metrics, re.M).group(1))
    assert requests >= 1 and steps >= 2 and "redline_batch_rows 4\n" in metrics
    assert re.search(r"^redline_time_to_first_token_seconds_count [1-9]", metrics, re.M)
    assert httpx.get(in_process.url + "/health").json()["status"] == "ok"


def test_a_disconnected_stream_frees_its_row(in_process):
    stats = in_process.scheduler.stats
    before, lengths = stats.finished["cancelled"], stats.finished["length"]
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": LONG, "temperature": 0, "stream": True}
    with httpx.stream("POST", in_process.url + "/v1/completions", json=body) as r:
        assert next(line for line in r.iter_lines() if line.startswith("data: "))
    wait_until(lambda: stats.finished["cancelled"] == before + 1)
    wait_until(lambda: in_process.scheduler.busy_rows() == 0)
    assert stats.finished["length"] == lengths  # cut off, not run to its end


def test_a_disconnected_plain_request_frees_its_row(in_process):
    stats = in_process.scheduler.stats
    before = stats.finished["cancelled"]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(in_process.url + "/v1/completions",
                   json={"model": MODEL, "prompt": "Hi", "max_tokens": LONG, "temperature": 0}, timeout=0.3)
    wait_until(lambda: stats.finished["cancelled"] == before + 1)
    wait_until(lambda: in_process.scheduler.busy_rows() == 0)


def stream_events(url: str, started: threading.Event) -> list[dict | str]:
    """A streamed request of LONG tokens, read to its end -> its data lines ([DONE] as a string)."""
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": LONG, "temperature": 0, "stream": True}
    out = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                started.set()
                out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return out


@pytest.mark.slow  # an engine process of its own: a few seconds to start
def test_a_dead_engine_ends_its_requests_with_an_error_and_fails_health(own_engine):
    engine = own_engine.scheduler
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(stream_events, own_engine.url, started)
        assert started.wait(30)
        os.kill(engine.pid, signal.SIGKILL)  # a crash the engine cannot report itself (as a segfault)
        events = running.result(30)
    error = events[-1]["error"]
    assert error["type"] == "server_error" and "engine process ended unexpectedly" in error["message"]
    health = httpx.get(own_engine.url + "/health")
    assert health.status_code == 503 and health.json()["error"]["code"] == "engine_failed"
    with pytest.raises(openai.InternalServerError) as info:
        own_engine.client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert info.value.status_code == 503 and "restart the server" in info.value.body["message"]
    own_engine.close()
    assert engine.process not in multiprocessing.active_children()  # reaped


def dying_scheduler(cfg: ServeConfig):
    """An engine process's builder (it runs there): a scheduler whose thread dies at the end of its first turn."""
    from redline.commands.serve import build_scheduler

    scheduler = build_scheduler(cfg)[0]

    def fail() -> None:
        raise SystemExit("a bug outside the scheduler's turn")  # not an Exception: nothing in the thread catches it

    scheduler.flushes.append(fail)
    return scheduler


@pytest.mark.slow  # an engine process of its own: a few seconds to start
def test_an_engine_whose_scheduler_thread_dies_says_so(checkpoint):
    import queue

    from redline.inference import SamplingParams
    from redline.serve.engine_process import EngineFailed, EngineProcess

    engine = EngineProcess.start(dying_scheduler, serve_config(checkpoint, True))
    try:
        events = queue.Queue()
        engine.submit([engine.sequence_type([1, 2, 3], 8, SamplingParams(), (), events.put)])
        event = events.get(timeout=30)
        assert event[0] == "error" and "scheduler thread died" in event[1] and "scheduler thread died" in engine.failure
        with pytest.raises(EngineFailed, match="restart the server"):
            engine.submit([engine.sequence_type([1, 2, 3], 8, SamplingParams(), (), events.put)])
    finally:
        engine.close()
    assert not engine.process.is_alive()


@pytest.mark.slow  # an engine process of its own: a few seconds to start
def test_drain_cancels_what_the_timeout_does_not_cover_and_ends_the_process(own_engine):
    engine = own_engine.scheduler
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(stream_events, own_engine.url, started)
        assert started.wait(30)
        assert engine.drain(0.05) is False  # LONG tokens take longer than that
        events = running.result(30)
    assert events[-1]["error"]["code"] == "shutting_down"
    assert not engine.process.is_alive() and engine.process not in multiprocessing.active_children()
    assert engine.failure is None  # closed, not failed


def test_a_bad_chat_template_fails_before_the_engine_starts(checkpoint):
    before = set(multiprocessing.active_children())
    with pytest.raises(UserError, match="--chat-template /no/such/file: no such file"):
        build(serve_config(checkpoint, True, chat_template="/no/such/file"))
    assert set(multiprocessing.active_children()) == before


@pytest.mark.slow  # an engine process of its own: a few seconds to start
def test_an_engine_that_cannot_start_says_why_and_leaves_nothing(checkpoint):
    before = set(multiprocessing.active_children())  # the module's own engine, if it runs
    with pytest.raises(UserError, match="fp16 is for GPUs"):
        build(serve_config(checkpoint, True, runtime=RuntimeOptions(device="cpu", dtype="fp16", cpu_threads=1)))
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.slow
def test_serve_command_drains_on_sigterm_to_both_processes_and_leaves_none(checkpoint):
    """`redline serve --engine-process` answers; SIGTERM sent to both processes (as a service manager stops a
    process group) lets the running stream finish, then ends both."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "redline", "serve", str(checkpoint), "--port", str(port),
                             "--model-name", MODEL, "--cpu-threads", "1", "--engine-process"],
                            stderr=subprocess.PIPE, text=True)
    try:
        banner = proc.stderr.readline()  # printed once the engine is ready, before listening
        engine_pid = int(re.search(r"engine: process (\d+)", banner).group(1))
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        deadline = time.time() + 60
        while True:
            try:
                out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0)
                break
            except openai.APIConnectionError:
                assert proc.poll() is None and time.time() < deadline
                time.sleep(0.2)
        assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 8
        started = threading.Event()
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(stream_events, url, started)
            assert started.wait(30)
            for pid in (proc.pid, engine_pid):
                os.kill(pid, signal.SIGTERM)
            events = running.result(30)
            code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"  # drained
    assert code in (0, -15) and "Traceback" not in proc.stderr.read()
    with pytest.raises(ProcessLookupError):
        os.kill(engine_pid, 0)


def test_the_engine_sends_each_api_process_the_events_of_its_own_requests():
    """engine_process._Outbox with two API processes (frontends) whose requests have the same ids: each gets the
    events of its own requests alone, its own count of requests received (its queue depth), and the engine's
    counters; a cancel names (frontend, id)."""
    from redline.inference import InferenceEngine, SamplingParams
    from redline.inference.batch import DecodeBatch
    from redline.serve.engine_process import _Outbox, to_wire
    from redline.serve.scheduler import Scheduler, Sequence

    class Pipe:
        def __init__(self):
            self.messages = []

        def send(self, message):
            self.messages.append(message)

    torch.manual_seed(0)
    tok = load_tokenizer("bytes")
    sched = Scheduler(DecodeBatch(InferenceEngine(GPT(CFG)), rows=4, capacity=64), tok, [256])
    pipes = [Pipe(), Pipe()]
    outbox = _Outbox(pipes, sched)
    try:
        prompts = {0: [[1, 2, 3], [4, 5]], 1: [[6, 7, 8, 9]]}
        for frontend, batch in prompts.items():
            outbox.submit(frontend, [to_wire(rid, Sequence(p, 5, SamplingParams(), (), None))
                                     for rid, p in enumerate(batch)])
        deadline = time.time() + 30
        while outbox.live and time.time() < deadline:
            time.sleep(0.01)
        assert not outbox.live
    finally:
        sched.close()
    for frontend, pipe in enumerate(pipes):
        events = [item for m in pipe.messages if m[0] == "events" for item in m[1]]
        ended = sorted(item[0] for item in events if item[1][0] == "done")
        assert ended == list(range(len(prompts[frontend])))  # its own ids, each ended once
        texts = collections.Counter(item[0] for item in events if item[1][0] == "text")
        assert set(texts) <= set(ended)
        assert pipe.messages[-1][2][0] == len(prompts[frontend])  # requests it sent, as the engine counted them
    # the engine's counters, in both: the last snapshot sent has every request of both finished
    assert max(sum(m[2][1].values()) for pipe in pipes for m in pipe.messages) == 3


@pytest.mark.slow
def test_two_api_processes_serve_one_engine_and_stop_together(checkpoint):
    """`redline serve --api-processes 2`: a second HTTP process on the same port, over the same engine process.
    Greedy completions of the same prompts are the same whichever process answered; both processes answer (each
    /metrics names its pid); SIGTERM to the group drains and ends all three processes."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "redline", "serve", str(checkpoint), "--port", str(port),
                             "--model-name", MODEL, "--cpu-threads", "1", "--api-processes", "2"],
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        banner = proc.stderr.readline()
        engine_pid = int(re.search(r"engine: process (\d+)", banner).group(1))
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        deadline = time.time() + 90
        pids = set()
        while len(pids) < 2:  # fresh connections until both processes have answered one
            try:
                metrics = httpx.get(url + "/metrics", headers={"Connection": "close"}).text
                pids.add(re.search(r'redline_api_process\{pid="(\d+)"\}', metrics).group(1))
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.time() < deadline, f"answered from {pids}"
            time.sleep(0.05)
        prompts = ["Hello", "The cat", "1 2 3", "x"] * 3

        def ask(prompt: str) -> str:
            fresh = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)  # a connection of its own
            return fresh.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0).choices[0].text

        with ThreadPoolExecutor(6) as pool:
            texts = list(pool.map(ask, prompts))
        assert texts[:4] == texts[4:8] == texts[8:]
        assert client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0).choices[0].text \
            == texts[0]
        # each process's /metrics has the engine's counters as they are now, however few requests it answered
        finished = {}
        while set(finished) != pids:
            metrics = httpx.get(url + "/metrics", headers={"Connection": "close"}).text
            pid = re.search(r'redline_api_process\{pid="(\d+)"\}', metrics).group(1)
            finished[pid] = (sum(int(n) for n in re.findall(r"^redline_requests_finished_total\{.*\} (\d+)$",
                                                                metrics, re.M)),
                             int(re.search(r"^redline_time_to_first_token_seconds_count (\d+)$", metrics, re.M)[1]))
            assert time.time() < deadline + 60
        assert set(finished.values()) == {(len(prompts) + 1,) * 2}, finished
        os.killpg(proc.pid, signal.SIGTERM)  # as a service manager stops the group
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code in (0, -15) and "Traceback" not in proc.stderr.read()
    with pytest.raises(ProcessLookupError):
        os.kill(engine_pid, 0)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
