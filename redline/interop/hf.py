"""Hugging Face model folders: reading one into redline's layout, and writing a redline model as one.

A folder holds config.json, model.safetensors (or shards named by model.safetensors.index.json; older uploads have
pytorch_model.bin or its shards), tokenizer.json with tokenizer_config.json (special tokens, chat template; older
uploads have vocab.json + merges.txt or tokenizer.model, converted by transformers) and generation_config.json (the
EOS ids generation stops at).
`read_folder` gives an `ImportedModel`; `write_folder` writes what `transformers.AutoModelForCausalLM.from_pretrained`
loads with no missing or unexpected keys, and `AutoTokenizer.from_pretrained` with the same tokens.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from redline.durable import DiskFullError, disk_full_error, fsync_dir, fsync_file, is_disk_full
from redline.errors import UserError
from redline.interop.families import Family, TensorSource, check_state, family_for
from redline.model import ModelConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HF_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
INDEX_FILE = "model.safetensors.index.json"
BIN_FILE, BIN_INDEX_FILE = "pytorch_model.bin", "pytorch_model.bin.index.json"


@dataclass
class ImportedModel:
    """A model read from elsewhere, in redline's layout."""

    cfg: ModelConfig
    state: dict[str, torch.Tensor]
    tokenizer: object
    family: str
    source: str
    source_dtype: torch.dtype | None = None
    """The floating dtype the source stored its weights in (None: mixed or dequantized)."""
    generation_config: dict = field(default_factory=dict)


