"""Offline tasks (redline/tasks): seeded generators with fixed, disjoint train/test splits; SFT conversations,
preference pairs whose rejected answer is wrong, rewards by extraction + exact match; JSONL task files of both
kinds; one-line errors for unknown tasks and malformed files."""

from __future__ import annotations

import json
import re

import pytest

from redline.chat.render import check_messages
from redline.errors import UserError
from redline.tasks import load_task, task_names
from redline.tasks.synthetic import _column as column

ALL = task_names()


@pytest.mark.parametrize("name", ALL)
def test_generators_are_seeded_with_disjoint_splits_and_verifiable(name):
    task = load_task(f"task:{name}", seed=3, train_size=300, test_size=50)
    again = load_task(name, seed=3, train_size=300, test_size=50)
    train, test = task.examples("train"), task.examples("test")
    assert len(train) == 300 and len(test) == 50
    assert train == again.examples("train") and test == again.examples("test")
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert load_task(name, seed=4, train_size=300, test_size=50).examples("test") != test
    for example in test:
        assert task.reward(example, example.answer) == 1.0
        assert task.reward(example, f"{example.answer}\n\nmore text 12345") == 1.0
        assert task.reward(example, "") == 0.0
    pairs = task.preference_pairs("train")
    assert len(pairs) == 300 and pairs == task.preference_pairs("train")
    for pair, example in zip(pairs, train):
        assert pair["chosen"] == example.reply and pair["messages"] == task.messages(example)
        assert task.reward(example, pair["rejected"]) == 0.0, (example, pair)
        assert task.reward(example, example.reply) == 1.0  # a worked solution is graded by the answer it ends in
    for conversation in task.conversations("train")[:20]:
        check_messages(conversation)


def test_answers_are_right():
    ar = load_task("arithmetic", train_size=50, test_size=10)
    for e in ar.examples("train"):
        if "gets" in e.prompt:
            nums = [int(t) for t in e.prompt.replace("?", " ").split() if t.isdigit()]
            assert int(e.answer) == sum(nums)
    assert ar.reward(ar.examples("test")[0], f"The answer is {ar.examples('test')[0].answer}.") == 1.0
    multistep = load_task("arithmetic_multistep", train_size=200, test_size=20)
    for e in multistep.examples("train") + multistep.examples("test"):
        a, b, c = map(int, re.findall(r"\d+", e.prompt))
        assert int(e.answer) == (a + b - c if "gives away" in e.prompt else a * b + c) >= 0, e
    assert load_task("letter_count").reward(
        type(ar.examples("test")[0])('How many "r" in "strawberry"?', "3"), "3 times") == 1.0
    sort = load_task("sort", train_size=20, test_size=5)
    e = sort.examples("test")[0]
    assert sort.reward(e, e.answer.replace(", ", " ")) == 1.0  # spaces or commas
    assert sort.reward(e, ", ".join(reversed(e.answer.split(", ")))) == (1.0 if len(set(e.answer.split(", "))) == 1
                                                                          else 0.0)


@pytest.mark.parametrize("name", ["arithmetic", "spelling"])
def test_a_larger_test_split_keeps_the_training_split_and_the_first_test_prompts(name):
    """Test prompts past the first 200 are drawn after the training split: 1,000 of them (the default) leave the
    training split and the first 200 test prompts (every score measured before) as they were."""
    small, large = load_task(name, test_size=200), load_task(name)
    assert len(large.examples("test")) == 1000 and large.examples("train") == small.examples("train")
    assert large.examples("test")[:200] == small.examples("test")
    assert not {e.prompt for e in large.examples("test")} & {e.prompt for e in large.examples("train")}


