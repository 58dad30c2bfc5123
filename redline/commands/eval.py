"""`redline eval`: loss, perplexity and bits per byte of a checkpoint on a data set's validation split.

With --kv-cache-dtypes it also scores sequences of the split through the inference engine, token by token, as
generation runs them (prefill, then one cached decode step per token, compiled and captured on a GPU), once per
KV-cache dtype: what an FP8 cache costs in loss and in next-token agreement, measured against the full forward
pass of the same weights on the same tokens."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch


@dataclass
class EvalConfig:
    checkpoint: str
    """A checkpoint folder (RUN/checkpoints/step_N) or a run directory (its newest checkpoint)."""
    data: str | None = None
    """What to score: a prepared shard folder (its `split`), or text as `redline data prepare` reads it (.txt,
    .jsonl, .parquet files, folders, hf:NAME), tokenized now with the checkpoint's tokenizer and scored whole (None:
    the data the run was trained on)."""
    split: Literal["val", "train"] = "val"
    """Which split to evaluate."""
    batches: int = 50
    """Micro-batches to evaluate (at most the split: a smaller one is read once, not repeated)."""
    batch_size: int = 8
    """Sequences per micro-batch."""
    seq_len: int = 0
    """Sequence length (0: the training run's)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to evaluate."""
    kv_cache_dtypes: tuple[Literal["auto", "fp8"], ...] = ()
    """Also score sequences through the KV-cache engine with each of these caches (auto: the model's dtype; fp8:
    float8_e4m3fn with a scale per token and kv head), e.g. `--kv-cache-dtypes auto fp8`."""
    kv_batches: int = 2
    """Micro-batches scored through the cache (every token is a decode step: slower than the plain evaluation)."""
    decode_from: int = 0
    """Tokens of each sequence prefilled before the token-by-token decoding (0: half the sequence)."""


def kv_cache_quality(model, batches, dtypes, decode_from: int) -> list[dict]:
    """Score each sequence of `batches` ((x, y) pairs) through the inference engine once per KV-cache dtype, and
    through the plain forward pass of the same weights (in the engine's dtype).

    -> a row per dtype: mean loss of the decoded positions (the tokens after the first decode_from) with that
    cache and with the full forward, their difference, and how often the cache's argmax next token equals the
    full forward's."""
    from redline.inference.engine import InferenceEngine
    from redline.model import logprobs_of

    # (B, T) tokens: T may be the whole context; rows whose targets are -1 repeat windows of a short split
    rows = [x[(y >= 0).any(1)].cpu() for x, y in batches]
    rows = [r for r in rows if len(r)]
    results, reference = [], None
    for dtype in dtypes:
        engine = InferenceEngine(model, kv_cache_dtype=dtype)
        model = engine.model  # the engine's dtype: the next engine and the reference use the same weights
        if reference is None:  # the full forward pass, in the dtype every engine computes in
            with torch.no_grad():
                reference = []
                for tokens in rows:
                    # a prefix-LM's (model.prefix_lm; reference_window's reference): the prefilled tokens are the
                    # prefix, as the engine takes them
                    prefix = (torch.full((len(tokens),), decode_from)
                              if model.cfg.prefix_lm or model.cfg.reference_window else None)
                    logits = model(tokens[:, :-1].to(engine.device),
                                   prefix_len=None if prefix is None else prefix.to(engine.device))
                    logits = logits[:, decode_from - 1:].float()
                    targets = tokens[:, decode_from:].to(engine.device)
                    reference.append((logprobs_of(logits, targets).cpu(),
                                      logits.argmax(-1).cpu()))
        losses, ref_losses, agree, count = 0.0, 0.0, 0, 0
        for tokens, (ref_logp, ref_pick) in zip(rows, reference):
            logp, pick = engine.score(tokens, decode_from)
            losses -= logp.double().sum().item()
            ref_losses -= ref_logp.double().sum().item()
            agree += (pick == ref_pick).sum().item()
            count += logp.numel()
        engine.release()
        results.append({"kv_cache_dtype": dtype, "engine_dtype": str(engine.dtype).removeprefix("torch."),
                        "loss": losses / count, "loss_full_forward": ref_losses / count,
                        "loss_increase": (losses - ref_losses) / count, "top1_agreement": agree / count,
                        "tokens": count, "kv_bytes_per_token": engine.kv_bytes_per_token()})
    return results


def text_to_score(source: str, tokenizer, folder: Path) -> int:
    """Raw text at `source` tokenized with `tokenizer` into the new folder `folder`, every document in the val
    split (the whole text is what eval scores). -> its number of tokens."""
    from redline.data.prepare import prepare_documents
    from redline.data.sources import iter_documents

    meta = prepare_documents(iter(()), folder, tokenizer, val_documents=iter_documents([source]), sources=[],
                             val_sources=[source], progress=False)
    return meta["splits"]["val"]["tokens"]


def main(argv: list[str]) -> int:
    import contextlib
    import tempfile

    from redline.config import parse
    from redline.data.prepare import check_prepared
    from redline.data.sources import list_files
    from redline.errors import UserError
    from redline.hardware import resolve_device
    from redline.inference.plan import plan_decode
    from redline.training.checkpoint import load_for_inference, read_meta, resolve_checkpoint
    from redline.training.loop import resolve_data

    cfg = parse(EvalConfig, argv, prog="redline eval", description=__doc__.strip())
    if cfg.batches < 1:
        raise UserError(f"--batches must be >= 1 (micro-batches to evaluate), got {cfg.batches}")
    if cfg.kv_batches < 1 or cfg.decode_from < 0:
        raise UserError("--kv-batches must be >= 1 and --decode-from >= 0")
    raw_text = cfg.data is not None and not check_prepared(cfg.data)
    if raw_text and cfg.split != "val":
        raise UserError(f"--split {cfg.split} needs a prepared folder; text given as --data ({cfg.data}) is scored "
                        f"whole (drop --split)")
    if raw_text:
        list_files([cfg.data])  # a missing path or a file type that is not text: one line, before any work
    ckpt = resolve_checkpoint(cfg.checkpoint)
    imported = read_meta(ckpt).get("imported_from")  # (a run trained from it is a checkpoint of its own)
    if cfg.data is None and imported:
        raise UserError(f"{cfg.checkpoint} was imported from {imported.get('source')} and has no training data here "
                        f"to score on; give --data: text files or a folder (tokenized with its tokenizer), or a "
                        f"folder prepared with --tokenizer {ckpt / 'tokenizer'}")
    device = resolve_device(cfg.device)
    model, tokenizer, train_cfg = load_for_inference(ckpt, device)
    seq_len = cfg.seq_len or train_cfg.effective_seq_len
    if seq_len > model.cfg.context_len:
        raise UserError(f"seq_len={seq_len} exceeds the model's context_len {model.cfg.context_len}")
    decode_from = cfg.decode_from or seq_len // 2
    if cfg.kv_cache_dtypes and not 1 <= decode_from < seq_len:  # checked before any evaluation runs
        raise UserError(f"--decode-from must be in [1, {seq_len - 1}] for seq_len {seq_len}, got {decode_from}")
    for dtype in cfg.kv_cache_dtypes:  # a cache this model cannot hold (plan_decode's errors), before any evaluation
        plan_decode(model.cfg, device, kv_cache_dtype=dtype)
    # text given as --data is tokenized into a folder that lives as long as this command
    with tempfile.TemporaryDirectory(prefix="redline-eval-") if raw_text else contextlib.nullcontext() as tmp:
        if raw_text:
            data_dir = Path(tmp) / "data"
            tokens = text_to_score(cfg.data, tokenizer, data_dir)
            if tokens < seq_len + 1:
                raise UserError(f"{cfg.data} is {tokens:,} tokens in this checkpoint's tokenizer, fewer than one "
                                f"window of seq_len + 1 = {seq_len + 1}; give more text or a shorter --seq-len")
        elif cfg.data is not None:
            data_dir = Path(cfg.data)
        else:
            data_dir = resolve_data(train_cfg, Path(train_cfg.out_dir) / (train_cfg.run_name or ""))
        return score(cfg, model, tokenizer, data_dir, seq_len, decode_from, device,
                     shown=cfg.data if raw_text else str(data_dir))


def score(cfg: EvalConfig, model, tokenizer, data_dir, seq_len: int, decode_from: int, device, shown: str) -> int:
    """Evaluate the model on data_dir's split, print the result and its JSON line (shown: what to call the data)."""
    from rich.console import Console

    from redline.data.loader import TokenLoader
    from redline.hardware import autocast_dtype
    from redline.training.evaluate import evaluate

    loader = TokenLoader(data_dir, cfg.split, cfg.batch_size, seq_len, expected_identity=tokenizer.identity,
                         device=device, prefetch=False)
    token_bytes = torch.as_tensor(tokenizer.token_byte_lengths(), device=device)
    whole = ", the whole split" if cfg.batches * cfg.batch_size >= loader.num_windows else ""  # read once
    result = evaluate(model, loader.eval_batches(cfg.batches), token_bytes,
                      autocast_dtype(device, "auto"), device)
    Console().print(f"{cfg.checkpoint} on {shown} ({cfg.split}, {result['eval_tokens']:,} tokens{whole}): "
                    f"loss {result['loss']:.4f} | perplexity {result['perplexity']:.2f} | bits/byte {result['bpb']:.4f}")
    kv_rows = []
    if cfg.kv_cache_dtypes:  # after the plain evaluation: the engine casts the model to its dtype
        kv_rows = kv_cache_quality(model, loader.eval_batches(cfg.kv_batches), cfg.kv_cache_dtypes, decode_from)
        console = Console()
        for r in kv_rows:
            console.print(f"KV cache {r['kv_cache_dtype']:<4} ({r['engine_dtype']} engine, {r['kv_bytes_per_token']:,} "
                          f"bytes/token): loss {r['loss']:.4f} over {r['tokens']:,} decoded tokens (full forward "
                          f"{r['loss_full_forward']:.4f}, {r['loss_increase']:+.4f}) | same next token as the full "
                          f"forward {100 * r['top1_agreement']:.2f}%")
    print(json.dumps({"checkpoint": cfg.checkpoint, "data": shown, "split": cfg.split, **result,
                      **({"kv_cache": kv_rows} if kv_rows else {})}))
    return 0
