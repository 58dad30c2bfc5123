"""A GGUF file's tokenizer metadata <-> a `tokenizers` tokenizer.

GGUF (llama.cpp's format) keeps the vocabulary as arrays under `tokenizer.ggml.*`, in one of two shapes:
- "gpt2": byte-level BPE. `tokens` spelled in GPT-2's byte alphabet, `merges` as "a b" strings, and `pre` naming
  the regex that splits text before the merges (GPT-2's, Llama 3's, Qwen2's, GPT-4o's o200k (GPT-OSS's), SmolLM's
  digits-apart, ...);
- "llama": SentencePiece-style BPE. `tokens` with "▁" for spaces and <0xNN> byte tokens (byte fallback), and
  `scores`: no merges; llama.cpp merges the adjacent pair whose concatenation scores highest, so the merges are
  recovered from the scores the same way.
Token types mark control (special), user-defined (added) and unused tokens.

redline writes these arrays (llama.cpp and transformers' GGUF loader read them) and also the exact tokenizer.json
under `tokenizer.huggingface.json`, which an import prefers when it is there. Pre-tokenizers redline does not know
by name are an error that says to pass the model's tokenizer.json instead.
"""

from __future__ import annotations

import json

from redline.errors import UserError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # gguf.TokenType
HF_JSON_KEY = "tokenizer.huggingface.json"

# the split regexes of the byte-level pre-tokenizers by their llama.cpp names (each well known: OpenAI's cl100k
# pattern as Llama 3 uses it, and Qwen2's variant of it that keeps digits apart)
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# OpenAI's o200k pattern (GPT-4o's, and GPT-OSS's o200k_harmony tokenizer): llama.cpp's "gpt-4o", which its converter
# writes for GPT-OSS (its get_vocab_base_pre hash of that tokenizer)
_O200K_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "gpt-4o": _O200K_SPLIT}
GPT2_PRES = ("gpt-2", "default")  # GPT-2's own regex (the ByteLevel pre-tokenizer's)
DIGITS_PRES = ("smollm", "starcoder")  # every digit apart, then GPT-2's regex


def _byte_level_pre_tokenizer(pre: str):
    from tokenizers import Regex, pre_tokenizers

    if pre in GPT2_PRES:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in DIGITS_PRES:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in _SPLITS:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    known = sorted({*GPT2_PRES, *DIGITS_PRES, *_SPLITS})
    raise UserError(f"the GGUF's tokenizer splits text with pre-tokenizer {pre!r}, which redline does not know "
                    f"(it knows {', '.join(known)}); pass the model's tokenizer.json with --tokenizer")