def _read_json(path: Path, what: str) -> dict:
    """A JSON object from `path`, or one line saying what is wrong with the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"cannot read {what} {path}: it is not UTF-8 text; download it again") from None
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else " ".join(str(e).split())
        raise UserError(f"cannot read {what} {path} ({reason}); download it again") from None
    if not isinstance(value, dict):
        raise UserError(f"{what} {path} holds a JSON {type(value).__name__}, not an object; download it again")
    return value


def _shard_list(folder: Path, index_file: str) -> tuple[list[str], dict | None]:
    """The shards an index file names (each present, or one line naming the missing one) and its weight map."""
    weight_map = _read_json(folder / index_file, "the shard index").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(s, str) for s in weight_map.values()):
        raise UserError(f"{folder / index_file} names no shard files (its weight_map is missing, empty or not "
                        f"tensor -> file names); download it again")
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise UserError(f"{folder}: shard {missing[0]} named by {index_file} is missing"
                        f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; download it again")
    return shards, weight_map


def _open_safetensors_files(folder: Path, shards: list[str]) -> tuple[dict[str, str], Callable, set[str]]:
    """({tensor name: shard}, read(name), the dtypes stored) over safetensors files."""
    from safetensors import safe_open

    handles, where = {}, {}
    try:
        for shard in shards:
            handles[shard] = safe_open(str(folder / shard), framework="pt")
            for name in handles[shard].keys():
                where[name] = shard
    except Exception as e:  # safetensors' own error types for a truncated or damaged file
        raise UserError(f"cannot read {folder / shard} ({e}); the file is damaged or incomplete") from None
    names = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
    # U8: MXFP4's packed blocks and scales (GPT-OSS), which dequantize exactly into bf16: no dtype of their own
    stored = {handles[s].get_slice(n).get_dtype() for n, s in where.items()}
    dtypes = {names.get(d, "other") for d in stored if d != "U8"}
    return where, lambda name: handles[where[name]].get_tensor(name), dtypes


def _open_torch_files(folder: Path, shards: list[str]) -> tuple[dict[str, str], Callable, set[str]]:
    """The same over PyTorch pickles (pytorch_model.bin), read with weights_only=True: tensors and plain
    containers only, never code, so a file from elsewhere cannot run anything while it loads."""
    import pickle

    tensors, where = {}, {}
    for shard in shards:
        path = folder / shard
        try:
            try:  # memory-mapped: a shard is not copied into memory before its tensors are used
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                state = torch.load(path, map_location="cpu", weights_only=True)  # the pre-zip format
        except pickle.UnpicklingError as e:  # what weights_only refuses: objects other than tensors
            raise UserError(f"cannot read {path}: it holds more than tensors ({str(e).splitlines()[0][:160]}); "
                            f"convert it to safetensors where it was made") from None
        except (RuntimeError, EOFError, OSError, ValueError) as e:
            raise UserError(f"cannot read {path} ({str(e).splitlines()[0][:160]}); the file is damaged or "
                            f"incomplete") from None
        if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
            state = state["state_dict"]
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise UserError(f"{path} is not a state dict (name -> tensor); it cannot be read as model weights")
        for name, t in state.items():
            tensors[name], where[name] = t, shard
    dtypes = {str(t.dtype).removeprefix("torch.") for t in tensors.values()}
    return where, tensors.__getitem__, dtypes


def _open_weights(folder: Path) -> tuple[TensorSource, torch.dtype | None]:
    """A TensorSource over the folder's weights and their common dtype: model.safetensors or the shards of its
    index, else pytorch_model.bin or the shards of its index (older uploads have only these)."""
    if (folder / INDEX_FILE).is_file():
        index_file, (shards, weight_map) = INDEX_FILE, _shard_list(folder, INDEX_FILE)
    elif (folder / "model.safetensors").is_file():
        index_file, shards, weight_map = None, ["model.safetensors"], None
    elif (folder / BIN_INDEX_FILE).is_file():
        index_file, (shards, weight_map) = BIN_INDEX_FILE, _shard_list(folder, BIN_INDEX_FILE)
    elif (folder / BIN_FILE).is_file():
        index_file, shards, weight_map = None, [BIN_FILE], None
    else:
        other = sorted(p.name for p in folder.glob("*.pt")) or sorted(p.name for p in folder.glob("*.h5"))
        hint = f" (it has {other[0]}, which redline does not read)" if other else ""
        raise UserError(f"{folder} has no model.safetensors, {INDEX_FILE}, {BIN_FILE} or {BIN_INDEX_FILE}{hint}")
    opener = _open_torch_files if shards[0].endswith(".bin") else _open_safetensors_files
    where, read, dtypes = opener(folder, shards)
    if weight_map is not None:
        absent = sorted(n for n, s in weight_map.items() if where.get(n) != s)
        if absent:
            raise UserError(f"{folder}: tensor {absent[0]} is not in shard {weight_map[absent[0]]} as "
                            f"{index_file} says; the shards do not match the index")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(next(iter(dtypes))) \
        if len(dtypes) == 1 else None
    return TensorSource(where, read, str(folder)), dtype


def convert_source(src: TensorSource, hf_config: dict, family: Family) -> tuple[ModelConfig, dict]:
    """(ModelConfig, redline state dict) from a HF config and HF-named tensors; every tensor used or named."""
    if family.settle is not None:
        hf_config = family.settle(hf_config, src)
    try:
        cfg = family.model_config(hf_config)
        cfg.validate()
    except UserError as e:
        raise UserError(f"{src.where}: the config gives a model redline cannot build ({e})") from None
    except KeyError as e:  # a field the architecture needs is missing from config.json
        raise UserError(f"{src.where}: config.json has no {e.args[0]!r}, which a {family.name} model needs") from None
    except (TypeError, ValueError) as e:  # e.g. "vocab_size": "300"
        raise UserError(f"{src.where}: config.json has a value of the wrong type ({e}); numbers must be JSON "
                        f"numbers") from None
    try:
        state = family.to_redline(src, cfg)
        if family.fold is not None:
            state = family.fold(hf_config, cfg, state)
    except RuntimeError as e:  # torch.cat / view / transpose of a tensor whose shape the config does not give
        raise UserError(f"{src.where}: the tensors read up to {src.last} do not have the shapes the config gives "
                        f"({str(e).splitlines()[0][:160]}); the weights do not match the config") from None
    unused = src.unused(family.ignorable)
    if unused:
        raise UserError(f"{src.where}: tensors {', '.join(unused[:3])}{' ...' if len(unused) > 3 else ''} have no "
                        f"place in a {family.name} model as its config describes it (an option redline does not "
                        f"support, or a config that does not match the weights)")
    check_state(state, cfg, src.where)
    # a multimodal folder (a vision tower, or Emu3's and Chameleon's VQ-VAE that tokenizes images): what was left
    # out, said once
    if "vision_config" in hf_config or "vq_config" in hf_config:
        skipped = len(src.names - src.used)
        print(f"{src.where}: a multimodal {family.name} folder; its text model is read, the {skipped} tensors "
              f"outside it (vision tower, projector) left out", file=sys.stderr)
    return cfg, state


def stop_ids_from(generation_config: Mapping, hf_config: Mapping) -> list[int]:
    """The EOS ids a model's generation stops at: generation_config.json's, else config.json's."""
    eos = generation_config.get("eos_token_id", hf_config.get("eos_token_id"))
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


