"""DPO (redline/posttrain/dpo.py): the three losses against their formulas written out here independently (trl is
not a dependency: the formulas are those of trl's `DPOTrainer.dpo_loss`), log-probabilities against a plain
log-softmax of the logits, the reference computed once and carried by the objective's state, one training step
through TrainStep, seeded batches that resume where they were, held-out evaluation, and bad pairs."""

from __future__ import annotations

import math

import pytest
import torch

from redline.chat.render import RedlineTemplate
from redline.config import TrainConfig, parse
from redline.errors import UserError
from redline.model import GPT, ModelConfig
from redline.posttrain.data import pairs_from_records
from redline.posttrain.dpo import DPO, Pair, PairBatches, collate, dpo_loss, evaluate_pairs, reference_logps
from redline.tokenizer import ByteTokenizer
from redline.training.step import TrainStep

CPU = torch.device("cpu")


def tiny_model(seed: int = 0, vocab: int = 256) -> GPT:
    # a vocabulary that is a multiple of 128 has no padding rows, whose logits the training loss also normalises over
    torch.manual_seed(seed)
    return GPT(ModelConfig(n_layer=2, n_embd=32, n_head=4, n_kv_head=2, vocab_size=vocab, context_len=64))


def random_pairs(n: int, seed: int = 0, vocab: int = 256) -> list[Pair]:
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        prompt = torch.randint(0, vocab, (int(torch.randint(2, 6, (), generator=g)),), generator=g).tolist()
        sides = []
        for _ in range(2):
            reply = torch.randint(0, vocab, (int(torch.randint(1, 8, (), generator=g)),), generator=g).tolist()
            ids = prompt + reply
            sides.append((ids[:-1], [-1] * (len(prompt) - 1) + reply))
        pairs.append(Pair(sides[0], sides[1]))
    return pairs


