"""Prefix reuse (inference/prefix_cache.py, DecodeBatch.copy_prefix, the scheduler's _reuse_prefixes): a prompt whose
beginning a row still holds copies it and prefills the rest, with the logits and greedy tokens of a prompt computed
whole; a freed row keeps its cache while the others decode; the choices of one request share one prefill; the API
reports the copied tokens as OpenAI does (usage.prompt_tokens_details.cached_tokens)."""

import queue

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.inference.batch import DecodeBatch
from redline.inference.prefix_cache import BLOCK, PrefixIndex, chain_hashes
from redline.model import GPT, ModelConfig
from redline.serve.scheduler import Scheduler, Sequence
from redline.tokenizer import load_tokenizer

CFG = ModelConfig(vocab_size=261, context_len=128, n_layer=2, n_embd=64, n_head=4, n_kv_head=2)
EOT = 256

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(CFG)


def tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 250, (n,), generator=g).tolist()


def reference(model, ids: list[int], max_tokens: int) -> list[int]:
    return InferenceEngine(model).generate([ids], max_tokens, stop_tokens=[EOT])[0].tokens


def whole_prompt(batch: DecodeBatch, row: int, prompt: list[int], n: int, variant: str) -> torch.Tensor:
    """The logits after `prompt` prefilled into `row` whole, to compare with a copy of its first n tokens and the
    rest prefilled after it; with an FP8 cache in the same two spans (the rest attends to the FP8 prefix)."""
    if variant != "fp8 cache":
        return batch.prefill(row, prompt)
    batch.prefill(row, prompt[:n])
    return batch.prefill(row, prompt[n:], start=n)


def test_the_index_finds_the_longest_held_prefix_in_whole_blocks_and_never_a_stale_one():
    index = PrefixIndex(rows=3)
    a, b = tokens(50, 1), tokens(40, 2)
    index.set(0, a)
    index.set(1, a[:20] + b)
    assert index.match(a + [7, 7]) == (0, 48)  # 50 tokens held: three whole blocks
    assert index.match(a[:20] + b[:30]) == (1, 48)  # row 1 holds the longer prefix of this one
    assert index.match(a[:40], exclude=[0]) == (1, 16)  # row 1 shares only the first block (and 4 tokens)
    assert index.match(a[:15]) == (-1, 0)  # less than a block
    index.set(0, b)  # row 0 is prefilled again: what it held is gone, though the dictionary still names it
    assert index.match(a + [7]) == (1, 16)
    index.set_hashes(2, index.hashes[1][:1])  # row 2 got row 1's first block copied
    assert index.match(a[:20] + b[:30], exclude=[1]) == (2, 16)
    assert chain_hashes(a)[:2] == chain_hashes(a[:33])
    assert chain_hashes(a, known=chain_hashes(a[:20])) == chain_hashes(a)  # a sequence that grew: its hashes kept


@pytest.mark.parametrize("variant", ["plain", "fp8 cache", "sliding window", "interleaved windows",
                                     "short convolutions"])
