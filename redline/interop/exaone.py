"""EXAONE 3.0 and 3.5 (LG AI Research's model_type "exaone": EXAONE-3.0-7.8B-Instruct, EXAONE-3.5-2.4B/7.8B/32B-
Instruct): Llama's block, which transformers runs as LlamaForCausalLM, with names of its own in the files and config.

The files name the tensors GPT-2's way: transformer.wte, transformer.h.N.{ln_1, attn.attention.{q,k,v,out}_proj,
ln_2, mlp.{c_fc_0 (gate), c_fc_1 (up), c_proj (down)}}, transformer.ln_f, lm_head; the config num_layers,
layer_norm_epsilon and activation_function for Llama's num_hidden_layers, rms_norm_eps and hidden_act. Both are read
(and files already in Llama's names); a redline model exports as Llama, the same computation. Names read from
transformers' conversion_mapping.py ("exaone") and models/exaone/configuration_exaone.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from redline.interop.families import Family, TensorSource
from redline.interop.llama import _ignorable, llama_shaped_hf_config, model_config_for, to_llama_hf, to_redline
from redline.model import ModelConfig

# the files' names -> Llama's, applied in order (transformers' renaming for "exaone")
_TO_LLAMA = [(r"^transformer\.wte\.", "model.embed_tokens."), (r"^transformer\.h\.", "model.layers."),
             (r"^transformer\.ln_f\.", "model.norm."), (r"\.attn\.attention\.", ".self_attn."),
             (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."), (r"\.ln_1\.", ".input_layernorm."),
             (r"\.ln_2\.", ".post_attention_layernorm."), (r"\.mlp\.c_fc_0\.", ".mlp.gate_proj."),
             (r"\.mlp\.c_fc_1\.", ".mlp.up_proj."), (r"\.mlp\.c_proj\.", ".mlp.down_proj.")]
_TO_FILE = [(r"^model\.embed_tokens\.", "transformer.wte."), (r"^model\.layers\.", "transformer.h."),
            (r"^model\.norm\.", "transformer.ln_f."), (r"\.self_attn\.o_proj\.", ".attn.attention.out_proj."),
            (r"\.self_attn\.", ".attn.attention."), (r"\.input_layernorm\.", ".ln_1."),
            (r"\.post_attention_layernorm\.", ".ln_2."), (r"\.mlp\.gate_proj\.", ".mlp.c_fc_0."),
            (r"\.mlp\.up_proj\.", ".mlp.c_fc_1."), (r"\.mlp\.down_proj\.", ".mlp.c_proj.")]
_CONFIG_NAMES = {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps",
                 "activation_function": "hidden_act"}


def _renamed(name: str, rules) -> str:
    for pattern, repl in rules:
        name = re.sub(pattern, repl, name)
    return name


def llama_config(hf: dict) -> dict:
    """config.json with EXAONE's key names as Llama's, and ExaoneConfig's RoPE base where none is given."""
    out = {_CONFIG_NAMES.get(k, k): v for k, v in hf.items()}
    if "rope_theta" not in out and not (out.get("rope_parameters") or {}).get("rope_theta"):
        out["rope_theta"] = 500_000.0
    return out


def model_config(hf: dict) -> ModelConfig:
    return model_config_for("llama")(llama_config(hf))


def _to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    names = {_renamed(n, _TO_LLAMA): n for n in src.names}
    return to_redline(TensorSource(names, lambda name: src.take(names[name]), src.where), cfg)


def _to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    return {_renamed(k, _TO_FILE): v for k, v in to_llama_hf(state, cfg).items()}


def hf_config(cfg: ModelConfig) -> dict:
    return llama_shaped_hf_config(cfg, "exaone")


# transformers runs model_type "exaone" as LlamaForCausalLM (its auto mapping); an export of any redline model picks
# Llama's own names (families.export_family), this family serving imports
FAMILY = Family(name="exaone", architecture="LlamaForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=_to_redline, to_hf=_to_hf, ignorable=_ignorable)
