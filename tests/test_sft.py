"""SFT (redline sft): packing never crosses documents (a packed row's logits equal each conversation's alone),
best-fit packing, the loss on trained tokens only, exact resume through the shared loop, the CLI end to end
(pretrain -> sft -> resume -> generate --chat), and bad input as one-line errors."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

from redline import cli
from redline.chat.render import renderer_for, training_example
from redline.errors import UserError
from redline.model import GPT, ModelConfig
from redline.tokenizer import ByteTokenizer
from redline.training import checkpoint as ckpt_io
from redline.training.conversations import ConversationData, build_rows, pack_best_fit
from redline.training.objectives import SupervisedFineTuning
from tests.test_train import dataset, train_losses  # noqa: F401  (a pytest fixture)


def _model(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=261, context_len=256, n_layer=2, n_embd=32, n_head=4, n_kv_head=2)
    return GPT(ModelConfig(**{**cfg, **kw})).eval()


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
@pytest.mark.parametrize("pos_emb,doc_attention", [("rope", "sdpa"), ("learned", "sdpa"), ("rope", "flex"),
                                                   ("alibi", "sdpa")])
def test_packed_row_logits_equal_each_conversation_alone(pos_emb, doc_attention):
    model = _model(pos_emb=pos_emb, doc_attention=doc_attention)
    g = torch.Generator().manual_seed(1)
    docs = [torch.randint(0, 261, (n,), generator=g) for n in (70, 130, 25)]  # across flex's 128-token blocks
    T = 240
    row = torch.zeros(1, T, dtype=torch.long)
    positions = torch.zeros(1, T, dtype=torch.long)
    doc_ids = torch.full((1, T), len(docs))
    at = 0
    for d, doc in enumerate(docs):
        row[0, at:at + len(doc)], positions[0, at:at + len(doc)] = doc, torch.arange(len(doc))
        doc_ids[0, at:at + len(doc)] = d
        at += len(doc)
    with torch.no_grad():
        packed = model(row, positions=positions, doc_ids=doc_ids)
        at = 0
        for doc in docs:
            alone = model(doc[None])
            torch.testing.assert_close(packed[0, at:at + len(doc)], alone[0], atol=1e-5, rtol=1e-5)
            at += len(doc)


def test_best_fit_packing():
    rng = random.Random(0)
    lengths = [rng.randint(1, 60) for _ in range(300)]
    rows = pack_best_fit(lengths, 64)
    assert sorted(i for row in rows for i in row) == list(range(300))
    assert all(sum(lengths[i] for i in row) <= 64 for row in rows)
    assert len(rows) <= sum(lengths) / 64 * 1.15  # close to the lower bound
    assert pack_best_fit([40, 30, 24, 10], 64) == [[0, 2], [1, 3]]  # 30 goes where 10 would not fit best


def _data(packing=True, seq_len=128) -> ConversationData:
    tok = ByteTokenizer()
    tok.add_chat_tokens()
    return ConversationData.load("task:letter_count", tok, seq_len, packing=packing)


def test_loss_is_on_trained_tokens_only():
    data = _data()
    examples = data.train[:6]
    rows = pack_best_fit([len(x) for x, _ in examples], 200)
    arrays = build_rows(examples, rows, 200, packed=True)
    batch = {k: torch.as_tensor(v) for k, v in arrays.items()}
    model = _model()
    loss, metrics = SupervisedFineTuning().compute(model, batch)
    # reference: each conversation alone, the model's own per-token loss summed over its trained targets only
    losses = []
    with torch.no_grad():
        for x, y in examples:
            y = torch.tensor([y])
            per_token = model(torch.tensor([x]), y, reduction="none")
            losses.append(per_token[y >= 0].sum())
    count = sum(sum(t >= 0 for t in y) for _, y in examples)
    torch.testing.assert_close(loss.detach(), torch.stack(losses).sum() / count, atol=1e-5, rtol=1e-5)
    assert metrics["trained_fraction"] == pytest.approx(count / (len(rows) * 200))
    # the trained targets are the assistant's answer and the end token: never the user's numbers
    x, y = examples[0]
    tok = data.tokenizer
    assert [t for t in y if t >= 0] == tok.encode(data.tokenizer.decode([t for t in y if 0 <= t < 256])) + [
        tok.chat_token_ids["<|end|>"]]


def test_no_packing_rows_use_the_plain_causal_path():
    data = _data(packing=False)
    loader = data.train_loader(type("C", (), {"batch_size": 4, "seed": 0})(), _info(), torch.device("cpu"))
    batch = loader.next_batch()
    assert set(batch) == {"inputs", "targets"}  # no doc_ids: the model's unchanged fast path
    assert (batch["targets"] >= 0).any(dim=1).all()


def _info():
    from redline.distributed import DistInfo

    return DistInfo()


def test_loader_resumes_exactly_and_splits_ranks():
    from redline.distributed import DistInfo

    data = _data()
    cfg = type("C", (), {"batch_size": 3, "seed": 5})()
    a = data.train_loader(cfg, DistInfo(), torch.device("cpu"))
    straight = [a.next_batch()["inputs"] for _ in range(400)]  # crosses epochs
    b = data.train_loader(cfg, DistInfo(), torch.device("cpu"))
    for _ in range(150):
        b.next_batch()
    c = data.train_loader(cfg, DistInfo(), torch.device("cpu"))
    c.load_state_dict(json.loads(json.dumps(b.state_dict())))
    for i in range(150, 400):
        assert torch.equal(c.next_batch()["inputs"], straight[i])
    r0 = data.train_loader(cfg, DistInfo(rank=0, local_rank=0, world_size=2), torch.device("cpu")).next_batch()
    r1 = data.train_loader(cfg, DistInfo(rank=1, local_rank=1, world_size=2), torch.device("cpu")).next_batch()
    assert not torch.equal(r0["inputs"], r1["inputs"])


def test_too_long_conversations_are_dropped_or_refused(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [{"prompt": "hi", "completion": "x" * 100}, {"prompt": "hi", "completion": "ok"},
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = ByteTokenizer()
    tok.add_chat_tokens()
    data = ConversationData.load(str(path), tok, 32, eval_fraction=0.0)
    assert data.dropped == 1 and len(data.train) == 2 and "1 longer than seq_len dropped" in data.describe()
    with pytest.raises(UserError, match="holds out all 3 conversations"):
        ConversationData.load(str(path), tok, 32, eval_fraction=1.0)
    # held out, a too-long conversation is counted too: the draw is by position, so the long one goes where it is
    from redline.training.conversations import read_conversations

    short = [{"prompt": f"hi {i}", "completion": "ok"} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in short))
    _, held, _ = read_conversations(str(path), eval_fraction=0.3)  # one of the three
    position = [_conversation_of(r) for r in short].index(held[0])
    short[position] = {"prompt": "hi", "completion": "x" * 100}
    path.write_text("".join(json.dumps(r) + "\n" for r in short))
    data = ConversationData.load(str(path), tok, 32, eval_fraction=0.3)
    assert data.heldout_dropped == 1 and len(data.heldout) == 0 and len(data.train) == 2
    assert "1 more longer than seq_len left out" in data.describe()
    with pytest.raises(UserError, match="every conversation .* longer than seq_len 4"):
        ConversationData.load(str(path), tok, 4, eval_fraction=0.0)


@pytest.mark.parametrize("line,match", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "record 1 has no assistant message"),
    ({"messages": [{"role": "bot", "content": "hi"}]}, "record 1: message 0 has role 'bot'"),
    ({"prompt": "hi", "completion": ""}, "empty content"),
    ({"text": "hi"}, "neither \"messages\" nor \"prompt\""),
])
def test_bad_conversation_files(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(line) + "\n")
    tok = ByteTokenizer()
    tok.add_chat_tokens()
    with pytest.raises(UserError, match=match) as e:
        ConversationData.load(str(path), tok, 64)
    assert "\n" not in str(e.value)


def _pretrain(dataset, tmp_path):
    base = [f"data.path={dataset}", f"out_dir={tmp_path}", "run_name=pre", "model.n_layer=1", "model.n_embd=32",
            "model.n_head=2", "model.context_len=128", "batch_size=2", "seq_len=32", "max_steps=2",
            "eval_batches=1", "sample_tokens=0", "tensorboard=False"]
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", *base])
    assert exc.value.code == 0
    return tmp_path / "pre"


def _cli(args, capsys=None):
    with pytest.raises(SystemExit) as exc:
        cli.main(args)
    return exc.value.code


@pytest.mark.slow
def test_sft_cli_exact_resume_and_chat_generation(dataset, tmp_path, capsys):  # noqa: F811
    pre = _pretrain(dataset, tmp_path)
    common = ["--data", "task:letter_count", "seq_len=128", "batch_size=4", "eval_batches=1", "log_every=1",
              "tensorboard=False", f"out_dir={tmp_path}", "checkpoint_every=2", "optim.warmup_steps=1"]
    assert _cli(["sft", "--from", str(pre), *common, "run_name=straight", "max_steps=4"]) == 0
    # the same run cut at its step-2 checkpoint (what a kill after it leaves), then resumed to the end
    shutil.copytree(tmp_path / "straight", tmp_path / "half")
    shutil.rmtree(ckpt_io.list_checkpoints(tmp_path / "half")[-1])
    assert _cli(["sft", "--resume", str(tmp_path / "half")]) == 0
    assert capsys.readouterr().out.count("resumed from") == 1
    assert train_losses(tmp_path / "straight") == train_losses(tmp_path / "half")  # bit-for-bit on a CPU
    ckpt = ckpt_io.resolve_checkpoint(tmp_path / "straight")
    config = json.loads((ckpt / "config.json").read_text())
    assert config["finetune"]["data"] == "task:letter_count" and config["model"]["vocab_size"] == 261
    meta = json.loads((ckpt / "tokenizer" / "redline_tokenizer.json").read_text())
    assert meta["chat_tokens"]["<|end|>"] == 260
    capsys.readouterr()
    assert _cli(["generate", "--checkpoint", str(tmp_path / "straight"), "--chat", "--prompt", "Remember: a=1. "
                 "What is the value of a?", "--max-new-tokens", "4", "--temperature", "0", "--jsonl", "-"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["completion_tokens"] <= 4


def test_sft_cli_bad_input(dataset, tmp_path, capsys):  # noqa: F811
    pre = _pretrain(dataset, tmp_path)
    for args, match in [(["--data", "task:nope"], "unknown task 'nope'"),
                        ([], "give --from CHECKPOINT"),
                        (["--data", str(tmp_path / "missing.jsonl")], "not found"),
                        (["--data", "task:arithmetic", "finetune.template=jinja"], "has no chat template")]:
        code = _cli(["sft", *(["--from", str(pre)] if args else []), *args, f"out_dir={tmp_path}"])
        err = capsys.readouterr().err
        assert code != 0 and match in err, err
    assert not (tmp_path / "sft").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["pre"]


def test_renderer_and_chat_tokens_of_sft_checkpoint_match(dataset, tmp_path):  # noqa: F811
    from redline.commands.sft import chat_tokenizer

    pre = _pretrain(dataset, tmp_path)
    tok = chat_tokenizer(ckpt_io.resolve_checkpoint(pre), "auto")
    out = renderer_for(tok).render([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    inputs, targets = training_example(out)
    assert [t for t in targets if t >= 0] == [ord("a"), 260]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_flex_document_masking_compiled_on_gpu_matches_sdpa():
    """The GPU path: flex attention's block mask inside the compiled model, forward and backward, against the
    dense SDPA mask."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=261, context_len=512, n_layer=2, n_embd=128, n_head=4, n_kv_head=2)
    sdpa = GPT(ModelConfig(**cfg, doc_attention="sdpa")).cuda()
    flex = GPT(ModelConfig(**cfg, doc_attention="auto")).cuda()  # auto: flex inside torch.compile on CUDA
    flex.load_state_dict(sdpa.state_dict())
    lengths = (100, 300, 112)
    doc_ids = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)]).cuda().expand(4, -1)
    positions = torch.cat([torch.arange(n) for n in lengths]).cuda().expand(4, -1)
    idx = torch.randint(0, 261, (4, 512), device="cuda")
    losses = []
    for model in (sdpa, torch.compile(flex)):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, idx, positions=positions, doc_ids=doc_ids)
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=2e-2)
    torch.testing.assert_close(flex.wte.weight.grad, sdpa.wte.weight.grad, atol=2e-3, rtol=5e-2)