def test_a_copied_prefix_gives_the_logits_of_the_whole_prompt(model, variant):
    """Row 0 prefilled and decoding, row 1 prefilled, decoded and freed while row 0 decodes on: both keep their
    prompts' keys and values; a prompt beginning as either copies that beginning into row 2 and prefills the rest,
    and its logits equal those of the same prompt prefilled whole in row 3 (with an FP8 cache, prefilled in the same
    two spans: the copy carries the scales too)."""
    if variant == "sliding window":
        torch.manual_seed(0)
        model = GPT(ModelConfig(**{**CFG.__dict__, "sliding_window": 24}))
    if variant == "interleaved windows":  # Gemma 3's: a windowed layer with its own RoPE base, then a full one
        torch.manual_seed(0)
        model = GPT(ModelConfig(**{**CFG.__dict__, "sliding_window": 24, "sliding_window_pattern": 2,
                                   "rope_local_theta": 100.0}))
    if variant == "short convolutions":  # LFM2's: a convolution layer's cache holds each slot's input b·h
        torch.manual_seed(0)
        model = GPT(ModelConfig(**{**CFG.__dict__, "conv_layers": (0,)}))
    engine = InferenceEngine(model, kv_cache_dtype="fp8" if variant == "fp8 cache" else "auto")
    batch = DecodeBatch(engine, rows=4, capacity=CFG.context_len)
    shared, other = tokens(40, 3), tokens(37, 4)
    batch.start(0, int(batch.prefill(0, shared).argmax()), len(shared))
    batch.start(1, int(batch.prefill(1, other).argmax()), len(other))
    for _ in range(5):
        batch.step()
    batch.free(1)
    for _ in range(5):  # row 1 parked: the other rows' steps must not write what it holds
        batch.step()
    for source, prompt in ((0, shared + tokens(9, 5)), (1, other + tokens(12, 6))):
        row, n = batch.match(prompt[:-1])
        assert (row, n) == (source, 32)
        batch.copy_prefix(row, 2, n)
        reused = batch.prefill(2, prompt[n:], start=n)
        torch.testing.assert_close(reused, whole_prompt(batch, 3, prompt, n, variant), rtol=1e-5, atol=1e-5)
        if variant in ("interleaved windows", "short convolutions"):  # as the model's forward computes it
            with torch.no_grad():
                full = model(torch.tensor([prompt]))[0, -1]
            torch.testing.assert_close(reused, full, rtol=1e-5, atol=1e-5)
        assert batch.held[2] == batch.held[3] == prompt
    with pytest.raises(UserError, match="decoding"):
        batch.copy_prefix(1, 0, 16)
    with pytest.raises(UserError, match="holds"):
        batch.prefill(2, [1, 2], start=len(batch.held[2]) + 1)


def test_the_rests_of_prompts_after_one_copied_beginning_go_through_in_one_forward(model):
    """Rows 1-3 copy row 0's 32-token beginning (together) and prefill their rests (9, 14 and 3 tokens: padded to
    the longest) in one prefill_many at slot 32: each row's logits and what it holds equal its prompt prefilled whole; a start
    past what a row holds is refused."""
    batch = DecodeBatch(InferenceEngine(model), rows=5, capacity=CFG.context_len)
    shared = tokens(40, 21)
    batch.prefill(0, shared)
    prompts = [shared[:32] + tokens(n, 22 + n) for n in (9, 14, 3)]
    batch.copy_prefixes([(0, 1), (0, 2), (0, 3)], 32)  # one gather and scatter per buffer for the three
    got = batch.prefill_many([3, 1, 2], [prompts[2][32:], prompts[0][32:], prompts[1][32:]], 32)
    for i, (row, prompt) in enumerate(zip((3, 1, 2), (prompts[2], prompts[0], prompts[1]))):
        torch.testing.assert_close(got[i], batch.prefill(4, prompt), rtol=1e-5, atol=1e-5)
        assert batch.held[row] == prompt
    with pytest.raises(UserError, match="holds"):
        batch.prefill_many([1], [[1, 2]], len(prompts[0]) + 1)
    with pytest.raises(UserError, match="both"):
        batch.copy_prefixes([(0, 1), (1, 2)], 16)


def run(sched: Scheduler, prompts, max_tokens: int, sampling=None) -> list[Sequence]:
    sinks = [queue.Queue() for _ in prompts]
    seqs = [Sequence(list(p), max_tokens, sampling or SamplingParams(), (), q.put) for p, q in zip(prompts, sinks)]
    sched.submit(seqs)
    for q in sinks:
        while q.get(timeout=30)[0] == "text":
            pass
    return seqs


