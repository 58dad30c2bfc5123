"""Data pipeline: shards, sources, prepare, the loader, the embedded corpus and the `redline data` CLI."""

from __future__ import annotations

import gzip
import json
import lzma
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from redline import cli
from redline.data import prepare as prepare_module
from redline.data.embedded import embedded_documents, prepare_embedded
from redline.data.loader import TokenLoader
from redline.data.prepare import is_prepared, load_data_tokenizer, load_meta, prepare
from redline.data.shards import HEADER_SIZE, read_header, read_shard, write_shard
from redline.data.sources import iter_documents
from redline.errors import UserError
from redline.tokenizer import ByteTokenizer, load_tokenizer, train_bpe

ID_A = "a" * 64
ID_B = "b" * 64
WORDS = "the model reads tokens and predicts the next one naïve café 日本語 données".split()


def make_docs(n: int, words: int = 60, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), words)) + f" #{k}" for k in range(n)]


def write_txt_folder(folder: Path, docs: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs):
        (folder / f"doc{i:03d}.txt").write_text(doc, encoding="utf-8")
    return folder


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """40 documents, byte tokenizer, 20% val, shards of 1000 tokens (so windows cross shard boundaries)."""
    root = tmp_path_factory.mktemp("prepared")
    texts = write_txt_folder(root / "texts", make_docs(40))
    out = root / "data"
    prepare([str(texts)], out, "bytes", val_fraction=0.2, shard_tokens=1000, num_workers=1)
    return out


# ----------------------------------------------------------------------------------------------------
# shards


@pytest.mark.parametrize("vocab_size,dtype", [(1000, np.uint16), (65536, np.uint16), (100_000, np.uint32)])
def test_shard_round_trip(tmp_path, vocab_size, dtype):
    tokens = np.random.default_rng(0).integers(0, vocab_size, 5000)
    path = write_shard(tmp_path / "s.bin", tokens, ID_A, vocab_size)
    header = read_header(path)
    assert header.dtype == dtype and header.num_tokens == 5000 and header.identity == ID_A
    assert header.vocab_size == vocab_size
    assert path.stat().st_size == HEADER_SIZE + 5000 * np.dtype(dtype).itemsize
    loaded = read_shard(path, expected_identity=ID_A, verify=True)
    assert isinstance(loaded, np.memmap) and loaded.dtype == dtype
    np.testing.assert_array_equal(loaded, tokens)
    assert [p.name for p in tmp_path.iterdir()] == ["s.bin"]  # no temp file left behind


def test_empty_shard_and_bad_tokens(tmp_path):
    write_shard(tmp_path / "e.bin", np.zeros(0, dtype=np.int64), ID_A, 257)
    assert read_shard(tmp_path / "e.bin", verify=True).size == 0
    with pytest.raises(ValueError):
        write_shard(tmp_path / "x.bin", np.array([0, 257]), ID_A, 257)  # a bug, not bad user input
    with pytest.raises(ValueError):
        write_shard(tmp_path / "x.bin", np.array([0]), "not-a-hash", 257)


@pytest.fixture
def shard(tmp_path) -> Path:
    return write_shard(tmp_path / "train_000000.bin", np.arange(1000) % 257, ID_A, 257)


def test_truncated_shard(shard):
    data = shard.read_bytes()
    shard.write_bytes(data[:-3])
    with pytest.raises(UserError, match=r"train_000000\.bin is truncated.*redline data prepare"):
        read_shard(shard)
    shard.write_bytes(data[:10])
    with pytest.raises(UserError, match="truncated"):
        read_shard(shard)
    shard.write_bytes(data + b"xx")
    with pytest.raises(UserError, match="longer than its header"):
        read_shard(shard)


def test_flipped_payload_byte_needs_verify(shard):
    data = bytearray(shard.read_bytes())
    data[HEADER_SIZE + 501] ^= 0x01
    shard.write_bytes(bytes(data))
    read_shard(shard)  # the header is fine: without verify the flip goes unnoticed
    with pytest.raises(UserError, match="corrupt.*checksum"):
        read_shard(shard, verify=True)


def test_bad_magic_and_version(shard):
    data = bytearray(shard.read_bytes())
    shard.write_bytes(b"NOTSHARD" + bytes(data[8:]))
    with pytest.raises(UserError, match="not a redline token shard"):
        read_shard(shard)
    data[8] = 99  # format version
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError, match="format version 99"):
        read_shard(shard)
    with pytest.raises(UserError, match="does not exist"):
        read_shard(shard.with_name("missing.bin"))


def test_tokenizer_mismatch(shard):
    with pytest.raises(UserError, match=r"made with tokenizer aaaaaaaaaaaa, this run uses bbbbbbbbbbbb.*re-prepare"):
        read_shard(shard, expected_identity=ID_B)


def test_errors_are_one_line(shard):
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(UserError) as exc:
        read_shard(shard)
    assert "\n" not in str(exc.value) and str(shard) in str(exc.value)


# ----------------------------------------------------------------------------------------------------
# sources


