"""GPT-J (EleutherAI's GPTJForCausalLM: GPT-J-6B and the small GPT-J models) and CodeGen (Salesforce's
CodeGenForCausalLM: codegen-350M/2B/6B/16B-mono/multi/nl): one LayerNorm a block feeding attention and MLP side by
side, RoPE on the first `rotary_dim` dimensions of each head in interleaved pairs, q/k/v and out_proj without
biases, a GELU MLP with biases, an untied head with a bias.

Each block is x + attn(ln_1(x)) + mlp(ln_1(x)) (redline's parallel_residual with parallel_shared_norm). RoPE turns
the pairs (0, 1), (2, 3), ... of the first rotary_dim dimensions (GPT-J's rotate_every_two) at 10000^(-2i/rotary_dim)
and leaves the rest; redline turns (first half, second half) pairs of its first rope_dims: each head's first
rotary_dim q and k rows are permuted into that order on import and back on export, which leaves every q·k product
as it was. transformers' code has no RoPE base or scaling option: 10000, unscaled. redline's `bias` puts a bias on
attn.proj too: zeros on import, and on export folded into fc_out's bias (the two sublayers' outputs are summed, so
b_out + b_fc_out is the same constant either way). The head's bias is head_bias.

CodeGen is GPT-J with q, v and k in one `qkv_proj` laid out for 4-way model parallelism (mp_num = 4): its 3·C
output rows are 4 blocks, each [q; v; k] of C/4 rows, and a projection's rows are the 4 blocks' in order (reshaped
to heads after). They are taken apart into redline's [q; k; v] on import. A CodeGen model computes what the GPT-J
with its q, k and v does, and exports as GPT-J (the same logits; transformers loads either). Semantics read from
transformers' models/gptj/modeling_gptj.py and models/codegen/modeling_codegen.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop.families import (Family, TensorSource, bias_or_zeros, interleave_rope_rows, pad_rows,
                                      plain_block_problems, qkv_apart, raise_first)
from redline.model import ModelConfig

_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}  # transformers' ACT2FN names
MP_NUM = 4  # CodeGen's qkv_proj blocks (CodeGenAttention.mp_num, fixed in transformers' code)


def _model_config(hf: dict, arch: str) -> ModelConfig:
    act = hf.get("activation_function", "gelu_new")
    if act not in _GELU:
        raise UserError(f"activation_function={act!r}: redline's {arch} MLP computes {', '.join(_GELU)}")
    width, heads = hf["n_embd"], hf["n_head"]
    head_dim = width // heads
    rotated = hf.get("rotary_dim", 64)
    if rotated is None:  # transformers then builds a table as wide as the model, which fits a head only if one head
        if heads != 1:
            raise UserError(f"rotary_dim=null: {arch} then rotates by a table of hidden_size={width} dimensions, "
                            f"which does not fit heads {head_dim} wide; give rotary_dim")
        rotated = head_dim
    if rotated <= 0 or rotated % 2 or rotated > head_dim:
        raise UserError(f"rotary_dim={rotated}: redline rotates an even number of each head's {head_dim} dimensions, "
                        f"above 0")
    return ModelConfig(
        vocab_size=hf["vocab_size"], context_len=hf.get("n_positions", 2048), n_layer=hf["n_layer"], n_embd=width,
        n_head=heads, n_kv_head=None, qk_norm=False, fused_qkv=True, pos_emb="rope", rope_theta=10000.0,
        rope_dims=0 if rotated == head_dim else rotated, mlp="gelu", gelu_approximate=_GELU[act],
        mlp_hidden=hf.get("n_inner") or 4 * width, norm="layernorm",
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), parallel_residual=True, parallel_shared_norm=True,
        head_bias=True, tie_embeddings=bool(hf.get("tie_word_embeddings", False)), bias=True, qkv_bias=False,
    )


def model_config(hf: dict) -> ModelConfig:
    return _model_config(hf, "GPT-J")


def codegen_model_config(hf: dict) -> ModelConfig:
    if hf["n_embd"] % MP_NUM:
        raise UserError(f"n_embd={hf['n_embd']}: CodeGen's qkv_proj is {MP_NUM} blocks, so the width must divide by "
                        f"{MP_NUM}")
    return _model_config(hf, "CodeGen")


def wants_gptj(cfg: ModelConfig) -> bool:
    """A RoPE model GPT-J is the export for: one LayerNorm for parallel sublayers, a GELU MLP, biases on the Linear
    layers but none on q/k/v (Phi takes those with them, StableLM and Cohere with SwiGLU)."""
    return (cfg.pos_emb == "rope" and cfg.parallel_residual and cfg.parallel_shared_norm and cfg.mlp == "gelu"
            and cfg.norm == "layernorm" and cfg.bias and not cfg.has_qkv_bias)


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of a parallel-block GELU model without q/k/v biases that GPT-J does not have."""
    when, arch = "one norm for parallel sublayers and no q/k/v biases", "GPT-J"
    raise_first(plain_block_problems(cfg, when, arch) + [
        (cfg.kv_heads != cfg.n_head, f"model.n_kv_head={cfg.kv_heads} with {when}: {arch} is multi-head"),
        (cfg.sliding_window > 0, f"model.sliding_window with {when}: {arch} attends to the whole context"),
        (cfg.attn_scale not in (0.0, cfg.head_dim ** -0.5), f"model.attn_scale={cfg.attn_scale} with {when}: {arch} "
                                                            f"scales its scores by 1/sqrt(head width)"),
        (cfg.rope_theta != 10000.0, f"model.rope_theta={cfg.rope_theta} with {when}: {arch}'s RoPE base is 10000, "
                                    f"fixed in transformers' code"),
        (cfg.rope_scaling != "none", f"model.rope_scaling={cfg.rope_scaling} with {when}: {arch} has no RoPE "
                                     f"scaling"),
    ])


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "model_type": "gptj", "vocab_size": cfg.vocab_size, "n_positions": cfg.context_len, "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": cfg.hidden_dim,
        "rotary_dim": cfg.rope_dims or cfg.head_dim,
        "activation_function": "gelu" if cfg.gelu_approximate == "none" else "gelu_new",
        "layer_norm_epsilon": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "resid_pdrop": 0.0,
        "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02, "use_cache": True,
    }