@pytest.mark.parametrize("lagged", [False, True])
def test_a_conversation_reuses_its_history_and_its_tokens_are_those_computed_whole(model, lagged):
    """Turn 2 sends turn 1's prompt and answer again with more: it copies what turn 1's row holds (the prompt and all
    but the last generated token) and computes the rest; n = 3 choices of one prompt: one prefill, the other two copy
    it a turn later. Greedy tokens are those of each prompt alone, computed whole."""
    sched = Scheduler(DecodeBatch(InferenceEngine(model), rows=3, capacity=CFG.context_len),
                      load_tokenizer("bytes"), [EOT], prefill_tokens=24, sync_every=3 if lagged else None,
                      prefix_min_tokens=16)
    sched.lag_reads = lagged
    try:
        first = tokens(30, 7)
        (turn1,) = run(sched, [first], 12)
        assert turn1.cached_tokens == 0 and turn1.tokens == reference(model, first, 12)
        second = first + turn1.tokens + tokens(10, 8)
        (turn2,) = run(sched, [second], 8)
        assert turn2.cached_tokens == (len(first) + len(turn1.tokens) - 1) // BLOCK * BLOCK == 32
        assert turn2.tokens == reference(model, second, 8)
        prompt = tokens(45, 9)
        spans = []
        sched.batch.prefill = lambda *a, **k: spans.append(a)  # the rests after a copy must not go in spans
        choices = run(sched, [prompt] * 3, 6)
        assert sorted(c.cached_tokens for c in choices) == [0, 32, 32] and not spans
        assert all(c.tokens == reference(model, prompt, 6) for c in choices)
        assert sched.stats.cached_tokens == 96
    finally:
        sched.close()


def test_with_cuda_graphs_a_copied_beginning_is_whole_start_steps(model):
    """With CUDA graphs a batch copies beginnings in whole PREFIX_START_STEP spans (the rest's start slot is part of
    its prefill graph's shape): turn 2 of a conversation whose row holds 81 tokens (80 in whole hash blocks) copies
    64 and computes the rest, with the greedy tokens of its prompt computed whole; on a CPU (no graphs) whole hash
    blocks."""
    from redline.inference.batch import PREFIX_START_STEP

    batch = DecodeBatch(InferenceEngine(model), rows=2, capacity=CFG.context_len)
    assert batch.start_step == BLOCK  # no CUDA graphs here
    batch.start_step = PREFIX_START_STEP
    sched = Scheduler(batch, load_tokenizer("bytes"), [EOT], prefix_min_tokens=16)
    try:
        first = tokens(70, 41)
        (turn1,) = run(sched, [first], 12)
        second = first + turn1.tokens + tokens(10, 42)
        (turn2,) = run(sched, [second], 8)
        assert (len(first) + len(turn1.tokens) - 1) // BLOCK * BLOCK == 80 and turn2.cached_tokens == 64
        assert turn2.tokens == reference(model, second, 8)
    finally:
        sched.close()


def test_a_prompt_prefilled_whole_is_not_prefilled_again_at_a_copy_as_long_as_it(model):
    """One turn admits a fresh 32-token prompt (slot 0) and a prompt that copies a 32-token beginning (its rest at slot
    32): the first, prefilled and started, must not be taken for one more rest at slot 32 (it was: 'row is
    decoding', and the scheduler's thread died). Both give the greedy tokens of their prompts computed whole."""
    sched = Scheduler(DecodeBatch(InferenceEngine(model), rows=3, capacity=CFG.context_len),
                      load_tokenizer("bytes"), [EOT], prefix_min_tokens=16)
    try:
        held = tokens(40, 31)
        run(sched, [held], 4)
        fresh, copying = tokens(32, 32), held[:32] + tokens(12, 33)
        done = run(sched, [fresh, copying], 5)
        assert [s.cached_tokens for s in done] == [0, 32] and all(s.finish_reason == "length" for s in done)
        assert [s.tokens for s in done] == [reference(model, fresh, 5), reference(model, copying, 5)]
        assert sched.alive
    finally:
        sched.close()