def test_sources_all_formats(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"text": "first doc"}, {"text": ""}, {"text": "second doc ü"}, {"text": None}, {"text": "third"}]
    lines = "\n".join(json.dumps(r) for r in rows) + "\n\n"
    (tmp_path / "a.jsonl").write_text(lines)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(lines)
    with lzma.open(tmp_path / "c.jsonl.xz", "wt") as f:
        f.write(lines)
    pq.write_table(pa.table({"text": ["pq one", None, "pq two"], "id": [1, 2, 3]}), tmp_path / "d.parquet")
    (tmp_path / "e.txt").write_text("a whole file\nis one document\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f.txt").write_text("nested")
    (tmp_path / "sub" / "ignored.csv").write_text("not read")
    (tmp_path / "blank.txt").write_text("   \n")

    expected_jsonl = ["first doc", "second doc ü", "third"]
    assert list(iter_documents([str(tmp_path / "a.jsonl")])) == expected_jsonl
    assert list(iter_documents([str(tmp_path / "b.jsonl.gz")])) == expected_jsonl
    assert list(iter_documents([str(tmp_path / "c.jsonl.xz")])) == expected_jsonl
    assert list(iter_documents([str(tmp_path / "d.parquet")])) == ["pq one", "pq two"]
    assert list(iter_documents([str(tmp_path / "e.txt")])) == ["a whole file\nis one document\n"]
    # a folder: recursive, sorted by path, unsupported and blank files skipped
    assert list(iter_documents([str(tmp_path)])) == (
        expected_jsonl * 3 + ["pq one", "pq two", "a whole file\nis one document\n", "nested"])


def test_sources_text_field_and_errors(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"body": "x"}\n{"body": "y"}\n')
    assert list(iter_documents([str(tmp_path / "a.jsonl")], text_field="body")) == ["x", "y"]
    with pytest.raises(UserError, match=r"a\.jsonl:1: no 'text' field"):
        list(iter_documents([str(tmp_path / "a.jsonl")]))
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{oops\n')
    with pytest.raises(UserError, match=r"bad\.jsonl:2: not valid JSON"):
        list(iter_documents([str(tmp_path / "bad.jsonl")]))
    with pytest.raises(UserError, match="data path .*missing.txt does not exist"):
        iter_documents([str(tmp_path / "missing.txt")])  # raised at once, before iterating
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(UserError, match="unsupported file type"):
        iter_documents([str(tmp_path / "x.csv")])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "e.txt").write_text("")
    with pytest.raises(UserError, match="no documents found"):
        list(iter_documents([str(tmp_path / "empty")]))
    with pytest.raises(UserError, match="no inputs"):
        iter_documents([])


def test_hf_source_without_datasets_is_a_user_error():
    try:
        import datasets  # noqa: F401

        pytest.skip("datasets is installed: this checks the error without it")
    except ImportError:
        pass
    with pytest.raises(UserError, match="pip install"):
        list(iter_documents(["hf:roneneldan/TinyStories@train"]))


# ----------------------------------------------------------------------------------------------------
# prepare


def test_prepare_meta_and_sizes(prepared):
    meta = load_meta(prepared)
    assert meta["format_version"] == 1 and meta["tokenizer"]["kind"] == "bytes"
    assert meta["tokenizer"]["identity"] == ByteTokenizer().identity and meta["tokenizer"]["vocab_size"] == 257
    docs = make_docs(40)
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    assert train["documents"] + val["documents"] == 40 and val["documents"] > 0
    assert train["bytes"] + val["bytes"] == sum(len(d.encode()) for d in docs)
    # byte tokenizer: tokens = bytes + one end-of-text token per document
    assert train["tokens"] + val["tokens"] == sum(len(d.encode()) + 1 for d in docs)
    for split in (train, val):
        stream = np.concatenate([read_shard(prepared / name, verify=True) for name in split["shards"]])
        assert stream.size == split["tokens"] and split["num_shards"] == len(split["shards"])
        assert int((stream == 256).sum()) == split["documents"] and stream[-1] == 256
        assert all(read_header(prepared / n).num_tokens == 1000 for n in split["shards"][:-1])
    assert is_prepared(prepared) and load_tokenizer(str(prepared)).name == "bytes"
    assert load_data_tokenizer(prepared).identity == meta["tokenizer"]["identity"]
    assert not [p for p in prepared.parent.iterdir() if ".tmp-" in p.name]


def test_prepare_is_deterministic_and_parallelism_free(tmp_path):
    texts = write_txt_folder(tmp_path / "texts", make_docs(30))
    tok = train_bpe(make_docs(30), vocab_size=300)
    prepare([str(texts)], tmp_path / "a", tok, val_fraction=0.3, num_workers=1, seed=5)
    prepare([str(texts)], tmp_path / "b", tok, val_fraction=0.3, num_workers=2, seed=5)
    prepare([str(texts)], tmp_path / "c", tok, val_fraction=0.3, num_workers=2, seed=6)
    for split in ("train", "val"):
        a = (tmp_path / "a" / f"{split}_000000.bin").read_bytes()
        assert a == (tmp_path / "b" / f"{split}_000000.bin").read_bytes()
    assert load_meta(tmp_path / "a")["splits"] != load_meta(tmp_path / "c")["splits"]  # another seed, another split
    loaded = load_tokenizer(str(tmp_path / "a"))
    assert loaded.identity == tok.identity and load_meta(tmp_path / "a")["tokenizer"]["spec"] == "."


