"""Tokenizers: round trips, identity hashes, byte lengths, saving/loading, the gpt2 offline error, the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from redline import cli
from redline.errors import UserError
from redline.tokenizer import ByteTokenizer, load_tokenizer, train_bpe

SAMPLES = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Ünïcödé: naïve café, 日本語のテキスト, emoji 🚀🔥, Ελληνικά, русский текст.",
    "  leading spaces\tand tabs\nand newlines\r\n and  double  spaces ",
    "numbers 1234567890 3.14159 and code: def f(x): return x ** 2",
    "a literal <|endoftext|> inside a text stays text",
    "",
]


def corpus() -> list[str]:
    """A few KB of mixed text, unicode included."""
    words = ("the model reads tokens and predicts the next one while loss falls over many steps "
             "naïve café 日本語 テキスト données über straße 🚀").split()
    rng = np.random.default_rng(0)
    docs = [" ".join(words[i] for i in rng.integers(0, len(words), 120)) for _ in range(40)]
    return docs + SAMPLES[:-1]


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(corpus(), vocab_size=400)


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


# ----------------------------------------------------------------------------------------------------
# round trips and byte lengths


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_round_trip(kind, bpe):
    tok = ByteTokenizer() if kind == "bytes" else bpe
    for text in SAMPLES:
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text
    assert tok.encode_batch(SAMPLES) == [tok.encode(t) for t in SAMPLES]


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_literal_special_is_plain_text_and_eot_decodes_to_nothing(kind, bpe):
    tok = ByteTokenizer() if kind == "bytes" else bpe
    assert tok.eot_id not in tok.encode("x <|endoftext|> y")
    assert tok.decode(tok.encode("ab") + [tok.eot_id] + tok.encode("cd")) == "abcd"


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_token_byte_lengths_sum_to_utf8_length(kind, bpe):
    tok = ByteTokenizer() if kind == "bytes" else bpe
    lengths = tok.token_byte_lengths()
    assert lengths.shape == (tok.vocab_size,) and lengths[tok.eot_id] == 0
    for text in SAMPLES:
        ids = tok.encode(text) + [tok.eot_id]
        assert int(lengths[ids].sum()) == len(text.encode("utf-8"))


def test_bpe_compresses_and_has_the_asked_vocab(bpe):
    big = train_bpe(corpus() * 3, vocab_size=300)
    assert big.vocab_size == 300  # enough text for every merge
    text = " ".join(corpus())
    assert len(bpe.encode(text)) < len(text.encode("utf-8")) / 2
    assert bpe.name == "bpe" and bpe.eot_id == bpe.hf.token_to_id("<|endoftext|>")


def test_bpe_too_small_vocab_is_a_user_error():
    with pytest.raises(UserError, match="at least 257"):
        train_bpe(["abc"], vocab_size=100)


# ----------------------------------------------------------------------------------------------------
# identity, save and load


def test_identity_is_stable_and_distinguishes(bpe, tmp_path):
    again = train_bpe(corpus(), vocab_size=400)
    assert again.identity == bpe.identity  # deterministic training, same definition
    other = train_bpe(corpus(), vocab_size=350)
    assert other.identity != bpe.identity
    assert ByteTokenizer().identity == ByteTokenizer().identity != bpe.identity
    assert len(bpe.identity) == 64 and int(bpe.identity, 16) >= 0

    # another process computes the same hash from the saved files
    bpe.save(tmp_path / "tok")
    code = f"from redline.tokenizer import load_tokenizer; print(load_tokenizer({str(tmp_path / 'tok')!r}).identity)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == bpe.identity


def test_save_and_load(bpe, tmp_path):
    folder = tmp_path / "bpe"
    bpe.save(folder)
    assert (folder / "tokenizer.json").is_file()
    meta = json.loads((folder / "redline_tokenizer.json").read_text())
    assert meta["kind"] == "bpe" and meta["identity"] == bpe.identity
    for spec in (folder, folder / "tokenizer.json", bpe.spec):
        loaded = load_tokenizer(str(spec))
        assert loaded.identity == bpe.identity and loaded.vocab_size == bpe.vocab_size
        assert loaded.encode(SAMPLES[1]) == bpe.encode(SAMPLES[1])
    ByteTokenizer().save(tmp_path / "bytes")
    assert load_tokenizer(str(tmp_path / "bytes")).name == "bytes"
    bpe.save(tmp_path / "checkpoint" / "tokenizer")  # a checkpoint's folder: its tokenizer/ inside
    assert load_tokenizer(str(tmp_path / "checkpoint")).identity == bpe.identity


def test_load_errors(tmp_path):
    with pytest.raises(UserError, match="unknown tokenizer 'nope'.*bytes.*gpt2"):
        load_tokenizer("nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no tokenizer.json"):
        load_tokenizer(str(tmp_path / "empty"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot load tokenizer"):
        load_tokenizer(str(tmp_path / "bad.json"))


@pytest.mark.parametrize("name,content,fragment", [
    ("redline_tokenizer.json", b"[1, 2]", "a JSON list, not an object"),
    ("redline_tokenizer.json", b'{"kind": "bpe\xff"}', "not UTF-8 text"),
    ("redline_tokenizer.json", b'{"vocab_size": 3}', "kind None"),
    ("redline_tokenizer.json", b'{"kind": "bpe", "chat_tokens": [1, 2]}', "lists chat tokens"),
    ("tokenizer_config.json", b'"a string"', "a JSON str, not an object"),
])
def test_damaged_tokenizer_folder_files_are_one_line(bpe, tmp_path, name, content, fragment):
    folder = tmp_path / "bpe"
    bpe.save(folder)
    (folder / name).write_bytes(content)
    with pytest.raises(UserError, match=re.escape(fragment)) as e:
        load_tokenizer(str(folder))
    assert name in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------------------
# gpt2


def _gpt2_or_skip():
    try:
        return load_tokenizer("gpt2")
    except UserError as e:
        pytest.skip(f"gpt2 files unavailable offline: {e}")


def test_gpt2_round_trip_when_available():
    tok = _gpt2_or_skip()
    assert tok.vocab_size == 50257 and tok.eot_id == 50256
    assert tok.encode("Hello world") == [15496, 995]
    for text in SAMPLES:
        assert tok.decode(tok.encode(text)) == text
        assert int(tok.token_byte_lengths()[tok.encode(text)].sum()) == len(text.encode())


def test_gpt2_offline_error_is_fast_and_explains(tmp_path, monkeypatch):
    pytest.importorskip("tiktoken")
    import time

    import redline.tokenizer as tokenizer_module

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty: the files are not there
    monkeypatch.setattr(tokenizer_module, "_can_reach", lambda *a, **k: False)  # as if offline, even when online
    start = time.perf_counter()
    with pytest.raises(UserError, match="TIKTOKEN_CACHE_DIR") as exc:
        load_tokenizer("gpt2")
    assert time.perf_counter() - start < 5
    assert "pip install tiktoken" in str(exc.value) and "\n" not in str(exc.value)


# ----------------------------------------------------------------------------------------------------
# CLI


def test_cli_tokenizer_train_and_info(tmp_path, capsys):
    texts = tmp_path / "texts"
    texts.mkdir()
    for i, doc in enumerate(corpus()):
        (texts / f"{i:03d}.txt").write_text(doc)
    code, out, err = run_cli(["tokenizer", "train", "--inputs", str(texts), "--vocab-size", "300",
                              "--out", str(tmp_path / "tok")], capsys)
    assert code == 0, err
    record = json.loads(out.strip().splitlines()[-1])
    assert record["vocab_size"] == 300 and record["bytes_per_token"] > 1.0
    assert record["identity"] == load_tokenizer(str(tmp_path / "tok")).identity

    code, out, err = run_cli(["tokenizer", "train", "--inputs", str(texts), "--out", str(tmp_path / "tok")], capsys)
    assert code == 2 and "already holds a tokenizer" in err  # no silent overwrite

    code, out, _ = run_cli(["tokenizer", "info", "bytes"], capsys)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["vocab_size"] == 257


def test_cli_tokenizer_bad_input(tmp_path, capsys):
    code, _, err = run_cli(["tokenizer", "train", "--inputs", str(tmp_path / "missing"), "--out", str(tmp_path)],
                           capsys)
    assert code == 2 and "does not exist" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["tokenizer", "frobnicate"], capsys)
    assert code == 2 and "unknown subcommand" in err
    code, _, _ = run_cli(["tokenizer", "train", "--no-such-flag"], capsys)
    assert code == 2