def test_the_api_reports_cached_prompt_tokens_as_openai_does(model):
    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tests.test_serve import Live

    from redline.serve.api import Server

    tok = load_tokenizer("bytes")
    sched = Scheduler(DecodeBatch(InferenceEngine(model), rows=2, capacity=CFG.context_len), tok, [EOT],
                      prefix_min_tokens=16)
    live = Live(Server(sched, tok, "tiny"))
    try:
        assert isinstance(live.client, openai.OpenAI)
        prompt = "the same long beginning of a prompt, " * 2
        first = live.client.completions.create(model="tiny", prompt=prompt + "one", max_tokens=4, temperature=0)
        again = live.client.completions.create(model="tiny", prompt=prompt + "two", max_tokens=4, temperature=0)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        assert again.usage.prompt_tokens_details.cached_tokens == len(prompt) // BLOCK * BLOCK
        assert again.choices[0].text == tok.decode(reference(model, tok.encode(prompt + "two"), 4))
        stream = live.client.completions.create(model="tiny", prompt=prompt + "three", max_tokens=3, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
        usage = [c.usage for c in stream if c.usage is not None]
        assert usage[-1].prompt_tokens_details.cached_tokens == len(prompt) // BLOCK * BLOCK
        metrics = httpx.get(live.url + "/metrics").text
        assert f"redline_prompt_tokens_cached_total {2 * (len(prompt) // BLOCK * BLOCK)}" in metrics
    finally:
        live.close()


def serve_load_run(model, monkeypatch, capsys, argv: list[str], parked: int = 0) -> tuple[int, dict]:
    """scripts/serve_load.py's main(argv) against a server of `model` (2 rows and `parked` parked ones, prefix reuse
    from 16 tokens) -> (its exit code, its summary)."""
    pytest.importorskip("uvicorn")
    import importlib.util
    import json
    import sys
    from pathlib import Path

    from redline.serve.api import Server
    from tests.test_serve import Live

    path = Path(__file__).resolve().parents[1] / "scripts" / "serve_load.py"
    spec = importlib.util.spec_from_file_location("serve_load", path)
    load = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "serve_load", load)  # its dataclasses look their module up
    spec.loader.exec_module(load)
    tok = load_tokenizer("bytes")
    batch = DecodeBatch(InferenceEngine(model), rows=2, capacity=CFG.context_len, parked_rows=parked)
    live = Live(Server(Scheduler(batch, tok, [EOT], prefix_min_tokens=16), tok, "tiny"))
    try:
        code = load.main(["--url", live.url, "--model", "tiny", *argv])
    finally:
        live.close()
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_load_generator_sends_prompts_that_share_a_beginning(model, capsys, monkeypatch):
    """scripts/serve_load.py --shared-prefix-tokens: every prompt begins with the same tokens, and the summary
    gives what the server reported reusing: the first request computes the 48 shared tokens (the second, arriving
    with it, waits a turn for them), the other seven copy them."""
    code, summary = serve_load_run(model, monkeypatch, capsys, [
        "--concurrency", "2", "--requests", "8", "--prompt-tokens", "60", "--shared-prefix-tokens", "48",
        "--max-tokens", "4"])
    assert code == 0 and summary["completed"] == 8 and summary["shared_prefix_tokens"] == 48
    assert summary["cached_prompt_tokens"] == 48 * 7 / 8


def test_the_load_generator_sends_conversations_whose_turns_reuse_the_last(model, capsys, monkeypatch):
    """scripts/serve_load.py --turns 3 --turn-tokens 20 --conversations 0: two conversations interleaved on one
    client: each turn's prompt is the last one and 20 tokens more, and the row that served the last turn holds its
    prompt: turns 2 and 3 reuse 32 of the first 40 tokens and 48 of the second's 60 (whole blocks of 16); a first
    turn reuses nothing."""
    code, summary = serve_load_run(model, monkeypatch, capsys, [
        "--concurrency", "1", "--requests", "6", "--prompt-tokens", "40", "--turns", "3", "--turn-tokens", "20",
        "--max-tokens", "4", "--conversations", "0"])
    assert code == 0 and summary["completed"] == 6 and summary["turns"] == 3
    assert summary["server_prompt_tokens"] == (40 + 60 + 80) / 3
    assert summary["cached_prompt_tokens"] == round(2 * (0 + 32 + 48) / 6, 2)