def explicit_logp(model: GPT, inputs: list[int], targets: list[int]) -> float:
    """Sum of log p(target) over the counted positions, from the logits' log-softmax, in float64."""
    with torch.no_grad():
        logits = model(torch.tensor([inputs]))[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return sum(float(logp[t, y]) for t, y in enumerate(targets) if y != -1)


def explicit_loss(pc, pr, rc, rr, beta, kind):
    h = (pc - pr) - (rc - rr)
    if kind == "sigmoid":
        return math.log1p(math.exp(-beta * h))  # -log σ(βh)
    if kind == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    if kind == "apo_zero":  # trl's DPOTrainer: 1 - σ(β chosen log-ratio) + σ(β rejected log-ratio)
        return 1 - 1 / (1 + math.exp(-beta * (pc - rc))) + 1 / (1 + math.exp(-beta * (pr - rr)))
    return max(0.0, 1 - beta * h)


@pytest.mark.parametrize("kind", ["sigmoid", "ipo", "hinge", "apo_zero"])
def test_losses_match_the_formulas(kind):
    g = torch.Generator().manual_seed(1)
    pc, pr, rc, rr = (torch.randn(6, generator=g, dtype=torch.float64) * 3 for _ in range(4))
    losses, chosen, rejected = dpo_loss(pc, pr, rc, rr, beta=0.3, loss_type=kind)
    for i in range(6):
        want = explicit_loss(float(pc[i]), float(pr[i]), float(rc[i]), float(rr[i]), 0.3, kind)
        assert float(losses[i]) == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert float(chosen[i]) == pytest.approx(0.3 * float(pc[i] - rc[i]))
        assert float(rejected[i]) == pytest.approx(0.3 * float(pr[i] - rr[i]))


@pytest.mark.parametrize("kind", ["sigmoid", "ipo", "hinge", "apo_zero"])
def test_objective_on_a_tiny_model_matches_an_explicit_computation(kind):
    pairs = random_pairs(5)
    reference_model, policy = tiny_model(0), tiny_model(1)
    reference = reference_logps(reference_model, pairs, batch_size=2, device=CPU)
    for i, pair in enumerate(pairs):  # the stored reference is the frozen model's summed reply log-probabilities
        assert float(reference[i, 0]) == pytest.approx(explicit_logp(reference_model, *pair.chosen), abs=1e-4)
        assert float(reference[i, 1]) == pytest.approx(explicit_logp(reference_model, *pair.rejected), abs=1e-4)
    objective = DPO(beta=0.2, loss_type=kind, reference=reference)
    indices = [3, 0, 4]
    loss, metrics = objective.compute(policy, collate(pairs, indices, CPU))
    want, margins, wins = [], [], []
    for i in indices:
        pc, pr = explicit_logp(policy, *pairs[i].chosen), explicit_logp(policy, *pairs[i].rejected)
        rc, rr = float(reference[i, 0]), float(reference[i, 1])
        if kind == "ipo":
            nc = sum(t != -1 for t in pairs[i].chosen[1])
            nr = sum(t != -1 for t in pairs[i].rejected[1])
            pc, pr, rc, rr = pc / nc, pr / nr, rc / nc, rr / nr
        want.append(explicit_loss(pc, pr, rc, rr, 0.2, kind))
        margins.append(0.2 * ((pc - rc) - (pr - rr)))
        wins.append(float(pc - rc > pr - rr))
    assert float(loss.detach()) == pytest.approx(sum(want) / 3, rel=1e-4)
    assert float(metrics["reward_margin"]) == pytest.approx(sum(margins) / 3, rel=1e-4, abs=1e-6)
    assert float(metrics["preference_accuracy"]) == pytest.approx(sum(wins) / 3)


def test_nll_weight_adds_the_chosen_replies_nll_per_token():
    """RPO (trl's rpo_alpha): loss = DPO + α · (-Σ log π(chosen tokens) / number of chosen tokens)."""
    pairs = random_pairs(4)
    policy = tiny_model(1)
    reference = reference_logps(tiny_model(0), pairs, batch_size=2, device=CPU)
    batch = collate(pairs, [2, 1, 0], CPU)
    plain, _ = DPO(beta=0.2, reference=reference).compute(policy, batch)
    loss, metrics = DPO(beta=0.2, reference=reference, nll_weight=0.5).compute(policy, batch)
    logp = sum(explicit_logp(policy, *pairs[i].chosen) for i in (2, 1, 0))
    tokens = sum(sum(t != -1 for t in pairs[i].chosen[1]) for i in (2, 1, 0))
    assert float(metrics["chosen_nll"]) == pytest.approx(-logp / tokens, rel=1e-4)
    assert float(loss.detach()) == pytest.approx(float(plain.detach()) - 0.5 * logp / tokens, rel=1e-4)


def test_at_the_start_the_policy_is_the_reference():
    pairs = random_pairs(4)
    model = tiny_model(0)
    objective = DPO(beta=0.1, reference=reference_logps(model, pairs, 4, CPU))
    loss, metrics = objective.compute(model, collate(pairs, [0, 1, 2, 3], CPU))
    assert float(loss.detach()) == pytest.approx(math.log(2), abs=1e-5)  # -log σ(0)
    assert float(metrics["reward_margin"]) == pytest.approx(0.0, abs=1e-5)


def step_config(*extra: str) -> TrainConfig:
    return parse(TrainConfig, ["--preset", "tiny", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
                               "model.n_kv_head=2", "model.vocab_size=256", "model.context_len=64", "seq_len=64", "batch_size=2",
                               "compile=False", "optim.lr=3e-3", "optim.warmup_steps=0", *extra],
                 prog="t", description="t")


def test_steps_through_trainstep_raise_the_margin_and_the_state_carries_the_reference():
    pairs = random_pairs(4)
    model = tiny_model(0)
    reference = reference_logps(model, pairs, 4, CPU)
    step = TrainStep(step_config(), CPU, model=model, objective=DPO(beta=0.5, reference=reference))
    batches = PairBatches(pairs, 2, CPU, seed=3)
    losses = [float(step.step((batches.next_batch() for _ in range(1)), 1.0).loss) for _ in range(30)]
    assert losses[-1] < losses[0] - 0.1
    held = evaluate_pairs(step.model, step.objective, pairs, reference, 4, CPU)
    assert held["reward_margin"] > 0 and held["preference_accuracy"] >= 0.75
    resumed = DPO()
    resumed.load_state_dict(step.state_dict()["objective"])
    assert torch.equal(resumed.reference, reference)


def test_batches_resume_where_they_were():
    batches = PairBatches(random_pairs(5), 2, CPU, seed=7)
    for _ in range(4):  # into the second epoch
        batches.next_indices()
    state = batches.state_dict()
    want = [batches.next_indices() for _ in range(4)]
    again = PairBatches(random_pairs(5), 2, CPU, seed=0)
    again.load_state_dict(state)
    assert [again.next_indices() for _ in range(4)] == want
    seen = PairBatches(random_pairs(5), 5, CPU, seed=1).next_indices()
    assert sorted(seen) == [0, 1, 2, 3, 4]  # an epoch is every pair once


def chat_tokenizer() -> ByteTokenizer:
    tokenizer = ByteTokenizer()
    tokenizer.add_chat_tokens()
    return tokenizer


def test_pairs_from_records_render_the_reply_only():
    renderer = RedlineTemplate(chat_tokenizer())
    records = [{"prompt": "2+2?", "chosen": "4", "rejected": "5"},
               {"messages": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "hey"}],
                "rejected": "go away"}]
    found = pairs_from_records(records, renderer, max_len=64)
    assert found.dropped == 0 and len(found.pairs) == 2
    inputs, targets = found.pairs[0].chosen
    assert [t for t in targets if t != -1] == [ord("4"), renderer.end_id]  # the reply and the end of its turn


