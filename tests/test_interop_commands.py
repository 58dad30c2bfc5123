"""An imported model through every command, in process, against transformers on the same tiny random models (a
Llama with GQA and a GPT-2, each with a ChatML chat template): generate (greedy tokens, stopping at the model's own
EOS ids), chat (the chat template), eval (the same loss), bench-infer, train --init-from (the first step's loss is
the imported model's) and its --resume, and export of the trained run back to transformers (equal logits, the
generation config kept)."""

from __future__ import annotations

import io
import json
import random
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from redline import cli
from redline.model import GPT
from redline.training.checkpoint import load_for_inference, load_init_weights
from tests.interop_models import hf_folder

transformers = pytest.importorskip("transformers")

PROMPT = "hello world"
WORDS = "hello world the model reads tokens and says hi café 日本 1234".split()
SEQ, BATCH = 32, 2


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def call(argv) -> int:
    """The CLI's exit code (its output goes where pytest captures it)."""
    with pytest.raises(SystemExit) as exc:
        cli.main([str(a) for a in argv])
    return exc.value.code


def run_cli(argv, capsys, stdin: str | None = None, monkeypatch=None):
    capsys.readouterr()
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = call(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


class Imported:
    """A transformers model, its folder, the redline checkpoint `redline import` made of it, and data prepared
    with that checkpoint's tokenizer."""

    def __init__(self, kind, root):
        self.hf_dir, self.ckpt, self.data = root / "hf", root / "ckpt", root / "data"
        self.hf = hf_folder(kind, self.hf_dir)
        self.hf_tok = transformers.AutoTokenizer.from_pretrained(self.hf_dir)
        self.prompt_ids = self.hf_tok(PROMPT).input_ids
        # the model's EOS ids: [its 4th greedy token after PROMPT, 2], so that generation must stop at the first
        greedy = self.greedy(self.prompt_ids, 8, eos=None)
        self.stops = [greedy[3], 2]
        self.generation = {"eos_token_id": self.stops, "bos_token_id": 0, "pad_token_id": 0, "max_length": 48}
        (self.hf_dir / "generation_config.json").write_text(json.dumps(self.generation))
        assert call(["import", self.hf_dir, "--out", self.ckpt]) == 0
        rng = random.Random(0)
        (root / "text.txt").write_text("\n\n".join(" ".join(rng.choice(WORDS) for _ in range(60)) for _ in range(60)))
        assert call(["data", "prepare", "--inputs", root / "text.txt", "--out", self.data,
                     "--tokenizer", self.ckpt / "tokenizer"]) == 0

    @torch.no_grad()
    def greedy(self, ids, n, eos):
        """transformers' greedy continuation of ids (its EOS token, where it stopped at one, left out)."""
        out = self.hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                               pad_token_id=0)[0, len(ids):].tolist()
        return out[:-1] if eos and out and out[-1] in eos else out

    @torch.no_grad()
    def loss(self, x, y):
        """transformers' mean cross-entropy of targets y (B, T) given inputs x (B, T)."""
        logits = self.hf(x).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).item()


def trained_two_steps(imported: Imported, tmp_path, capsys):
    """`redline train --init-from` the imported checkpoint for two steps at a high rate: the first step's loss is
    transformers' on that batch. Returns the models (before, after) for the caller to check what moved."""
    from redline.data.loader import TokenLoader

    before, _, _ = load_for_inference(imported.ckpt)
    common = [f"out_dir={tmp_path}", "run_name=run", "eval_batches=1", "sample_tokens=0", "device=cpu"]
    code, _, err = run_cli(["train", "--init-from", str(imported.ckpt), "--data.path", str(imported.data),
                            "max_steps=2", f"seq_len={SEQ}", f"batch_size={BATCH}", "eval_every=0",
                            "optim.warmup_steps=0", "optim.lr=1e-2", *common], capsys)
    assert code == 0, err
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in steps if r.get("kind") == "train" and r["step"] == 1)
    x, y = TokenLoader(imported.data, "train", BATCH, SEQ, seed=1337, prefetch=False).next_batch()
    assert first["loss"] == pytest.approx(imported.loss(x, y), abs=1e-4)
    after, _, _ = load_for_inference(tmp_path / "run")
    return before, after


@pytest.fixture(scope="module", params=["llama-gqa-tied", "gpt2"])
def imported(request, tmp_path_factory):
    return Imported(request.param, tmp_path_factory.mktemp(request.param))


def test_generate_greedy_equals_transformers_and_stops_at_the_models_eos(imported, capsys):
    code, out, err = run_cli(["generate", "--checkpoint", imported.ckpt, "--prompt", PROMPT, "--temperature", "0",
                              "--max-new-tokens", "8", "--jsonl", "-", "--device", "cpu"], capsys)
    assert code == 0, err
    row = json.loads(out.strip().splitlines()[-1])
    expected = imported.greedy(imported.prompt_ids, 8, imported.stops)
    assert len(expected) <= 3 and row["finish_reason"] == "eot"  # stopped at the first EOS id, before 8 tokens
    assert row["prompt_tokens"] == len(imported.prompt_ids) and row["completion_tokens"] == len(expected)
    assert row["completion"] == imported.hf_tok.decode(expected, skip_special_tokens=True)


