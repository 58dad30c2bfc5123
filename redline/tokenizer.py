"""Tokenizers: raw bytes, byte-level BPE (Hugging Face `tokenizers`), and GPT-2 (tiktoken), behind one interface.

Every kind has the same surface:
- `encode(text)` / `encode_batch(texts)` never add special tokens, and a literal "<|endoftext|>" inside a text is
  encoded as ordinary text (so a document can never forge a document boundary);
- `eot_id` is the end-of-text token that `redline data prepare` appends after each document;
- `identity` is a sha256 of the tokenizer's full definition (vocabulary, merges, specials, pre-tokenizer), stable
  across processes and machines, and written into every token shard so that shards and tokenizer can be checked
  against each other;
- `token_byte_lengths()` gives the UTF-8 bytes each token stands for (0 for specials), for bits per byte;
- `save(dir)` writes `redline_tokenizer.json` (kind, identity, sizes), plus `tokenizer.json` for BPE, so that
  `load_tokenizer(dir)` gets the same tokenizer back.

`load_tokenizer(spec)` takes "bytes", "gpt2", a tokenizer.json path, or a folder holding one of the above.

A Hugging Face tokenizer folder (tokenizer.json with tokenizer_config.json, as `redline import` copies it) also
brings what the model around it needs: its BOS/EOS tokens and whether encoding adds them (`encode(text,
add_special_tokens=True)` applies tokenizer.json's post-processor, as transformers does), the token ids that end
a generation (`stop_ids`, from generation_config.json on import), and its Jinja chat template (`chat_template`,
rendered by redline/chat). They are saved with it (tokenizer_config.json, as transformers reads it) and so travel
with every checkpoint; none of them changes `identity`, which is about how text maps to ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from redline.durable import write_atomic
from redline.errors import UserError

EOT = "<|endoftext|>"
# end-of-text tokens of common tokenizer.json files, tried in order when a loaded file lacks EOT
_OTHER_EOT_NAMES = ("<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
META_FILE = "redline_tokenizer.json"
HF_FILE = "tokenizer.json"
HF_CONFIG_FILE = "tokenizer_config.json"  # special tokens, add_bos_token, chat_template (transformers' layout)
HF_TEMPLATE_FILE = "chat_template.jinja"  # where transformers >= 4.50 saves the chat template instead
# a multimodal folder's processor template ({"chat_template": ...}), read where the tokenizer's files give none
HF_PROCESSOR_TEMPLATE_FILE = "chat_template.json"
HF_SPECIALS_FILE = "special_tokens_map.json"  # older transformers' special tokens, read over tokenizer_config's
# the keys of tokenizer_config.json redline reads and writes back
_HF_CONFIG_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "add_bos_token", "add_eos_token",
                   "chat_template")
# redline's own chat tokens (redline/chat/render.py): appended after a tokenizer's vocabulary by add_chat_tokens
CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")


def _sha256_json(obj) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Tokenizer:
    """Common interface; see the module docstring. Subclasses set name, vocab_size, eot_id and spec."""

    name: str  # kind: "bytes", "bpe" or "gpt2"
    vocab_size: int
    eot_id: int
    spec: str  # what load_tokenizer() needs to rebuild it ("" for a trained tokenizer not yet saved)

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a prompt to generate from, as transformers' `tokenizer(text)` gives them: with the special
        tokens the tokenizer itself adds to an input (an imported Llama tokenizer's BOS first). redline's own
        tokenizers add none."""
        return self.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def token_byte_lengths(self) -> np.ndarray:
        """(vocab_size,) int64: UTF-8 bytes each token decodes to; 0 for special tokens."""
        raise NotImplementedError

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (b"" for special tokens): part of a UTF-8 character where a character
        spans tokens, which decode([token]) can only show as U+FFFD. Logprobs report these (OpenAI's `bytes`)."""
        return self.decode([token]).encode("utf-8")

    @property
    def stop_ids(self) -> list[int]:
        """Token ids that end a generation: an imported model's EOS ids, else the end-of-text token."""
        return list(getattr(self, "_stop_ids", None) or [self.eot_id])

    @stop_ids.setter
    def stop_ids(self, ids: Sequence[int]) -> None:
        bad = [i for i in ids if not 0 <= int(i) < self.vocab_size]
        if bad:
            raise UserError(f"stop token ids {bad} are outside the tokenizer's {self.vocab_size} tokens")
        self._stop_ids = [int(i) for i in ids]

    @property
    def bos_id(self) -> int | None:
        """The beginning-of-sequence token, where the tokenizer has one."""
        return None

    # -- redline's chat tokens ---------------------------------------------------------------------------

    @property
    def chat_token_ids(self) -> dict[str, int] | None:
        """{"<|user|>": id, ...} once add_chat_tokens ran (the ids after the text vocabulary), else None."""
        return dict(getattr(self, "_chat_tokens", None) or {}) or None

    @property
    def text_vocab_size(self) -> int:
        """The vocabulary without redline's chat tokens (the ids text can encode to)."""
        return self.vocab_size - len(getattr(self, "_chat_tokens", None) or {})

    def add_chat_tokens(self) -> dict[str, int]:
        """Append redline's chat tokens (CHAT_TOKENS) as new ids after the vocabulary; does nothing when they are
        there already. Text never encodes to them (they are not in any merge table or byte alphabet), so
        `identity`, which is about how text maps to ids, does not change; vocab_size grows by len(CHAT_TOKENS)."""
        if not getattr(self, "_chat_tokens", None):
            base = self.vocab_size
            self._chat_tokens = {name: base + i for i, name in enumerate(CHAT_TOKENS)}
            self.vocab_size = base + len(CHAT_TOKENS)
        return dict(self._chat_tokens)

    def _without_chat_tokens(self, ids: Iterable[int]) -> list[int]:
        limit = self.text_vocab_size
        return [i for i in ids if i < limit]

    @property
    def chat_template(self) -> str | None:
        """The Jinja chat template source (redline/chat renders it), where the tokenizer has one."""
        return None

    def _definition(self) -> dict:
        """Everything that decides how text maps to ids, as plain JSON (hashed by `identity`)."""
        raise NotImplementedError

    @property
    def identity(self) -> str:
        if getattr(self, "_identity", None) is None:
            self._identity = _sha256_json(self._definition())
        return self._identity

    def save(self, directory: str | os.PathLike) -> Path:
        """Write the tokenizer into `directory` (created if needed); afterwards `spec` points there."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self._save_files(out)
        meta = {"kind": self.name, "identity": self.identity, "vocab_size": self.vocab_size, "eot_id": self.eot_id}
        if self.stop_ids != [self.eot_id]:
            meta["stop_ids"] = self.stop_ids
        if self.chat_token_ids:
            meta["chat_tokens"] = self.chat_token_ids
        write_atomic(out / META_FILE, json.dumps(meta, indent=2) + "\n")
        if self.name == "bpe":
            self.spec = str(out.resolve())
        return out

    def _save_files(self, out: Path) -> None:
        pass  # bytes and gpt2 need nothing beyond redline_tokenizer.json

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, eot_id={self.eot_id}, "
                f"identity={self.identity[:12]})")


# ----------------------------------------------------------------------------------------------------
# bytes


class ByteTokenizer(Tokenizer):
    """Token = UTF-8 byte (ids 0..255), plus <|endoftext|> at 256. Needs no files; about 1 token per byte."""

    name = "bytes"

    def __init__(self) -> None:
        self.vocab_size = 257
        self.eot_id = 256
        self.spec = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def token_byte_lengths(self) -> np.ndarray:
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        lengths[:256] = 1  # the end-of-text and chat tokens stand for no bytes
        return lengths

    def token_bytes(self, token: int) -> bytes:
        return bytes([token]) if 0 <= token < 256 else b""

    def _definition(self) -> dict:
        return {"kind": "bytes", "specials": {EOT: 256}}


# ----------------------------------------------------------------------------------------------------
# byte-level BPE (Hugging Face tokenizers)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's ByteLevel alphabet inverted: character -> the byte it stands for (printable Latin-1 bytes stand for
    themselves, the other 68 are mapped to U+0100 onwards in byte order; as `tokenizers`' ByteLevel and GPT-2's
    encoder.py define it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_LEVEL_DECODE = _byte_level_alphabet()


class BPETokenizer(Tokenizer):
    """Any Hugging Face `tokenizers.Tokenizer`; in practice a byte-level BPE made by `train_bpe`."""

    name = "bpe"

    def __init__(self, hf_tokenizer, spec: str = "", hf_config: dict | None = None) -> None:
        self.hf = hf_tokenizer
        # a literal "<|endoftext|>" in the text is ordinary text, as with tiktoken's encode_ordinary
        self.hf.encode_special_tokens = True
        self.vocab_size = self.hf.get_vocab_size(with_added_tokens=True)
        self.spec = spec
        # what tokenizer_config.json says: special tokens as strings, add_bos/eos_token, chat_template
        self.hf_config = _clean_hf_config(hf_config or {})
        self._with_specials = None  # a copy that reads special tokens written in the text (chat templates)
        configured_eos = self.hf_config.get("eos_token")
        for name in (EOT, *_OTHER_EOT_NAMES, configured_eos):
            eot = self.hf.token_to_id(name) if name else None
            if eot is not None:
                self.eot_id = eot
                break
        else:
            raise UserError(
                f"tokenizer {spec or '(in memory)'} has no end-of-text token ({EOT}); add it as a special token "
                f"or train one with `redline tokenizer train`"
            )
        if configured_eos and self.hf.token_to_id(configured_eos) is not None:
            self.stop_ids = [self.hf.token_to_id(configured_eos)]

    def __getstate__(self) -> dict:  # for spawned tokenizer processes; keeps encode_special_tokens
        return {"json": self.hf.to_str(), "spec": self.spec, "hf_config": self.hf_config,
                "stop_ids": self.stop_ids, "chat_tokens": bool(self.chat_token_ids)}

    def __setstate__(self, state: dict) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self.__init__(HFTokenizer.from_str(state["json"]), state["spec"], state.get("hf_config"))
        if state.get("chat_tokens"):
            self.add_chat_tokens()
        if "stop_ids" in state:
            self.stop_ids = state["stop_ids"]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in it are ordinary text. add_special_tokens: wrap the
        ids as tokenizer.json's post-processor says (e.g. Llama's BOS first), as transformers' `tokenizer(text)`."""
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_prompt(self, text: str) -> list[int]:
        """As transformers' `tokenizer(text)`: special tokens written in a prompt are those tokens (a prompt typed
        in a model's chat format works as it does there), and the post-processor's tokens are added."""
        return self.encode_with_specials(text, add_special_tokens=True)

    def encode_with_specials(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text` in which special tokens written out (e.g. "<|im_start|>") are those tokens, and
        nothing is added: how a rendered chat template is tokenized (transformers' apply_chat_template)."""
        if self._with_specials is None:
            from tokenizers import Tokenizer as HFTokenizer

            self._with_specials = HFTokenizer.from_str(self.hf.to_str())
            self._with_specials.encode_special_tokens = False
        return self._with_specials.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_with_specials_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """encode_with_specials's ids and each token's (start, end) character offsets in `text` (how the chat
        renderer maps a template's assistant spans onto tokens)."""
        self.encode_with_specials("")  # builds the specials-aware copy once
        encoding = self._with_specials.encode(text, add_special_tokens=False)
        return list(encoding.ids), list(encoding.offsets)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    @property
    def bos_id(self) -> int | None:
        bos = self.hf_config.get("bos_token")
        return self.hf.token_to_id(bos) if bos else None

    @property
    def chat_template(self) -> str | None:
        return self.hf_config.get("chat_template")

    def special_tokens_map(self) -> dict[str, str]:
        """{"bos_token": "<s>", "eos_token": "</s>", ...}: the names a chat template reads (as transformers
        passes them)."""
        return {k: v for k, v in self.hf_config.items() if k.endswith("_token") and isinstance(v, str)}

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # encode_batch_fast skips offset tracking; both run on all cores (rayon) inside the library
        encode = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)
        return [e.ids for e in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode(self._without_chat_tokens(ids), skip_special_tokens=True)

    def _json(self) -> dict:
        return json.loads(self.hf.to_str())

    def token_byte_lengths(self) -> np.ndarray:
        data = self._json()
        specials = {t["id"] for t in data.get("added_tokens", []) if t.get("special")}
        byte_level = (data.get("decoder") or {}).get("type") == "ByteLevel"
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.text_vocab_size):
            if i in specials:
                continue
            token = self.hf.id_to_token(i)
            if token is None:
                continue
            if byte_level:
                lengths[i] = len(token)  # one character of the ByteLevel alphabet per byte
            else:  # other decoders: approximate through the decoded text
                lengths[i] = len(self.hf.decode([i]).encode("utf-8"))
        return lengths

    def token_bytes(self, token: int) -> bytes:
        piece = self.hf.id_to_token(token) if 0 <= token < self.text_vocab_size else None
        if piece is None or self.hf.decode([token]) == "" and piece:  # a special token: skipped in decode
            return b""
        if self._byte_level:
            return bytes(_BYTE_LEVEL_DECODE.get(c, 0) for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):  # SentencePiece's byte fallback
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode("utf-8")  # SentencePiece's word-start mark is a space

    @property
    def _byte_level(self) -> bool:
        if not hasattr(self, "_byte_level_cached"):
            self._byte_level_cached = (self._json().get("decoder") or {}).get("type") == "ByteLevel"
        return self._byte_level_cached

    def _definition(self) -> dict:
        data = self._json()
        model = dict(data.get("model") or {})
        vocab = model.pop("vocab", {})
        merges = model.pop("merges", [])
        # tokenizers >= 0.20 writes merges as pairs, older versions as "a b" strings: hash one form
        merges = [m.split(" ", 1) if isinstance(m, str) else list(m) for m in merges]
        return {
            "kind": "bpe",
            "model": model,
            "vocab": sorted(vocab.items(), key=lambda kv: kv[1]) if isinstance(vocab, dict) else vocab,
            "merges": merges,
            "added_tokens": sorted((t["id"], t["content"], bool(t.get("special")))
                                   for t in data.get("added_tokens", [])),
            "normalizer": data.get("normalizer"),
            "pre_tokenizer": data.get("pre_tokenizer"),
            "decoder": data.get("decoder"),
        }

    def _save_files(self, out: Path) -> None:
        write_atomic(out / HF_FILE, self.hf.to_str(pretty=True))
        if self.hf_config:
            # transformers' generic fast tokenizer uses tokenizer.json as it is (a model-specific class may rebuild
            # parts of it), so that is the class named
            config = {"tokenizer_class": "PreTrainedTokenizerFast", **self.hf_config}
            write_atomic(out / HF_CONFIG_FILE, json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def train_bpe(texts: Iterable[str], vocab_size: int = 32768, min_frequency: int = 2) -> BPETokenizer:
    """Train a byte-level BPE (GPT-2 style pre-tokenization, all 256 bytes in the base alphabet, EOT special)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise UserError(f"vocab_size must be at least 257 (256 bytes + {EOT}), got {vocab_size}")
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    count = 0

    def counted(it):
        nonlocal count
        for t in it:
            count += 1
            yield t

    hf.train_from_iterator(counted(texts), trainer)
    if count == 0:
        raise UserError("no text to train the tokenizer on; give inputs with at least one non-empty document")
    return BPETokenizer(hf)


def _clean_hf_config(config: dict) -> dict:
    """The keys of a tokenizer_config.json redline keeps, special tokens as plain strings (transformers writes
    them as strings or as {"content": ...} objects) and the chat template as one string."""
    out = {}
    for key in _HF_CONFIG_KEYS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if key == "chat_template" and isinstance(value, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
            value = named.get("default") or next(iter(named.values()), None)
        if value is not None:
            out[key] = value
    return out


def read_hf_tokenizer_config(folder: Path) -> dict:
    """tokenizer_config.json of a tokenizer folder, with special_tokens_map.json's tokens over its own (older
    uploads name BOS and EOS there alone; transformers lets that file win) and chat_template.jinja's template where
    there is one, else a multimodal processor's chat_template.json's where the tokenizer's files give none."""
    config: dict = {}
    if (folder / HF_CONFIG_FILE).is_file():
        config = _json_object(folder / HF_CONFIG_FILE, "download or save the tokenizer again")
    if (folder / HF_SPECIALS_FILE).is_file():
        specials = _json_object(folder / HF_SPECIALS_FILE, "download or save the tokenizer again")
        config.update({k: v for k, v in specials.items() if k.endswith("_token") and v is not None})
    if (folder / HF_TEMPLATE_FILE).is_file():
        config["chat_template"] = (folder / HF_TEMPLATE_FILE).read_text(encoding="utf-8")
    elif not config.get("chat_template") and (folder / HF_PROCESSOR_TEMPLATE_FILE).is_file():
        template = _json_object(folder / HF_PROCESSOR_TEMPLATE_FILE, "download or save the processor again")
        config["chat_template"] = template.get("chat_template")
    return _clean_hf_config(config)


def _load_hf_file(path: Path) -> BPETokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    try:
        hf = HFTokenizer.from_file(str(path))
    except Exception as e:  # the library's message says what is malformed
        raise UserError(f"cannot load tokenizer {path}: {e}") from None
    folder = path.parent
    hf_config = read_hf_tokenizer_config(folder) if path.name == HF_FILE else {}
    tok = BPETokenizer(hf, spec=str(folder.resolve() if path.name == HF_FILE else path.resolve()),
                       hf_config=hf_config)
    if path.name == HF_FILE and (folder / META_FILE).is_file():
        stop_ids = _json_object(folder / META_FILE).get("stop_ids")
        if stop_ids:
            tok.stop_ids = stop_ids
    return tok


# ----------------------------------------------------------------------------------------------------
# GPT-2 (tiktoken)

# where tiktoken fetches the gpt2 encoding; it caches each file under sha1(url) in its cache folder
_GPT2_URLS = (
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
)
_GPT2_HOST = "openaipublic.blob.core.windows.net"


def tiktoken_cache_dir() -> str:
    """The folder tiktoken reads its cached files from (same rules as tiktoken.load.read_file_cached)."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return os.environ["TIKTOKEN_CACHE_DIR"]
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return os.environ["DATA_GYM_CACHE_DIR"]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _gpt2_files_cached(cache_dir: str) -> bool:
    return bool(cache_dir) and all(
        os.path.isfile(os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest())) for url in _GPT2_URLS
    )


def _can_reach(host: str, port: int = 443, timeout: float = 3.0) -> bool:
    """True when a TCP connection opens within `timeout` (DNS included: it runs in a thread we stop waiting on)."""
    result = [False]

    def probe():
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result[0] = True
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    return result[0]


def _gpt2_help(cache_dir: str) -> str:
    return (
        "run once on a machine with internet: `pip install tiktoken` and "
        "`TIKTOKEN_CACHE_DIR=DIR python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\"`, then copy DIR here and "
        f"set TIKTOKEN_CACHE_DIR=DIR (now: {cache_dir or 'caching disabled'}); or use --tokenizer bytes or a BPE"
    )


class TiktokenTokenizer(Tokenizer):
    """OpenAI's GPT-2 encoding through tiktoken (50257 tokens, <|endoftext|> = 50256)."""

    name = "gpt2"

    def __init__(self) -> None:
        try:
            import tiktoken
        except ImportError:
            raise UserError(
                "the gpt2 tokenizer needs tiktoken: `pip install 'redline[gpt2]'` (or `pip install tiktoken`)"
            ) from None
        cache_dir = tiktoken_cache_dir()
        # offline, tiktoken would try to download and could wait a long time: fail fast instead
        if not _gpt2_files_cached(cache_dir) and not _can_reach(_GPT2_HOST):
            raise UserError(f"the gpt2 tokenizer files are not in tiktoken's cache and the network is unreachable; "
                            f"{_gpt2_help(cache_dir)}")
        try:
            self.enc = tiktoken.get_encoding("gpt2")
        except Exception as e:
            raise UserError(f"cannot load the gpt2 tokenizer ({type(e).__name__}: {e}); "
                            f"{_gpt2_help(cache_dir)}") from None
        self.vocab_size = self.enc.n_vocab
        self.eot_id = self.enc.eot_token
        self.spec = "gpt2"

    def __getstate__(self) -> dict:  # tiktoken reloads its files from the cache in the new process
        return {"chat_tokens": bool(self.chat_token_ids)}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        if state.get("chat_tokens"):
            self.add_chat_tokens()

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.enc.encode_ordinary_batch(list(texts), num_threads=os.cpu_count() or 1)

    def decode(self, ids: Iterable[int]) -> str:
        return self.enc.decode([i for i in self._without_chat_tokens(ids) if i != self.eot_id])

    def token_byte_lengths(self) -> np.ndarray:
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.text_vocab_size):
            if i != self.eot_id:
                lengths[i] = len(self.enc.decode_single_token_bytes(i))
        return lengths

    def token_bytes(self, token: int) -> bytes:
        if token == self.eot_id or not 0 <= token < self.text_vocab_size:
            return b""
        return self.enc.decode_single_token_bytes(token)

    def _definition(self) -> dict:
        ranks = self.enc._mergeable_ranks  # bytes -> rank; no public accessor
        digest = hashlib.sha256()
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            digest.update(rank.to_bytes(4, "little") + len(token).to_bytes(2, "little") + token)
        return {"kind": "gpt2", "pattern": self.enc._pat_str, "ranks_sha256": digest.hexdigest(),
                "specials": self.enc._special_tokens}


