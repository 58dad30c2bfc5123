"""`redline serve` against the official `openai` client on a live server (uvicorn in a thread, a tiny model on the
CPU): completions and chat, streamed and not, greedy text equal to the engine's own `generate`; concurrent
requests equal to the same requests alone (continuous batching); OpenAI-shaped 4xx errors; a client that
disconnects frees its row; the scheduler's prefill spans, stops, UTF-8 streaming and queue limit."""

import collections
import json
import queue
import random
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import torch

from redline.config import TrainConfig, to_dict
from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.inference.batch import DecodeBatch
from redline.model import GPT, ModelConfig
from redline.serve.scheduler import QueueFull, Scheduler, Sequence, check_queue
from redline.tokenizer import load_tokenizer

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

CFG = ModelConfig(vocab_size=261, context_len=96, n_layer=2, n_embd=64, n_head=4, n_kv_head=2)
MODEL = "tiny-test"
EOT = 256


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(CFG)


@pytest.fixture(scope="module")
def tokenizer():
    """Bytes with redline's chat tokens (as `redline sft` leaves it), so chat requests render in redline's format."""
    tok = load_tokenizer("bytes")
    tok.add_chat_tokens()
    return tok


def reference(model, ids: list[int], max_tokens: int, stop=(EOT,)) -> list[int]:
    """Greedy tokens of redline's own generate for one prompt (a stop token ends it, as the server's does)."""
    return InferenceEngine(model).generate([ids], max_tokens, stop_tokens=list(stop))[0].tokens


def scheduler_for(model, tokenizer, rows: int = 3, **kwargs) -> Scheduler:
    return Scheduler(DecodeBatch(InferenceEngine(model), rows=rows, capacity=CFG.context_len), tokenizer, [EOT],
                     **kwargs)


class Live:
    """uvicorn serving a Server (or the app given for it) in a thread on a free loopback port."""

    def __init__(self, server, app=None):
        from redline.serve.api import create_app

        self.server = server
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.uvicorn = uvicorn.Server(uvicorn.Config(app or create_app(server), log_level="warning"))
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.uvicorn.started:
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.01)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def close(self):
        self.uvicorn.should_exit = True
        self.thread.join(10)
        self.server.scheduler.close()


@pytest.fixture(scope="module")
def live(model, tokenizer):
    from redline.chat.render import renderer_for
    from redline.serve.api import Server

    server = Server(scheduler_for(model, tokenizer, prefill_tokens=8), tokenizer, MODEL,
                    renderer=renderer_for(tokenizer))
    live = Live(server)
    yield live
    live.close()


def free_port() -> int:
    """A loopback port nothing listens on now (for a `redline serve` subprocess to bind)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


# ----------------------------------------------------------------------------------------------------
# the official client


@pytest.mark.parametrize("stream", [False, True])
def test_completions_greedy_equal_generate(live, model, tokenizer, stream):
    prompt = "Once upon a time"
    ref = reference(model, tokenizer.encode(prompt), 20)
    args = dict(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
    if stream:
        chunks = list(live.client.completions.create(stream=True, stream_options={"include_usage": True}, **args))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
        assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    else:
        out = live.client.completions.create(**args)
        text, reason, usage = out.choices[0].text, out.choices[0].finish_reason, out.usage
        assert out.model == MODEL and out.object == "text_completion"
    assert text == tokenizer.decode(ref)
    assert reason == ("length" if len(ref) == 20 else "stop")
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (16, len(ref), 16 + len(ref))


@pytest.mark.parametrize("stream", [False, True])
def test_chat_greedy_equal_generate_through_the_renderer(live, model, tokenizer, stream):
    """Chat goes through redline/chat/render.py's renderer and ends at its end-of-turn token."""
    from redline.chat.render import RedlineTemplate

    renderer = RedlineTemplate(tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    ids = renderer.prompt(messages)
    ref = reference(model, ids, 16, stop=renderer.stop_ids)
    args = dict(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    if stream:
        chunks = list(live.client.chat.completions.create(stream=True, **args))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        assert all(c.object == "chat.completion.chunk" for c in chunks)
    else:
        out = live.client.chat.completions.create(**args)
        text = out.choices[0].message.content
        assert out.choices[0].message.role == "assistant" and out.object == "chat.completion"
        assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == len(ref)
    assert text == tokenizer.decode(ref)


def test_concurrent_requests_equal_the_same_requests_alone(live, model, tokenizer):
    """More requests than rows, prompts longer than a prefill span, different lengths: each request's greedy
    text is the one it gets alone (rows are admitted as others finish, prefilled in spans between steps)."""
    prompts = [f"{i} " + "abcdefghij"[: 1 + i] * (1 + i % 3) for i in range(8)]
    lengths = [5 + 3 * i for i in range(8)]
    refs = [tokenizer.decode(reference(model, tokenizer.encode(p), n)) for p, n in zip(prompts, lengths)]

    def ask(i):
        stream = i % 2 == 0
        out = live.client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=lengths[i], temperature=0,
                                             stream=stream)
        return "".join(c.choices[0].text for c in out) if stream else out.choices[0].text

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, range(8)))
    assert got == refs
    assert live.server.scheduler.busy_rows() == 0


def test_sampling_is_seeded_and_n_gives_that_many_choices(live):
    args = dict(model=MODEL, prompt="Hello", max_tokens=12, temperature=1.0, top_p=0.9, seed=7, n=3)
    a = live.client.completions.create(**args)
    b = live.client.completions.create(**args)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # the same seed, the same text
    assert len({c.text for c in a.choices}) > 1  # each choice samples on its own
    greedy = live.client.completions.create(model=MODEL, prompt="Hello", max_tokens=12, temperature=0, n=2)
    assert greedy.choices[0].text == greedy.choices[1].text


def test_stop_strings_cut_the_text(live, model, tokenizer):
    full = tokenizer.decode(reference(model, tokenizer.encode("Hello"), 30))
    stop = next((full[i:i + 2] for i in range(3, len(full) - 2) if "\ufffd" not in full[i:i + 2]), None)
    if stop is None:
        pytest.skip("no usable stop string in this model's output")
    for stream in (False, True):
        out = live.client.completions.create(model=MODEL, prompt="Hello", max_tokens=30, temperature=0, stop=[stop],
                                             stream=stream)
        text = "".join(c.choices[0].text for c in out) if stream else out.choices[0].text
        assert text == full[: full.index(stop)]


