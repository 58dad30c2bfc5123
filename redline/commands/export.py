"""`redline export CKPT --out DIR`: a redline checkpoint as a Hugging Face folder or a GGUF file.

    redline export runs/modern-124m-... --out exported/       # transformers.AutoModelForCausalLM.from_pretrained
    redline export models/smollm2 --out smol.gguf --format gguf --dtype fp16   # llama.cpp, transformers' GGUF loader
    redline export models/smollm2 --out smol-q8.gguf --format gguf --dtype q8_0  # llama.cpp's 8-bit blocks
    redline export models/smollm2 --out smol-q4.gguf --format gguf --dtype q4_0  # 4-bit blocks, the head's 8-bit

The architecture follows the model: GPT-2 for learned positions (the gpt2 presets), Qwen3 with QK-norm (the modern
presets), Mistral with a sliding window, Qwen2 with biases on q/k/v alone, Llama otherwise, and the architecture
whose options an imported model has (OLMo 2, EXAONE 4.0, the Gemmas, Phi, Phi-3, GPT-NeoX, StableLM, StarCoder2,
OPT, SmolLM3, Granite, Hunyuan, Cohere, LFM2, nanochat, OLMo; a mixture of experts as Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE,
GraniteMoE or LFM2-MoE: docs/import_export.md). A redline option none of them has (post-norm, ReLU² with RoPE,
learned positions with RMSNorm, ...) is an error that names it.
The folder holds config.json, model.safetensors, generation_config.json (the stop, BOS and padding ids, with the
rest of an imported model's own generation config), tokenizer.json and
tokenizer_config.json (special tokens, chat template). Written atomically: on any error nothing is left at --out.

A LoRA run's checkpoint (adapters and a reference to its base: docs/lora.md):
    redline export runs/lora-run --adapter adapter/       # a PEFT adapter for the model `export BASE` writes
    redline export runs/lora-run --merge --out merged/    # the base with the adapters folded in
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Literal

import tyro


@dataclass
class ExportConfig:
    checkpoint: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="CKPT")]
    """A checkpoint folder or a run directory (its newest checkpoint)."""
    out: str | None = None
    """The folder (hf) or .gguf file (gguf) to write; it must not exist yet."""
    adapter: str | None = None
    """A LoRA run's checkpoint only: write its adapters as a PEFT adapter folder here (instead of --out)."""
    merge: bool = False
    """A LoRA run's checkpoint only: write the merged model (base + adapters) to --out."""
    format: Literal["hf", "gguf"] = "hf"
    """hf: a Hugging Face model folder; gguf: one GGUF file."""
    max_shard_size: str = "5GB"
    """hf: the largest safetensors file (5GB, 500MB, 2GiB, ...); a larger model is written as shards with
    model.safetensors.index.json, as transformers' save_pretrained writes them."""
    dtype: Literal["auto", "fp32", "bf16", "fp16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "mxfp4"] = "auto"
    """Dtype of the written weights (auto: the dtype the checkpoint stores, fp32 for one redline trained). GGUF only:
    q8_0, llama.cpp's 8-bit blocks for the matrices (about a quarter of fp32's size); q5_1, q5_0, q4_1, q4_0, its 5-
    and 4-bit blocks, the head's matrix in q8_0 (llama-quantize keeps it above 4 bits too); mxfp4 (GPT-OSS only), the
    experts in llama.cpp's MXFP4 and the other matrices in bf16, as its converter writes the released checkpoints. In a
    GGUF, norms and biases stay fp32 as llama.cpp keeps them."""


def stored_dtype(ckpt):
    """The dtype of a checkpoint's model.safetensors (fp32 for the sharded layout, which training writes)."""
    import torch
    from safetensors import safe_open

    path = ckpt / "model.safetensors"
    if not path.is_file():
        return torch.float32
    with safe_open(str(path), framework="pt") as f:
        names = list(f.keys())
        kind = f.get_slice(names[0]).get_dtype() if names else "F32"
    return {"BF16": torch.bfloat16, "F16": torch.float16}.get(kind, torch.float32)


def main(argv: list[str]) -> int:
    from pathlib import Path

    from redline.config import parse
    from redline.errors import UserError
    from redline.interop.families import export_family
    from redline.interop.gguf_file import GGUF_DTYPES
    from redline.interop.hf import DTYPES
    from redline.training.checkpoint import generation_config, load_checkpoint_weights, resolve_checkpoint

    cfg = parse(ExportConfig, argv, prog="redline export", description=__doc__.strip())
    if cfg.adapter is not None:
        return export_adapter(cfg)
    if cfg.out is None:
        raise UserError("give --out DIR (or, for a LoRA run's checkpoint, --adapter DIR)")
    out = Path(cfg.out)
    if cfg.format == "hf" and out.suffix == ".gguf":  # a Hugging Face folder named x.gguf is never what was meant
        raise UserError(f"--out {cfg.out} names a GGUF file: add --format gguf (the default, hf, writes a folder)")
    check_merge(cfg)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} already exists; give a new path for --out (or remove that one)")
    if cfg.dtype in GGUF_DTYPES and cfg.format != "gguf":
        raise UserError(f"--dtype {cfg.dtype} is a GGUF type (llama.cpp's blocks of 32 weights): add --format gguf, "
                        f"or give fp32, bf16 or fp16 for a Hugging Face folder")
    from redline.interop.hf import parse_size

    max_shard = parse_size(cfg.max_shard_size)  # a bad size is one line before any work
    if cfg.format == "gguf":
        from redline.interop.gguf_file import require_gguf

        require_gguf()  # the extra, before any work
    ckpt = resolve_checkpoint(cfg.checkpoint)
    state, train_cfg, tokenizer, ckpt = load_checkpoint_weights(ckpt)
    family = export_family(train_cfg.model)  # the one-line error for an option no architecture has, early
    dtype = stored_dtype(ckpt) if cfg.dtype == "auto" else cfg.dtype if cfg.dtype in GGUF_DTYPES else \
        DTYPES[cfg.dtype]
    if cfg.format == "hf":
        from redline.interop.hf import write_folder

        write_folder(out, state, train_cfg.model, tokenizer, family, dtype, generation_config(ckpt), max_shard)
        # transformers' AutoModelForCausalLM maps no mistral4 (Mistral 4 loads by its class: deepseek_kin.py)
        auto = "AutoModelForCausalLM" if family.name != "mistral4" else family.architecture
        loader = f"{auto}.from_pretrained({str(out)!r})"
    else:
        from redline.interop.gguf_file import write_gguf

        write_gguf(out, state, train_cfg.model, tokenizer, family, dtype)
        loader = "llama.cpp"
        if transformers_reads_gguf(train_cfg.model, family):
            loader = f"AutoModelForCausalLM.from_pretrained({str(out.parent)!r}, gguf_file={out.name!r}) or llama.cpp"
    name = str(dtype).removeprefix("torch.")
    print(f"redline export: {ckpt} -> {out} as {family.architecture} ({cfg.format}, {name}); load it with {loader}")
    print(json.dumps({"out": str(out), "format": cfg.format, "architecture": family.architecture, "dtype": name}))
    return 0