# tokenizer files of older uploads, which transformers converts to a tokenizer.json: (files, what they are)
_CONVERTIBLE = ((("vocab.json", "merges.txt"), "a byte-level BPE's vocab.json and merges.txt"),
                (("tokenizer.model",), "a SentencePiece tokenizer.model"),
                (("spiece.model",), "a SentencePiece spiece.model"))


def _converted_tokenizer(folder: Path, what: str):
    """The folder's tokenizer as transformers builds it from `what` (its fast tokenizer, the tokenizer.json it would
    save), loaded as redline's."""
    import tempfile

    from redline.tokenizer import load_tokenizer

    try:
        import transformers
    except ImportError:
        raise UserError(f"{folder} has {what} but no tokenizer.json; converting it needs transformers (pip install "
                        f"transformers), or give a tokenizer.json with --tokenizer PATH") from None
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # transformers raises many kinds here (a missing sentencepiece, a damaged file, ...)
        reason = " ".join(str(e).split())[:240]
        raise UserError(f"transformers could not convert {what} in {folder} to a tokenizer.json ({reason}); give "
                        f"a tokenizer.json with --tokenizer PATH") from None
    if getattr(tok, "backend_tokenizer", None) is None:
        raise UserError(f"transformers read {what} in {folder} as a {type(tok).__name__}, which has no "
                        f"tokenizer.json form; give a tokenizer.json with --tokenizer PATH")
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        out = load_tokenizer(tmp)
    out.spec = str(folder.resolve())
    return out


def load_folder_tokenizer(folder: Path, override: str | None = None):
    """The tokenizer of a model folder (tokenizer.json with tokenizer_config.json; an older upload's vocab.json +
    merges.txt or SentencePiece model converted by transformers), or the one `override` names."""
    from redline.tokenizer import HF_FILE, load_tokenizer

    if override:
        return load_tokenizer(override)
    if (folder / HF_FILE).is_file():
        return load_tokenizer(folder)
    for files, what in _CONVERTIBLE:
        if all((folder / f).is_file() for f in files):
            return _converted_tokenizer(folder, what)
    raise UserError(f"{folder} has no {HF_FILE}; give the model's tokenizer.json with --tokenizer PATH")


