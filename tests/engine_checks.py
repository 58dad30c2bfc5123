"""Checks of the inference engine on a GPU that several test files share."""

from __future__ import annotations

import torch

from redline.inference import InferenceEngine, SamplingParams


def assert_compiled_engine_stays_greedy(model, prompts: list[list[int]], new: int = 24, tol: float = 0.05,
                                        dtype: torch.dtype = torch.bfloat16) -> None:
    """The compiled, graph-captured engine and the eager one (both in dtype, bf16 by default) each decode `prompts`
    greedily: every token, teacher-forced through the fp32 model, within tol of the best logit at its step. bf16
    near-ties may split the two runs (a row that takes another token at one goes on differently from there); a wrong
    cache gives tokens about the logits' spread below the best (~0.7 for the tests' random models)."""
    runs = [InferenceEngine(model, dtype=dtype, compile=compiled, cuda_graphs=compiled)
            .generate(prompts, new, SamplingParams(temperature=0)) for compiled in (False, True)]
    model.eval()
    for results in runs:
        for prompt, result in zip(prompts, results):
            seq = torch.tensor([prompt + result.tokens], device="cuda")
            with torch.no_grad():
                logits = model(seq)[0, len(prompt) - 1:-1].float()  # (new, vocab): step i predicts token i
            chosen = logits.gather(1, torch.tensor(result.tokens, device="cuda")[:, None])[:, 0]
            gaps = logits.max(dim=-1).values - chosen
            assert gaps.max() < tol, gaps


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