@pytest.mark.parametrize("variant", ["plain", "fp8 cache"])
def test_a_parked_prefix_outlives_its_row_and_gives_the_logits_of_the_whole_prompt(model, variant):
    """Row 0's prompt is parked, then row 0 is prefilled with another: a prompt beginning as the first finds it in
    the parked row, copies it and gets the logits of itself prefilled whole. Parking again what a parked row holds
    copies nothing; a longer history of the same beginning replaces it in its parked row; with every parked row in
    use, the least recently used one makes room."""
    kv = "fp8" if variant == "fp8 cache" else "auto"
    engine = InferenceEngine(model, kv_cache_dtype=kv)
    batch = DecodeBatch(engine, rows=2, capacity=CFG.context_len, parked_rows=2)
    unparked = DecodeBatch(InferenceEngine(model, kv_cache_dtype=kv), rows=2, capacity=CFG.context_len)
    assert batch.parked == [2, 3] and len(batch.held) == 4
    assert engine.kv_cache_bytes == 2 * unparked.engine.kv_cache_bytes  # the parked rows' memory counted
    assert batch.state.cache.k[0].shape == unparked.state.cache.k[0].shape  # steps see the batch's rows alone
    first, later = tokens(40, 41), tokens(37, 42)
    batch.prefill(0, first)
    batch.park([0])
    assert batch.held[2] == first[:32] and batch.held[3] == []
    batch.prefill(0, later)  # row 0 given to another sequence
    assert batch.match(first + [1], exclude=[]) == (2, 32)
    assert batch.match(first + [1], parked=False) == (-1, 0)
    prompt = first + tokens(9, 43)
    row, n = batch.match(prompt[:-1])
    assert batch.parked == [3, 2]
    batch.copy_prefix(row, 1, n)
    assert batch.parked == [2, 3]  # copied into the batch: its tokens live in row 1 now, it makes room first
    reused = batch.prefill_many([1], [prompt[n:]], n)[0]
    torch.testing.assert_close(reused, whole_prompt(batch, 0, prompt, n, variant), rtol=1e-5, atol=1e-5)
    copies = []
    real = batch.state.cache.copy_slots
    batch.state.cache.copy_slots = lambda *a: (copies.append(a), real(*a))
    batch.park([1])  # row 1 holds prompt (48 tokens in whole blocks): it goes on from row 2's 32: replaces it
    assert batch.held[2] == prompt[:48] and batch.parked == [3, 2] and len(copies) == 1
    batch.park([0])  # row 0 holds the same prompt: parked already, nothing copied
    assert len(copies) == 1
    batch.prefill(0, later)
    batch.park([0])  # another beginning: into the least recently used parked row (3)
    assert batch.held[3] == later[:32] and batch.parked == [2, 3]
    batch.prefill(1, tokens(20, 44))
    batch.park([1], keep=[2])  # the next one: not into row 2 (a new sequence is about to copy from it)
    assert batch.held[3] == tokens(20, 44)[:16] and batch.match(prompt) == (2, 48)
    batch.prefill(0, later)
    batch.park([0])  # and the one after evicts row 2's (the least recently used now)
    assert batch.held[2] == later[:32] and batch.match(prompt) == (-1, 0)
    with pytest.raises(UserError, match="parked_rows"):
        DecodeBatch(engine, rows=2, capacity=CFG.context_len, parked_rows=-1)


@pytest.mark.parametrize("parked", [0, 2])
def test_a_conversation_finds_its_history_parked_after_other_requests_took_its_row(model, parked):
    """Turn 1 of a conversation, then two other requests take both rows of the batch; turn 2 (turn 1's prompt and
    answer and more) copies its history from the parked row and gives the tokens of its prompt computed whole.
    Without parked rows, the history is gone and nothing is reused."""
    sched = Scheduler(DecodeBatch(InferenceEngine(model), rows=2, capacity=CFG.context_len, parked_rows=parked),
                      load_tokenizer("bytes"), [EOT], prefix_min_tokens=16)
    try:
        first = tokens(30, 51)
        (turn1,) = run(sched, [first], 12)
        run(sched, [tokens(25, 52), tokens(26, 53)], 4)  # both rows given to others
        second = first + turn1.tokens + tokens(10, 54)
        (turn2,) = run(sched, [second], 8)
        assert turn2.tokens == reference(model, second, 8)
        assert turn2.cached_tokens == (32 if parked else 0)
    finally:
        sched.close()