def read_folder(folder: str | Path, tokenizer: str | None = None) -> ImportedModel:
    """A Hugging Face model folder in redline's layout (weights in the source's dtypes)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise UserError(f"{folder} has no config.json; give a Hugging Face model folder (config.json, "
                        f"model.safetensors, tokenizer.json), a .gguf file or a Hub model name")
    hf_config = _read_json(folder / "config.json", "the model config")
    family = family_for(hf_config, str(folder / "config.json"))
    tok = load_folder_tokenizer(folder, tokenizer)  # before the weights: a missing tokenizer fails fast
    src, dtype = _open_weights(folder)
    cfg, state = convert_source(src, hf_config, family)
    generation = _read_json(folder / "generation_config.json", "the generation config") \
        if (folder / "generation_config.json").is_file() else {}
    stops = stop_ids_from(generation, hf_config)
    outside = [i for i in stops if not 0 <= i < tok.vocab_size]
    if outside:  # transformers warns and goes on (e.g. a small model keeping GPT2Config's default 50256)
        where = "generation_config.json" if "eos_token_id" in generation else "config.json"
        print(f"redline import: {where}'s eos_token_id {outside} is outside the tokenizer's {tok.vocab_size} "
              f"tokens; ignored (generation stops at the tokenizer's own end of text instead)", file=sys.stderr)
        stops = [i for i in stops if i not in outside]
    unreachable = [i for i in stops if i >= cfg.head_width]
    if unreachable:  # kept (the tokenizer's, and the export's generation_config), but no row of the head gives them
        print(f"redline import: eos_token_id {unreachable} lies past the model's head (model.head_vocab="
              f"{cfg.head_vocab}): it is never generated, so generation stops at the other stop ids or the length "
              f"limit", file=sys.stderr)
    if stops:
        tok.stop_ids = stops
    return ImportedModel(cfg=cfg, state=state, tokenizer=tok, family=family.name, source=str(folder),
                         source_dtype=dtype, generation_config=generation)


# ----------------------------------------------------------------------------------------------------
# writing


def generation_config(tokenizer, original: Mapping | None = None) -> dict:
    """generation_config.json: the EOS ids generation stops at (the tokenizer's stop_ids), the BOS and padding ids;
    `original` (an imported model's own generation_config.json) gives the rest, and its BOS and padding ids win."""
    stops = tokenizer.stop_ids
    out = {**(original or {}), "eos_token_id": stops[0] if len(stops) == 1 else stops}
    pad = getattr(tokenizer, "hf_config", {}).get("pad_token")
    pad_id = tokenizer.token_to_id(pad) if pad else None
    for key, value in (("bos_token_id", tokenizer.bos_id), ("pad_token_id", pad_id)):
        if value is not None and out.get(key) is None:
            out[key] = value
    return out


def hf_config_json(cfg: ModelConfig, family: Family, tokenizer, dtype: torch.dtype,
                   generation: Mapping | None = None) -> dict:
    config = {"architectures": [family.architecture], **family.hf_config(cfg), "torch_dtype": HF_DTYPE_NAMES[dtype]}
    own = config.get("eos_token_id")  # a family's own (Qwen4-Exp's n-gram hash stops at it: model.ngram_eos)
    ids = generation or generation_config(tokenizer)
    config.update({k: ids[k] for k in ("eos_token_id", "bos_token_id", "pad_token_id") if k in ids})
    if own is not None:  # first in the list, where transformers reads it; the tokenizer's stop ids after it
        stops = config.get("eos_token_id")
        stops = [s for s in (stops if isinstance(stops, list) else [stops]) if s is not None and s != own]
        config["eos_token_id"] = [own, *stops] if stops else own
    return config


def hf_tokenizer_files(tokenizer) -> dict[str, str]:
    """tokenizer.json and tokenizer_config.json of a redline tokenizer, as transformers reads them."""
    from redline.interop.tokenizer_files import hf_tokenizer_files as files

    return files(tokenizer)


def write_atomic_folder(out: Path, write) -> Path:
    """Call write(tmp) to fill a temporary sibling folder, fsync it, rename it to `out` (which must not exist or be
    empty); nothing is left under `out` on failure."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} already exists; give a new folder for --out (or remove that one)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{secrets.token_hex(4)}"
    try:
        tmp.mkdir()
        write(tmp)
        for f in tmp.iterdir():
            fsync_file(f)
        fsync_dir(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception) and not isinstance(e, DiskFullError) and is_disk_full(e):
            # safetensors and torch.save report a full disk as their own errors, not as OSError
            raise disk_full_error(str(out), "nothing was left there") from None
        if isinstance(e, OSError) and not isinstance(e, UserError):
            raise UserError(f"could not write {out} ({e.strerror or e}); nothing was left there") from None
        raise
    return out


_SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """Bytes of a size written as transformers' max_shard_size is ("5GB", "500MB", "2GiB", or a number of bytes)."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", str(text), re.IGNORECASE)
    if not m or float(m[1]) <= 0:
        raise UserError(f"--max-shard-size {text!r} is not a size: give e.g. 5GB, 500MB or 2GiB")
    return int(float(m[1]) * _SIZE_UNITS[(m[2] or "B").upper()])


def shard_names(tensors: Mapping[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    """The tensors' names in files of at most max_bytes each, in order (a larger tensor alone in its file), as
    transformers' save_pretrained splits them."""
    shards, size = [[]], 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def write_folder(out: str | Path, state: Mapping[str, torch.Tensor], cfg: ModelConfig, tokenizer, family: Family,
                 dtype: torch.dtype, original_generation: Mapping | None = None,
                 max_shard_bytes: int = 5 * 10**9) -> Path:
    """A Hugging Face model folder for redline weights `state` (its fp32 state dict) in `dtype`: model.safetensors,
    or shards of at most max_shard_bytes named by model.safetensors.index.json (transformers' layout).
    original_generation: the imported model's generation_config.json, kept (see generation_config)."""
    from safetensors.torch import save_file

    # integer tensors (Qwen4-Exp's hash constants) stay as they are: a float would round them
    tensors = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous()
               for k, v in family.to_hf(state, cfg).items()}
    files = hf_tokenizer_files(tokenizer)
    generation = generation_config(tokenizer, original_generation)
    shards = shard_names(tensors, max_shard_bytes)

    def write(tmp: Path) -> None:
        if len(shards) == 1:
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, names in enumerate(shards, 1):
                shard = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file({n: tensors[n] for n in names}, str(tmp / shard), metadata={"format": "pt"})
                weight_map.update(dict.fromkeys(names, shard))
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        config = hf_config_json(cfg, family, tokenizer, dtype, generation)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")

    return write_atomic_folder(Path(out), write)
