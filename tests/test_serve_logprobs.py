"""`redline serve`'s logprobs through the official `openai` client: each generated token's log-probability and its
most likely alternatives equal the model's own (a full forward over the prompt and the tokens, log-softmax), for
completions (`logprobs`: N) and chat (`logprobs`, `top_logprobs`), streamed or not; completions' `echo`, with the
prompt's own logprobs (evaluation harnesses score text so); bad values are OpenAI errors."""

import pytest
import torch

from redline.inference import InferenceEngine
from tests.test_serve import EOT, MODEL, error_of, live, model, tokenizer  # noqa: F401  (fixtures)

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def model_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """(len(tokens), vocab) log-probabilities the model gives each generated token's position."""
    ids = torch.tensor([prompt + tokens], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(ids)[0].cpu()  # (T, vocab)
    return logits[len(prompt) - 1:len(prompt) - 1 + len(tokens)].float().log_softmax(-1)


def greedy_tokens(model, prompt: list[int], n: int) -> list[int]:
    return InferenceEngine(model).generate([prompt], n, stop_tokens=[EOT])[0].tokens


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_are_the_models(live, model, tokenizer, stream):
    prompt = tokenizer.encode("The cat sat")
    args = dict(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, logprobs=3)
    if stream:
        chunks = [c for c in live.client.completions.create(stream=True, **args) if c.choices]
        text = "".join(c.choices[0].text for c in chunks)
        parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None]
        tokens = [t for p in parts for t in p.tokens]
        token_logprobs = [x for p in parts for x in p.token_logprobs]
        top = [x for p in parts for x in p.top_logprobs]
        offsets = [x for p in parts for x in p.text_offset]
    else:
        choice = live.client.completions.create(**args).choices[0]
        text, lp = choice.text, choice.logprobs
        tokens, token_logprobs, top, offsets = lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset
    want = greedy_tokens(model, prompt, 10)
    reference = model_logprobs(model, prompt, want)
    assert len(token_logprobs) == len(want) == len(top)
    assert tokens == [tokenizer.decode([t]) for t in want]
    # each token's offset in characters (exact figures for split characters: test_text_offsets_and_bytes_...)
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] <= len(text)
    assert text == tokenizer.decode(want)
    for j, token in enumerate(want):
        assert token_logprobs[j] == pytest.approx(float(reference[j, token]), abs=1e-4)
        values, ids = reference[j].topk(3)
        # keyed by the tokens' texts, as OpenAI's completions logprobs are (bytes of one UTF-8 character share one:
    # the likeliest keeps it)
        expected = {}
        for i, v in zip(ids, values.tolist()):
            expected.setdefault(tokenizer.decode([int(i)]), v)
        assert list(top[j]) == list(expected) and list(top[j].values()) == pytest.approx(list(expected.values()),
                                                                                          abs=1e-4)
        assert token_logprobs[j] == pytest.approx(values[0].item(), abs=1e-4)  # greedy: the most likely token


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_have_openais_shape_and_the_models_values(live, stream):
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8, temperature=0,
                logprobs=True, top_logprobs=2)
    if stream:
        chunks = [c for c in live.client.chat.completions.create(stream=True, **args) if c.choices]
        content = [e for c in chunks if c.choices[0].logprobs is not None for e in c.choices[0].logprobs.content]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
    else:
        out = live.client.chat.completions.create(**args)
        content, text = out.choices[0].logprobs.content, out.choices[0].message.content
    assert content and len(content) <= 8
    assert "".join(e.token for e in content) == text or "\ufffd" in "".join(e.token for e in content)
    assert bytes(b for e in content for b in e.bytes).decode("utf-8", errors="replace") == text
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2
        assert e.bytes == list(e.token.encode()) or e.token == "\ufffd"  # a byte of a character split over tokens
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-5)  # greedy
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
    plain = live.client.chat.completions.create(**{**args, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == text


@pytest.mark.parametrize("lagged", [False, True])
def test_the_scheduler_gives_each_drawn_token_its_models_logprob(model, tokenizer, lagged):
    """In the scheduler (no HTTP): a seeded sampled sequence and a greedy one with logprobs, beside one without,
    in groups of steps (read a group late, as on a GPU): each event's entries are the tokens the sequence got, with
    the model's log-probability of each (before temperature) and its top 2, against a full forward."""
    import queue

    from redline.inference import SamplingParams
    from redline.serve.scheduler import Sequence
    from tests.test_serve import scheduler_for

    sched = scheduler_for(model, tokenizer, rows=3, sync_every=3 if lagged else None)
    sched.lag_reads = lagged
    prompts = [tokenizer.encode("Once upon"), tokenizer.encode("Hello"), tokenizer.encode("Plain")]
    samplings = [SamplingParams(temperature=1.3, seed=5), SamplingParams(), SamplingParams(temperature=1.0)]
    sinks = [queue.Queue() for _ in prompts]
    seqs = [Sequence(p, 9, sp, (), q.put, logprobs=k) for p, sp, q, k in zip(prompts, samplings, sinks, (2, 2, None))]
    try:
        sched.submit(seqs)
        events = []
        for q in sinks:
            events.append([])
            while (event := q.get(timeout=30))[0] == "text":
                events[-1].append(event)
    finally:
        sched.close()
    assert all(len(e) == 3 for e in events[2])  # no logprobs asked: none computed or sent
    for seq, got in zip(seqs[:2], events[:2]):
        entries = [entry for event in got for entry in event[3]]
        assert [t for t, _, _ in entries] == seq.tokens and seq.tokens
        reference = model_logprobs(model, seq.prompt, seq.tokens)
        for j, (token, lp, top) in enumerate(entries):
            assert lp == pytest.approx(float(reference[j, token]), abs=1e-4)
            values, ids = reference[j].topk(2)
            assert [t for t, _ in top] == ids.tolist() and [v for _, v in top] == pytest.approx(values.tolist(),
                                                                                                  abs=1e-4)


@pytest.mark.parametrize("max_tokens", [0, 1])
@pytest.mark.parametrize("stream", [False, True])
def test_echo_scores_the_prompt_as_evaluation_harnesses_ask(live, model, tokenizer, max_tokens, stream):
    """echo with logprobs (lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs 1, max_tokens
    0 or 1): the text starts with the prompt's, and token_logprobs start with the prompt's tokens' (the first None),
    each the model's, then the generated token's."""
    prompt = tokenizer.encode("The quick brown fox")
    args = dict(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, logprobs=1, echo=True)
    if stream:
        chunks = [c for c in live.client.completions.create(stream=True, **args) if c.choices]
        text = "".join(c.choices[0].text for c in chunks)
        token_logprobs = [x for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
        top = [x for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.top_logprobs]
    else:
        out = live.client.completions.create(**args)
        text, lp = out.choices[0].text, out.choices[0].logprobs
        token_logprobs, top = lp.token_logprobs, lp.top_logprobs
        assert out.usage.completion_tokens == max_tokens and out.usage.prompt_tokens == len(prompt)
    generated = greedy_tokens(model, prompt, 1)[:max_tokens]
    assert text == tokenizer.decode(prompt + generated)
    assert len(token_logprobs) == len(prompt) + max_tokens and token_logprobs[0] is None and top[0] == {}
    reference = model_logprobs(model, prompt[:1], prompt[1:] + generated)
    for j, token in enumerate(prompt[1:] + generated):
        assert token_logprobs[j + 1] == pytest.approx(float(reference[j, token]), abs=1e-4)
        assert list(top[j + 1].values()) == pytest.approx([reference[j].max().item()], abs=1e-4)


@pytest.mark.parametrize("stream", [False, True])
def test_text_offsets_and_bytes_follow_characters_split_over_tokens(live, stream):
    """Byte tokens split "é" (2 bytes) and "€" (3): text_offset counts characters of the text, a token inside a
    character at that character's offset; chat's `bytes` are each token's own bytes, which rebuild the text."""
    args = dict(model=MODEL, prompt="héllo €!", max_tokens=0, logprobs=0, echo=True)
    if stream:
        chunks = [c for c in live.client.completions.create(stream=True, **args) if c.choices]
        offsets = [x for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.text_offset]
    else:
        offsets = live.client.completions.create(**args).choices[0].logprobs.text_offset
    #            h  é(2 bytes)  l  l  o  ' '  €(3 bytes)  !
    assert offsets == [0, 1, 1, 2, 3, 4, 5, 6, 6, 6, 7]
    # a completion's offsets go on from the prompt's when both are sent in one stream
    chunks = [c for c in live.client.completions.create(stream=True, **{**args, "max_tokens": 3}) if c.choices]
    offsets = [x for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.text_offset]
    assert offsets[:11] == [0, 1, 1, 2, 3, 4, 5, 6, 6, 6, 7] and offsets[11] == 8


def test_chat_logprob_bytes_are_the_tokens_own(live, tokenizer):
    content = live.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "€"}], max_tokens=6, temperature=0,
        logprobs=True).choices[0].logprobs.content
    for e in content:
        assert len(e.bytes) <= 1  # a byte a token (the bytes tokenizer; none for a chat token), never U+FFFD's 3
    assert tokenizer.token_bytes(0xE2) == b"\xe2" and tokenizer.token_bytes(256) == b""