def test_continuous_usage_stats_count_every_token(live):
    """stream_options.continuous_usage_stats (vLLM's): a chunk whenever tokens arrive, with the usage so far (tokens
    that arrived together share a chunk)."""
    chunks = list(live.client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks if c.choices and c.usage]
    assert counts[0] >= 1 and counts == sorted(counts) and counts[-1] == chunks[-1].usage.completion_tokens
    # the chunk with the finish reason has the usage too
    assert all(c.usage is not None for c in chunks if c.choices and c.choices[0].finish_reason)
    assert all(c.usage.prompt_tokens == 5 for c in chunks if c.usage)


def test_models_health_and_metrics(live):
    assert [m.id for m in live.client.models.list().data] == [MODEL]
    assert httpx.get(live.url + "/health").json()["status"] == "ok"
    metrics = httpx.get(live.url + "/metrics").text
    assert "redline_requests_total" in metrics and "redline_time_to_first_token_seconds_count" in metrics


def test_metrics_count_every_first_token_and_every_busy_row(model, tokenizer):
    """The TTFT summary's _count and _sum cover every request since the start (its quantiles the last 1,024), and
    the busy-row counter over the step counter is the batch's occupancy."""
    from redline.serve.api import metrics_text

    sched = scheduler_for(model, tokenizer, rows=2)
    try:
        for i in range(1100):
            sched.stats.add_ttft(0.001 * (i % 7))
        run_all(sched, [[1, 2, 3], [4, 5]], [5, 3])
        values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics_text(sched).splitlines()
                  if not line.startswith("#")}
    finally:
        sched.close()
    assert len(sched.stats.ttft_snapshot()) == 1024
    assert values["redline_time_to_first_token_seconds_count"] == 1102
    total = sum(0.001 * (i % 7) for i in range(1100))
    assert total < values["redline_time_to_first_token_seconds_sum"] < total + 10
    steps, busy = values["redline_decode_steps_total"], values["redline_batch_busy_row_steps_total"]
    assert busy == 4 + 2 and steps == 4  # the first token of each comes from its prefill
    assert values["redline_batch_occupancy"] == pytest.approx(busy / steps / 2, abs=1e-4)


def test_the_chat_page_is_self_contained_and_needs_no_key_itself(live):
    import re

    live.server.api_key = "sesame"
    try:
        r = httpx.get(live.url + "/")  # the page asks for the key; the API behind it still needs it
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert httpx.get(live.url + "/v1/models").status_code == 401
    finally:
        live.server.api_key = None
    page = r.text
    assert "/v1/chat/completions" in page and "getReader" in page and "Bearer " in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # no CDN: nothing loaded from elsewhere


# ----------------------------------------------------------------------------------------------------
# errors


def error_of(call) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    return info.value.status_code, info.value.body


@pytest.mark.parametrize("args, status, param", [
    ({"model": "no-such-model"}, 404, "model"),
    ({"temperature": 3}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"n": 99}, 400, "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"logprobs": 21}, 400, "logprobs"),
    ({"frequency_penalty": 2.5}, 400, "frequency_penalty"),
    ({"prompt": "x" * 90, "max_tokens": 10}, 400, "prompt"),
    ({"prompt": ""}, 400, "prompt"),
])
def test_bad_completion_requests_are_openai_errors(live, args, status, param):
    code, body = error_of(lambda: live.client.completions.create(**{"model": MODEL, "prompt": "Hi", **args}))
    assert code == status and body["param"] == param and body["message"] and body["type"]


def test_bad_chat_requests_are_openai_errors(live):
    chat = live.client.chat.completions.create
    assert error_of(lambda: chat(model=MODEL, messages=[]))[0] == 400
    assert error_of(lambda: chat(model=MODEL, messages=[{"role": "wizard", "content": "x"}]))[0] == 400
    assert error_of(lambda: chat(model=MODEL, messages=[{"role": "user", "content": " "}]))[0] == 400
    code, body = error_of(lambda: chat(model=MODEL, messages=[{"role": "user", "content": "x" * 200}]))
    assert code == 400 and body["code"] == "context_length_exceeded"