def test_prepare_val_inputs_and_tiny_corpus(tmp_path):
    train_dir = write_txt_folder(tmp_path / "train", make_docs(5))
    val_dir = write_txt_folder(tmp_path / "val", make_docs(2, seed=1))
    meta = prepare([str(train_dir)], tmp_path / "out", "bytes", val_inputs=[str(val_dir)])
    assert meta["splits"]["train"]["documents"] == 5 and meta["splits"]["val"]["documents"] == 2
    assert meta["val_inputs"] == [str(val_dir)] and meta["val_fraction"] == 0.0
    # 3 documents with a 1% val fraction: the hash picks none, so the end of the training text tops val up to
    # half the tokens (fewer than min_val_tokens in all): the last document and the end of the one before
    docs = make_docs(3)
    meta = prepare([str(write_txt_folder(tmp_path / "three", docs))], tmp_path / "out3", "bytes")
    total = sum(len(d.encode()) + 1 for d in docs)
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    assert val["tokens"] == total // 2 == meta["val_tokens_from_train_end"] and train["tokens"] == total - total // 2
    assert (train["documents"], val["documents"]) == (2, 2)  # the second document is cut in two


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_one_long_document_gets_a_val_split_from_its_end(tmp_path, tokenizer, capfd):
    """nanoGPT's input.txt: a single .txt file is one document; its end becomes the val split, said in one line."""
    text = "\n\n".join(make_docs(60, words=80))  # ~40 kB, one document
    (tmp_path / "input.txt").write_text(text, encoding="utf-8")
    tok = "bytes" if tokenizer == "bytes" else train_bpe([text], vocab_size=400)
    meta = prepare([str(tmp_path / "input.txt")], tmp_path / "data", tok, num_workers=1, shard_tokens=5000)
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    total = train["tokens"] + val["tokens"]
    assert val["tokens"] == max(math.ceil(0.01 * total), 2049) == meta["val_tokens_from_train_end"]
    assert (train["documents"], val["documents"]) == (1, 1)
    assert train["bytes"] + val["bytes"] == len(text.encode())
    loaded = load_tokenizer(str(tmp_path / "data"))
    head, tail = stream(tmp_path / "data", "train"), stream(tmp_path / "data", "val")
    assert tail[-1] == loaded.eot_id and loaded.eot_id not in head  # the document's one EOT ends val
    assert loaded.encode(text) == head.tolist() + tail[:-1].tolist()  # nothing lost or repeated at the cut
    assert len(loaded.decode(tail[:-1].tolist()).encode()) == val["bytes"]
    err = capfd.readouterr().err
    assert f"val split: the last {val['tokens']:,} tokens of the training text" in err
    assert len([line for line in err.splitlines() if "val split" in line]) == 1
    TokenLoader(tmp_path / "data", "val", 1, 2048)  # one window of the longest preset context fits
    # a document too short for the floor: half of it
    (tmp_path / "short.txt").write_text("x" * 99)
    meta = prepare([str(tmp_path / "short.txt")], tmp_path / "short", "bytes")
    assert (meta["splits"]["train"]["tokens"], meta["splits"]["val"]["tokens"]) == (50, 50)
    # val_fraction 0 asks for no val split, and gets none
    meta = prepare([str(tmp_path / "short.txt")], tmp_path / "none", "bytes", val_fraction=0.0)
    assert meta["splits"]["val"]["tokens"] == 0 and meta["val_tokens_from_train_end"] == 0


def test_prepare_refuses_overwrite_and_is_atomic(prepared, tmp_path, monkeypatch):
    texts = write_txt_folder(tmp_path / "texts", make_docs(4))
    out = tmp_path / "out"
    prepare([str(texts)], out, "bytes")
    before = (out / "meta.json").read_text()
    with pytest.raises(UserError, match="already exists and is not empty.*--overwrite"):
        prepare([str(texts)], out, "bytes")

    # a crash in the middle leaves the old data set untouched and no temp folder behind
    def boom(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(prepare_module, "write_shard", boom)
    with pytest.raises(RuntimeError):
        prepare([str(texts)], out, "bytes", overwrite=True)
    with pytest.raises(RuntimeError):
        prepare([str(texts)], tmp_path / "fresh", "bytes")
    assert (out / "meta.json").read_text() == before and not (tmp_path / "fresh").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "texts"]
    monkeypatch.undo()

    meta = prepare([str(texts)], out, "bytes", overwrite=True, seed=1)
    assert json.loads((out / "meta.json").read_text())["seed"] == 1 == meta["seed"]
    (tmp_path / "empty").mkdir()
    prepare([str(texts)], tmp_path / "empty", "bytes")  # an existing empty folder is fine
    with pytest.raises(UserError, match="does not exist"):
        prepare([str(tmp_path / "nope")], tmp_path / "x", "bytes")