def test_multistep_problems_come_with_worked_solutions():
    """SFT trains on the steps, DPO prefers them to the same steps with a slip, and both are graded by the last
    number; the default training split is 50,000 problems, the test split the one the task had before."""
    task = load_task("arithmetic_multistep", train_size=300, test_size=50)
    for e in task.examples("test"):
        (x, op1, y, r1), (r1_again, op2, z, r2) = e.meta["steps"]
        assert e.solution == f"{x} {op1} {y} = {r1}, {r1} {op2} {z} = {r2}." and r1 == r1_again
        assert r1 == (x + y if op1 == "+" else x * y) and str(r2) == e.answer
    conversation = task.conversations("test")[0]
    assert conversation[-1] == {"role": "assistant", "content": task.examples("test")[0].solution}
    for pair, e in zip(task.preference_pairs("test"), task.examples("test")):
        assert pair["chosen"] == e.solution and re.fullmatch(r"\d+ [*+] \d+ = \d+, \d+ [-+] \d+ = -?\d+\.",
                                                              pair["rejected"])
    first = task.examples("test")[0]
    assert (first.prompt, first.answer) == ("Ava has 10 books, gets 14 more and then gives away 21. How many "
                                            "books are left?", "3")
    mc = load_task("arithmetic_multistep_mc", train_size=50, test_size=20)
    for e in mc.examples("test"):
        assert e.choices[e.gold] == e.answer and e.answer.endswith(".") and len(set(e.choices)) == 4
    assert load_task("arithmetic_multistep").train_size == 50_000 and load_task("arithmetic").train_size == 5000


def test_worked_arithmetic_asks_arithmetics_problems_with_column_sums():
    """arithmetic_worked has arithmetic's splits and answers; its replies work a sum or difference column by
    column and end in the answer; its rejected replies carry a slip into a wrong answer."""
    plain, worked = load_task("arithmetic", train_size=200, test_size=50), load_task("arithmetic_worked",
                                                                                    train_size=200, test_size=50)
    for split in ("train", "test"):
        assert [(e.prompt, e.answer) for e in worked.examples(split)] == [(e.prompt, e.answer)
                                                                          for e in plain.examples(split)]
        assert all(e.reply == e.answer for e in plain.examples(split))  # arithmetic's own replies stay bare
    step = re.compile(r"(\d+) ([-+]) (\d+): (\d+) [-+] (\d) = (\d+)(, carry 1|, borrow 1)?; (\d) [-+] (\d)"
                      r"(?: [-+] 1)? = (\d+)\. (\d+)|(\d) \* (\d) = (\d+)\.")
    for e, pair in zip(worked.examples("train"), worked.preference_pairs("train")):
        m = step.fullmatch(e.solution)
        assert m, e.solution
        if m[12]:
            assert int(m[12]) * int(m[13]) == int(m[14]) == int(e.answer)
        else:
            a, op, b = int(m[1]), m[2], int(m[3])
            assert int(m[11]) == int(e.answer) == (a + b if op == "+" else a - b)
            assert int(m[11]) == 10 * int(m[10]) + int(m[6]) % 10  # the answer is the columns' digits
        assert step.fullmatch(pair["rejected"]) and worked.reward(e, pair["rejected"]) == 0.0
    assert column(7, "+", 15) == "7 + 15: 7 + 5 = 12, carry 1; 0 + 1 + 1 = 2. 22"
    assert column(23, "-", 8) == "23 - 8: 13 - 8 = 5, borrow 1; 2 - 0 - 1 = 1. 15"
    assert column(25, "-", 13) == "25 - 13: 5 - 3 = 2; 2 - 1 = 1. 12" and column(4, "*", 7) == "4 * 7 = 28."
    assert column(7, "+", 15, ones=-3) == "7 + 15: 7 + 5 = 9; 0 + 1 = 1. 19"  # the slip drops the carry
    assert column(25, "-", 13, ones=-3) is None and column(2, "-", 2, tens=-1) is None  # no negative step
    mc = load_task("arithmetic_worked_mc", train_size=50, test_size=20)
    for e in mc.examples("test"):
        assert e.choices[e.gold] == e.answer and len(set(e.choices)) == 4 and step.fullmatch(e.answer)


def test_multiple_choice_variant():
    task = load_task("arithmetic_mc", train_size=50, test_size=20)
    assert task.kind == "multiple_choice"
    for e in task.examples("test"):
        assert len(e.choices) == 4 == len(set(e.choices)) and e.choices[e.gold] == e.answer
        assert task.chance(e) == 0.25
    assert [e.gold for e in task.examples("test")] == [e.gold for e in load_task("arithmetic_mc", train_size=50,
                                                                                  test_size=20).examples("test")]


