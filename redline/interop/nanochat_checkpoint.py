"""Native nanochat checkpoints (karpathy/nanochat): what its training scripts write, read into redline's layout.

A checkpoint folder (e.g. ~/.cache/nanochat/base_checkpoints/d20/) holds, per saved step N, `model_NNNNNN.pt` (a
torch state dict, keys prefixed `_orig_mod.` where the model was compiled, tensors bf16 or fp32) and
`meta_NNNNNN.json` ({"model_config": {sequence_len, vocab_size, n_layer, n_head, n_kv_head, n_embd,
window_pattern?}, ...}); the tokenizer is a pickled tiktoken Encoding, ~/.cache/nanochat/tokenizer/tokenizer.pkl.

nanochat's model changed in place over its history, and its checkpoints do not record which version wrote them. The
state dict's keys tell two versions apart, and redline reads those two exactly (semantics from nanochat's gpt.py):
- the original (October 2025 on; no per-layer scalars, value embeddings, smear or backout keys): the architecture
  transformers ports as NanoChatForCausalLM (redline/interop/nanochat.py), RoPE base 10000, full attention;
- the current (since 2026-03-14, the commit that added `smear_gate`): RoPE base 100000, q and k scaled by 1.2
  after the QK-norm (redline: an attention scale of 1.44 / sqrt(head_dim)), value embeddings on every other layer
  through a 12-channel gate of range (0, 3), the smear, per-layer residual and x0 scalars (checkpoints without them:
  ones and zeros, as nanochat's loader patches them), backout, sliding windows from window_pattern.
The checkpoints in between (January to mid-March 2026: scalars or value embeddings but no smear) ran under
constants that changed from commit to commit (gate width and range, QK scale, RoPE base, soft cap): they are
refused by name rather than imported under a guess.

Mapping (C = n_embd, D = C / n_head): transformer.wte -> wte, lm_head -> lm_head (V padded to a multiple of 64:
pad_vocab_to=64), attn.c_q/c_k/c_v -> attn.qkv (q's and k's rows with each head's second half negated:
nanochat.flip_rope_rows, its rotation by -θ as redline's by θ), attn.c_proj -> attn.proj, mlp.c_fc/c_proj ->
mlp.fc/proj, attn.ve_gate -> attn.ve_gate, value_embeds.{layer} -> value_embeds.{k} (k-th such layer), and the
scalars by name. nanochat's window (w, 0) attends to a token and the w before it: redline's window w + 1.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import sys
import tempfile
from pathlib import Path

import torch

from redline.errors import UserError
from redline.interop.families import check_state, pad_rows
from redline.interop.hf import ImportedModel
from redline.interop.nanochat import flip_rope_rows
from redline.model import ModelConfig

FAMILY = "nanochat-checkpoint"
MODEL_FILE = re.compile(r"^model_(\d+)\.pt$")
SCALARS = ("smear_lambda", "resid_lambdas", "x0_lambdas", "backout_lambda")
QK_SCALE = 1.2  # nanochat's q and k multiplier after the QK-norm (current version)
SOFTCAP = 15.0
SHORT_WINDOW_TILE = 128  # nanochat rounds its short window up to FA3's tile


def is_checkpoint_folder(folder: Path) -> bool:
    """A nanochat checkpoint folder: model_NNNNNN.pt or meta_NNNNNN.json files, and no config.json."""
    if (folder / "config.json").is_file():
        return False
    return any(MODEL_FILE.match(p.name) or re.match(r"^meta_\d+\.json$", p.name) for p in folder.iterdir())


def pick_step(folder: Path, step: int | None) -> int:
    """The step to read: `step` where given (a UserError naming the steps there are if it is not), else the
    latest, said on stderr when there are several."""
    steps = sorted(int(m.group(1)) for p in folder.iterdir() if (m := MODEL_FILE.match(p.name)))
    if not steps:
        raise UserError(f"{folder} has no model_NNNNNN.pt; give a nanochat checkpoint folder (model_*.pt, "
                        f"meta_*.json)")
    if step is not None:
        if step not in steps:
            raise UserError(f"{folder} has no step {step} (model_{step:06d}.pt); its steps: "
                            f"{', '.join(map(str, steps))}")
        return step
    if len(steps) > 1:
        print(f"redline import: {folder} holds steps {', '.join(map(str, steps))}; importing the latest, "
              f"{steps[-1]} (--step N picks another)", file=sys.stderr)
    return steps[-1]


def _read_meta(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"{path.parent} has no {path.name} beside {path.name.replace('meta_', 'model_')[:-5]}.pt; "
                        f"nanochat writes the model config there: copy it from where the checkpoint was saved")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {' '.join(str(e).split())}") from None
    model = meta.get("model_config") if isinstance(meta, dict) else None
    if not isinstance(model, dict):
        raise UserError(f"{path} has no \"model_config\" object; it is not a nanochat checkpoint's meta file")
    missing = [k for k in ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd") if k not in model]
    if missing:
        raise UserError(f"{path}: model_config has no {', '.join(missing)}; it is damaged or not nanochat's")
    return model


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many kinds for a damaged or foreign file
        raise UserError(f"cannot read {path} as a torch state dict ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise UserError(f"{path} is not a state dict of tensors; give nanochat's model_NNNNNN.pt")
    return {k.removeprefix("_orig_mod."): t for k, t in state.items()}


def windows(pattern: str, n_layer: int, sequence_len: int) -> tuple[int, tuple[int, ...]]:
    """(redline's sliding_window, window_layers) for nanochat's window_pattern: chars L (the whole sequence_len) and
    S (sequence_len / 4 rounded up to 128) tiled over the layers, the last layer L; an S layer attending to itself
    and `short` tokens before it is a redline window of short + 1. (0, ()) where every layer sees the context."""
    pattern = pattern.upper()
    if not pattern or set(pattern) - {"S", "L"}:
        raise UserError(f"window_pattern={pattern!r}: nanochat's pattern is made of L and S")
    short = -(-sequence_len // 4 // SHORT_WINDOW_TILE) * SHORT_WINDOW_TILE
    layers = tuple(i for i in range(n_layer - 1) if pattern[i % len(pattern)] == "S")
    if not layers or short + 1 >= sequence_len:  # a window as long as the context is no window
        return 0, ()
    return short + 1, layers


def model_config(meta: dict, state: dict[str, torch.Tensor], source: str) -> ModelConfig:
    """redline's config of the checkpoint, from its meta's model_config and its state dict's keys and shapes."""
    C, H, KV, L = (int(meta[k]) for k in ("n_embd", "n_head", "n_kv_head", "n_layer"))
    if H <= 0 or C % H or KV <= 0 or H % KV:
        raise UserError(f"{source}: n_embd={C}, n_head={H}, n_kv_head={KV}: nanochat's heads are n_embd / n_head "
                        f"wide and n_head a multiple of n_kv_head")
    current = "smear_gate.weight" in state
    newer = [k for k in state if k in SCALARS or k.startswith("value_embeds.") or ".ve_gate." in k]
    pattern = str(meta.get("window_pattern", "L"))
    if not current and (newer or set(pattern.upper()) - {"L"}):
        what = newer[0] if newer else f"window_pattern={pattern!r}"
        raise UserError(f"{source}: {what} without smear_gate.weight: a nanochat checkpoint from between January and "
                        f"mid-March 2026, whose constants changed from commit to commit; redline reads the original "
                        f"and the current (2026-03-14 on) versions: re-save it with current nanochat")
    ve_layers = tuple(sorted(int(k.split(".")[1]) for k in state if re.match(r"^value_embeds\.\d+\.weight$", k)))
    gates = [state.get(f"transformer.h.{i}.attn.ve_gate.weight") for i in ve_layers]
    sliding, window_layers = windows(pattern, L, int(meta["sequence_len"])) if current else (0, ())
    D = C // H
    return ModelConfig(
        vocab_size=int(meta["vocab_size"]), context_len=int(meta["sequence_len"]), n_layer=L, n_embd=C, n_head=H,
        n_kv_head=KV, mlp="relu2", mlp_hidden=4 * C, norm="rmsnorm", norm_affine=False, embed_norm=True,
        norm_eps=torch.finfo(torch.float32).eps,  # F.rms_norm's default eps (None) in fp32
        qk_norm=True, fused_qkv=True, bias=False, tie_embeddings=False, pos_emb="rope",
        rope_theta=100000.0 if current else 10000.0, attn_scale=QK_SCALE ** 2 / D ** 0.5 if current else 0.0,
        logit_softcap=SOFTCAP, pad_vocab_to=64, sliding_window=sliding, window_layers=window_layers,
        value_embed_layers=ve_layers,
        value_embed_gate=int(gates[0].shape[1]) if ve_layers and gates[0] is not None and gates[0].dim() == 2 else 0,
        smear_gate=int(state["smear_gate.weight"].shape[-1]) if current else 0,
        layer_lambdas=current, backout=current)


def to_redline(state: dict[str, torch.Tensor], cfg: ModelConfig, source: str) -> dict[str, torch.Tensor]:
    """nanochat's tensors under redline's names (each taken once; a UserError naming the first key left over)."""
    left = dict(state)

    def take(name: str) -> torch.Tensor:
        if name not in left:
            raise UserError(f"{source}: no tensor {name}; the checkpoint does not match its meta's model_config")
        return left.pop(name)

    out = {"wte.weight": pad_rows(take("transformer.wte.weight"), cfg),
           "lm_head.weight": pad_rows(take("lm_head.weight"), cfg)}
    for i in range(cfg.n_layer):
        p, r = f"transformer.h.{i}.", f"blocks.{i}."
        q, k, v = (take(f"{p}attn.c_{x}.weight") for x in "qkv")
        if q.shape[0] != cfg.n_head * cfg.head_dim or k.shape[0] != cfg.kv_heads * cfg.head_dim:
            raise UserError(f"{source}: {p}attn.c_q/c_k have {q.shape[0]} and {k.shape[0]} rows; meta's n_head and "
                            f"n_kv_head give {cfg.n_head * cfg.head_dim} and {cfg.kv_heads * cfg.head_dim}")
        out[r + "attn.qkv.weight"] = torch.cat([flip_rope_rows(q, cfg.n_head), flip_rope_rows(k, cfg.kv_heads), v])
        out[r + "attn.proj.weight"] = take(p + "attn.c_proj.weight")
        out[r + "mlp.fc.weight"] = take(p + "mlp.c_fc.weight")
        out[r + "mlp.proj.weight"] = take(p + "mlp.c_proj.weight")
        if i in cfg.value_embed_layers:
            out[r + "attn.ve_gate.weight"] = take(p + "attn.ve_gate.weight")
    for t, layer in enumerate(cfg.value_embed_layers):
        out[f"value_embeds.{t}.weight"] = pad_rows(take(f"value_embeds.{layer}.weight"), cfg)
    if cfg.smear_gate:
        out["smear_gate.weight"] = take("smear_gate.weight")
        out["smear_lambda"] = take("smear_lambda").reshape(1)
        out["backout_lambda"] = take("backout_lambda").reshape(1)
        # older current-version checkpoints lack the per-layer scalars: nanochat's loader patches ones and zeros
        out["resid_lambdas"] = left.pop("resid_lambdas", torch.ones(cfg.n_layer))
        out["x0_lambdas"] = left.pop("x0_lambdas", torch.zeros(cfg.n_layer))
    if left:
        raise UserError(f"{source}: tensors {', '.join(sorted(left)[:3])} have no place in nanochat's model as "
                        f"redline reads it; the checkpoint is not a nanochat model it knows")
    check_state(out, cfg, source)
    return out


# nanochat's conversation rendering (its tokenizer's render_conversation) as a chat template: <|bos|>, then each
# user turn between <|user_start|> and <|user_end|> (a system message joins the first user turn, two newlines
# between), each assistant turn between <|assistant_start|> and <|assistant_end|>
CHAT_SPECIALS = ("<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>")
CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}{{ bos_token }}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] + '\n\n' -%}"
    "{%- elif m['role'] == 'user' -%}<|user_start|>{{ ns.system }}{{ m['content'] }}<|user_end|>"
    "{%- set ns.system = '' -%}"
    "{%- else -%}<|assistant_start|>{{ m['content'] }}<|assistant_end|>{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|assistant_start|>{%- endif -%}")