def test_load_meta_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist.*redline data prepare"):
        load_meta(tmp_path / "nope")
    with pytest.raises(UserError, match="not a prepared data folder.*redline data prepare"):
        load_meta(tmp_path)
    (tmp_path / "meta.json").write_text("{broken")
    with pytest.raises(UserError, match="damaged"):
        load_meta(tmp_path)
    assert not is_prepared(tmp_path)


@pytest.mark.parametrize("damage", ["not json", "no format", "no splits"])
def test_a_prepared_folder_with_a_damaged_meta_json_says_so(prepared, tmp_path, capsys, damage):
    """Not "no documents found": the folder is read as a prepared one, and its meta.json named as the fault."""
    import shutil

    folder = tmp_path / "data"
    shutil.copytree(prepared, folder)
    meta = json.loads((folder / "meta.json").read_text())
    meta.pop("format" if damage == "no format" else "splits")
    (folder / "meta.json").write_text("{broken" if damage == "not json" else json.dumps(meta))
    for argv in (["train", "--preset", "tiny", "--data.path", str(folder), "max_steps=1", "device=cpu",
                  f"out_dir={tmp_path / 'runs'}"],
                 ["sweep", "smoke", "--data", str(folder), "--out", str(tmp_path / "runs"), "--dry-run"]):
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and f"{folder / 'meta.json'} is damaged" in err and "redline data prepare" in err, err
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------------------------------
# loader


def stream(folder: Path, split: str) -> np.ndarray:
    meta = load_meta(folder)
    return np.concatenate([read_shard(folder / n) for n in meta["splits"][split]["shards"]]).astype(np.int64)


def batches(loader: TokenLoader, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [loader.next_batch() for _ in range(n)]


def test_loader_batches_are_windows_of_the_stream(prepared):
    loader = TokenLoader(prepared, "train", batch_size=4, seq_len=32, seed=0)
    tokens = stream(prepared, "train")
    assert loader.num_windows == (tokens.size - 1) // 32
    x, y = loader.next_batch()
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
    assert x.is_contiguous() and y.is_contiguous()
    assert torch.equal(x[:, 1:], y[:, :-1])
    windows = {tuple(tokens[w * 32 : w * 32 + 33]) for w in range(loader.num_windows)}
    for row_x, row_y in zip(x, y):
        assert tuple(row_x.tolist()) + (int(row_y[-1]),) in windows


def test_loader_epoch_visits_every_window_once(prepared):
    loader = TokenLoader(prepared, "train", batch_size=1, seq_len=64, seed=3)
    tokens = stream(prepared, "train")
    seen = sorted(tuple(loader.next_batch()[0][0].tolist()) for _ in range(loader.num_windows))
    expected = sorted(tuple(tokens[w * 64 : w * 64 + 64].tolist()) for w in range(loader.num_windows))
    assert seen == expected  # windows crossing the 1000-token shard boundaries included
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["index"] == 0


def test_loader_determinism_and_seeds(prepared):
    a = batches(TokenLoader(prepared, "train", 4, 32, seed=1), 5)
    b = batches(TokenLoader(prepared, "train", 4, 32, seed=1), 5)
    c = batches(TokenLoader(prepared, "train", 4, 32, seed=2), 5)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b))
    assert not all(torch.equal(p[0], q[0]) for p, q in zip(a, c))


def test_loader_rank_sharding(prepared):
    single = TokenLoader(prepared, "train", batch_size=6, seq_len=16, seed=4)
    ranks = [TokenLoader(prepared, "train", batch_size=3, seq_len=16, seed=4, rank=r, world_size=2) for r in (0, 1)]
    # enough steps to cross an epoch boundary (the tail of an epoch rolls over into the next)
    steps = int(single.batches_per_epoch) + 3
    for _ in range(steps):
        x, y = single.next_batch()
        (x0, y0), (x1, y1) = ranks[0].next_batch(), ranks[1].next_batch()
        assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)
        rows0, rows1 = {tuple(r.tolist()) for r in x0}, {tuple(r.tolist()) for r in x1}
        assert single.epoch > 1 or not rows0 & rows1  # disjoint within an epoch
    with pytest.raises(UserError, match="rank"):
        TokenLoader(prepared, "train", 3, 16, rank=2, world_size=2)


def test_loader_exact_resume(prepared):
    loader = TokenLoader(prepared, "train", 4, 32, seed=7, prefetch=True)
    batches(loader, 3)
    state = json.loads(json.dumps(loader.state_dict()))  # survives a JSON round trip (checkpoints)
    expected = batches(loader, 20)  # crosses into the next epoch
    resumed = TokenLoader(prepared, "train", 4, 32, seed=7)
    resumed.load_state_dict(state)
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(expected, batches(resumed, 20)))
    with pytest.raises(UserError, match="another seq_len"):
        TokenLoader(prepared, "train", 4, 16, seed=7).load_state_dict(state)
    with pytest.raises(UserError, match="seed"):
        TokenLoader(prepared, "train", 4, 32, seed=8).load_state_dict(state)