def _merges_from_scores(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """SentencePiece merges from piece scores: every split of a normal token into two vocabulary pieces, the
    splits of higher-scoring tokens first (llama.cpp's rule for a vocabulary without merges)."""
    ids = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for i, token in enumerate(tokens):
        if types[i] != NORMAL or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[i], ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def tokenizer_from_gguf(fields: dict):
    """(tokenizers.Tokenizer, tokenizer_config dict) from a GGUF's metadata (name -> value)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = fields.get("tokenizer.ggml.model")
    tokens = list(fields.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise UserError("the GGUF has no tokenizer (tokenizer.ggml.tokens); pass one with --tokenizer")
    types = list(fields.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))

    def named(key):
        i = fields.get(f"tokenizer.ggml.{key}")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    config = {"bos_token": named("bos_token_id"), "eos_token": named("eos_token_id"),
              "unk_token": named("unknown_token_id"), "pad_token": named("padding_token_id"),
              "add_bos_token": bool(fields.get("tokenizer.ggml.add_bos_token", kind == "llama")),
              "add_eos_token": bool(fields.get("tokenizer.ggml.add_eos_token", False)),
              "chat_template": fields.get("tokenizer.chat_template")}
    config = {k: v for k, v in config.items() if v is not None}
    if HF_JSON_KEY in fields:
        return Tokenizer.from_str(fields[HF_JSON_KEY]), config

    if kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges") or []]
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        tok.pre_tokenizer = _byte_level_pre_tokenizer(fields.get("tokenizer.ggml.pre", "default"))
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama":
        scores = list(fields.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
        unk = config.get("unk_token")
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                                   merges=_merges_from_scores(tokens, scores, types), unk_token=unk,
                                   byte_fallback=True, fuse_unk=True))
        prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first" if prefix else "never",
                                                     split=False)
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    else:
        raise UserError(f"the GGUF's tokenizer model {kind!r} is not supported (redline reads gpt2 and llama); "
                        f"pass the model's tokenizer.json with --tokenizer")
    tok.add_tokens([AddedToken(t, special=types[i] == CONTROL, normalized=False)
                    for i, t in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED)])
    bos = config.get("bos_token") if config.get("add_bos_token") else None
    eos = config.get("eos_token") if config.get("add_eos_token") else None
    if bos or eos:  # BOS before (and EOS after) each sequence, as llama.cpp's add_bos/add_eos flags say
        head, tail = [bos] if bos else [], [eos] if eos else []
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join([*head, "$A", *tail]), pair=" ".join([*head, "$A", *tail, *head, "$B:1", *tail]),
            special_tokens=[(t, tokens.index(t)) for t in dict.fromkeys(head + tail)])
    return tok, config


# ----------------------------------------------------------------------------------------------------
# writing


def _pre_name(pre_tokenizer: dict | None) -> str:
    """llama.cpp's name for a byte-level pre-tokenizer (the ones _byte_level_pre_tokenizer reads), or "default"
    (then only the tokenizer.huggingface.json an import prefers is exact)."""
    if not pre_tokenizer:
        return "default"
    if pre_tokenizer.get("type") == "ByteLevel" and pre_tokenizer.get("use_regex", True):
        return "gpt-2"
    parts = pre_tokenizer.get("pretokenizers") or []
    kinds = [p.get("type") for p in parts]
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits"):
        return "smollm"
    if kinds == ["Split", "ByteLevel"]:
        pattern = (parts[0].get("pattern") or {}).get("Regex")
        for name, split in (("llama-bpe", _LLAMA3_SPLIT), ("qwen2", _QWEN2_SPLIT), ("gpt-4o", _O200K_SPLIT)):
            if pattern == split:
                return name
    return "default"


def gguf_vocab(tokenizer, vocab_size: int) -> dict:
    """The `tokenizer.*` metadata of a redline BPE tokenizer for a model of vocab_size rows (unused rows are
    [PADn] tokens of type unused, as llama.cpp's converter writes them)."""
    if tokenizer.name != "bpe":
        from redline.interop.tokenizer_files import hf_tokenizer_files
        from redline.tokenizer import BPETokenizer
        from tokenizers import Tokenizer

        tokenizer = BPETokenizer(Tokenizer.from_str(hf_tokenizer_files(tokenizer)["tokenizer.json"]))
    data = json.loads(tokenizer.hf.to_str())
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise UserError(f"a GGUF holds BPE vocabularies; this tokenizer's model is {model.get('type')}")
    specials = {t["id"]: t for t in data.get("added_tokens", [])}
    tokens = [None] * max(vocab_size, tokenizer.vocab_size)
    for token, i in model["vocab"].items():
        tokens[i] = token
    for i, t in specials.items():
        tokens[i] = t["content"]
    types = []
    byte_fallback = bool(model.get("byte_fallback"))
    for i, token in enumerate(tokens):
        if token is None:
            tokens[i], kind = f"[PAD{i}]", UNUSED
        elif i in specials:
            kind = CONTROL if specials[i].get("special") else USER_DEFINED
        elif byte_fallback and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            kind = BYTE
        elif token == model.get("unk_token"):
            kind = UNKNOWN
        else:
            kind = NORMAL
        types.append(kind)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    out = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
           HF_JSON_KEY: tokenizer.hf.to_str()}
    if byte_fallback:  # SentencePiece style: scores that reproduce the merge order (a merge's result ranks higher)
        rank = {"".join(m.split(" ", 1)): r for r, m in enumerate(merges)}
        out["tokenizer.ggml.model"] = "llama"
        out["tokenizer.ggml.scores"] = [-float(rank.get(t, len(merges) + i)) for i, t in enumerate(tokens)]
        meta = data.get("pre_tokenizer") or {}
        out["tokenizer.ggml.add_space_prefix"] = meta.get("prepend_scheme", "first") != "never"
    else:
        out["tokenizer.ggml.model"] = "gpt2"
        out["tokenizer.ggml.merges"] = merges
        out["tokenizer.ggml.pre"] = _pre_name(data.get("pre_tokenizer"))
    config = tokenizer.hf_config
    ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.stop_ids[0]}
    # GGUF has one end-of-sequence id; llama.cpp also stops at the end-of-turn and end-of-message ids, where a
    # model with several stop ids (Llama 3's <|end_of_text|>, <|eot_id|>, <|eom_id|>) keeps the others
    ids.update(zip(("eot_token_id", "eom_token_id"), tokenizer.stop_ids[1:3]))
    for key, token in (("unknown_token_id", config.get("unk_token")), ("padding_token_id", config.get("pad_token"))):
        ids[key] = tokenizer.token_to_id(token) if token else None
    out.update({f"tokenizer.ggml.{k}": v for k, v in ids.items() if v is not None})
    processor = json.dumps(data.get("post_processor") or {})
    bos = config.get("bos_token")
    out["tokenizer.ggml.add_bos_token"] = bool(bos) and f'"{bos}"' in processor
    if tokenizer.chat_template:
        out["tokenizer.chat_template"] = tokenizer.chat_template
    return out