@pytest.mark.parametrize("stream", [False, True])
def test_echo_without_logprobs_starts_the_text_with_the_prompt(live, stream):
    args = dict(model=MODEL, prompt="Echo me", max_tokens=3, temperature=0)
    plain = live.client.completions.create(**args).choices[0].text
    if stream:
        text = "".join(c.choices[0].text for c in live.client.completions.create(stream=True, echo=True, **args)
                       if c.choices)
    else:
        text = live.client.completions.create(echo=True, **args).choices[0].text
    assert text == "Echo me" + plain


@pytest.mark.parametrize("args, param", [
    ({"logprobs": 21}, "logprobs"), ({"logprobs": -1}, "logprobs"), ({"echo": 1}, "echo"),
    ({"max_tokens": 0}, "max_tokens"),  # only with echo and logprobs: scoring the prompt
    ({"max_tokens": 0, "echo": True}, "max_tokens"),
])
def test_bad_completion_logprobs_are_openai_errors(live, args, param):
    args = {"max_tokens": 2, **args}
    status, body = error_of(lambda: live.client.completions.create(model=MODEL, prompt="hi", **args))
    assert status == 400 and body["param"] == param


def test_bad_chat_logprobs_are_openai_errors(live):
    messages = [{"role": "user", "content": "hi"}]
    status, body = error_of(lambda: live.client.chat.completions.create(model=MODEL, messages=messages,
                                                                        top_logprobs=2))
    assert status == 400 and body["param"] == "top_logprobs"
    status, body = error_of(lambda: live.client.chat.completions.create(model=MODEL, messages=messages,
                                                                        logprobs=True, top_logprobs=21))
    assert status == 400 and body["param"] == "top_logprobs"
    status, body = error_of(lambda: live.client.chat.completions.create(model=MODEL, messages=messages,
                                                                        extra_body={"echo": True}))
    assert status == 400 and body["param"] == "echo"  # chat has no echo


