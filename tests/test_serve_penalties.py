"""OpenAI's presence_penalty, frequency_penalty and logit_bias in `redline serve`: each token's logit lowered by the
presence penalty once the sequence has generated it and by the frequency penalty for every time it has (OpenAI's
definition, as vLLM applies it: generated tokens only), and raised or lowered by its bias before every token, the
first included. Greedy tokens against a reference loop over full forwards, among rows without any (which keep their
tokens), with groups read late (as on a GPU); through the `openai` client."""

import queue

import pytest
import torch

from redline.inference import SamplingParams
from redline.serve.scheduler import Sequence
from tests.test_serve import EOT, MODEL, live, model, reference, run_all, scheduler_for, tokenizer  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def penalized_greedy(model, prompt: list[int], n: int, presence: float, frequency: float,
                     bias: dict[int, float] | None = None) -> list[int]:
    """The reference: a full forward per token, the bias and the penalties (on the generated tokens' counts) applied
    by hand."""
    tokens: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([prompt + tokens]))[0, -1].float()
            for token, b in (bias or {}).items():
                logits[token] += b
            counts = torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=logits.numel()).float()
            token = int((logits - presence * (counts > 0) - frequency * counts).argmax())
            if token == EOT:
                break
            tokens.append(token)
    return tokens


@pytest.mark.parametrize("lagged", [False, True])
def test_penalized_greedy_tokens_equal_the_reference_among_rows_without(model, tokenizer, lagged):
    sched = scheduler_for(model, tokenizer, rows=4, sync_every=3 if lagged else None)
    sched.lag_reads = lagged
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13], [14, 15, 16]]
    settings = [(0.0, 1.5), (1.0, 0.0), (0.0, 0.0), (0.0, 0.0)]
    plain = reference(model, prompts[3], 20)
    bias = {plain[0]: -100.0, plain[3]: -100.0, 65: 4.0}  # the first token banned, another and 'A' favoured
    try:
        sinks = [queue.Queue() for _ in prompts]
        seqs = [Sequence(p, 20, SamplingParams(), (), q.put, penalties=pen)
                for p, q, pen in zip(prompts, sinks, settings)]
        seqs[3].logit_bias = tuple(bias.items())
        sched.submit(seqs)
        for q in sinks:
            while q.get(timeout=30)[0] == "text":
                pass
        again = run_all(sched, [prompts[2]], [20])[0]  # the row without penalties, after a row that had them
    finally:
        sched.close()
    for seq, p, (presence, frequency) in zip(seqs[:3], prompts, settings):
        assert seq.tokens == penalized_greedy(model, p, 20, presence, frequency)
    assert seqs[3].tokens == penalized_greedy(model, prompts[3], 20, 0, 0, bias) and seqs[3].tokens[0] != plain[0]
    assert seqs[2].tokens == again.tokens == reference(model, prompts[2], 20)
    assert seqs[0].tokens != reference(model, prompts[0], 20)  # the penalty changed what it wrote


def test_penalties_through_the_openai_client(live, model, tokenizer):
    prompt = tokenizer.encode("la la la")
    out = live.client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                         frequency_penalty=1.2, presence_penalty=0.3)
    assert out.choices[0].text == tokenizer.decode(penalized_greedy(model, prompt, 12, 0.3, 1.2))
    out = live.client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                         logit_bias={"97": 100})  # 'a' forced
    assert out.choices[0].text == "a" * 6


@pytest.mark.parametrize("args", [{"logit_bias": {"x": 1}}, {"logit_bias": {"99999": 1}}, {"logit_bias": {"5": 101}},
                                  {"logit_bias": [1]}, {"presence_penalty": -2.5}])
def test_bad_biases_and_penalties_are_openai_errors(live, args):
    from tests.test_serve import error_of

    status, body = error_of(lambda: live.client.completions.create(model=MODEL, prompt="hi", max_tokens=2, **args))
    assert status == 400 and body["param"] == next(iter(args))