def rope_rows(w: torch.Tensor, cfg: ModelConfig, to_hf: bool) -> torch.Tensor:
    """q or k rows (H·D, ...) with each head's first rope_dims rows between redline's (first half, second half)
    pairs and GPT-J's interleaved ones (to_hf), or back; the rest of each head as it is."""
    H, D = cfg.n_head, cfg.head_dim
    R = cfg.rope_dims or D
    heads = w.reshape(H, D, *w.shape[1:])
    rot = interleave_rope_rows(heads[:, :R].reshape(H * R, *w.shape[1:]), H, inverse=not to_hf)
    return torch.cat([rot.reshape(H, R, *w.shape[1:]), heads[:, R:]], dim=1).reshape(w.shape)


def codegen_qkv(w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """CodeGen's qkv_proj weight (3C, C) -> (q, k, v), each (C, C): its rows are MP_NUM blocks of [q; v; k] (C/4 rows
    each), a projection's rows the blocks' in order."""
    C = w.shape[1]
    blocks = w.reshape(MP_NUM, 3, C // MP_NUM, C)  # (block, q/v/k, row in block, in)
    q, v, k = (blocks[:, j].reshape(C, C) for j in range(3))
    return q, k, v


def _start(src: TensorSource, cfg: ModelConfig) -> dict:
    out = {"wte.weight": pad_rows(src.take("transformer.wte.weight"), cfg),
           "norm_f.weight": src.take("transformer.ln_f.weight"), "norm_f.bias": src.take("transformer.ln_f.bias"),
           "lm_head.bias": pad_rows(src.take("lm_head.bias"), cfg)}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = pad_rows(src.take("lm_head.weight"), cfg)
    elif "lm_head.weight" in src:
        src.take("lm_head.weight")  # the tied head, stored anyway
    return out


def _block(src: TensorSource, cfg: ModelConfig, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    p, r = f"transformer.h.{i}.", f"blocks.{i}."
    proj = src.take(f"{p}attn.out_proj.weight")
    return {f"{r}attn.qkv.weight": torch.cat([rope_rows(q, cfg, to_hf=False), rope_rows(k, cfg, to_hf=False), v]),
            f"{r}attn.proj.weight": proj, f"{r}attn.proj.bias": proj.new_zeros(proj.shape[0]),  # GPT-J has none
            f"{r}norm1.weight": src.take(f"{p}ln_1.weight"), f"{r}norm1.bias": src.take(f"{p}ln_1.bias"),
            **{f"{r}mlp.{ours}.{kind}": src.take(f"{p}mlp.{theirs}.{kind}")
               for ours, theirs in (("fc", "fc_in"), ("proj", "fc_out")) for kind in ("weight", "bias")}}


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = _start(src, cfg)
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}.attn."
        out.update(_block(src, cfg, i, *(src.take(f"{p}{x}_proj.weight") for x in "qkv")))
    return out


def codegen_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = _start(src, cfg)
    for i in range(cfg.n_layer):
        out.update(_block(src, cfg, i, *codegen_qkv(src.take(f"transformer.h.{i}.attn.qkv_proj.weight"))))
    return out


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    V = cfg.vocab_size
    head = state["lm_head.weight"] if "lm_head.weight" in state else state["wte.weight"]
    out = {"transformer.wte.weight": state["wte.weight"][:V], "transformer.ln_f.weight": state["norm_f.weight"],
           "transformer.ln_f.bias": bias_or_zeros(state, "norm_f.bias", state["norm_f.weight"]),
           "lm_head.bias": bias_or_zeros(state, "lm_head.bias", head)[:V]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = head[:V]
    for i in range(cfg.n_layer):
        r, p = f"blocks.{i}.", f"transformer.h.{i}."
        apart = qkv_apart(state, r, cfg, "")  # biases: none (checked)
        out[f"{p}attn.q_proj.weight"] = rope_rows(apart["q_proj.weight"], cfg, to_hf=True)
        out[f"{p}attn.k_proj.weight"] = rope_rows(apart["k_proj.weight"], cfg, to_hf=True)
        out[f"{p}attn.v_proj.weight"] = apart["v_proj.weight"]
        proj = state[f"{r}attn.proj.weight"]
        out[f"{p}attn.out_proj.weight"] = proj
        out[f"{p}ln_1.weight"] = state[f"{r}norm1.weight"]
        out[f"{p}ln_1.bias"] = bias_or_zeros(state, f"{r}norm1.bias", state[f"{r}norm1.weight"])
        out[f"{p}mlp.fc_in.weight"] = state[f"{r}mlp.fc.weight"]
        out[f"{p}mlp.fc_in.bias"] = bias_or_zeros(state, f"{r}mlp.fc.bias", state[f"{r}mlp.fc.weight"])
        out[f"{p}mlp.fc_out.weight"] = state[f"{r}mlp.proj.weight"]
        # out_proj has no bias: attn.proj's joins fc_out's (both sublayers add to the same sum)
        out[f"{p}mlp.fc_out.bias"] = (bias_or_zeros(state, f"{r}mlp.proj.bias", state[f"{r}mlp.proj.weight"])
                                      + bias_or_zeros(state, f"{r}attn.proj.bias", proj))
    return {k: v.contiguous() for k, v in out.items()}


def _ignorable(name: str) -> bool:
    # the mask buffers older transformers saved with every attention layer (GPT-J's, CodeGen's)
    return name.endswith((".attn.bias", ".attn.masked_bias", ".attn.causal_mask"))


FAMILY = Family(name="gptj", architecture="GPTJForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
# CodeGen imports; it exports as GPT-J (hf_config and to_hf are GPT-J's: the same function)
CODEGEN_FAMILY = Family(name="codegen", architecture="GPTJForCausalLM", model_config=codegen_model_config,
                        hf_config=hf_config, to_redline=codegen_to_redline, to_hf=to_hf, ignorable=_ignorable)