def test_bad_pairs_are_one_line_errors_or_counted():
    renderer = RedlineTemplate(chat_tokenizer())
    with pytest.raises(UserError, match=r"record 2: \"chosen\" and \"rejected\" are identical"):
        pairs_from_records([{"prompt": "a", "chosen": "x", "rejected": "y"},
                            {"prompt": "b", "chosen": "same", "rejected": "same"}], renderer, 64)
    long = {"prompt": "a" * 100, "chosen": "x", "rejected": "y"}
    found = pairs_from_records([long, {"prompt": "a", "chosen": "x", "rejected": "y"}], renderer, 64)
    assert found.dropped == 1 and len(found.pairs) == 1
    with pytest.raises(UserError, match=r"every pair of data \(1\) is longer than the context of 64 tokens"):
        pairs_from_records([long], renderer, 64)
    with pytest.raises(UserError, match="no \"prompt\" text and no \"messages\""):
        pairs_from_records([{"chosen": "x", "rejected": "y"}], renderer, 64)


def test_a_task_file_given_as_pairs_says_how_to_give_it(tmp_path):
    from redline.posttrain.data import read_preference_records

    path = tmp_path / "task.jsonl"
    path.write_text('{"prompt": "2+2?", "answer": "4"}\n{"prompt": "3+3?", "answer": "6"}\n')
    with pytest.raises(UserError, match=f"give it as --data task:{path}"):
        read_preference_records(str(path), 0, 0.1)
    # 24 pairs at the default 2% keep one held out (as SFT rounds up), not none
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(f'{{"prompt": "p{i}", "chosen": "a", "rejected": "b"}}\n' for i in range(24)))
    train, held = read_preference_records(str(pairs), 0, 0.02)
    assert (len(train), len(held)) == (23, 1)


def test_an_unsplit_task_file_says_its_held_out_scores_are_training_scores(tmp_path, capsys):
    from redline.tasks import load_task

    path = tmp_path / "task.jsonl"
    path.write_text('{"prompt": "2+2?", "answer": "4"}\n{"prompt": "3+3?", "answer": "6"}\n')
    task = load_task(str(path))
    assert len(task.examples("test")) == 2 and "note:" not in capsys.readouterr().err  # evaluating it: fine
    assert len(task.examples("train")) == 2
    assert "held-out scores are training scores" in capsys.readouterr().err


def test_held_out_pairs_all_too_long_leave_training_without_them(tmp_path, capsys):
    import json

    from redline.posttrain.data import PairData, read_preference_records

    path = tmp_path / "pairs.jsonl"
    records = [{"prompt": f"p{i}", "chosen": "a", "rejected": "b"} for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    _, held = read_preference_records(str(path), 0, 0.1)
    records[records.index(held[0])]["prompt"] = "x" * 200  # the one held-out pair, longer than the context
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    data = PairData.load(str(path), None, RedlineTemplate(chat_tokenizer()), 64, objective=None, eval_fraction=0.1)
    assert len(data.train.pairs) == 9 and data.heldout is None
    assert "training goes on without held-out pairs" in capsys.readouterr().err
