"""Raw text given straight to `redline train --data.path TEXT`: checked, tokenized and prepared for that run.

`prepare_raw_text` is the training loop's whole data step for raw text (training/loop.py resolve_data; a prepared
folder is used as it is):
1. before anything is trained or written, the text is checked to be large enough for the run's seq_len: every
   tokenizer redline uses gives at most one token per UTF-8 byte, plus one end-of-text token per document, so
   fewer than 2 × (seq_len + 1) of those cannot fill one window in each of the train and val splits. Only the
   first documents are read (until there are enough bytes), so a large corpus costs nothing here;
2. a byte-level BPE is trained on it (unless a tokenizer is named);
3. `prepare` writes the shards into the run's data folder, with at least seq_len + 1 val tokens whenever the text
   has twice that (a single document's end becomes val);
4. each split is checked to hold one window; if one does not, the folder and any run folder this call created
   are removed again, so a failed start leaves nothing behind.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from redline.data.prepare import DEFAULT_MIN_VAL_TOKENS, first_missing, is_prepared, load_meta, prepare
from redline.data.sources import iter_documents
from redline.errors import UserError
from redline.tokenizer import Tokenizer

TOKENIZER_TRAIN_BYTES = 200_000_000  # the BPE trained for a run sees the first this-many bytes of the text


def prepare_raw_text(path: str | Path, out: str | Path, seq_len: int, tokenizer: str | Tokenizer | None = None,
                     vocab_size: int = 4096, encoding_errors: str = "strict") -> Path:
    """A prepared folder at `out` for the raw text at `path` (a file or a folder of them), ready to train at
    `seq_len`; an existing prepared `out` (a resumed run) is returned as it is. tokenizer: a tokenizer, or what
    load_tokenizer takes (`bytes`, `gpt2`, a tokenizer.json path); None: a BPE of vocab_size trained on the text."""
    from redline.tokenizer import load_tokenizer, train_bpe

    out = Path(out)
    if is_prepared(out):
        return out
    if seq_len <= 0:
        raise UserError(f"seq_len must be positive, got {seq_len}")
    check_enough_text(path, seq_len, encoding_errors)
    created = first_missing(out)
    try:
        if isinstance(tokenizer, Tokenizer):
            tok = tokenizer
        elif tokenizer:
            tok = load_tokenizer(tokenizer)
        else:
            print(f"redline: training a {vocab_size}-token BPE on {path}", file=sys.stderr)
            tok = train_bpe(_capped(iter_documents([str(path)], encoding_errors=encoding_errors),
                                    TOKENIZER_TRAIN_BYTES), vocab_size=vocab_size)
        prepare([str(path)], out, tok, min_val_tokens=max(seq_len + 1, DEFAULT_MIN_VAL_TOKENS),
                encoding_errors=encoding_errors)
        meta = load_meta(out)
        sizes = {split: meta["splits"][split]["tokens"] for split in ("train", "val")}
        if min(sizes.values()) < seq_len + 1:
            raise UserError(f"{path} gives {sum(sizes.values()):,} tokens (train {sizes['train']:,}, val "
                            f"{sizes['val']:,}), too few for seq_len {seq_len}: each split needs {seq_len + 1}; give "
                            f"more text or a shorter seq_len")
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        elif is_prepared(out):  # an empty folder before, prepared by this call
            shutil.rmtree(out, ignore_errors=True)
        raise
    return out


def check_enough_text(path: str | Path, seq_len: int, encoding_errors: str = "strict") -> None:
    """UserError when the text at `path` cannot give seq_len + 1 tokens to each of train and val whatever the
    tokenizer (at most one token per byte, plus one per document). Reads only until it has seen enough."""
    need = 2 * (seq_len + 1)
    seen = documents = 0
    for doc in iter_documents([str(path)], encoding_errors=encoding_errors):
        documents += 1
        seen += len(doc.encode("utf-8")) + 1
        if seen >= need:
            return
    raise UserError(f"{path} holds {seen - documents:,} bytes of text in {documents:,} document(s), at most "
                    f"{seen:,} tokens: too little to train at seq_len {seq_len}, whose train and val splits need "
                    f"{seq_len + 1} tokens each ({need:,} in all); give more text or a shorter seq_len")


def _capped(documents, max_bytes: int) -> Iterator[str]:
    seen = 0
    for doc in documents:
        yield doc
        seen += len(doc.encode("utf-8"))
        if seen >= max_bytes:
            return