def test_jsonl_tasks(tmp_path):
    mc = tmp_path / "arc.jsonl"
    mc.write_text("\n".join(json.dumps(o) for o in [
        {"question": "Sky colour?", "choices": ["green", "blue"], "answer": 1},
        {"question": "2+2?", "choices": ["3", "4", "5"], "answer": "B", "split": "test"},
        {"question": "Cat says?", "choices": ["woof", "meow"], "answer": "meow", "split": "train"}]) + "\n")
    task = load_task(str(mc))
    assert task.kind == "multiple_choice"
    assert [e.gold for e in task.examples("test")] == [1] and task.examples("train")[0].answer == "meow"
    gen = tmp_path / "gsm.jsonl"
    gen.write_text(json.dumps({"prompt": "5 + 7?", "answer": "#### 12"}) + "\n" +
                   json.dumps({"prompt": "Capital of France?", "answer": 3}) + "\n")
    task = load_task(str(gen))
    assert task.kind == "generative" and len(task.examples("test")) == len(task.examples("train")) == 2
    e = task.examples("test")[0]
    assert task.reward(e, "5 + 7 = 12") == 1.0 and task.reward(e, "13") == 0.0
    assert task.reward(e, task.preference_pairs()[0]["rejected"]) == 0.0
    worked = tmp_path / "worked.jsonl"
    worked.write_text(json.dumps({"prompt": "3 packs of 4, and 2 more?", "answer": 14,
                                  "solution": "3 * 4 = 12, 12 + 2 = 14."}) + "\n")
    task = load_task(str(worked))
    assert task.conversations("train")[0][-1]["content"] == "3 * 4 = 12, 12 + 2 = 14."
    assert task.preference_pairs()[0]["chosen"] == "3 * 4 = 12, 12 + 2 = 14."


@pytest.mark.parametrize("lines,match", [
    ([{"prompt": "p", "answer": 14, "solution": "3 * 4 = 12, 12 + 2 = 15."}], "gives '15', not the answer '14'"),
    ([{"prompt": "p", "answer": 14, "solution": 14}], "\"solution\" must be text"),
    (["{not json"], "line 1 is not valid JSON"),
    ([{"question": "q", "choices": ["a"], "answer": 0}], "at least 2"),
    ([{"question": "q", "choices": ["a", "b"], "answer": 5}], "answer"),
    ([{"prompt": "p"}], "\"answer\" must be"),
    ([{"text": "p"}], "needs a non-empty \"prompt\""),
    ([{"prompt": "p", "answer": "a"}, {"question": "q", "choices": ["a", "b"], "answer": 0}], "one kind per file"),
    ([], "holds no example"),
])
def test_bad_task_files_are_one_line_errors(tmp_path, lines, match):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines))
    with pytest.raises(UserError, match=match) as e:
        load_task(str(path))
    assert "\n" not in str(e.value)


def test_unknown_task_names_the_built_in_ones():
    with pytest.raises(UserError, match="did you mean arithmetic") as e:
        load_task("task:arithmetik")
    assert "letter_count" in str(e.value)
    with pytest.raises(UserError, match="not found"):
        load_task("missing.jsonl")


def test_a_runs_seed_does_not_move_a_tasks_splits():
    """sft, dpo and grpo read a task's splits by finetune.task_seed (0, as evaluate's --task-seed), not by the run's
    seed: with the run's seed, seed 1337 (the default) drew a training split holding 36 of seed 0's 1,000 test
    prompts."""
    from redline.config import TrainConfig
    from redline.posttrain.data import read_preference_records
    from redline.training.conversations import read_conversations

    test = {e.prompt for e in load_task("arithmetic").examples("test")}
    for seed in (0, 1337):
        train, _, _ = read_conversations("task:arithmetic", seed=seed)
        prompts = {c[0]["content"] for c in train}
        assert prompts == {e.prompt for e in load_task("arithmetic").examples("train")} and not prompts & test
        pairs, heldout = read_preference_records("task:arithmetic", seed, 0.02)
        assert {p["messages"][0]["content"] for p in pairs} == prompts
        assert {p["messages"][0]["content"] for p in heldout} == test
    assert TrainConfig().finetune.task_seed == 0 and TrainConfig().seed != 0
    other = {c[0]["content"] for c in read_conversations("task:arithmetic", task_seed=5)[0]}
    assert other != prompts  # task_seed itself still draws other splits
