"""A redline tokenizer as the files transformers and llama.cpp's converters read: tokenizer.json and
tokenizer_config.json.

- a BPE tokenizer (trained by redline or imported) is a `tokenizers` tokenizer already: its JSON as it is, and the
  special tokens, BOS/EOS and chat template it carries;
- the `bytes` tokenizer (id = byte, 256 = <|endoftext|>) becomes a byte-level BPE without merges whose 256 base
  tokens are the bytes in id order, which encodes every text to the same ids;
- the `gpt2` tokenizer (tiktoken) becomes the byte-level BPE it is: tiktoken keeps only each token's rank, and the
  merge that made a token is recovered by running BPE on its bytes with the lower ranks alone, which leaves exactly
  two parts (the approach of tiktoken's own educational module).
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


# GPT-2's split regex as tiktoken versions spell it; the ByteLevel pre-tokenizer applies the same one
_GPT2_PATTERNS = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                  r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def _bpe_parts(token: bytes, ranks: dict[bytes, int], below: int) -> list[bytes]:
    """BPE on token's bytes using only merges whose result ranks below `below`."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < below and (best is None or rank < best[0]):
                best = (rank, i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def tiktoken_tokenizer_json(ranks: dict[bytes, int], specials: dict[str, int], pattern: str) -> str:
    """tokenizer.json of a tiktoken encoding (token bytes -> rank = id, special tokens, split regex)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    alphabet = _byte_alphabet()

    def spell(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = _bpe_parts(token, ranks, rank)
        if len(parts) != 2:
            raise UserError(f"the tiktoken encoding's token {token!r} (rank {rank}) is not the merge of two lower "
                            f"tokens; it cannot be written as a BPE tokenizer.json")
        merges.append((spell(parts[0]), spell(parts[1])))
    tok = Tokenizer(models.BPE(vocab={spell(t): r for t, r in ranks.items()}, merges=merges))
    if pattern in _GPT2_PATTERNS:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                              use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    for name, i in sorted(specials.items(), key=lambda kv: kv[1]):
        if tok.get_vocab_size(with_added_tokens=True) != i:
            raise UserError(f"special token {name} has id {i}, not the next free one; it cannot be written as a "
                            f"tokenizer.json")
        tok.add_special_tokens([AddedToken(name, special=True, normalized=False)])
    return tok.to_str(pretty=True)


def hf_tokenizer_files(tokenizer) -> dict[str, str]:
    """{"tokenizer.json": ..., "tokenizer_config.json": ...} for a redline tokenizer."""
    if tokenizer.name == "bpe":
        tokenizer_json = tokenizer.hf.to_str(pretty=True)
        config = dict(tokenizer.hf_config)
    elif tokenizer.name == "bytes":
        tokenizer_json, config = _bytes_tokenizer_json(), {}
    elif tokenizer.name == "gpt2":
        enc = tokenizer.enc  # tiktoken keeps these private; they are the encoding's whole definition
        tokenizer_json, config = tiktoken_tokenizer_json(enc._mergeable_ranks, enc._special_tokens, enc._pat_str), {}
    else:
        raise UserError(f"exporting the {tokenizer.name!r} tokenizer is not implemented")
    eot = json.loads(tokenizer_json)
    names = {t["id"]: t["content"] for t in eot.get("added_tokens", [])}
    vocab = (eot.get("model") or {}).get("vocab") or {}
    by_id = {i: t for t, i in vocab.items()} if isinstance(vocab, dict) else {}
    stop = tokenizer.stop_ids[0]
    config.setdefault("eos_token", names.get(stop, by_id.get(stop)))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **{k: v for k, v in config.items() if v is not None}}
    return {"tokenizer.json": tokenizer_json,
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n"}