# ----------------------------------------------------------------------------------------------------
# loading


def _json_object(path: Path, fix: str = "save the tokenizer again") -> dict:
    """A tokenizer folder's JSON file as a dict, or one line naming the file and what is wrong with it."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{path} is damaged (not UTF-8 text); {fix}") from None
    except ValueError as e:
        raise UserError(f"{path} is damaged ({e}); {fix}") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} is damaged (a JSON {type(value).__name__}, not an object); {fix}")
    return value


def load_tokenizer(spec: str | os.PathLike) -> Tokenizer:
    """"bytes" | "gpt2" | a tokenizer.json file | a folder with redline_tokenizer.json or tokenizer.json (with
    redline's chat tokens where the folder's redline_tokenizer.json lists them)."""
    tokenizer = _load_tokenizer(str(spec))
    meta_file = Path(str(spec)).expanduser() / META_FILE
    if meta_file.is_file():
        chat = _json_object(meta_file).get("chat_tokens")
        if chat:
            well_formed = isinstance(chat, dict) and all(isinstance(i, int) for i in chat.values())
            if (not well_formed or tokenizer.vocab_size + len(CHAT_TOKENS) - 1 != max(chat.values())
                    or set(chat) != set(CHAT_TOKENS)):
                raise UserError(f"{meta_file} lists chat tokens {chat} that do not follow the tokenizer's "
                                f"{tokenizer.vocab_size} tokens; it is damaged, save the tokenizer again")
            tokenizer.add_chat_tokens()
    return tokenizer


def _load_tokenizer(spec: str) -> Tokenizer:
    if spec == "bytes":
        return ByteTokenizer()
    if spec == "gpt2":
        return TiktokenTokenizer()
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / META_FILE).is_file():
            kind = _json_object(path / META_FILE).get("kind")
            if not isinstance(kind, str):
                raise UserError(f"{path / META_FILE} is damaged (kind {kind!r}); save the tokenizer again")
            if kind in ("bytes", "gpt2"):
                return _load_tokenizer(kind)
        if (path / HF_FILE).is_file():
            return _load_hf_file(path / HF_FILE)
        if (path / "tokenizer").is_dir():  # a checkpoint (an imported model's too) keeps its tokenizer there
            return _load_tokenizer(str(path / "tokenizer"))
        raise UserError(f"folder {path} holds no {HF_FILE} or {META_FILE}; give a tokenizer folder, a checkpoint "
                        f"folder, 'bytes' or 'gpt2'")
    if path.is_file():
        return _load_hf_file(path)
    raise UserError(f"unknown tokenizer {spec!r}: use 'bytes', 'gpt2', or the path of a tokenizer.json "
                    f"(or of a folder holding one, e.g. made by `redline tokenizer train`)")
