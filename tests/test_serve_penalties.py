"""OpenAI's presence_penalty and frequency_penalty in `redline serve`: each token's logit lowered by the presence
penalty once the sequence has generated it and by the frequency penalty for every time it has (OpenAI's definition,
as vLLM applies it: generated tokens only). Greedy tokens against a reference loop over full forwards, among rows
without penalties (which keep their tokens), with groups read late (as on a GPU); through the `openai` client."""

import queue

import pytest
import torch

from redline.inference import SamplingParams
from redline.serve.scheduler import Sequence
from tests.test_serve import EOT, MODEL, live, model, reference, run_all, scheduler_for, tokenizer  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def penalized_greedy(model, prompt: list[int], n: int, presence: float, frequency: float) -> list[int]:
    """The reference: a full forward per token, the penalties applied to the generated tokens' counts by hand."""
    tokens: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([prompt + tokens]))[0, -1].float()
            counts = torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=logits.numel()).float()
            token = int((logits - presence * (counts > 0) - frequency * counts).argmax())
            if token == EOT:
                break
            tokens.append(token)
    return tokens


@pytest.mark.parametrize("lagged", [False, True])
def test_penalized_greedy_tokens_equal_the_reference_among_rows_without(model, tokenizer, lagged):
    sched = scheduler_for(model, tokenizer, rows=3, sync_every=3 if lagged else None)
    sched.lag_reads = lagged
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13]]
    settings = [(0.0, 1.5), (1.0, 0.0), (0.0, 0.0)]
    try:
        sinks = [queue.Queue() for _ in prompts]
        seqs = [Sequence(p, 20, SamplingParams(), (), q.put, penalties=pen)
                for p, q, pen in zip(prompts, sinks, settings)]
        sched.submit(seqs)
        for q in sinks:
            while q.get(timeout=30)[0] == "text":
                pass
        again = run_all(sched, [prompts[2]], [20])[0]  # the row without penalties, after a row that had them
    finally:
        sched.close()
    for seq, p, (presence, frequency) in zip(seqs, prompts, settings):
        assert seq.tokens == penalized_greedy(model, p, 20, presence, frequency)
    assert seqs[2].tokens == again.tokens == reference(model, prompts[2], 20)
    assert seqs[0].tokens != reference(model, prompts[0], 20)  # the penalty changed what it wrote


def test_penalties_through_the_openai_client(live, model, tokenizer):
    prompt = tokenizer.encode("la la la")
    out = live.client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                         frequency_penalty=1.2, presence_penalty=0.3)
    assert out.choices[0].text == tokenizer.decode(penalized_greedy(model, prompt, 12, 0.3, 1.2))