def test_served_logprobs_of_an_imported_model_equal_transformers(tmp_path, capsys):
    """Parity: a tiny Qwen2 built with transformers, imported with `redline import` and served as `redline serve`
    builds it; the logprobs of the prompt (echo) and of the generated tokens equal transformers' log-softmax of its
    own logits over the same tokens."""
    pytest.importorskip("transformers")
    from redline.commands.serve import ServeConfig, build
    from redline.inference.runtime import RuntimeOptions
    from tests.interop_models import hf_folder
    from tests.test_interop import run_cli
    from tests.test_serve import Live

    hf = hf_folder("qwen2", tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    live = Live(*build(ServeConfig(checkpoint=str(tmp_path / "ckpt"), model_name="qwen", max_batch=2,
                                   runtime=RuntimeOptions(cpu_threads=1))))
    try:
        prompt = [5, 77, 140, 9, 260, 31]
        out = live.client.completions.create(model="qwen", prompt=prompt, max_tokens=5, temperature=0, logprobs=3,
                                             echo=True)
    finally:
        live.close()
    lp = out.choices[0].logprobs
    generated = len(lp.token_logprobs) - len(prompt)
    assert generated == out.usage.completion_tokens >= 1 and lp.token_logprobs[0] is None
    with torch.no_grad():  # transformers' own greedy continuation and its log-softmax over the whole sequence
        ids = hf.generate(torch.tensor([prompt]), max_new_tokens=generated, do_sample=False)[0].tolist()
        reference = hf(torch.tensor([ids])).logits[0].log_softmax(-1)
    for j in range(1, len(ids)):
        assert lp.token_logprobs[j] == pytest.approx(float(reference[j - 1, ids[j]]), abs=1e-4)
        assert max(lp.top_logprobs[j].values()) == pytest.approx(reference[j - 1].max().item(), abs=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_logprobs_on_a_gpu_are_the_models_and_leave_the_tokens_as_they_are(tokenizer):
    """bf16, compiled, CUDA graphs: a greedy request with logprobs (its groups step by step from the logits) among
    requests without (captured greedy steps) gets the tokens it gets without logprobs, and logprobs within bf16's
    rounding of a full forward; a prompt's logprobs (echo) likewise."""
    import queue
    from dataclasses import replace

    from redline.inference import SamplingParams
    from redline.inference.batch import DecodeBatch
    from redline.model import GPT
    from redline.serve.scheduler import Scheduler, Sequence
    from tests.test_serve import CFG, run_all

    torch.manual_seed(0)
    model = GPT(replace(CFG, n_embd=128, n_head=4, n_kv_head=2)).cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # logits far apart: bf16 rounding alone cannot flip an argmax
    sched = Scheduler(DecodeBatch(InferenceEngine(model), rows=4, capacity=CFG.context_len), tokenizer, [EOT],
                      sync_every=8)
    try:
        prompt = [(5 * j) % 250 + 1 for j in range(20)]
        plain = run_all(sched, [prompt], [24])[0].tokens
        sink = queue.Queue()
        seq = Sequence(prompt, 24, SamplingParams(), (), sink.put, logprobs=2, prompt_logprobs=2)
        others = [Sequence([j + 1] * 9, 30, SamplingParams(), (), lambda e: None) for j in range(3)]
        sched.submit([seq] + others)
        events = []
        while (event := sink.get(timeout=60))[0] != "done":
            events.append(event)
    finally:
        sched.close()
    assert seq.tokens == plain
    scored = events[0][1]
    generated = [entry for event in events[1:] for entry in event[3]]
    assert [t for t, _, _ in scored] == prompt and [t for t, _, _ in generated] == seq.tokens
    reference = model_logprobs(model.float(), prompt[:1], prompt[1:] + seq.tokens)
    got = [lp for _, lp, _ in scored[1:] + generated]
    want = [float(reference[j, t]) for j, t in enumerate(prompt[1:] + seq.tokens)]
    assert got == pytest.approx(want, abs=0.1 + 0.02 * max(abs(w) for w in want))
