"""redline evaluate (redline/tasks/scoring.py, redline/commands/evaluate.py): batched choice log-likelihoods equal
each row scored alone, acc / acc_norm / chance / centered, generative exact match through the engine, the table and
JSON line, evaluations.jsonl read by `redline report`, and bad input as one-line errors."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from redline.chat.render import renderer_for
from redline.model import GPT, ModelConfig
from redline.tasks import load_task
from redline.tasks.scoring import centered, choice_loglikelihoods, sampled_pass_rates, score_multiple_choice
from redline.tokenizer import ByteTokenizer
from tests.test_pairs import ScriptedGenerator
from tests.test_sft import _cli, _pretrain
from tests.test_train import dataset  # noqa: F401  (a pytest fixture)


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=261, context_len=128, n_layer=1, n_embd=32, n_head=2)).eval()


def test_batched_loglikelihoods_equal_rows_alone():
    model = _model()
    g = torch.Generator().manual_seed(0)
    rows = [(torch.randint(0, 257, (n,), generator=g).tolist(), torch.randint(0, 257, (m,), generator=g).tolist())
            for n, m in ((5, 3), (20, 1), (9, 7), (1, 2))]
    batched = choice_loglikelihoods(model, rows, batch_size=3)
    for (context, cont), got in zip(rows, batched):
        ids = torch.tensor([context + cont])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids[:, :-1]).float(), -1)[0]
        want = sum(logp[len(context) - 1 + i, t].item() for i, t in enumerate(cont))
        assert got == pytest.approx(want, abs=1e-4)


def test_prompts_cut_to_fit_are_counted_aloud(capsys):
    model = _model()
    rows = [([1] * 200, [2, 3]), ([1] * 10, [2])]  # the first is longer than the 128-token context
    choice_loglikelihoods(model, rows, batch_size=2)
    assert "1 of 2 choices' prompts were longer than the model's room for them (128 tokens)" in capsys.readouterr().err
    choice_loglikelihoods(model, rows[1:], batch_size=2)
    assert "cut" not in capsys.readouterr().err


@pytest.mark.parametrize("chat", [False, True])
def test_multiple_choice_scores_follow_the_loglikelihoods(chat):
    tok = ByteTokenizer()
    tok.add_chat_tokens()
    renderer = renderer_for(tok) if chat else None
    task = load_task("sort_mc", train_size=10, test_size=12)
    examples = task.examples("test")
    model = _model()
    result = score_multiple_choice(model, tok, renderer, task, examples, batch_size=5)
    # the same choice, scored one row at a time
    acc = acc_norm = 0
    for e in examples:
        context = renderer.prompt([{"role": "user", "content": e.prompt}]) if chat else [tok.eot_id] + tok.encode(
            e.prompt)
        conts = [tok.encode(c) + [renderer.stop_ids[0]] if chat else tok.encode(" " + c) for c in e.choices]
        sums = choice_loglikelihoods(model, [(context, c) for c in conts], batch_size=1)
        acc += max(range(4), key=sums.__getitem__) == e.gold
        acc_norm += max(range(4), key=lambda i: sums[i] / len(e.choices[i])) == e.gold
    assert result.extra["acc"] == acc / len(examples) and result.score == acc_norm / len(examples)
    assert result.chance == 0.25 and result.centered == pytest.approx(centered(result.score, 0.25))
    assert centered(0.25, 0.25) == 0 and centered(1.0, 0.25) == 1


def test_sampled_pass_rates_are_the_unbiased_estimates_over_whole_groups():
    task = load_task("arithmetic")
    ex = task.examples("test")[:3]
    wrong = [str(int(e.answer) + 1) for e in ex]
    generator = ScriptedGenerator({ex[0].prompt: [ex[0].answer, wrong[0], wrong[0], wrong[0]],  # 1 of 4 right
                                   ex[1].prompt: [wrong[1]] * 4,  # none
                                   ex[2].prompt: [ex[2].answer] * 3 + [wrong[2]]})  # 3 of 4
    rates = sampled_pass_rates(generator, SimpleNamespace(stop_ids=[7]), task, ex, batch_size=9, max_new_tokens=4,
                               n=4, temperature=0.7, seed=1)
    assert rates["pass@1"] == pytest.approx((1 / 4 + 0 + 3 / 4) / 3) and rates["pass@4"] == pytest.approx(2 / 3)
    # 9 rows a batch hold two whole groups of 4; each batch its own seed, at the temperature asked
    assert generator.calls == [(8, 0.7, 1_000_003), (4, 0.7, 1_000_004)]


@pytest.mark.slow
def test_evaluate_cli_table_json_and_report(dataset, tmp_path, capsys):  # noqa: F811
    pre = _pretrain(dataset, tmp_path)
    mc = tmp_path / "mc.jsonl"
    mc.write_text("".join(json.dumps({"question": f"{i}+1?", "choices": [str(i + 1), str(i + 7)], "answer": 0}) + "\n"
                          for i in range(6)))
    capsys.readouterr()
    assert _cli(["evaluate", str(pre), "--tasks", f"arithmetic,{mc}", "--limit", "4", "--max-new-tokens", "3",
                 "--samples", "3"]) == 0
    out, err = capsys.readouterr()
    record = json.loads(out.strip().splitlines()[-1])
    assert record["chat"] == "plain" and set(record["tasks"]) == {"arithmetic", "mc"}
    sampled = record["tasks"]["arithmetic"]  # greedy exact match, and pass@1 <= pass@3 from 3 samples a prompt
    assert sampled["sampling"] == {"n": 3, "temperature": 1.0} and 0 <= sampled["pass@1"] <= sampled["pass@3"] <= 1
    assert "pass@" not in json.dumps(record["tasks"]["mc"])  # multiple choice is scored by likelihood only
    assert record["tasks"]["mc"]["chance"] == 0.5 and record["tasks"]["arithmetic"]["n"] == 4
    assert "acc_norm" in err and "exact_match" in err  # the table
    lines = (pre / "evaluations.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["tasks"] == record["tasks"]
    from redline.experiments.report import build_report, task_score_lines

    report = build_report(pre)
    assert report["runs"][0]["task_scores"]["mc"]["score"] == record["tasks"]["mc"]["score"]
    assert any("| pre |" in line for line in task_score_lines(report["runs"]))


def test_evaluate_bad_input(dataset, tmp_path, capsys):  # noqa: F811
    pre = _pretrain(dataset, tmp_path)
    for args, match in [(["--tasks", "nope"], "unknown task 'nope'"),
                        (["--tasks", "arithmetic", "--chat", "on"], "no chat template and no chat tokens"),
                        (["--tasks", str(tmp_path / "x.jsonl")], "not found"),
                        (["--tasks", "arithmetic", "--samples", "2", "--temperature", "0"], "--temperature > 0")]:
        capsys.readouterr()
        assert _cli(["evaluate", str(pre), *args]) != 0
        err = capsys.readouterr().err
        assert match in err and len(err.strip().splitlines()) == 1, err
    assert not (pre / "evaluations.jsonl").exists()
