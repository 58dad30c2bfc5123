"""Checks of the inference engine on a GPU that several test files share."""

from __future__ import annotations

import torch

from redline.inference import InferenceEngine, SamplingParams


def assert_compiled_engine_stays_greedy(model, prompts: list[list[int]], new: int = 24, tol: float = 0.05,
                                        dtype: torch.dtype = torch.bfloat16, prompt_prefix: bool = False) -> None:
    """The compiled, graph-captured engine and the eager one (both in dtype, bf16 by default) each decode `prompts`
    greedily: every token, teacher-forced through the fp32 model, within tol of the best logit at its step. bf16
    near-ties may split the two runs (a row that takes another token at one goes on differently from there); a wrong
    cache gives tokens about the logits' spread below the best (~0.7 for the tests' random models). prompt_prefix:
    each prompt is its row's prefix_len in the teacher-forced forward (a prefix-LM's prefix, a reference window's
    reference), as the engine takes it."""
    runs = [InferenceEngine(model, dtype=dtype, compile=compiled, cuda_graphs=compiled)
            .generate(prompts, new, SamplingParams(temperature=0)) for compiled in (False, True)]
    model.eval()
    for kind, results in zip(("eager", "compiled"), runs):
        for i, (prompt, result) in enumerate(zip(prompts, results)):
            seq = torch.tensor([prompt + result.tokens], device="cuda")
            with torch.no_grad():
                prefix = torch.tensor([len(prompt)], device="cuda") if prompt_prefix else None
                logits = model(seq, prefix_len=prefix)[0, len(prompt) - 1:-1].float()  # (new, vocab): step i, token i
            chosen = logits.gather(1, torch.tensor(result.tokens, device="cuda")[:, None])[:, 0]
            gaps = logits.max(dim=-1).values - chosen
            assert gaps.max() < tol, f"{kind} run, prompt {i}, tokens {result.tokens}: {gaps}"


def full_recompute(model, prompt: list[int], n: int) -> list[int]:
    """The model's own greedy continuation of `prompt`, n tokens, each step recomputing the whole sequence."""
    return model.generate(torch.tensor([prompt]), n, temperature=0)[0, len(prompt):].tolist()


def assert_decode_batch_parks_rows(engine: InferenceEngine, model, steps: int = 4):
    """A server's batch of two rows (inference.batch.DecodeBatch): row 0 decodes while row 1's prompt goes in over
    two spans, the decoding steps between them leaving the parked row as it is; then both decode `steps` tokens.
    Each row's tokens are the full recompute's. Returns the batch, row 0 still holding its sequence."""
    from redline.inference.batch import DecodeBatch

    batch = DecodeBatch(engine, rows=2, capacity=48)
    a, b = list(range(3, 14)), [7, 1, 8, 2, 8, 1, 8, 2, 9]
    first = int(batch.prefill(0, a).argmax())
    batch.start(0, first, len(a))
    got_a = [first] + [int(batch.step()[0]) for _ in range(3)]
    batch.prefill(1, b[:4])
    got_a += [int(batch.step()[0]) for _ in range(2)]  # row 1 is parked between its spans
    second = int(batch.prefill(1, b[4:], start=4).argmax())
    batch.start(1, second, len(b))
    got_b = [second]
    for _ in range(steps):
        nxt = batch.step()
        got_a.append(int(nxt[0]))
        got_b.append(int(nxt[1]))
    assert got_a == full_recompute(model, a, len(got_a)) and got_b == full_recompute(model, b, len(got_b))
    return batch


def assert_freed_row_refills(batch, model) -> None:
    """Row 0 of `batch` freed and refilled with a new prompt: its tokens are the full recompute's."""
    batch.free(0)
    c = [11, 12, 13]
    third = int(batch.prefill(0, c).argmax())
    batch.start(0, third, len(c))
    assert [third] + [int(batch.step()[0]) for _ in range(3)] == full_recompute(model, c, 4)


def assert_scores_equal_full_forward(model, vocab_size: int) -> None:
    """The engine's teacher-forced log-probabilities (fp64, 7 tokens prefilled, the rest scored) equal the full
    forward's log-softmax at the same positions."""
    tokens = torch.randint(0, vocab_size, (3, 30), generator=torch.Generator().manual_seed(1))
    logps, _ = InferenceEngine(model, dtype=torch.float64).score(tokens, prefill=7)
    with torch.no_grad():
        full = torch.log_softmax(model.double()(tokens), dim=-1)
    expected = full[:, 6:-1].gather(2, tokens[:, 7:, None])[..., 0]
    torch.testing.assert_close(logps, expected.float(), rtol=0, atol=1e-6)