@pytest.mark.slow
def test_sft_and_evaluate_an_imported_model_with_its_jinja_template(tmp_path, capsys):
    """An imported Llama (vocabulary padded past its tokenizer's, a ChatML template): sft renders through the
    template (no chat tokens added, the vocabulary kept), evaluate and generate --chat use it too."""
    from tests.interop_models import hf_folder

    hf_folder("llama-gqa-tied", tmp_path / "hf")
    assert _cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")]) == 0
    data = tmp_path / "c.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"hi {i}", "completion": "hello world"}) + "\n" for i in range(40)))
    assert _cli(["sft", "--from", str(tmp_path / "ckpt"), "--data", str(data), f"out_dir={tmp_path}", "run_name=s",
                 "max_steps=2", "batch_size=2", "seq_len=64", "eval_batches=1", "tensorboard=False"]) == 0
    ckpt = ckpt_io.resolve_checkpoint(tmp_path / "s")
    imported = json.loads((tmp_path / "ckpt" / "config.json").read_text())["model"]["vocab_size"]
    assert json.loads((ckpt / "config.json").read_text())["model"]["vocab_size"] == imported
    assert "chat_tokens" not in json.loads((ckpt / "tokenizer" / "redline_tokenizer.json").read_text())
    assert f"next: redline chat --checkpoint {tmp_path / 's'}" in capsys.readouterr().out  # not generate's hint
    assert _cli(["evaluate", str(tmp_path / "s"), "--tasks", "sort", "--limit", "2", "--max-new-tokens", "2"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["chat"] == "jinja"


@pytest.mark.slow
def test_pairs_dpo_and_grpo_run_on_an_imported_model_through_its_jinja_template(tmp_path, capsys):
    """The post-training chain on an imported Llama with a ChatML template, no redline chat tokens anywhere: its
    own replies sampled into pairs (`redline pairs`), DPO on them, GRPO on the task, each through the template."""
    from tests.interop_models import hf_folder

    hf_folder("llama-gqa-tied", tmp_path / "hf")
    assert _cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")]) == 0
    task = tmp_path / "digit.jsonl"  # one-digit answers: a random model samples some right, some wrong
    task.write_text("".join(json.dumps({"prompt": f"Name a number ({i}).", "answer": str(i % 10)}) + "\n"
                            for i in range(8)))
    common = [f"out_dir={tmp_path}", "seq_len=64", "eval_batches=1", "tensorboard=False", "max_steps=1"]
    pairs = tmp_path / "pairs.jsonl"
    assert _cli(["pairs", str(tmp_path / "ckpt"), "--task", str(task), "--out", str(pairs), "--samples", "16",
                 "--max-new-tokens", "3"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["pairs"] > 0
    assert _cli(["dpo", "--from", str(tmp_path / "ckpt"), "--data", str(pairs), "run_name=d", "batch_size=2",
                 *common]) == 0
    assert _cli(["grpo", "--from", str(tmp_path / "d"), "--task", str(task), "run_name=g", "batch_size=4",
                 "grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.max_new_tokens=3", "grpo.eval_examples=2",
                 *common]) == 0
    for run in ("d", "g"):
        ckpt = ckpt_io.resolve_checkpoint(tmp_path / run)
        assert "chat_tokens" not in json.loads((ckpt / "tokenizer" / "redline_tokenizer.json").read_text())
    capsys.readouterr()
    assert _cli(["evaluate", str(tmp_path / "g"), "--tasks", str(task), "--max-new-tokens", "3"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["chat"] == "jinja"


def _conversation_of(row: dict) -> list[dict]:
    from redline.training.conversations import _conversation

    return _conversation(row, "test")