def transformers_reads_gguf(model_cfg, family) -> bool:
    """Whether the installed transformers' GGUF loader has the architecture the file is written as (its list names
    some with underscores where llama.cpp has none, e.g. qwen2_moe for qwen2moe); False without transformers."""
    from redline.interop.gguf_file import _arch

    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except Exception:  # not installed, or a version that keeps the list elsewhere: name llama.cpp alone
        return False
    known = {name.replace("_", "") for name in GGUF_SUPPORTED_ARCHITECTURES}
    # its gemma4 maps the common keys alone (no per-layer arrays, none of the per-layer inputs' or window's keys) and
    # no name for the router's scales: it builds Gemma 4 models apart from the file's
    known.discard("gemma4")
    return _arch(family, model_cfg).replace("-", "").replace("_", "") in known


def check_merge(cfg: ExportConfig) -> None:
    """--merge for a LoRA run's checkpoint and for it alone: the merged model is what --out then holds."""
    from redline.errors import UserError
    from redline.training.adapters import is_adapter_checkpoint
    from redline.training.checkpoint import read_meta, resolve_checkpoint

    ckpt = resolve_checkpoint(cfg.checkpoint)
    adapters = is_adapter_checkpoint(read_meta(ckpt))
    if adapters and not cfg.merge:
        raise UserError(f"{ckpt} holds LoRA adapters: give --merge to write the merged model to --out, or "
                        f"--adapter DIR for a PEFT adapter")
    if cfg.merge and not adapters:
        raise UserError(f"{ckpt} is not a LoRA run's checkpoint: there is nothing to merge; drop --merge")


def export_adapter(cfg: ExportConfig) -> int:
    """`--adapter DIR`: the adapters of a LoRA run's checkpoint as a PEFT adapter folder."""
    from pathlib import Path

    from safetensors.torch import load_file

    from redline.config import TrainConfig, from_dict
    from redline.errors import UserError
    from redline.interop.families import export_family
    from redline.interop.gguf_file import GGUF_DTYPES
    from redline.interop.hf import DTYPES
    from redline.interop.peft_adapter import write_adapter
    from redline.training.adapters import META_KEY, is_adapter_checkpoint, resolve_base
    from redline.training.checkpoint import load_config_dict, resolve_checkpoint, verify_checkpoint

    if cfg.out is not None or cfg.merge or cfg.format != "hf":
        raise UserError("--adapter writes a PEFT adapter folder on its own; drop --out, --merge and --format")
    if cfg.dtype in GGUF_DTYPES:
        raise UserError(f"--dtype {cfg.dtype} is a GGUF type; a PEFT adapter is written in fp32, bf16 or fp16")
    ckpt = resolve_checkpoint(cfg.checkpoint)
    meta = verify_checkpoint(ckpt)
    if not is_adapter_checkpoint(meta):
        raise UserError(f"{ckpt} is not a LoRA run's checkpoint (it holds a whole model); export it with --out")
    base = resolve_base(meta, ckpt)
    train_cfg = from_dict(TrainConfig, load_config_dict(ckpt))
    family = export_family(train_cfg.model)
    dtype = DTYPES["fp32"] if cfg.dtype == "auto" else DTYPES[cfg.dtype]
    out = write_adapter(Path(cfg.adapter), load_file(str(ckpt / "model.safetensors")), train_cfg, family, str(base),
                        dtype)
    print(f"redline export: {ckpt} -> {out} (PEFT LoRA adapter for {family.architecture}, base {meta[META_KEY]['path']}); "
          f"load it with PeftModel.from_pretrained(model, {str(out)!r}) on the model `redline export {base} --out "
          f"DIR` writes")
    print(json.dumps({"out": str(out), "format": "peft", "architecture": family.architecture, "base": str(base)}))
    return 0