class _PickledEncoding:
    """Stands in for tiktoken.Encoding while its pickle is read: keeps the state it is handed (name, pat_str,
    mergeable_ranks, special_tokens) without importing or running tiktoken."""

    def __setstate__(self, state) -> None:
        self.state = state


class _EncodingUnpickler(pickle.Unpickler):
    """Reads a pickled tiktoken Encoding and nothing else: any other class a pickle names is refused."""

    def find_class(self, module: str, name: str):
        if module in ("tiktoken", "tiktoken.core") and name == "Encoding":
            return _PickledEncoding
        if (module, name) in (("copyreg", "_reconstructor"), ("builtins", "object")):
            return getattr(__import__(module), name)
        raise UserError(f"the tokenizer pickle names {module}.{name}; redline reads only a pickled tiktoken "
                        f"Encoding (nanochat's tokenizer.pkl)")


def read_pickled_tokenizer(path: Path):
    """nanochat's tokenizer.pkl (a pickled tiktoken.Encoding) as redline's tokenizer: its ranks, special tokens and
    split pattern written as a byte-level BPE tokenizer.json; generation stops at <|assistant_end|> and <|bos|>
    (nanochat's document delimiter)."""
    from redline.interop.tokenizer_files import tiktoken_tokenizer_json
    from redline.tokenizer import load_tokenizer

    print(f"redline import: loading the tokenizer pickle {path} (a Python pickle: only a tiktoken Encoding's "
          f"state is accepted from it)", file=sys.stderr)
    try:
        with open(path, "rb") as f:
            enc = _EncodingUnpickler(f).load()
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"cannot read {path} as a pickled tiktoken Encoding ({' '.join(str(e).split())[:200]})") \
            from None
    state = getattr(enc, "state", None)
    if isinstance(state, str):
        raise UserError(f"{path} names tiktoken's registered encoding {state!r} rather than holding one; give its "
                        f"tokenizer.json with --tokenizer PATH")
    if not isinstance(state, dict) or not {"pat_str", "mergeable_ranks", "special_tokens"} <= set(state):
        raise UserError(f"{path} is not a pickled tiktoken Encoding (no ranks, special tokens and pattern)")
    specials = state["special_tokens"]
    text = tiktoken_tokenizer_json(state["mergeable_ranks"], specials, state["pat_str"])
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if "<|bos|>" in specials:  # nanochat begins every document, and every prompt it samples from, with <|bos|>
        from tokenizers import Tokenizer, processors

        hf = Tokenizer.from_str(text)
        hf.post_processor = processors.TemplateProcessing(
            single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", specials["<|bos|>"])])
        text = hf.to_str()
        config |= {"bos_token": "<|bos|>", "eos_token": "<|bos|>", "add_bos_token": True}
    if all(t in specials for t in CHAT_SPECIALS):
        config["chat_template"] = CHAT_TEMPLATE
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "tokenizer.json").write_text(text, encoding="utf-8")
        Path(tmp, "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        tok = load_tokenizer(tmp)
    stops = [specials[s] for s in ("<|assistant_end|>", "<|bos|>") if s in specials]
    if stops:
        tok.stop_ids = stops
    tok.spec = str(path.resolve())
    return tok


def _default_tokenizer(folder: Path) -> Path | None:
    """Where nanochat keeps its tokenizer: base_dir/tokenizer/tokenizer.pkl, base_dir being the checkpoint folder's
    grandparent (base_dir/base_checkpoints/d20), $NANOCHAT_BASE_DIR or ~/.cache/nanochat."""
    bases = [folder.resolve().parent.parent]
    if os.environ.get("NANOCHAT_BASE_DIR"):
        bases.append(Path(os.environ["NANOCHAT_BASE_DIR"]))
    bases.append(Path.home() / ".cache" / "nanochat")
    return next((b / "tokenizer" / "tokenizer.pkl" for b in bases if (b / "tokenizer" / "tokenizer.pkl").is_file()),
                None)


def read_checkpoint(folder: str | Path, step: int | None = None, tokenizer: str | None = None) -> ImportedModel:
    """A nanochat checkpoint folder's step `step` (None: the latest) in redline's layout. tokenizer: a tokenizer.pkl,
    a tokenizer.json or folder (None: nanochat's own place for it, _default_tokenizer)."""
    from redline.tokenizer import load_tokenizer

    folder = Path(folder).expanduser()
    n = pick_step(folder, step)
    source = str(folder / f"model_{n:06d}.pt")
    meta = _read_meta(folder / f"meta_{n:06d}.json")
    if tokenizer is not None:
        tok = (read_pickled_tokenizer(Path(tokenizer).expanduser()) if tokenizer.endswith(".pkl")
               else load_tokenizer(tokenizer))
    else:
        found = _default_tokenizer(folder)
        if found is None:
            raise UserError(f"no nanochat tokenizer found for {folder} (looked for tokenizer/tokenizer.pkl under "
                            f"{folder.resolve().parent.parent} and ~/.cache/nanochat); give --tokenizer PATH "
                            f"(tokenizer.pkl or a tokenizer.json)")
        tok = read_pickled_tokenizer(found)
    state = _read_state(Path(source))
    cfg = model_config(meta, state, source)
    cfg.validate()
    out = to_redline(state, cfg, source)
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    return ImportedModel(cfg=cfg, state=out, tokenizer=tok, family=FAMILY, source=source,
                         source_dtype=dtypes.pop() if len(dtypes) == 1 else None)
