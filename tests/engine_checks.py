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