def test_loader_eval_batches_are_fixed(prepared):
    loader = TokenLoader(prepared, "val", 2, 32)
    first = list(loader.eval_batches(5))
    loader.next_batch()
    again = list(loader.eval_batches(5))
    assert len(first) == 5 and all(torch.equal(p[0], q[0]) for p, q in zip(first, again))
    tokens = stream(prepared, "val")
    assert first[0][0][0].tolist() == tokens[:32].tolist()


@pytest.mark.parametrize("world_size", [1, 2])
def test_evaluation_reads_a_short_split_once(prepared, world_size):
    """More eval batches than the split holds: each window is scored once (the rows past its end are ignored
    targets, so every rank runs the same batches), eval_tokens counts distinct tokens, and loss and bpb are the
    plain means over the split."""
    from redline.model import GPT, ModelConfig
    from redline.training.evaluate import evaluate

    T = 32
    windows = TokenLoader(prepared, "val", 1, T).num_windows
    B = next(b for b in (3, 4, 5, 7) if windows % (b * world_size))  # the last batch runs past the split's end
    loaders = [TokenLoader(prepared, "val", B, T, rank=r, world_size=world_size) for r in range(world_size)]
    batches = [list(loader.eval_batches(10_000)) for loader in loaders]
    assert {len(b) for b in batches} == {-(-windows // (B * world_size))}  # one pass, the same count on every rank
    targets = torch.cat([y for rank in batches for _, y in rank])
    assert (targets >= 0).sum() == windows * T

    torch.manual_seed(0)
    tokenizer = load_data_tokenizer(prepared)
    model = GPT(ModelConfig(vocab_size=tokenizer.vocab_size, context_len=T, n_layer=1, n_embd=32, n_head=2))
    token_bytes = torch.as_tensor(tokenizer.token_byte_lengths())
    sums = [evaluate(model, rank, token_bytes, None, torch.device("cpu")) for rank in batches]
    eval_tokens = sum(s["eval_tokens"] for s in sums)
    tokens = torch.from_numpy(stream(prepared, "val")[:windows * T + 1])
    with torch.no_grad():
        loss = model(tokens[:-1].view(windows, T), tokens[1:].view(windows, T), reduction="none").double()
    nbytes = token_bytes[tokens[1:]].double()
    assert eval_tokens == windows * T
    if world_size == 1:
        assert sums[0]["loss"] == pytest.approx(loss.mean().item(), rel=1e-6)
        assert sums[0]["bpb"] == pytest.approx((loss.flatten() * (nbytes > 0)).sum().item()
                                               / (math.log(2) * nbytes.sum().item()), rel=1e-6)


def test_loader_errors(prepared):
    val_tokens = load_meta(prepared)["splits"]["val"]["tokens"]
    with pytest.raises(UserError, match=f"val split .* has {val_tokens:,} tokens \\(.*\\), fewer than one window"):
        TokenLoader(prepared, "val", 1, val_tokens)
    with pytest.raises(UserError, match="prepared with tokenizer"):
        TokenLoader(prepared, "train", 1, 8, expected_identity=ID_B)
    with pytest.raises(UserError, match="no split 'test'"):
        TokenLoader(prepared, "test", 1, 8)
    with pytest.raises(UserError, match="not a prepared data folder"):
        TokenLoader(prepared.parent / "texts", "train", 1, 8)


# ----------------------------------------------------------------------------------------------------
# embedded corpus


def test_embedded_documents_deterministic_and_sized():
    docs = embedded_documents(200_000)
    size = sum(len(d.encode()) for d in docs)
    assert 150_000 < size <= 200_000 and len(docs) > 50
    assert embedded_documents(200_000) == docs
    assert embedded_documents(50_000) == docs[: len(embedded_documents(50_000))]  # a prefix: same order
    assert sum(d.count(" the ") for d in docs) > 1000  # English prose


def test_prepare_embedded_cached_and_concurrent(tmp_path):
    cache = tmp_path / "cache"
    code = (f"from redline.data.embedded import prepare_embedded; "
            f"print(prepare_embedded({str(cache)!r}, vocab_size=512, max_bytes=150_000, verbose=False))")
    # two processes building the same cache at once: both get the same, complete folder
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    paths = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(paths) == 1
    folder = Path(paths.pop())
    meta = load_meta(folder)
    assert meta["tokenizer"]["vocab_size"] == 512 and meta["splits"]["val"]["tokens"] > 1000
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [folder.name]
    start = time.perf_counter()
    assert prepare_embedded(cache, vocab_size=512, max_bytes=150_000) == folder  # cached: no rebuild
    assert time.perf_counter() - start < 1.0
    x, _ = TokenLoader(folder, "train", 2, 64).next_batch()
    assert load_tokenizer(str(folder)).decode(x[0].tolist()).strip()


def test_embedded_corpus_with_a_named_tokenizer(tmp_path, monkeypatch):
    """`redline train data.tokenizer=bytes` with no data.path: the embedded corpus's documents and split, tokenized
    with that tokenizer, in a cache folder of its own (the default BPE's is not built)."""
    from redline.config import TrainConfig
    from redline.training.loop import resolve_data

    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    cfg = TrainConfig()
    cfg.data.tokenizer = "bytes"
    folder = resolve_data(cfg, tmp_path / "run")
    assert load_data_tokenizer(folder).identity == ByteTokenizer().identity
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == [folder.name]
    assert not (tmp_path / "run").exists()
    small = prepare_embedded(tmp_path / "small", vocab_size=300, max_bytes=150_000, verbose=False)
    as_bytes = prepare_embedded(tmp_path / "small", vocab_size=300, max_bytes=150_000, verbose=False,
                                tokenizer=ByteTokenizer())
    splits = [{k: v["documents"] for k, v in load_meta(f)["splits"].items()} for f in (small, as_bytes)]
    assert as_bytes != small and splits[0] == splits[1]  # the same documents in each split
    assert load_meta(as_bytes)["splits"]["val"]["bytes"] == load_meta(small)["splits"]["val"]["bytes"]


# ----------------------------------------------------------------------------------------------------
# CLI


def test_cli_data_prepare_and_info(tmp_path, capsys):
    texts = write_txt_folder(tmp_path / "texts", make_docs(12))
    out = tmp_path / "out"
    code, stdout, err = run_cli(["data", "prepare", "--inputs", str(texts), "--out", str(out), "--tokenizer", "bpe",
                                 "--vocab-size", "300", "--val-fraction", "0.25", "--workers", "1"], capsys)
    assert code == 0, err
    record = json.loads(stdout.strip().splitlines()[-1])
    assert record["tokenizer"]["vocab_size"] == 300 and record["splits"]["val"]["documents"] > 0
    assert record["tokens"] == sum(s["tokens"] for s in record["splits"].values()) and "bytes/token" in stdout
    assert load_tokenizer(str(out)).vocab_size == 300

    code, stdout, err = run_cli(["data", "info", str(out), "--verify"], capsys)
    assert code == 0, err
    assert json.loads(stdout.strip().splitlines()[-1])["splits"] == record["splits"]

    code, _, err = run_cli(["data", "prepare", "--inputs", str(texts), "--out", str(out), "--tokenizer", "bytes"],
                           capsys)
    assert code == 2 and "--overwrite" in err
    code, _, err = run_cli(["data", "prepare", "--inputs", str(texts), "--out", str(out), "--tokenizer", "bytes",
                            "--overwrite", "--val-inputs", str(texts)], capsys)
    assert code == 0, err
    assert load_meta(out)["tokenizer"]["kind"] == "bytes" and load_meta(out)["val_inputs"] == [str(texts)]


def test_cli_data_bad_input(tmp_path, capsys):
    code, _, err = run_cli(["data", "prepare", "--inputs", str(tmp_path / "missing.jsonl"), "--out",
                            str(tmp_path / "o"), "--tokenizer", "bytes"], capsys)
    assert code == 2 and "does not exist" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["data", "prepare", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "--inputs" in err
    code, _, err = run_cli(["data", "prepare", "--inputs", str(tmp_path), "--out", str(tmp_path / "o"),
                            "--tokenizer", "nope"], capsys)
    assert code == 2 and "unknown tokenizer" in err
    code, _, err = run_cli(["data", "info", str(tmp_path)], capsys)
    assert code == 2 and "redline data prepare" in err
    code, _, err = run_cli(["data", "frobnicate"], capsys)
    assert code == 2 and "prepare" in err
    code, stdout, _ = run_cli(["data"], capsys)
    assert code == 0 and "prepare" in stdout
    assert not os.path.exists(tmp_path / "o")


def test_prepare_with_spawned_workers_matches(tmp_path, monkeypatch):
    """Where fork is not used (macOS, Windows) the tokenizer is pickled into spawned processes: same output."""
    docs = make_docs(12) + ["a literal <|endoftext|> stays text"]
    texts = write_txt_folder(tmp_path / "texts", docs)
    tok = train_bpe(docs, vocab_size=300)
    prepare([str(texts)], tmp_path / "one", tok, num_workers=1)
    monkeypatch.setattr(prepare_module.sys, "platform", "darwin")
    prepare([str(texts)], tmp_path / "spawned", tok, num_workers=2)
    for name in ("train_000000.bin", "val_000000.bin"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "spawned" / name).read_bytes()


def test_loader_refuses_token_ids_outside_the_vocabulary(tmp_path, monkeypatch):
    """A shard whose payload holds an id past the vocabulary (edited or corrupted; the header is fine) is refused
    when the loader opens it, with the shard's name, instead of crashing the embedding mid-run."""
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "data"
    prepare([str(write_txt_folder(tmp_path / "texts", make_docs(20)))], out, "bytes", val_fraction=0.2,
            shard_tokens=1000, num_workers=1)
    TokenLoader(out, "train", 2, 16)  # fine, and the scan is remembered
    shard = out / load_meta(out)["splits"]["train"]["shards"][1]
    data = bytearray(shard.read_bytes())
    data[HEADER_SIZE + 20 : HEADER_SIZE + 22] = (300).to_bytes(2, "little")  # vocab is 257
    shard.write_bytes(bytes(data))  # a new modification time: the remembered scan no longer applies
    with pytest.raises(UserError) as exc:
        TokenLoader(out, "train", 2, 16)
    message = str(exc.value)
    assert str(shard) in message and "token id 300" in message and "257" in message and "\n" not in message
    TokenLoader(out, "val", 2, 16)  # the other split is untouched


def test_loader_remembers_each_shard_scan(tmp_path, monkeypatch, prepared):
    from redline.data import shards as shards_module

    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(shards_module, "_max_tokens", {})
    TokenLoader(prepared, "train", 2, 16)
    cache = json.loads((tmp_path / "cache" / shards_module.MAX_TOKEN_CACHE).read_text())
    names = load_meta(prepared)["splits"]["train"]["shards"]
    assert sorted(cache) == sorted(str((prepared / n).resolve()) for n in names)
    assert all(cache[str((prepared / n).resolve())][2] == int(read_shard(prepared / n).max()) for n in names)

    def no_scan(*args, **kwargs):
        raise AssertionError("a remembered shard was scanned again")

    monkeypatch.setattr(shards_module, "_max_tokens", {})  # a new process: only the cache file remains
    monkeypatch.setattr(np.memmap, "max", no_scan)
    TokenLoader(prepared, "train", 2, 16)


# ----------------------------------------------------------------------------------------------------
# raw text for a training run


def test_raw_text_for_a_run_one_file(tmp_path):
    from redline.data.raw import prepare_raw_text

    text = "\n\n".join(make_docs(60, words=80))
    (tmp_path / "input.txt").write_text(text)
    out = prepare_raw_text(tmp_path / "input.txt", tmp_path / "runs" / "r" / "data", seq_len=256, vocab_size=300)
    meta = load_meta(out)
    assert meta["splits"]["val"]["tokens"] >= 2049 and meta["splits"]["train"]["tokens"] >= 257
    assert prepare_raw_text(tmp_path / "input.txt", out, seq_len=256) == out  # a resumed run: as it is
    TokenLoader(out, "val", 1, 256)


def test_raw_text_too_small_fails_before_tokenizer_training_and_leaves_nothing(tmp_path, monkeypatch):
    from redline.data import raw

    def no_training(*args, **kwargs):
        raise AssertionError("a tokenizer was trained on text that is too small")

    monkeypatch.setattr("redline.tokenizer.train_bpe", no_training)
    (tmp_path / "tiny.txt").write_text("a tiny corpus " * 10)
    with pytest.raises(UserError) as exc:
        raw.prepare_raw_text(tmp_path / "tiny.txt", tmp_path / "runs" / "r" / "data", seq_len=256)
    assert "140 bytes" in str(exc.value) and "seq_len 256" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "runs").exists()


def test_raw_text_too_few_tokens_after_tokenizing_leaves_nothing(tmp_path):
    from redline.data.raw import prepare_raw_text

    # 600 bytes are enough for seq_len 200 by the byte bound, but the BPE merges "ab " into one token: 200 tokens
    (tmp_path / "ab.txt").write_text("ab " * 200)
    with pytest.raises(UserError, match=r"gives \d+ tokens .* too few for seq_len 200"):
        prepare_raw_text(tmp_path / "ab.txt", tmp_path / "runs" / "r" / "data", seq_len=200, vocab_size=300)
    assert not (tmp_path / "runs").exists()


def test_train_on_too_little_text_is_one_line_and_writes_nothing(tmp_path, capsys):
    """`redline train --data.path TEXT` takes its data through prepare_raw_text: too little text is refused before
    a tokenizer is trained, and no run folder is left behind."""
    (tmp_path / "tiny.txt").write_text("a tiny corpus " * 10)
    code, _, err = run_cli(["train", "--data.path", str(tmp_path / "tiny.txt"), "max_steps=1",
                            f"out_dir={tmp_path / 'runs'}", "device=cpu"], capsys)
    assert code != 0 and "too little to train at seq_len" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_raw_text_bpe_has_the_models_vocabulary_unless_given(tmp_path, monkeypatch):
    from redline.config import TrainConfig, apply_preset
    from redline.training.loop import resolve_data

    asked = []

    def small_bpe(texts, vocab_size):  # records the size asked for; trains a small one, which is quicker
        asked.append(vocab_size)
        return train_bpe(texts, vocab_size=300)

    monkeypatch.setattr("redline.tokenizer.train_bpe", small_bpe)
    (tmp_path / "input.txt").write_text("\n\n".join(make_docs(60, words=80)))
    for preset, vocab_size in (("modern-124m", 0), ("gpt2-124m", 0), ("tiny", 0), ("modern-124m", 512)):
        cfg = TrainConfig()
        apply_preset(cfg, preset)
        cfg.data.path, cfg.data.vocab_size, cfg.seq_len = str(tmp_path / "input.txt"), vocab_size, 256
        resolve_data(cfg, tmp_path / f"{preset}-{vocab_size}")
    assert asked == [32768, 50304, 4096, 512]


# ----------------------------------------------------------------------------------------------------
# text that is not UTF-8


def latin1_inputs(folder: Path) -> tuple[Path, Path]:
    """A good .txt, a Latin-1 .txt ("café" with é = 0xE9 at byte 3), and a JSONL whose second line is Latin-1."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a_good.txt").write_text("plain text " * 40)
    (folder / "b_latin1.txt").write_bytes("café au lait ".encode("latin-1") * 40)
    lines = [json.dumps({"text": "fine"}).encode(), '{"text": "naïve"}'.encode("latin-1"),
             json.dumps({"text": "also fine"}).encode()]
    (folder / "c.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return folder / "b_latin1.txt", folder / "c.jsonl"


def test_non_utf8_is_an_error_naming_file_and_offset(tmp_path):
    latin, jsonl = latin1_inputs(tmp_path / "in")
    with pytest.raises(UserError) as exc:
        list(iter_documents([str(latin)]))
    assert f"{latin} is not UTF-8 text: byte 0xe9 at offset 3" in str(exc.value) and "--encoding-errors" in str(exc.value)
    offset = len(json.dumps({"text": "fine"})) + 1 + len('{"text": "na')
    with pytest.raises(UserError, match=rf"c\.jsonl:2 is not UTF-8 text: byte 0xef at offset {offset}"):
        list(iter_documents([str(jsonl)]))
    (tmp_path / "bin.txt").write_bytes(b"text\x00\x01\x02")
    with pytest.raises(UserError, match=r"bin\.txt is not UTF-8 text: byte 0x00 at offset 4 is a NUL byte"):
        list(iter_documents([str(tmp_path / "bin.txt")]))
    (tmp_path / "sur.jsonl").write_text('{"text": "half \\udc80 a pair"}\n')
    with pytest.raises(UserError, match=r"sur\.jsonl:1 holds .*surrogate"):
        list(iter_documents([str(tmp_path / "sur.jsonl")]))
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfwith a byte-order mark")
    assert list(iter_documents([str(tmp_path / "bom.txt")])) == ["with a byte-order mark"]


def test_non_utf8_replace_and_skip_say_what_they_did(tmp_path, capfd):
    latin1_inputs(tmp_path / "in")
    docs = list(iter_documents([str(tmp_path / "in")], encoding_errors="replace"))
    assert docs[1].startswith("caf\ufffd au lait") and json.loads('"na\ufffdve"') in docs[3]
    assert "2 document(s) were not UTF-8" in capfd.readouterr().err
    docs = list(iter_documents([str(tmp_path / "in")], encoding_errors="skip"))
    assert docs == ["plain text " * 40, "fine", "also fine"]
    assert "left out 2 document(s)" in capfd.readouterr().err


def test_cli_data_prepare_and_tokenizer_train_refuse_latin1(tmp_path, capsys):
    latin1_inputs(tmp_path / "in")
    for argv in (["data", "prepare", "--inputs", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--vocab-size",
                  "300", "--workers", "1"],
                 ["tokenizer", "train", "--inputs", str(tmp_path / "in"), "--out", str(tmp_path / "t"),
                  "--vocab-size", "300"]):
        code, _, err = run_cli(argv, capsys)
        last = err.strip().splitlines()[-1]
        assert code == 2 and "error: " in last and "b_latin1.txt is not UTF-8 text: byte 0xe9 at offset 3" in last
        assert "Traceback" not in err
        code, _, err = run_cli(argv + ["--encoding-errors", "skip"], capsys)
        assert code == 0 and "left out 2 document(s)" in err, err
    assert not (tmp_path / "o" / "meta.json").exists() or load_meta(tmp_path / "o")["encoding_errors"] == "skip"


@pytest.mark.slow
def test_train_on_one_text_file(tmp_path, capsys):
    """`redline train --data.path input.txt max_steps=3`: one document, and its end is the validation text."""
    text = "\n\n".join(make_docs(150, words=80))  # ~100 kB
    (tmp_path / "input.txt").write_text(text)
    argv = ["train", "--data.path", str(tmp_path / "input.txt"), "max_steps=3", f"out_dir={tmp_path / 'runs'}",
            "device=cpu", "batch_size=2", "eval_batches=2", "sample_tokens=0", "tensorboard=False", "compile=False",
            "data.vocab_size=512"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    (run,) = (tmp_path / "runs").iterdir()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("kind") == "eval" and r.get("loss") is not None for r in records)
    assert "val split: the last" in err