def test_malformed_bodies_unknown_routes_and_auth(live):
    r = httpx.post(live.url + "/v1/completions", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(live.url + "/v1/completions", json={"prompt": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = httpx.post(live.url + "/v1/completions", content=b"x" * (2 << 20))
    assert r.status_code == 413
    r = httpx.get(live.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    live.server.api_key = "sesame"
    try:
        code, body = error_of(lambda: live.client.models.list())
        assert code == 401 and body["code"] == "invalid_api_key"
        assert httpx.get(live.url + "/health").status_code == 200
        keyed = openai.OpenAI(base_url=live.url + "/v1", api_key="sesame", max_retries=0)
        assert keyed.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].finish_reason
    finally:
        live.server.api_key = None


def test_bodies_that_trip_parsers_are_400s_and_a_chunked_body_is_cut_at_the_limit(live):
    post = lambda body: httpx.post(live.url + "/v1/completions", content=body)  # noqa: E731
    r = post(b'{"model": "tiny-test", "prompt": "x", "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
    r = post(b'{"model": "tiny-test", "prompt": "\\ud800"}')  # a lone surrogate: not text
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.post(live.url + "/v1/chat/completions",
                   content=b'{"model": "tiny-test", "messages": [{"role": "user", "content": "a\\udfffb"}]}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    for key in ("\u00b2", "\u2460", "-1", "1.5"):  # unicode digits int() refuses, and what is no token id
        r = httpx.post(live.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "logit_bias": {key: 1}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", key
    # no Content-Length (chunked): counted as it arrives, refused once over the limit, not read whole first
    sent = []

    def body():
        for _ in range(64):
            sent.append(1)
            yield b"x" * (64 << 10)

    r = httpx.post(live.url + "/v1/completions", content=body())
    assert r.status_code == 413 and "--max-body-kib" in r.json()["error"]["message"]


def test_openai_request_details(live):
    chat, complete = live.client.chat.completions.create, live.client.completions.create
    out = chat(model=MODEL, messages=[{"role": "developer", "content": "Be brief."},
                                      {"role": "user", "content": "Hi"}], max_tokens=2)
    assert out.choices[0].message.content is not None  # OpenAI's newer name of the system role
    code, body = error_of(lambda: complete(model=MODEL, prompt="Hi", stream_options={"include_usage": True}))
    assert code == 400 and body["param"] == "stream_options"  # only with stream: true, as OpenAI answers
    code, body = error_of(lambda: complete(model=MODEL, prompt="Hi", stream=True,
                                           stream_options={"include_usage": "no"}))
    assert code == 400 and body["param"] == "stream_options"
    code, body = error_of(lambda: chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                       max_completion_tokens=4, extra_body={"max_tokens": "x"}))
    assert code == 400 and body["param"] == "max_tokens"
    live.server.max_tokens = 5
    try:
        code, body = error_of(lambda: chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                           max_completion_tokens=6))
        assert code == 400 and body["param"] == "max_completion_tokens"
    finally:
        live.server.max_tokens = None
    r = httpx.delete(live.url + "/v1/completions")
    assert r.status_code == 405 and "POST" in r.headers["allow"] and r.json()["error"]["code"]
    live.server.api_key = "sesame"
    try:
        r = httpx.get(live.url + "/v1/models", headers={"Authorization": "bearer sesame"})
        assert r.status_code == 200  # the scheme is case-insensitive
        r = httpx.get(live.url + "/v1/models", headers={"Authorization": "Basic sesame"})
        assert r.status_code == 401
    finally:
        live.server.api_key = None


def test_top_k_is_read(live):
    """top_k (vLLM's and llama.cpp's extra field): 1 makes any temperature greedy."""
    greedy = live.client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0)
    for seed in range(3):
        out = live.client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=1.5, seed=seed,
                                             extra_body={"top_k": 1})
        assert out.choices[0].text == greedy.choices[0].text
    code, body = error_of(lambda: live.client.completions.create(model=MODEL, prompt="Hi",
                                                                 extra_body={"top_k": -2}))
    assert code == 400 and body["param"] == "top_k"


def test_a_full_queue_answers_429_and_a_request_that_never_fits_400(live, monkeypatch):
    def full(seqs):
        raise QueueFull("3 sequences are waiting and this request adds 1 (the limit is 3); retry later")

    with monkeypatch.context() as patch:
        patch.setattr(live.server.scheduler, "submit", full)
        code, body = error_of(lambda: live.client.completions.create(model=MODEL, prompt="Hi", max_tokens=2))
        assert code == 429 and body["code"] == "rate_limit_exceeded"
    # more sequences than the queue holds: a retry would fail again, so it is not a 429 (which clients retry)
    monkeypatch.setattr(live.server.scheduler, "max_queue", 4)
    code, body = error_of(lambda: live.client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, n=5))
    assert code == 400 and "--max-queue" in body["message"]


def test_queue_check_tells_a_full_queue_from_a_request_too_big_for_it():
    check_queue(1, 1, 2)  # fits
    with pytest.raises(QueueFull, match="retry later"):
        check_queue(2, 1, 2)
    with pytest.raises(UserError, match="ask for fewer"):
        check_queue(0, 3, 2)


# ----------------------------------------------------------------------------------------------------
# disconnects


@pytest.fixture
def slow_steps(live, monkeypatch):
    """Each decode step takes 20 ms, so that a request is still running when its client goes away."""
    engine = live.server.scheduler.batch.engine
    step = engine._step  # what every decode step runs, greedy groups and sampled steps alike

    def slow(*args, **kwargs):
        time.sleep(0.02)
        return step(*args, **kwargs)

    monkeypatch.setattr(engine, "_step", slow)


def test_a_disconnected_stream_frees_its_row(live, slow_steps):
    stats = live.server.scheduler.stats
    before = stats.finished["cancelled"]
    # greedy: "Hi" runs its 80 tokens without an end token (sampled, it may stop before the client goes away)
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 80, "temperature": 0, "stream": True}
    with httpx.stream("POST", live.url + "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert live.server.scheduler.busy_rows() == 1
    wait_until(lambda: stats.finished["cancelled"] == before + 1)
    wait_until(lambda: live.server.scheduler.busy_rows() == 0)


def test_a_disconnected_plain_request_frees_its_row(live, slow_steps):
    stats = live.server.scheduler.stats
    before = stats.finished["cancelled"]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(live.url + "/v1/completions",
                   json={"model": MODEL, "prompt": "Hi", "max_tokens": 80, "temperature": 0}, timeout=0.3)
    wait_until(lambda: stats.finished["cancelled"] == before + 1)
    wait_until(lambda: live.server.scheduler.busy_rows() == 0)


# ----------------------------------------------------------------------------------------------------
# the scheduler alone


def run_all(sched: Scheduler, prompts, max_tokens, sampling=None, stop=()) -> list[Sequence]:
    """Submit one sequence per prompt at once (sampling: one SamplingParams for all, or a list, one each) and wait
    for all of them to end."""
    samplings = sampling if isinstance(sampling, list) else [sampling or SamplingParams()] * len(prompts)
    sinks = [queue.Queue() for _ in prompts]
    seqs = [Sequence(list(p), n, sp, stop, q.put) for p, n, sp, q in zip(prompts, max_tokens, samplings, sinks)]
    sched.submit(seqs)
    for q in sinks:
        while q.get(timeout=30)[0] == "text":
            pass
    return seqs


def test_prefill_wait_gathers_requests_into_one_prefill(model, tokenizer, monkeypatch):
    """--prefill-wait-ms: while a row decodes, requests that arrive apart wait for each other (up to the wait since
    the first arrived) and go through one batched prefill; the last free row taken ends the wait at once; the
    tokens are those of each request alone."""
    calls = []
    sched = scheduler_for(model, tokenizer, rows=4, prefill_wait_ms=150)
    batch = sched.batch
    prefill_many, decode_greedy = batch.prefill_many, batch.decode_greedy
    monkeypatch.setattr(batch, "prefill_many", lambda rows, *args: calls.append(
        (len(rows), time.perf_counter())) or prefill_many(rows, *args))

    def slow_steps(*args):  # 5 ms a step: the long request is still decoding while the others arrive
        time.sleep(0.005)
        return decode_greedy(*args)

    monkeypatch.setattr(batch, "decode_greedy", slow_steps)
    try:
        slow = queue.Queue()
        sched.submit([Sequence([9, 8, 7], 90, SamplingParams(), (), slow.put)])
        slow.get(timeout=30)  # its first text: it is decoding
        prompts, sinks, seqs = [[1, 2, 3], [4, 5], [6, 7, 8, 9]], [], []
        t0 = time.perf_counter()
        for p in prompts[:2]:
            sinks.append(queue.Queue())
            seqs.append(Sequence(p, 6, SamplingParams(), (), sinks[-1].put))
            sched.submit([seqs[-1]])
            time.sleep(0.04)
        while seqs[0].first_token_s is None:
            time.sleep(0.002)
        # the two went through one prefill, once the first had waited its 150 ms
        assert calls[-1][0] == 2 and calls[-1][1] - t0 >= 0.145
        # the next request, while those two and the long one decode, takes the last free row: no wait
        sinks.append(queue.Queue())
        seqs.append(Sequence(prompts[2], 6, SamplingParams(), (), sinks[-1].put))
        t1 = time.perf_counter()
        sched.submit([seqs[-1]])
        for q in sinks:
            while q.get(timeout=30)[0] == "text":
                pass
        assert calls[-1][0] == 1 and calls[-1][1] - t1 < 0.1
        for seq, p in zip(seqs, prompts):
            assert seq.tokens == reference(model, p, 6)
    finally:
        sched.close()


@pytest.mark.parametrize("lagged", [False, True])
def test_scheduler_tokens_equal_generate_with_spans_and_more_requests_than_rows(model, tokenizer, lagged):
    """lagged: groups of 3 steps, each read while the next runs (as on a GPU), so rows are freed and refilled while
    tokens of their previous sequence are still on their way."""
    prompts = [list(range(1, 40)), [5], [200, 3, 7, 9, 11, 13], list(range(60, 90)), [42, 42], [7] * 20]
    lengths = [12, 30, 5, 20, 1, 9]
    sched = scheduler_for(model, tokenizer, rows=2, prefill_tokens=7, sync_every=3 if lagged else None)
    sched.lag_reads = lagged
    try:
        seqs = run_all(sched, prompts, lengths)
    finally:
        sched.close()
    for p, n, seq in zip(prompts, lengths, seqs):
        assert seq.tokens == reference(model, p, n)
        assert seq.finish_reason == ("length" if len(seq.tokens) == n else "stop")


@pytest.mark.parametrize("lagged", [False, True])
def test_seeded_sampled_requests_among_others_equal_generate_alone(model, tokenizer, lagged):
    """Seeded requests sampling at their own temperature and top-p, among greedy ones and unseeded sampled ones, in
    groups of steps whose draw is captured with the step (decode_sampled): each seeded and each greedy request gets
    the tokens redline's generate gives it alone with the same seed. A request with top-k sends its groups through
    the per-step RowSampler draw instead, with the same result."""
    prompts = [[5, 9, 2], list(range(30, 52)), [200, 3, 7], [42] * 9, [11, 12], [90, 80, 70, 60]]
    lengths = [14, 9, 20, 6, 11, 16]
    samplings = [SamplingParams(temperature=0.8, seed=3), SamplingParams(),
                 SamplingParams(temperature=1.3, top_p=0.6, seed=11), SamplingParams(temperature=1.0),
                 SamplingParams(temperature=0.9, top_k=5, seed=2), SamplingParams(temperature=2.0, seed=7)]
    sched = scheduler_for(model, tokenizer, rows=3, sync_every=3 if lagged else None)
    sched.lag_reads = lagged
    calls = collections.Counter()
    for owner, name in ((sched.batch, "decode_greedy"), (sched.batch, "decode_sampled"), (sched, "_step")):
        method = getattr(owner, name)
        setattr(owner, name, lambda *a, _m=method, _n=name, **k: calls.update([_n]) or _m(*a, **k))
    try:
        seqs = run_all(sched, prompts, lengths, samplings)
    finally:
        sched.close()
    engine = InferenceEngine(model)
    for p, n, sp, seq in zip(prompts, lengths, samplings, seqs):
        if sp.greedy or sp.seed is not None:
            assert seq.tokens == engine.generate([p], n, sp, stop_tokens=[EOT])[0].tokens, sp
    assert calls["decode_sampled"] > 0 and calls["_step"] > 0  # the captured draw, and the top-k groups' draw


@pytest.mark.slow
@pytest.mark.parametrize("window", [0, 24])
def test_the_warm_up_compiles_every_prefill_a_server_meets(window):
    """With torch.compile (here on a CPU), after the serve warm-up no prefill a server makes compiles anything more:
    whole prompts and the rests after a copied beginning, on one row or several, of one token or more, with and
    without a sliding window shorter than the prompts. Before, a rest on one row compiled a variant under load
    (seconds every stream waited), and one more variant than dynamo's default limit of 8 failed the request."""
    import torch._dynamo.utils as dynamo_utils

    from redline.commands.serve import warm_up

    torch.manual_seed(0)
    model = GPT(replace(CFG, sliding_window=window))
    batch = DecodeBatch(InferenceEngine(model, compile=True), rows=8, capacity=CFG.context_len)
    warm_up(batch)
    compiled = dynamo_utils.counters["stats"]["unique_graphs"]
    ids = list(range(1, 80))
    batch.prefill_many([3], [ids[:40]])
    batch.prefill_many([4, 5, 6], [ids[:20], ids[:30], ids[:9]])
    for rows, length, start in (([3], 9, 32), ([3], 1, 32), ([4, 5], 7, 32), ([4, 5], 1, 32), ([6, 7, 2], 5, 16)):
        batch.copy_prefixes([(3, r) for r in rows if r != 3], start)
        batch.prefill_many(rows, [ids[start:start + length]] * len(rows), start)
    batch.prefill(1, ids[:40])  # the spans of a long prompt (one row, alone), past the window if there is one
    batch.prefill(1, ids[40:41], start=40)
    batch.prefill(1, ids[41:60], start=41)
    assert dynamo_utils.counters["stats"]["unique_graphs"] == compiled


def test_a_draw_that_cannot_be_captured_falls_back_to_the_step_by_step_draw(model, tokenizer, monkeypatch, capsys):
    """If the warm-up cannot capture the sampling step (a device or library that refuses), the server says so in one
    line and samples after each step instead: seeded requests still get generate's tokens."""
    from redline.commands.serve import warm_up

    batch = DecodeBatch(InferenceEngine(model), rows=2, capacity=CFG.context_len)
    monkeypatch.setattr(batch, "decode_sampled", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no capture")))
    warm_up(batch)
    assert not batch.captured_draw and not any(batch.busy)
    assert "could not be captured (RuntimeError: no capture)" in capsys.readouterr().err
    sched = Scheduler(batch, tokenizer, [EOT])
    params = SamplingParams(temperature=1.1, top_p=0.7, seed=4)
    try:
        seq = run_all(sched, [[3, 4, 5]], [10], params)[0]
    finally:
        sched.close()
    assert seq.tokens == InferenceEngine(model).generate([[3, 4, 5]], 10, params, stop_tokens=[EOT])[0].tokens


def test_scheduler_streams_whole_characters_and_stops_at_a_stop_string(tokenizer):
    """The text handed out never ends in half a UTF-8 character, and a stop string splitting across tokens cuts
    the text before it."""
    sched = Scheduler.__new__(Scheduler)  # _take alone: no batch, no thread
    sched.stop_ids, sched.stats = {EOT}, type("S", (), {"finished": {}, "completion_tokens": 0})()
    sched.stats.finished = __import__("collections").Counter()
    sched.rows = []
    events = []
    from redline.inference.text import IncrementalText

    seq = Sequence([1], 100, SamplingParams(), ("END",), events.append, decoder=IncrementalText(tokenizer, ("END",)))
    for b in "héllo € 😀 EN".encode() + b"D tail":
        if not seq.done:
            sched._take(seq, [b])
    pieces = [e[1] for e in events if e[0] == "text"]
    assert "".join(pieces) == "héllo € 😀 " and all("\ufffd" not in p for p in pieces)
    assert events[-1] == ("done", "stop") and seq.completion_tokens == len("héllo € 😀 END".encode())


def test_scheduler_queue_limit_and_checks(model, tokenizer):
    sched = scheduler_for(model, tokenizer, rows=1, max_queue=2)
    try:
        seq = lambda n=4, p=(1, 2): Sequence(list(p), n, SamplingParams(), (), lambda e: None)  # noqa: E731
        with pytest.raises(UserError, match="queue holds at most 2"):
            sched.submit([seq(), seq(), seq()])  # all or none
        with pytest.raises(UserError, match="maximum context length is 96"):
            sched.submit([seq(n=95)])
        with pytest.raises(UserError, match="outside the model's vocabulary"):
            sched.submit([seq(p=(1, 999))])
        assert sched.queue_depth() == 0
    finally:
        sched.close()


# ----------------------------------------------------------------------------------------------------
# the command


def test_serve_command_needs_the_extra_before_loading(monkeypatch, capsys):
    from redline import cli

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn -> ImportError
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", "/no/such/checkpoint"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "pip install 'redline[serve]'" in err and "checkpoint" not in err


@pytest.mark.parametrize("args,message", [(["--api-processes", "0"], "--api-processes must be in 1..64"),
                                          (["--api-processes", "2", "--engine-process", "False"],
                                           "--api-processes above 1 needs the engine in its own process"),
                                          (["--prefix-parked-rows", "-1"], "--prefix-parked-rows must be >= 0")])
def test_serve_command_refuses_bad_process_and_cache_options_before_loading(capsys, args, message):
    from redline import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", "/no/such/checkpoint", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_serve_command_refuses_a_busy_port_before_loading(capsys):
    from redline import cli

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["serve", "/no/such/checkpoint", "--port", str(port)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err and "checkpoint" not in err


@pytest.mark.slow
def test_serve_command_end_to_end(model, tokenizer, tmp_path):
    """`redline serve CKPT` in its own process answers the client and stops on SIGTERM."""
    from redline.training.checkpoint import save_checkpoint

    plain = load_tokenizer("bytes")  # no chat tokens: chat requests are refused
    ckpt = save_checkpoint(tmp_path / "run", 1, model, {}, to_dict(TrainConfig(model=CFG)), plain, keep=1)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "redline", "serve", str(ckpt), "--port", str(port),
                             "--model-name", MODEL, "--cpu-threads", "1"], stderr=subprocess.PIPE, text=True)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        deadline = time.time() + 60
        while True:
            try:
                out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0)
                break
            except openai.APIConnectionError:
                assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
                time.sleep(0.2)
        assert out.choices[0].text == tokenizer.decode(reference(model, tokenizer.encode("Hello"), 8))
        chat = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                          json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        assert chat.status_code == 400 and chat.json()["error"]["code"] == "no_chat_template"
    finally:
        proc.terminate()
        code = proc.wait(30)
    # uvicorn shuts down gracefully, then re-raises the signal: the exit status says SIGTERM ended it
    assert code in (0, -15) and "Traceback" not in proc.stderr.read()