def test_the_load_generator_s_conversations_reuse_their_parked_history_when_they_outnumber_the_rows(
        model, capsys, monkeypatch):
    """Four clients' conversations of three turns on two rows: between two turns of one conversation, the others
    take its row. With four parked rows every turn 2 and 3 finds its last turn parked; without, less is reused.
    --conversations 2 (eight of them, two at a time, on two rows and two parked): every later turn reuses."""
    argv = ["--concurrency", "4", "--requests", "12", "--prompt-tokens", "40", "--turns", "3", "--turn-tokens", "20",
            "--max-tokens", "4"]
    code, without = serve_load_run(model, monkeypatch, capsys, argv)
    assert code == 0 and without["completed"] == 12
    code, parked = serve_load_run(model, monkeypatch, capsys, argv, parked=4)
    assert code == 0 and parked["completed"] == 12
    assert parked["cached_prompt_tokens"] > without["cached_prompt_tokens"]
    assert parked["cached_prompt_tokens"] == round((0 + 32 + 48) / 3, 2)  # every turn 2 and 3 found its last
    # --conversations 2: eight conversations, two in progress at once
    code, two = serve_load_run(model, monkeypatch, capsys, [*argv, "--requests", "24", "--conversations", "2"],
                                parked=2)
    assert code == 0 and two["completed"] == 24 and two["conversations"] == 2
    assert two["cached_prompt_tokens"] == round((0 + 32 + 48) / 3, 2)


@pytest.mark.parametrize("parked, lagged, step", [(0, False, BLOCK), (2, True, BLOCK), (2, False, 32)])
def test_random_traffic_gives_every_request_the_tokens_of_its_prompt_computed_whole(model, parked, lagged, step):
    """Requests in overlapping waves on three rows: fresh prompts, prompts sharing a beginning, conversations going
    on from a finished request's prompt and answer, the choices of n = 2, some cancelled while they run; prompts
    longer than a turn's prefill budget, so some go in spans. Whatever the order rows are freed, copied from, parked
    and copied back in, every request that was not cancelled gets the greedy tokens of its prompt computed whole,
    and the scheduler's thread lives on. step: copied beginnings cut to multiples of it (as with CUDA graphs)."""
    import random

    rng = random.Random(parked + step)
    batch = DecodeBatch(InferenceEngine(model), rows=3, capacity=CFG.context_len, parked_rows=parked)
    batch.start_step = step
    sched = Scheduler(batch, load_tokenizer("bytes"), [EOT], prefill_tokens=40, sync_every=2 if lagged else None,
                      prefix_min_tokens=16)
    sched.lag_reads = lagged
    shared = tokens(32, 70)
    done: list[Sequence] = []  # finished, to go on from
    submitted: list[tuple[Sequence, queue.Queue]] = []
    try:
        for wave in range(20):
            prompts = []
            for _ in range(rng.randint(1, 4)):
                kind = rng.choice(["fresh", "shared", "go on", "go on"])
                ended = [s for s in done if s.finish_reason in ("length", "stop") and len(s.prompt) < 80]
                if kind == "go on" and ended:
                    last = rng.choice(ended)
                    prompts.append(last.prompt + last.tokens + tokens(rng.randint(1, 12), rng.randrange(10**6)))
                elif kind == "shared":
                    prompts.append(shared + tokens(rng.randint(1, 30), rng.randrange(10**6)))
                else:
                    prompts.append(tokens(rng.randint(5, 60), rng.randrange(10**6)))
            if rng.random() < 0.3:
                prompts.append(prompts[-1])  # n = 2: the same prompt twice in one submission
            wave_seqs = []
            for p in prompts:
                sink = queue.Queue()
                seq = Sequence(list(p), rng.randint(1, 10), SamplingParams(), (), sink.put)
                wave_seqs.append(seq)
                submitted.append((seq, sink))
            sched.submit(wave_seqs)
            if rng.random() < 0.25:
                rng.choice(wave_seqs).cancel()
            for seq, sink in submitted:  # wait for some of what is in flight, not all: the waves overlap
                if seq.done or rng.random() < 0.5:
                    continue
                while sink.get(timeout=30)[0] == "text":
                    pass
            done = [seq for seq, _ in submitted if seq.done]
        for seq, sink in submitted:
            while not seq.done:
                sink.get(timeout=30)
        assert sched.alive
        checked = 0
        for seq, _ in submitted:
            if seq.finish_reason == "cancelled":
                continue
            assert seq.finish_reason in ("length", "stop"), seq.finish_reason
            assert seq.tokens == reference(model, seq.prompt, seq.max_tokens), (len(seq.prompt), seq.cached_tokens)
            checked += 1
        assert checked >= 25 and sched.stats.cached_tokens > 0  # reuse happened, and most requests were checked
        assert all(seq.cached_tokens % step == 0 for seq, _ in submitted)
    finally:
        sched.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_row_freed_inside_a_group_graph_keeps_its_prefix_on_a_gpu():
    """On a GPU (bf16, compiled, CUDA graphs, one graph a group of greedy steps): a row that a group graph frees
    part-way (parked on the device, not by the host) keeps its prompt's keys and values while the other rows decode
    on, and a prompt copying that beginning gets the logits of the prompt prefilled whole, within bf16's rounding."""
    torch.manual_seed(0)
    model = GPT(CFG).cuda()
    batch = DecodeBatch(InferenceEngine(model), rows=6, capacity=CFG.context_len, group_steps=4)
    prompt, other = tokens(40, 11), tokens(30, 12)
    first = batch.prefill_many([0, 1], [prompt, other]).argmax(-1).tolist()
    batch.start(0, first[0], len(prompt))
    batch.start(1, first[1], len(other))
    batch.decode_greedy(4, ends={1: [0]})  # row 0 ends after the group's second step, inside the graph
    for _ in range(3):
        batch.decode_greedy(4)  # row 1 decodes on: row 0 runs parked
    longer = prompt + tokens(7, 13)
    row, n = batch.match(longer[:-1])
    assert (row, n) == (0, 32)
    batch.copy_prefix(row, 2, n)
    reused = batch.prefill(2, longer[n:], start=n)
    whole = batch.prefill_many([3], [longer])[0]
    torch.testing.assert_close(reused, whole, rtol=0.05, atol=0.05)
    assert int(reused.argmax()) == int(whole.argmax())
    # the rests of three prompts copying that beginning, in one graphed prefill at slot 32 (padded to 4 rows with
    # the last again; its graph captured on the first call, replayed on the second), against each prompt prefilled
    # whole
    rests = [tokens(5, 14), tokens(11, 15), tokens(2, 16)]
    for _ in range(2):
        batch.copy_prefixes([(0, 2), (0, 4), (0, 5)], n)
        got = batch.prefill_many([2, 4, 5], rests, n)
        assert got.shape[0] == 3 and ("prefill", 4, 32, n) in batch.state.prefill_inputs
        for i, rest in enumerate(rests):
            want = batch.prefill_many([3], [prompt[:n] + rest])[0]  # the rows' own logits came back already
            torch.testing.assert_close(got[i], want, rtol=0.05, atol=0.05)
            assert int(got[i].argmax()) == int(want.argmax())
            assert batch.held[(2, 4, 5)[i]] == prompt[:n] + rest


