"""Families that transformers runs as LlamaForCausalLM under a config class of their own: InternLM3 (Shanghai AI
Lab's internlm3-8b-instruct, model_type "internlm3") and IQuest-Coder (IQuestLab's IQuest-Coder-V1, model_type
"iquestcoder"); and Emu3's text model (BAAI's Emu3, Emu3ForCausalLM, model_type "emu3_text_model"), Llama's block
and names under a class of its own. Their folders hold Llama's names and block; what differs is the config: defaults
of their own where a config.json leaves a field out (a head width of 128 rather than hidden_size / heads, an RMSNorm
eps of 1e-5, their KV heads), InternLM3's `qkv_bias` / `bias` spellings of attention_bias / mlp_bias (its attribute_map), and the
released InternLM3's "dynamic" (NTK) RoPE.

Dynamic NTK RoPE stretches the base once a sequence runs past max_position_embeddings, by
((factor · length / max_position_embeddings) − (factor − 1)) ** (dim / (dim − 2)) (transformers'
_compute_dynamic_ntk_parameters), which is exactly 1 up to max_position_embeddings: below it the model is plain RoPE
at its base, so the import's context stops there (context_len), equal to transformers at every position it takes.

Every option these configs have is one of Llama's, so a model of either exports as Llama (export_family), with the
same logits; PEFT adapters and GGUF files as Llama's. Semantics read from transformers'
models/internlm3/modular_internlm3.py and models/iquestcoder/modular_iquestcoder.py (both configs of LlamaConfig).
"""

from __future__ import annotations

from redline.errors import UserError
from redline.interop import llama
from redline.interop.families import Family
from redline.model import ModelConfig

_TITLES = {"internlm3": "InternLM3", "iquestcoder": "IQuest-Coder", "emu3_text_model": "Emu3"}
# the config classes' defaults for the fields a config.json may leave out (LlamaConfig's differ)
_DEFAULTS = {
    "internlm3": dict(vocab_size=128512, hidden_size=4096, intermediate_size=10240, num_hidden_layers=48,
                      num_attention_heads=32, num_key_value_heads=2, max_position_embeddings=32768,
                      rms_norm_eps=1e-5, head_dim=128, tie_word_embeddings=False),
    "iquestcoder": dict(vocab_size=76800, hidden_size=5120, intermediate_size=27648, num_hidden_layers=80,
                        num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=131072,
                        rms_norm_eps=1e-5, head_dim=128, tie_word_embeddings=False),
    # Emu3's text model (Emu3ForCausalLM, and Emu3ForConditionalGeneration's: multimodal.py): Llama's block, a
    # dropout on each sublayer's output in training (attention_dropout, which redline's training sets apart)
    "emu3_text_model": dict(vocab_size=184_622, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=9216,
                            rms_norm_eps=1e-5, rope_theta=1_000_000.0, tie_word_embeddings=False),
}


def _plain_below_context(hf: dict) -> dict:
    """`hf` with a dynamic NTK RoPE as the plain RoPE it is up to max_position_embeddings (the module docstring)."""
    params, scaling = dict(hf.get("rope_parameters") or {}), dict(hf.get("rope_scaling") or {})
    spec = params if params.get("rope_type", "default") != "default" else scaling
    if spec.get("rope_type", spec.get("type")) != "dynamic":
        return hf
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    return {**hf, "rope_parameters": {"rope_type": "default", "rope_theta": theta}, "rope_scaling": None}


def model_config_for(name: str):
    def model_config(hf: dict) -> ModelConfig:
        hf = {**_DEFAULTS[name], **hf}
        if name == "internlm3":  # InternLM3Config's attribute_map: qkv_bias is attention_bias, bias is mlp_bias
            hf["attention_bias"] = hf.get("attention_bias", hf.get("qkv_bias", False))
            hf["mlp_bias"] = hf.get("mlp_bias", hf.get("bias", False))
        if name == "iquestcoder":  # options of IQuest-Coder's original code that transformers' Llama has not
            if hf.get("clip_qkv") is not None:
                raise UserError(f"clip_qkv={hf['clip_qkv']} on an IQuest-Coder model: transformers' IQuestCoder "
                                f"(Llama's attention) does not clip q/k/v, and neither does redline")
            if hf.get("use_sliding_window"):
                raise UserError("use_sliding_window=true on an IQuest-Coder model: transformers' IQuestCoder (Llama's "
                                "attention) has no window; redline reads it without one only where it has none")
        return llama.model_config_for("llama")(_plain_below_context(hf))

    return model_config


def hf_config_for(name: str):
    """Llama's config.json entries as `name`'s, for writing a folder of this family (export_family sends these models
    to Llama, the architecture transformers runs them as)."""
    def hf_config(cfg: ModelConfig) -> dict:
        out = llama.llama_shaped_hf_config(cfg, name)
        if cfg.has_qkv_bias != cfg.bias:  # Llama's attention_bias covers o_proj too
            raise UserError(f"model.qkv_bias apart from model.bias: {_TITLES[name]} has biases on every Linear layer "
                            f"or none")
        return out

    return hf_config


FAMILIES = tuple(Family(name=name, architecture="LlamaForCausalLM", model_config=model_config_for(name),
                        hf_config=hf_config_for(name), to_redline=llama.to_redline, to_hf=llama.to_llama_hf,
                        ignorable=llama._ignorable) for name in _DEFAULTS)