def read_stream(url: str, prompt: str, max_tokens: int, started: threading.Event | None = None) -> dict:
    """A streamed completion read to its end -> {"done": saw [DONE], "reason": its finish_reason, "error": ...}."""
    out = {"done": False, "reason": None, "error": None}
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if started is not None:
                    started.set()
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                    if "error" in data:
                        out["error"] = data["error"]["code"]
                    else:
                        out["reason"] = data["choices"][0]["finish_reason"] or out["reason"]
    except httpx.HTTPError as e:  # cut off at shutdown
        out["error"] = type(e).__name__
    return out


@pytest.mark.slow
def test_sigterm_refuses_new_connections_drains_then_cancels_within_the_timeout(model, tmp_path):
    """SIGTERM: the listening socket closes at once, the running stream finishes, and whatever the timeout does
    not cover is cancelled: the process ends within --shutdown-timeout plus its own teardown."""
    from redline.training.checkpoint import save_checkpoint

    ckpt = save_checkpoint(tmp_path / "run", 1, model, {}, to_dict(TrainConfig(model=CFG)), load_tokenizer("bytes"),
                           keep=1)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "redline", "serve", str(ckpt), "--port", str(port),
                             "--model-name", MODEL, "--cpu-threads", "1", "--max-batch", "1",
                             "--shutdown-timeout", "1"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                httpx.get(url + "/health")
                break
            except httpx.ConnectError:
                assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
                time.sleep(0.2)
        started = threading.Event()
        with ThreadPoolExecutor(49) as pool:
            first = pool.submit(read_stream, url, "Hello", 88, started)
            assert started.wait(30)
            # one row: these wait in the queue behind the first, longer than the timeout lets them
            queued = [pool.submit(read_stream, url, f"Hi {i}", 88) for i in range(48)]
            wait_until(lambda: "redline_requests_total 49\n" in httpx.get(url + "/metrics").text, 30)  # all queued
            t0 = time.time()
            proc.send_signal(15)
            time.sleep(0.5)
            with pytest.raises(httpx.ConnectError):  # admits nothing new
                httpx.get(url + "/health")
            code = proc.wait(30)
            elapsed = time.time() - t0
            results = [f.result() for f in queued]
        assert first.result() == {"done": True, "reason": "length", "error": None}  # the running stream drained
    finally:
        if proc.poll() is None:
            proc.kill()
    assert elapsed < 1 + 10, elapsed
    err = proc.stderr.read()
    assert code in (0, -15) and "Traceback" not in err, err
    cut = [r for r in results if not r["done"]]
    assert cut, "every queued request finished within the timeout: make them longer"
    assert all(r == {"done": False, "reason": None, "error": "shutting_down"} for r in cut), cut  # told why
    # a finished one ends whole: at max_tokens, or at the end-of-text token this random model emits for some prompts
    # ("Hi 6", "Hi 27", "Hi 28"), which finish within the timeout on some runs only
    assert all(r["done"] and r["reason"] in ("length", "stop") and r["error"] is None
               for r in results if r not in cut), results