def test_chat_renders_the_chat_template(imported, capsys, monkeypatch):
    message = "hi there"
    text = imported.hf_tok.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                               tokenize=False)
    ids = imported.hf_tok(text, add_special_tokens=False).input_ids
    assert "<|im_start|>assistant" in text
    code, out, err = run_cli(["chat", "--checkpoint", imported.ckpt, "--temperature", "0", "--repetition-penalty",
                              "1.0", "--max-new-tokens", "6", "--device", "cpu"], capsys, f"{message}\n", monkeypatch)
    assert code == 0, err
    reply = imported.greedy(ids, 6, imported.stops)
    assert out == imported.hf_tok.decode(reply, skip_special_tokens=True) + "\n"


def test_eval_loss_equals_transformers(imported, capsys):
    from redline.data.loader import TokenLoader

    code, out, err = run_cli(["eval", "--checkpoint", imported.ckpt, "--data", imported.data, "--batches", "2",
                              "--batch-size", BATCH, "--seq-len", SEQ, "--device", "cpu"], capsys)
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    loader = TokenLoader(imported.data, "val", BATCH, SEQ, prefetch=False)
    batches = list(loader.eval_batches(2))
    expected = sum(imported.loss(x, y) for x, y in batches) / len(batches)
    assert result["eval_tokens"] == 2 * BATCH * SEQ
    assert result["loss"] == pytest.approx(expected, abs=1e-4)

    # more batches than the split holds: read once, not wrapped around
    code, out, err = run_cli(["eval", "--checkpoint", imported.ckpt, "--data", imported.data, "--batches", "100000",
                              "--batch-size", BATCH, "--seq-len", SEQ, "--device", "cpu"], capsys)
    assert code == 0, err
    assert loader.num_windows < 100000 * BATCH
    assert json.loads(out.strip().splitlines()[-1])["eval_tokens"] == loader.num_windows * SEQ  # each window once


