"""`redline pairs`: which replies become a pair (a scripted generator, so every case is known), and the command end
to end on a tiny fine-tuned checkpoint: its file is what `redline dpo --data` trains on, and bad input is one line
with nothing written."""

from __future__ import annotations

import json
from types import SimpleNamespace

from redline.commands.pairs import PairsConfig, sample_pairs
from redline.tasks import load_task
from tests.test_posttrain_cli import digit_task
from tests.test_sft import _cli, _pretrain
from tests.test_train import dataset  # noqa: F401  (a pytest fixture)


class ScriptedGenerator:
    """Stands in for TextGenerator: replies to each prompt from a script, in order, and records what it was asked."""

    def __init__(self, script: dict[str, list[str]]):
        self.script = {k: list(v) for k, v in script.items()}
        self.tokenizer = SimpleNamespace(eot_id=0)
        self.calls = []

    def encode_chat(self, messages, renderer, max_new_tokens, truncate, index):
        return [1, 2, 3], False

    def generate(self, prompts, max_new_tokens, sampling, encoded, stop_tokens):
        self.calls.append((len(prompts), sampling.temperature, sampling.seed))
        return [SimpleNamespace(text=self.script[p].pop(0), finish_reason="stop") for p in prompts]


def test_a_pair_holds_a_right_reply_over_a_wrong_one_and_all_right_prompts_are_left_out():
    task = load_task("arithmetic")
    ex = task.examples("train")[:4]
    wrong = [str(int(e.answer) + 1) for e in ex]
    script = {
        ex[0].prompt: [wrong[0], ex[0].answer, wrong[0], wrong[0]],  # a right sample: chosen from the samples
        ex[1].prompt: [ex[1].answer] * 4,  # all right: no pair
        ex[2].prompt: [wrong[2]] * 4,  # none right: the task's reference reply is chosen
        ex[3].prompt: ["", ex[3].answer, ex[3].answer, ex[3].answer],  # the only "wrong" reply is empty: no pair
    }
    generator = ScriptedGenerator(script)
    renderer = SimpleNamespace(stop_ids=[7])
    cfg = PairsConfig(checkpoint="-", task="arithmetic", out="-", samples=4, batch_size=8, seed=3)
    records, counts = sample_pairs(generator, renderer, task, ex, cfg)
    assert [(r["chosen"], r["rejected"], r["chosen_from"]) for r in records] == [
        (ex[0].answer, wrong[0], "sample"), (ex[2].reply, wrong[2], "reference")]
    assert records[0]["messages"] == task.messages(ex[0])
    assert (counts.prompts, counts.samples, counts.right, counts.all_right, counts.none_right) == (4, 16, 8, 1, 1)
    # whole groups per batch (8 sequences: 2 prompts × 4), sampled, a seed per batch
    assert generator.calls == [(8, 1.0, 3 * 1_000_003), (8, 1.0, 3 * 1_000_003 + 1)]

    cfg.chosen = "reference"  # the reference reply whatever the samples
    records, _ = sample_pairs(ScriptedGenerator(script), renderer, task, ex, cfg)
    assert [r["chosen"] for r in records] == [ex[0].reply, ex[2].reply]


def test_pairs_cli_writes_what_dpo_trains_on_and_refuses_bad_input(dataset, tmp_path, capsys):  # noqa: F811
    pre = _pretrain(dataset, tmp_path)
    task = digit_task(tmp_path)  # one-digit answers: a random tiny model samples some right and some wrong
    assert _cli(["sft", "--from", str(pre), "--data", task, "seq_len=64", "batch_size=4", "max_steps=2",
                 "eval_batches=1", "tensorboard=False", f"out_dir={tmp_path}", "run_name=sft"]) == 0
    capsys.readouterr()
    out = tmp_path / "pairs.jsonl"
    assert _cli(["pairs", str(tmp_path / "sft"), "--task", task, "--out", str(out), "--samples", "16",
                 "--max-new-tokens", "4"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["pairs"] == len(written) > 0 and summary["samples"] == 8 * 16
    assert all(r["chosen"] != r["rejected"] and r["messages"][-1]["role"] == "user" for r in written)
    assert _cli(["dpo", "--from", str(tmp_path / "sft"), "--data", str(out), "seq_len=64", "batch_size=2",
                 "max_steps=1", "tensorboard=False", f"out_dir={tmp_path}", "run_name=dpo"]) == 0

    before = sorted(p.name for p in tmp_path.iterdir())
    for args, match in [
        ([str(tmp_path / "sft"), "--task", task, "--out", str(tmp_path / "x.jsonl"), "--samples", "1"],
         "--samples must be >= 2"),
        ([str(tmp_path / "sft"), "--task", "arithmetic_mc", "--out", str(tmp_path / "x.jsonl")], "multiple_choice"),
        ([str(tmp_path / "sft"), "--task", task, "--out", str(tmp_path / "no" / "x.jsonl")], "does not exist"),
        ([str(pre), "--task", task, "--out", str(tmp_path / "x.jsonl")], "no chat template"),
    ]:
        code = _cli(["pairs", *args])
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert code == 2 and last.startswith("redline pairs: error: ") and match in last, (args, last)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_out_that_exists_or_is_a_folder_is_refused_before_any_sampling(tmp_path):
    import pytest

    from redline.errors import UserError

    (tmp_path / "pairs.jsonl").write_text("kept\n")
    for out, fragment in [(tmp_path / "pairs.jsonl", "exists"), (tmp_path, "is a folder")]:
        with pytest.raises(UserError, match=fragment):
            PairsConfig(checkpoint="-", task="arithmetic", out=str(out)).validate()
    PairsConfig(checkpoint="-", task="arithmetic", out=str(tmp_path / "pairs.jsonl"), overwrite=True).validate()
    assert (tmp_path / "pairs.jsonl").read_text() == "kept\n"


def test_a_bare_overwrite_means_true_as_the_error_spells_it(tmp_path):
    """`--overwrite` alone (as the refusal above suggests it) is `--overwrite True`: config.parse takes every
    boolean field of a command's config as a bare flag; `--overwrite False` still works."""
    from redline.config import parse

    (tmp_path / "pairs.jsonl").write_text("kept\n")
    args = ["-", "--task", "arithmetic", "--out", str(tmp_path / "pairs.jsonl")]
    cfg = parse(PairsConfig, [*args, "--overwrite"], prog="redline pairs", description="")
    assert cfg.overwrite is True
    cfg = parse(PairsConfig, ["--overwrite", "--task", "arithmetic", "-", "--out", str(tmp_path / "x.jsonl")],
                prog="redline pairs", description="")
    assert cfg.overwrite is True and cfg.checkpoint == "-"
    import pytest

    from redline.errors import UserError

    with pytest.raises(UserError, match="exists"):  # False: an existing --out is refused
        parse(PairsConfig, [*args, "--overwrite", "False"], prog="redline pairs", description="")