def assert_decode_batch_serves_like_generate(model, prompts: list[list[int]], n: int = 10) -> None:
    """The server's DecodeBatch (fp64, four rows) greedy-equal to the model's own generate for four prompts: prompt
    0 prefilled whole, prompt 3 in spans of 5, prompts 2 and 1 together with prefill_many two steps later, rows freed
    as they finish while the others decode."""
    from redline.inference.batch import DecodeBatch

    model = model.double()
    refs = [full_recompute(model, p, n) for p in prompts]
    batch = DecodeBatch(InferenceEngine(model, dtype=torch.float64), rows=4, capacity=64)
    got, done = {}, {}

    def started(rows, prompts_at, logits):
        for row, i, t in zip(rows, prompts_at, logits.argmax(-1).tolist()):
            batch.start(row, t, len(prompts[i]))
            got[row] = (i, [t])

    started([0], [0], batch.prefill(0, prompts[0])[None])
    for s in range(0, len(prompts[3]), 5):
        logits = batch.prefill(3, prompts[3][s:s + 5], start=s)
    started([3], [3], logits[None])
    for step in range(40):
        if step == 2:
            started([2, 1], [2, 1], batch.prefill_many([2, 1], [prompts[2], prompts[1]]))
        out = batch.step()
        for row, (i, tokens) in list(got.items()):
            tokens.append(int(out[row]))
            if len(tokens) == n:
                batch.free(row)
                done[i] = tokens
                del got[row]
        if not got:
            break
    assert [done[i] for i in range(len(prompts))] == refs


def assert_compiled_training_step_matches(model, weight: torch.Tensor, length: int = 96) -> None:
    """On a GPU, under bf16 autocast: the compiled training forward's loss within 1e-2 of eager's on a random (4,
    length) batch, and `weight`'s gradient about as close to the fp32 eager gradient as eager bf16's is.

    Eager and compiled bf16 round differently, and on models with many paths into one weight (clamps, differential
    heads, experts) the two bf16 gradients differ from each other by 5-20%; both are measured against fp32 eager
    instead, which a wrong compiled computation misses by ~100%. The compiled step is fp32-free (Triton 3.6 fails to
    build some fp32 fused norm kernels) and compiled with static shapes, as `redline train` compiles, after a
    dynamo reset, so that an earlier test's compiles in the same process do not make its shapes dynamic."""
    model.train()
    idx = torch.randint(0, model.cfg.vocab_size, (4, length), device="cuda")
    exact = torch.autograd.grad(model(idx, idx), weight)[0]
    assert exact.norm() > 0, "the loss does not reach this weight: check one it reaches"
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx, idx)
    grad = torch.autograd.grad(loss, weight)[0]
    torch._dynamo.reset()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss_c = torch.compile(model, dynamic=False)(idx, idx)
    grad_c = torch.autograd.grad(loss_c, weight)[0]
    torch.testing.assert_close(loss_c, loss, rtol=1e-2, atol=1e-2)
    eager_error, compiled_error = ((g - exact).norm() / exact.norm() for g in (grad, grad_c))
    assert compiled_error < 2 * eager_error + 0.02, (f"compiled bf16 gradient {compiled_error:.4f} from fp32 eager's, "
                                                     f"eager bf16 {eager_error:.4f}")


def assert_scheduler_copies_no_beginning(model, new: int) -> int:
    """The server's scheduler, asked to reuse 16-token prompt beginnings and to prefill 4 tokens a turn, on a model
    whose prompts change what their slots hold (a prefix-LM, a reference window): it copies no beginning, and each of
    three requests sharing a beginning gets the engine's `new` greedy tokens alone. model: a 261-token vocabulary
    (bytes and the stop id 256). -> the tokens the scheduler prefills a turn."""
    import queue

    from redline.inference.batch import DecodeBatch
    from redline.serve.scheduler import Scheduler, Sequence
    from redline.tokenizer import load_tokenizer

    sched = Scheduler(DecodeBatch(InferenceEngine(model, compile=False), rows=2, capacity=64),
                      load_tokenizer("bytes"), [256], prefill_tokens=4, prefix_min_tokens=16)
    assert sched.prefix_min_tokens == 0
    shared = [(7 * j) % 250 + 1 for j in range(20)]
    prompts = [shared + [3, 4, 5], shared + [9], shared[:11]]
    sinks = [queue.Queue() for _ in prompts]
    seqs = [Sequence(p, new, SamplingParams(temperature=0), (), q.put) for p, q in zip(prompts, sinks)]
    try:
        sched.submit(seqs)
        for q in sinks:
            while q.get(timeout=30)[0] == "text":
                pass
    finally:
        sched.close()
    alone = [InferenceEngine(model, compile=False).generate([p], new, SamplingParams(temperature=0))[0].tokens
             for p in prompts]
    assert [s.tokens for s in seqs] == alone and sched.stats.cached_tokens == 0
    return sched.prefill_tokens