def test_eval_scores_text_with_the_checkpoints_tokenizer(imported, tmp_path, capsys):
    """--data given as text: tokenized as transformers' tokenizer does it (the document, then the end-of-text token)
    and scored whole, window by window, to transformers' loss. Without --data an imported checkpoint, which has no
    training data here, is a one-line error, as is text shorter than one window."""
    from redline.tokenizer import load_tokenizer

    rng = random.Random(1)
    text = " ".join(rng.choice(WORDS) for _ in range(150))
    (tmp_path / "mine.txt").write_text(text)
    code, out, err = run_cli(["eval", "--checkpoint", imported.ckpt, "--data", tmp_path / "mine.txt", "--batches",
                              "1000", "--batch-size", 1, "--seq-len", SEQ, "--device", "cpu"], capsys)
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    eot = load_tokenizer(imported.ckpt / "tokenizer").eot_id
    stream = imported.hf_tok(text, add_special_tokens=False).input_ids + [eot]
    windows = torch.tensor([stream[w * SEQ:(w + 1) * SEQ + 1] for w in range((len(stream) - 1) // SEQ)])
    assert len(windows) > 2 and result["eval_tokens"] == windows[:, 1:].numel()
    assert result["loss"] == pytest.approx(imported.loss(windows[:, :-1], windows[:, 1:]), abs=1e-4)
    assert result["data"] == str(tmp_path / "mine.txt")

    (tmp_path / "short.txt").write_text(PROMPT)
    for extra, fragment in (([], "has no training data here"),
                            (["--data", tmp_path / "short.txt", "--seq-len", SEQ], "fewer than one window")):
        code, _, err = run_cli(["eval", "--checkpoint", imported.ckpt, "--device", "cpu", *extra], capsys)
        assert code != 0 and fragment in err and len(err.strip().splitlines()) == 1, err


def test_bench_infer_runs_an_imported_checkpoint(imported, capsys):
    code, out, err = run_cli(["bench-infer", "--checkpoint", imported.ckpt, "--batch-sizes", "1", "--prompt-lens", "8",
                              "--max-new-tokens", "4", "--repeats", "1", "--methods", "eager", "--device", "cpu"],
                             capsys)
    assert code == 0, err
    rows = json.loads(out.strip().splitlines()[-1])["results"]
    assert rows and all(r["status"] == "ok" and r["decode_tok_s_total"] > 0 for r in rows)


def test_train_init_from_starts_at_the_imported_models_loss_resumes_and_exports(imported, tmp_path, capsys):
    from redline.data.loader import TokenLoader
    from redline.training.checkpoint import list_checkpoints

    run = tmp_path / "run"
    common = [f"out_dir={tmp_path}", "run_name=run", "eval_batches=1", "sample_tokens=0", "device=cpu"]
    code, _, err = run_cli(["train", "--init-from", imported.ckpt, "--data.path", imported.data, "max_steps=2",
                            f"seq_len={SEQ}", f"batch_size={BATCH}", "eval_every=0", "optim.warmup_steps=0",
                            "optim.lr=1e-3", *common], capsys)
    assert code == 0, err
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in steps if r.get("kind") == "train" and r["step"] == 1)
    x, y = TokenLoader(imported.data, "train", BATCH, SEQ, seed=1337, prefetch=False).next_batch()
    assert first["loss"] == pytest.approx(imported.loss(x, y), abs=1e-4)  # the imported weights, not a random init

    code, _, err = run_cli(["train", "--resume", run, "max_steps=3"], capsys)
    assert code == 0, err
    assert list_checkpoints(run)[-1].name == "step_00000003"
    model, tokenizer, cfg = load_for_inference(run)
    assert cfg.model.vocab_size == imported.hf.config.vocab_size and tokenizer.stop_ids == imported.stops

    code, _, err = run_cli(["export", run, "--out", tmp_path / "exported"], capsys)
    assert code == 0, err
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = back(tokens).logits
        torch.testing.assert_close(got, model(tokens), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(got, imported.hf(tokens).logits, atol=1e-4)  # trained: not the import any more
    generation = json.loads((tmp_path / "exported" / "generation_config.json").read_text())
    assert {k: generation[k] for k in imported.generation} == imported.generation
    # the helper other commands build on: a run directory's newest checkpoint into a model of its config
    fresh = GPT(cfg.model)
    assert load_init_weights(fresh, run) == list_checkpoints(run)[-1]
    with torch.no_grad():
        torch.testing.assert_close(fresh(tokens), model(tokens))


def check_train_init_from(kind: str, tmp_path, capsys) -> None:
    """The test above on an imported `kind` (a test model of tests/interop_models.py), for a family's own tests."""
    imported = Imported(kind, tmp_path / "imported")
    (tmp_path / "train").mkdir()
    test_train_init_from_starts_at_the_imported_models_loss_resumes_and_exports(imported, tmp_path / "train", capsys)


def check_import_refuses(kind: str, change: dict, fragment: str, tmp_path, capsys) -> None:
    """`redline import` of a test model of tests/interop_models.py with `change` made to its config.json: exit 2,
    one stderr line naming `fragment`, and no output folder (for a family's own tests of its refusals)."""
    hf_folder(kind, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **change}))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_init_point_takes_the_architecture_and_keeps_run_settings(imported):
    from redline.config import TrainConfig, apply_preset
    from redline.training.init_from import InitPoint

    init = InitPoint.read(imported.ckpt)
    cfg = TrainConfig(init_from=str(imported.ckpt))
    apply_preset(cfg, "tiny")  # as the command line does when no preset is given
    cfg.model.dropout, cfg.optim.lr = 0.1, 5e-5
    out = init.configure(cfg)
    assert out.model == replace(init.model, dropout=0.1) and out.optim.lr == 5e-5
    assert out.preset == init.preset == f"imported-{imported.hf.config.model_type}"
    assert init.tokenizer.identity == load_for_inference(imported.ckpt)[1].identity


def test_init_from_extends_a_rope_models_context(imported):
    """Continued pretraining at a longer context: context_len and RoPE's frequencies may change on a RoPE model (no
    weight changes shape), and YaRN switched on takes the checkpoint's context as the original one; a model with
    learned positions refuses (its position table has a row per position of its context)."""
    from redline.config import TrainConfig, apply_preset
    from redline.errors import UserError
    from redline.training.init_from import InitPoint

    init = InitPoint.read(imported.ckpt)
    cfg = TrainConfig(init_from=str(imported.ckpt))
    apply_preset(cfg, "tiny")
    longer = 2 * init.model.context_len
    cfg.model.context_len, cfg.model.rope_scaling, cfg.model.rope_factor = longer, "yarn", 2.0
    if init.model.pos_emb != "rope":
        with pytest.raises(UserError, match="model.context_len=.*this one has learned positions"):
            init.configure(cfg)
        return
    out = init.configure(cfg)
    assert out.model == replace(init.model, context_len=longer, rope_scaling="yarn", rope_factor=2.0,
                                rope_original_context=init.model.context_len)
    model = GPT(out.model)
    load_init_weights(model, imported.ckpt)
    tokens = torch.randint(0, init.model.vocab_size, (1, longer), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert model(tokens).isfinite().all()
    cfg.model.rope_factor = 0.5
    with pytest.raises(UserError, match="rope_factor must be >= 1"):
        init.configure(cfg)


def test_init_from_conflicts_and_foreign_data_are_one_line_errors(imported, tmp_path, capsys):
    from redline.data.embedded import prepare_embedded

    prepare_embedded()  # built beforehand: its one-time "building ..." line is not the error under test
    base = ["train", "--init-from", imported.ckpt, "max_steps=1", f"seq_len={SEQ}", f"out_dir={tmp_path}"]
    for extra, fragment in ((["--preset", "gpt2-124m", "--data.path", imported.data], "drop --preset gpt2-124m"),
                            (["model.n_layer=5", "--data.path", imported.data], "model.n_layer=5 conflicts"),
                            ([], "prepare")):  # no data.path: the embedded corpus has another tokenizer
        code, _, err = run_cli(base + extra, capsys)
        assert code != 0 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())  # nothing written