def test_whole_start_steps_meet_fewer_prefill_shapes_in_a_chat_load():
    """scripts/serve_prefill_shapes.py on a small chat load (histories sent back with their answers): beginnings cut
    to 64 tokens start the rests at slots that are multiples of 64, and at fewer distinct slots and shapes than
    whole hash blocks do, over the same number of rests."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "serve_prefill_shapes.py"
    spec = importlib.util.spec_from_file_location("serve_prefill_shapes", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=261, context_len=1024, n_layer=1, n_embd=32, n_head=2, n_kv_head=1))
    blocks, rests16, copied16 = script.shapes(model, conversations=4, turns=4, step=BLOCK, seed=1)
    steps, rests64, copied64 = script.shapes(model, conversations=4, turns=4, step=64, seed=1)
    assert rests16 == rests64 == 12 and 0 < copied64 <= copied16
    assert all(start % 64 == 0 for _, _, start in steps)
    assert len({s[2] for s in steps}) < len({s[2] for s in blocks}) and len(steps) <= len(blocks)


def test_the_load_generator_refuses_requests_longer_than_the_context(model, capsys, monkeypatch):
    """scripts/serve_load.py reads the model's context_length from /v1/models and stops with one line before the
    load when its longest request cannot fit (each would be a 400), naming the options to lower."""
    with pytest.raises(SystemExit) as stop:
        serve_load_run(model, monkeypatch, capsys, [
            "--concurrency", "1", "--requests", "2", "--prompt-tokens", str(CFG.context_len - 3), "--max-tokens", "4"])
    assert f"does not fit tiny's context_length {CFG.context_len}" in str(stop.value.code)
    assert "--prompt-tokens or --max-tokens" in str(stop.value.code)
