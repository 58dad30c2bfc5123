"""OLMo 2 (AI2's Olmo2ForCausalLM): the Llama layout with its norms moved and QK-norm over whole projections.

Each block is h = x + norm(attn(x)), out = h + norm(mlp(h)): the norms (post_attention_layernorm,
post_feedforward_layernorm) sit on the sublayers' outputs, before the residual add, and nothing normalizes their
inputs (redline's norm_position "output"); a final norm follows the last block. QK-norm is an RMSNorm over the whole
q projection (num_heads · head_dim weights) and the whole k projection (num_kv_heads · head_dim) before the split
into heads (redline's qk_norm_scope "all"). The rest is Llama's: SwiGLU, RoPE on (first half, second half) pairs,
grouped-query attention, an untied head by default. Tensor names are Llama's (llama.py's maps, NORM_NAMES["output"]
for the norms). Semantics read from transformers' models/olmo2/modeling_olmo2.py.
"""

from __future__ import annotations

from redline.errors import UserError
from redline.interop.families import Family, raise_first
from redline.interop.llama import (_ignorable, _rope, check_silu, hf_config_for, shape_fields, to_hf,
                                   to_redline)
from redline.model import ModelConfig


def model_config(hf: dict) -> ModelConfig:
    check_silu(hf)
    if hf.get("attention_bias"):  # q/k/v/o biases with none in the MLP: redline's `bias` covers o_proj and the MLP
        raise UserError("attention_bias=true: OLMo 2 then has a bias on o_proj but none in its MLP, a mix redline "
                        "does not have (biases on q/k/v alone, or on every Linear layer)")
    return ModelConfig(
        **shape_fields(hf), qk_norm=True, qk_norm_scope="all", fused_qkv=True, pos_emb="rope", mlp="swiglu",
        fused_mlp=True, norm="rmsnorm", norm_position="output",
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bias=False, **_rope(hf),
    )


def check_exportable(cfg: ModelConfig) -> None:
    """A UserError naming the option of an output-norm model (norm_position "output") that OLMo 2 does not have."""
    problems = [
        (cfg.norm != "rmsnorm", "model.norm=layernorm with norm_position=output: OLMo 2 uses RMSNorm"),
        (cfg.mlp != "swiglu", f"model.mlp={cfg.mlp} with norm_position=output: OLMo 2's MLP is SwiGLU"),
        (cfg.pos_emb != "rope", f"model.pos_emb={cfg.pos_emb} with norm_position=output: OLMo 2 uses RoPE"),
        (not cfg.qk_norm or cfg.qk_norm_scope != "all", "norm_position=output without model.qk_norm=true and "
                                                         "model.qk_norm_scope=all: OLMo 2 normalizes its whole q and "
                                                         "k projections"),
        (cfg.sliding_window > 0, "model.sliding_window with norm_position=output: OLMo 2 attends to the whole "
                                 "context"),
        (cfg.bias, "model.bias=true with norm_position=output: OLMo 2 has no MLP biases"),
    ]
    raise_first(problems)


def _hf_config(cfg: ModelConfig) -> dict:
    out = hf_config_for("olmo2")(cfg)
    out["attention_bias"] = cfg.has_qkv_bias  # redline's q/k/v-only biases get a zero o_proj bias (llama.to_hf)
    return out


FAMILY = Family(name="olmo2", architecture="Olmo2ForCausalLM", model_config=model_config, hf_config=_hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=_ignorable)
