"""A redline tokenizer as the files transformers and llama.cpp's converters read: tokenizer.json and
tokenizer_config.json.

- a BPE tokenizer (trained by redline or imported) is a `tokenizers` tokenizer already: its JSON as it is, and the
  special tokens, BOS/EOS and chat template it carries;
- the `bytes` tokenizer (id = byte, 256 = <|endoftext|>) becomes a byte-level BPE without merges whose 256 base
  tokens are the bytes in id order, which encodes every text to the same ids.
"""

from __future__ import annotations

import json

from redline.errors import UserError
from redline.tokenizer import EOT


def _bytes_tokenizer_json() -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = _byte_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # no regex split: with no merges every byte is its own token whatever the pre-tokenization
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    return tok.to_str(pretty=True)


def _byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character table (the ByteLevel pre-tokenizer's): printable Latin-1 bytes stand
    for themselves, the others are shifted to 256 and up, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    table, shift = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return [table[b] for b in range(256)]


def hf_tokenizer_files(tokenizer) -> dict[str, str]:
    """{"tokenizer.json": ..., "tokenizer_config.json": ...} for a redline tokenizer."""
    if tokenizer.name == "bpe":
        tokenizer_json = tokenizer.hf.to_str(pretty=True)
        config = dict(tokenizer.hf_config)
    elif tokenizer.name == "bytes":
        tokenizer_json, config = _bytes_tokenizer_json(), {}
    else:
        raise UserError(f"exporting the {tokenizer.name!r} tokenizer is not implemented; train the model with a BPE "
                        f"tokenizer (`redline tokenizer train`) or the bytes one")
    eot = json.loads(tokenizer_json)
    names = {t["id"]: t["content"] for t in eot.get("added_tokens", [])}
    vocab = (eot.get("model") or {}).get("vocab") or {}
    by_id = {i: t for t, i in vocab.items()} if isinstance(vocab, dict) else {}
    stop = tokenizer.stop_ids[0]
    config.setdefault("eos_token", names.get(stop, by_id.get(stop)))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **{k: v for k, v in config.items() if v is not None}}
    return {"tokenizer.json": tokenizer_json,
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n"}