def test_load_generator_in_two_client_processes(live, capsys, monkeypatch, tmp_path):
    """serve_load.py --processes 2: the clients and requests split over two processes started together, every
    request counted once in one summary; --requests-out writes each one's times, in the order they started."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "serve_load.py"
    spec = importlib.util.spec_from_file_location("serve_load", path)
    load = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "serve_load", load)
    spec.loader.exec_module(load)
    code = load.main(["--url", live.url, "--model", MODEL, "--concurrency", "4", "--requests", "11",
                      "--prompt-tokens", "10", "--max-tokens", "6", "--processes", "2",
                      "--requests-out", str(tmp_path / "requests.jsonl")])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and summary["completed"] == 11 and summary["failed"] == 0
    rows = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 11 and rows[0]["start"] == 0 and [r["start"] for r in rows] == sorted(r["start"] for r in rows)
    assert all(r["start"] < r["first"] <= r["end"] and r["error"] is None for r in rows)
    ttft = sorted(r["first"] - r["start"] for r in rows[4:])  # after the opening wave of 4 clients
    assert summary["ttft_ms_after_opening"]["p50"] == pytest.approx(ttft[len(ttft) // 2] * 1000, abs=2e-3)
    assert summary["client_processes"] == 2 and summary["concurrency"] == 4
    assert sum(summary["finish_reasons"].values()) == 11 and 0 < summary["output_tokens"] <= 66
    assert 0 < summary["ttft_ms"]["p50"] and 0 < summary["wall_s"] < 30
    with pytest.raises(SystemExit):  # more processes than clients
        load.main(["--url", live.url, "--model", MODEL, "--concurrency", "2", "--processes", "3"])


@pytest.mark.parametrize("spread,temperature", [(0.0, 0.0), (0.5, 0.0), (0.0, 1.0)])
def test_load_generator_bounded_load(live, capsys, monkeypatch, spread, temperature):
    """scripts/serve_load.py: a fixed number of streamed requests with Poisson arrivals, a time limit, nothing
    lost, every response complete; with --max-tokens-spread each request asks for its own seeded length; with
    --temperature the requests sample."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "serve_load.py"
    spec = importlib.util.spec_from_file_location("serve_load", path)
    load = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "serve_load", load)  # its dataclasses look their module up
    spec.loader.exec_module(load)
    t0 = time.time()
    code = load.main(["--url", live.url, "--model", MODEL, "--concurrency", "4", "--requests", "12",
                      "--rate", "200", "--prompt-tokens", "10", "--max-tokens", "8", "--max-tokens-spread", str(spread),
                      "--temperature", str(temperature), "--top-p", "0.9", "--redline-metrics"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and time.time() - t0 < 30
    assert summary["completed"] == 12 and summary["failed"] == 0 and summary["max_tokens_spread"] == spread
    assert summary["temperature"] == temperature and summary["top_p"] == 0.9
    reasons = summary["finish_reasons"]
    lengths = random.Random(1)  # the generator's stream of lengths for --seed 0
    asked = [max(1, round(8 * lengths.uniform(1 - spread, 1 + spread))) if spread else 8 for _ in range(12)]
    assert sum(reasons.values()) == 12 and summary["output_tokens"] <= sum(asked)
    assert reasons["stop"] or summary["output_tokens"] == sum(asked)
    assert spread == 0 or len(set(asked)) > 1
    assert summary["ttft_ms"]["p50"] > 0 and summary["output_tokens_per_s"] > 0
    # what the server counted over this load alone: its own TTFT is part of the client's
    server = summary["server"]
    assert server["decode_steps"] > 0 and 0 < server["occupancy"] <= 1 and server["ms_per_step"] > 0
    assert 0 < server["ttft_ms_mean"] <= summary["ttft_ms"]["mean"]


def test_a_failing_step_fails_the_requests_in_flight_and_the_scheduler_goes_on(model, tokenizer, monkeypatch):
    sched = scheduler_for(model, tokenizer, rows=2)
    try:
        engine = sched.batch.engine
        step = engine._step
        monkeypatch.setattr(engine, "_step", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("device lost")))
        events = queue.Queue()
        sched.submit([Sequence([1, 2, 3], 10, SamplingParams(), (), events.put)])
        while (event := events.get(timeout=30))[0] == "text":
            pass
        assert event == ("error", "RuntimeError: device lost") and sched.busy_rows() == 0
        monkeypatch.setattr(engine, "_step", step)
        assert run_all(sched, [[1, 2, 3]], [6])[0].tokens == reference(model, [1, 2, 3], 6)
        # a failure between a prompt's prefill and its first step (its first token sampled, not yet delivered)
        launch = sched._launch
        monkeypatch.setattr(sched, "_launch", lambda: (_ for _ in ()).throw(RuntimeError("launch failed")))
        sched.submit([Sequence([4, 5, 6], 10, SamplingParams(), (), events.put)])
        assert events.get(timeout=30) == ("error", "RuntimeError: launch failed") and sched.alive
        monkeypatch.setattr(sched, "_launch", launch)
        assert run_all(sched, [[1, 2, 3]], [6])[0].tokens == reference(model, [1, 2, 3], 6)
    finally:
        sched.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("group_graphs", [False, True])
def test_greedy_tokens_among_others_equal_alone_on_a_gpu(tokenizer, group_graphs):
    """The continuous-batching guarantee where it is hardest: bf16, compiled, CUDA graphs, prompts prefilled together
    (padded to the longest) and decoded in groups. 12 requests of different lengths at once on 8 rows, against each
    one alone: the same greedy tokens."""
    torch.manual_seed(0)
    model = GPT(replace(CFG, n_embd=128, n_head=4, n_kv_head=2)).cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # logits far apart: bf16 rounding alone cannot flip an argmax
    engine = InferenceEngine(model)  # bf16, compiled, CUDA graphs on a GPU
    batch = DecodeBatch(engine, rows=8, capacity=CFG.context_len, group_steps=8 if group_graphs else 0)
    sched = Scheduler(batch, tokenizer, [EOT], sync_every=8)
    try:
        prompts = [[(7 * i + j) % 250 + 1 for j in range(3 + 4 * i)] for i in range(12)]
        lengths = [16 + 2 * i for i in range(12)]  # prompt and tokens within the 96-token context
        together = [s.tokens for s in run_all(sched, prompts, lengths)]
        alone = [run_all(sched, [p], [n])[0].tokens for p, n in zip(prompts, lengths)]
    finally:
        sched.close()
    assert together == alone


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prefills_beside_the_decode_steps_change_no_token_on_a_gpu(tokenizer):
    """The prefill stream (prompts prefilled beside the group of steps running): 4 clients in a closed loop on 4
    rows, each submitting its next request from its last one's final event (so rows are given out again while the
    group in which their last request ended may still run), prompts sharing a 64-token beginning (copied from rows
    that finished, prefix reuse) and lengths that end requests mid-group: every request's greedy tokens are those it
    gets alone with one stream."""
    torch.manual_seed(0)
    model = GPT(replace(CFG, n_embd=128, n_head=4, n_kv_head=2)).cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # logits far apart: bf16 rounding alone cannot flip an argmax
    batch = DecodeBatch(InferenceEngine(model), rows=4, capacity=CFG.context_len)
    sched = Scheduler(batch, tokenizer, [EOT], sync_every=8, prefix_min_tokens=16)
    assert sched.prefill_stream
    shared = [(5 * j) % 250 + 1 for j in range(64)]
    prompts = [shared + [(11 * i + j) % 250 + 1 for j in range(2 + i % 7)] for i in range(20)]
    lengths = [6 + (5 * i) % 15 for i in range(20)]
    seqs: list[Sequence] = []
    lock, done = threading.Lock(), threading.Event()

    def submit_next() -> None:
        with lock:
            i = len(seqs)
            if i == len(prompts):
                return
            seqs.append(Sequence(list(prompts[i]), lengths[i], SamplingParams(), (), sink))
        sched.submit([seqs[i]])

    def sink(event: tuple) -> None:
        if event[0] == "text":
            return
        with lock:
            finished = sum(s.done for s in seqs) == len(prompts)
        done.set() if finished else submit_next()

    try:
        for _ in range(4):
            submit_next()
        assert done.wait(120)
        assert sched.stats.cached_tokens > 0  # beginnings were copied
        sched.prefill_stream = False
        alone = [run_all(sched, [p], [n])[0] for p, n in zip(prompts, lengths)]
    finally:
        sched.close()
    assert [(s.finish_reason, s.tokens) for s in seqs] == [(a.finish_reason, a.tokens) for a in alone]
    assert "error" not in {s.finish_reason for s in seqs}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_seeded_sampled_tokens_among_others_equal_alone_on_a_gpu(tokenizer):
    """The draw captured with each decode step (DecodeBatch.decode_sampled) on a GPU, bf16, compiled, CUDA graphs:
    12 requests at once on 8 rows (seeded ones sampling with and without top-p, greedy ones, unseeded sampled ones)
    against each alone: the same tokens for every seeded and every greedy request."""
    torch.manual_seed(0)
    model = GPT(replace(CFG, n_embd=128, n_head=4, n_kv_head=2)).cuda()
    batch = DecodeBatch(InferenceEngine(model), rows=8, capacity=CFG.context_len)
    sched = Scheduler(batch, tokenizer, [EOT], sync_every=8)
    kinds = [SamplingParams(temperature=0.9, seed=5), SamplingParams(), SamplingParams(temperature=1.2, top_p=0.8,
             seed=9), SamplingParams(temperature=1.0)]
    prompts = [[(7 * i + j) % 250 + 1 for j in range(3 + 4 * i)] for i in range(12)]
    lengths = [16 + 2 * i for i in range(12)]
    samplings = [replace(kinds[i % 4], seed=None if kinds[i % 4].seed is None else kinds[i % 4].seed + i)
                 for i in range(12)]

    def run(indices):
        seqs = run_all(sched, [prompts[i] for i in indices], [lengths[i] for i in indices],
                       [samplings[i] for i in indices])
        return [s.tokens for s in seqs]

    try:
        together = run(range(12))
        alone = [run([i])[0] for i in range(12)]
    finally:
        sched.close()
    kept = [i for i in range(12) if samplings[i].greedy or samplings[i].seed is not None]
    assert [together[i] for i in kept] == [alone[i] for i in kept]


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("continuous", [False, True])
def test_text_chunks_are_the_json_of_chunk(kind, continuous):
    """The streamed text chunk built from its fixed parts is the JSON chunk() gives, whatever the text holds (quotes,
    backslashes, newlines, non-ASCII, NUL, a mark's digits) and with a model name spelling a mark (built whole)."""
    from redline.serve import protocol

    body = {"model": "m", "stream": True, "stream_options": {"continuous_usage_stats": continuous,
                                                             "include_usage": True}}
    job = (protocol.chat_job({**body, "messages": [{"role": "user", "content": "x"}]}) if kind == "chat" else
           protocol.completion_job({**body, "prompt": "x"}))
    for model in ('mo"del', str(protocol.TextChunks._INDEX)):
        text_chunk = protocol.TextChunks(job, "id-1", model)
        for text in ["", 'a"b\\c\n', "héllo ✓ \x00 \u2028", str(protocol.TextChunks._INDEX)]:
            got = json.loads(text_chunk(3, text, 11, 5))
            want = protocol.chunk(job, "id-1", model, 3, text=text,
                                  progress=protocol.usage(11, 5) if continuous else None)
            assert got == dict(want, created=got["created"]) and abs(got["created"] - want["created"]) <= 1


def test_events_that_waited_go_out_as_one_chunk_per_choice():
    """A stream reads every event already queued: a choice's adjacent text events become one chunk (text joined, the
    last token count), other choices' events and the end of a choice keep their order."""
    import asyncio

    from redline.serve.api import _drain

    q = asyncio.Queue()
    for item in [(0, ("text", "b", 2)), (0, ("text", "c", 3)), (1, ("text", "x", 1)), (0, ("text", "d", 4)),
                 (0, ("done", "stop"))]:
        q.put_nowait(item)
    assert _drain((0, ("text", "a", 1)), q) == [(0, ("text", "abc", 3)), (1, ("text", "x", 1)),
                                                 (0, ("text", "d", 4)), (0, ("done", "stop"))]
    assert q.empty() and _drain((1, ("done", "length")), q) == [(1, ("done", "length"))]


def test_a_served_run_is_named_after_the_run_not_its_newest_checkpoint(tmp_path):
    from redline.commands.serve import served_name

    for step in ("step_00000002", "step_00000003"):
        ckpt = tmp_path / "myrun" / "checkpoints" / step
        ckpt.mkdir(parents=True)
        (ckpt / "meta.json").write_text("{}")
        (ckpt / "model.safetensors").write_bytes(b"")
    run = tmp_path / "myrun"
    assert served_name(str(run)) == served_name(str(run / "checkpoints")) == "myrun"
    assert served_name(str(run / "checkpoints" / "step_00000002")) == "step_00000002"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_warm_scheduler_never_waits_for_the_device_outside_its_reads(tokenizer):
    """The scheduler's turns (admitting, prefilling, launching greedy and sampled steps, freeing rows, handing tokens
    over) under torch's sync debug mode, which raises on a call that waits for the device: a wait there drains the
    queued steps. Its only waits are the events of the groups it reads (not such calls). A second round of the same
    shapes (the first compiles and captures them) ends every request as it did, none in an error."""
    from redline.commands.serve import warm_up

    torch.manual_seed(0)
    model = GPT(replace(CFG, n_embd=128, n_head=4, n_kv_head=2)).cuda()
    batch = DecodeBatch(InferenceEngine(model), rows=8, capacity=CFG.context_len)
    warm_up(batch)
    sched = Scheduler(batch, tokenizer, [EOT], sync_every=8)
    prompts = [[(7 * i + j) % 250 + 1 for j in range(5 + 3 * i)] for i in range(6)]
    lengths = [12 + 3 * i for i in range(6)]
    samplings = [SamplingParams() if i % 2 else SamplingParams(temperature=0.8, top_p=0.9, seed=i)
                 for i in range(6)]

    def round_() -> list[Sequence]:
        sinks = [queue.Queue() for _ in prompts]
        seqs = [Sequence(list(p), n, s, (), q.put) for p, n, s, q in zip(prompts, lengths, samplings, sinks)]
        sched.submit(seqs)  # at once: admitted together, prefilled in one forward of the same shape each round
        for q in sinks:
            while q.get(timeout=60)[0] == "text":
                pass
        return seqs

    try:
        first = round_()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            second = round_()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    finally:
        sched.close()
    assert [s.finish_reason for s in second] == [s.finish_reason for s in first]
    assert "error" not in {s.finish_reason for s in second}
    assert [s.tokens for s in second] == [s.tokens for s in first]  # greedy, and sampled with the same seeds


def test_requests_that_leave_sampling_out_take_the_models_recommendation():
    """A model's generation_config.json temperature / top_p / top_k (the server's sampling_defaults) for a request
    without them, as vLLM serves; a request's own values win; without defaults, OpenAI's."""
    from redline.serve import protocol

    defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    body = {"messages": [{"role": "user", "content": "x"}]}
    s = protocol.chat_job(body, defaults).sampling
    assert (s.temperature, s.top_p, s.top_k) == (0.6, 0.95, 20)
    s = protocol.completion_job({"prompt": "x", "temperature": 0, "top_k": -1}, defaults).sampling
    assert (s.temperature, s.top_p, s.top_k) == (0.0, 0.95, 0)
    s = protocol.chat_job(body).sampling
    assert (s.temperature, s.top_p, s.top_k) == (1.0, 1.0, 0)
