"""A LoRA run's adapters as a PEFT adapter folder (adapter_config.json + adapter_model.safetensors), for the
Hugging Face model `redline export` writes from the run's base:

    redline export BASE --out base-hf/                  # the base, as transformers loads it
    redline export RUN --adapter adapter/               # this module
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("base-hf"), "adapter")

Names follow the exported architecture's modules (redline/interop/llama.py, gpt2.py, gpt_bigcode.py, gpt_neo.py,
gptj.py: q and k rows (B's rows) in GPT-J's interleaved RoPE order; phi.py, phi3.py, gpt_neox.py (persimmon.py's
query_key_value alike), opt.py,
starcoder2.py, nanochat.py, bloom.py, falcon.py, mpt.py, lfm2.py, qwen3_5.py, granite.py, olmo_hybrid.py,
gemma4.py: Llama's attention and MLP names, each block's ple_gate and ple_proj as per_layer_input_gate and
per_layer_projection, the model's ple_proj as model.per_layer_model_projection; gemma3n.py: Gemma 4's and each
block's laurel_left and laurel_right as laurel.linear_left and linear_right (AltUp's layers refused by name); deepseek.py: the latent
attention's q_a_proj, q_b_proj or q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj, DeepSeek-V2's rotated rows (B's
rows) interleaved again, no MLP adapter (PEFT moves them onto the experts); minicpm3.py: that latent attention
beside Llama's MLP names; falcon_h1.py: its Mamba-2
mixer's blocks.N.mamba.in_proj as mamba.in_proj; PEFT adapts no out_proj of a Falcon-H1; nemotron_h.py), as PEFT
saves them (Nemotron-H's and Mamba2's every sublayer under mixer.: q/k/v/o_proj, in_proj and out_proj, up_proj and
down_proj, an E layer's shared_experts.up_proj and down_proj, never its router; no adapter on a Mamba-2 layer's out_proj, which PEFT refuses there;
zamba2.py: Zamba2's mixers' in_proj and out_proj, a hybrid layer's linear, never the shared blocks (one module for
all their callers in transformers); mamba.py: Mamba's and
Falcon-Mamba's mixer.in_proj, x_proj and dt_proj, never out_proj, which PEFT refuses in them too; jamba.py:
Jamba's mamba.in_proj, x_proj, dt_proj and out_proj, which PEFT adapts there, its dense feed_forward's
gate/up/down_proj and attention as Llama's, never the experts' router, a bare weight in transformers; llama4.py:
Llama 4's q and k rows in its interleaved RoPE order as Cohere's, feed_forward.gate/up/down_proj and
feed_forward.shared_expert.*, never the router, whose forward returns a pair; dots1.py, glm.py's Solar Open,
minimax_m2.py, phimoe.py: the attention's, as Llama's; minimax.py: that and lightning attention's qkv_proj,
output_gate and out_proj under their own names; dbrx.py: Wqkv (redline's qkv as it is), out_proj and the
router's ffn.router.layer; jetmoe.py: the two routers' Linear layers, self_attention.experts.router.layer and
mlp.router.layer, JetMoE's queries, output projections and experts being bare tensors; zamba.py: none, refused by
name; deepseek_v4.py: its attention's q_a_proj, q_b_proj, kv_proj and o_b_proj under self_attn., q_b's and kv's rows
(B's rows) in DeepSeek-V4's RoPE order, no adapter on its grouped o_a_proj or its MLPs):
`base_model.model.<module>.lora_A.weight` (r, in) and `...lora_B.weight` (out, r), scaled by lora_alpha / r.
Qwen3.5's q_proj (Qwen3.5-MoE's and Qwen3-Next's too), whose rows hold each head's queries and output gate, takes
redline's attn.qkv and attn.gate adapters together at the sum of their ranks (rank_pattern, alpha_pattern);
Qwen3-Next's delta nets take adapters on out_proj alone, and none go on its gate_proj, up_proj or down_proj layers
(PEFT moves those onto its experts), nor on GLM-4-MoE's (glm.py), Solar Open's or dots.llm1's for that reason; GLM's
and GLM-4's q and k rows (B's rows) are in their interleaved RoPE order on each head's first rope_dims rows.

Fused layers split exactly: redline's one qkv projection is three in Llama-family models (q_proj, k_proj, v_proj)
and its fused SwiGLU fc is gate_proj and up_proj. B·A of the fused layer stacks the parts' rows, so each part takes
the shared A and its own rows of B: the same update, at the same rank and scale. GPT-2's c_attn and c_fc are fused
as redline's are (Conv1D layers: fan_in_fan_out), and so are Phi-3's qkv_proj and gate_up_proj; GPT-NeoX's
query_key_value is too, its rows (B's rows) grouped by head, GPTBigCode's c_attn (nn.Linear: B's rows as redline's
where it is multi-query, grouped by head where multi-head), BLOOM's query_key_value (grouped by head alike), Falcon's
(grouped by KV head: each group's queries, key, value) and MPT's Wqkv. Modules trained in full (lora.train_modules: wte,
lm_head) go in as PEFT's modules_to_save.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from redline.errors import UserError
from redline.interop.families import Family, interleave_rope_rows
from redline.model import ModelConfig

PREFIX = "base_model.model."
_LAYER = re.compile(r"^blocks\.(\d+)\.(.+)$")
_LLAMA = {"attn.proj": "self_attn.o_proj", "attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj",
          "attn.v": "self_attn.v_proj", "mlp.proj": "mlp.down_proj", "mlp.up": "mlp.up_proj"}
_PHI = {"attn.proj": "self_attn.dense", "mlp.fc": "mlp.fc1", "mlp.proj": "mlp.fc2"}  # q/k/v as Llama's
_PHI3 = {"attn.qkv": "self_attn.qkv_proj", "attn.proj": "self_attn.o_proj", "mlp.fc": "mlp.gate_up_proj",
         "mlp.proj": "mlp.down_proj"}
_NEOX = {"attn.proj": "attention.dense", "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h"}
_PERSIMMON = {"attn.proj": "self_attn.dense", "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h"}
_OPT = {"attn.proj": "self_attn.out_proj", "mlp.fc": "fc1", "mlp.proj": "fc2"}  # q/k/v as Llama's
_STARCODER2 = {"attn.proj": "self_attn.o_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}  # q/k/v as Llama's
_NANOCHAT = {"attn.proj": "self_attn.o_proj", "mlp.fc": "mlp.fc1", "mlp.proj": "mlp.fc2"}  # q/k/v as Llama's
_GRANITE_SHARED = {"mlp.shared.fc": "shared_mlp.input_linear", "mlp.shared.proj": "shared_mlp.output_linear"}
_NEO = {"attn.q": "attn.attention.q_proj", "attn.k": "attn.attention.k_proj", "attn.v": "attn.attention.v_proj",
        "attn.proj": "attn.attention.out_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
_GPTJ = {"attn.q": "attn.q_proj", "attn.k": "attn.k_proj", "attn.v": "attn.v_proj", "attn.proj": "attn.out_proj",
         "mlp.fc": "mlp.fc_in", "mlp.proj": "mlp.fc_out"}
_BIGCODE = {"attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}  # c_attn apart
_GPT2 = {"attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
_BLOOM = {"attn.proj": "self_attention.dense", "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h"}
_MPT = {"attn.proj": "attn.out_proj", "mlp.fc": "ffn.up_proj", "mlp.proj": "ffn.down_proj"}
# ModernBERT-Decoder's (modernbert_decoder.py): q/k/v apart under attn, Wi the fused GeGLU as redline's fc
_MODERNBERT = {"attn.proj": "attn.Wo", "mlp.fc": "mlp.Wi", "mlp.proj": "mlp.Wo"}
# Gemma 4's per-layer input layers (gemma4.py): each block's gate and projection (the model's own projection of the
# embeddings: _parts)
_GEMMA4_PLE = {"ple_gate": "per_layer_input_gate", "ple_proj": "per_layer_projection"}
# Gemma 3n's LAuReL branch (gemma3n.py); its AltUp router, coefficients and stream projections take no adapter
_LAUREL = {"laurel_left": "laurel.linear_left", "laurel_right": "laurel.linear_right"}
# the architectures whose gate_proj, up_proj and down_proj adapters PEFT moves onto the experts' fused parameters
_EXPERT_NAMES = {"qwen3_next": "Qwen3-Next", "ernie4_5_moe": "ERNIE 4.5 MoE", "hunyuan_v1_moe": "Hunyuan MoE",
                 "cohere2_moe": "Cohere2 MoE", "dots1": "dots.llm1", "solar_open": "Solar Open"}
_QWEN3_5 = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next",  # qwen3_5.py's layout
            "qwen4_exp", "qwen4_exp_text")  # (Qwen4-Exp's: qwen4_exp.py)
# Qwen4-Exp's hyper-connection mixers (qwen4_exp.py) -> their Qwen4ExpTextGatedResidual's Linear layers
_HYPER = {"down": "input_mix_weight_down", "up": "input_mix_weight_up", "inject": "block_inject_weight"}


def _parts(layer: str, out_features: int, cfg: ModelConfig, family: Family) -> list[tuple[str, slice]]:
    """The exported modules that redline layer `layer` becomes, each with its rows of the layer's output."""
    gpt2 = family.name in ("gpt2", "openai-gpt")  # GPT-1's Conv1D modules are named as GPT-2's (openai_gpt.py)
    if family.name == "modernbert-decoder":
        return _modernbert_parts(layer, out_features, cfg)
    if layer in ("lm_head",):  # BioGPT's head is output_projection (biogpt.py)
        return [("output_projection" if family.name == "biogpt" else "lm_head", slice(0, cfg.head_width))]
    gemma4 = family.name in ("gemma4_text", "gemma4", "gemma3n_text", "gemma3n")  # gemma3n.py: Gemma 4's names
    if gemma4 and layer == "ple_proj":
        return [("model.per_layer_model_projection", slice(0, out_features))]
    qwen4 = family.name in ("qwen4_exp", "qwen4_exp_text")
    if qwen4 and layer.startswith("hc_out."):  # the last mixer, before the head
        return [(f"model.hyper_connection_mixer.{_HYPER[layer.split('.')[1]]}", slice(0, out_features))]
    match = _LAYER.match(layer)
    if match is None:
        raise UserError(f"the adapter on {layer} has no counterpart in the exported {family.architecture}")
    i, rest = match.groups()
    if family.name == "gpt_neox":
        return _neox_parts(layer, f"gpt_neox.layers.{i}.", rest, out_features, cfg)
    if family.name == "persimmon":  # GPT-NeoX's query_key_value under Llama's prefixes (persimmon.py)
        return _neox_parts(layer, f"model.layers.{i}.", rest, out_features, cfg, persimmon=True)
    if family.name == "gpt_bigcode":
        return _bigcode_parts(layer, f"transformer.h.{i}.", rest, out_features, cfg)
    if family.name == "gptj":  # q/k/v apart, q and k rows in GPT-J's interleaved RoPE order (as gptj.py exports)
        from redline.interop.gptj import rope_rows

        base = f"transformer.h.{i}."
        if rest == "attn.qkv":
            C = cfg.n_head * cfg.head_dim
            rows = torch.arange(3 * C)
            return [(base + "attn.q_proj", rope_rows(rows[:C], cfg, to_hf=True)),
                    (base + "attn.k_proj", rope_rows(rows[C:2 * C], cfg, to_hf=True)),
                    (base + "attn.v_proj", slice(2 * C, 3 * C))]
        if rest not in _GPTJ:
            raise UserError(f"the adapter on {layer} has no counterpart in GPT-J; export with --merge")
        if rest in ("attn.q", "attn.k"):
            return [(base + _GPTJ[rest], rope_rows(torch.arange(out_features), cfg, to_hf=True))]
        return [(base + _GPTJ[rest], slice(0, out_features))]
    if family.name == "gpt_neo":  # q/k/v apart under attn.attention, the rest GPT-2's names as nn.Linear
        base = f"transformer.h.{i}."
        if rest == "attn.qkv":
            C = cfg.n_head * cfg.head_dim
            return [(f"{base}attn.attention.{x}_proj", slice(j * C, (j + 1) * C)) for j, x in enumerate("qkv")]
        if rest not in _NEO:
            raise UserError(f"the adapter on {layer} has no counterpart in GPT-Neo; export with --merge")
        return [(base + _NEO[rest], slice(0, out_features))]
    if family.name in ("bloom", "mpt", "falcon"):
        return _alibi_parts(layer, i, rest, out_features, cfg, family)
    if family.name == "rwkv":  # rwkv.py's names: attention.* (time mixing), feed_forward.* (channel mixing)
        names = {"attn.key": "attention.key", "attn.value": "attention.value", "attn.receptance":
                 "attention.receptance", "attn.proj": "attention.output", "mlp.fc": "feed_forward.key",
                 "mlp.receptance": "feed_forward.receptance", "mlp.proj": "feed_forward.value"}
        if rest not in names:
            raise UserError(f"the adapter on {layer} has no counterpart in RWKV; export with --merge")
        if rest in ("attn.proj", "mlp.proj") and cfg.rescale_every and int(i) >= cfg.rescale_every:
            raise UserError(f"the adapter on {layer}: transformers' RWKV divides that layer's base weight by "
                            f"2^{int(i) // cfg.rescale_every} in eval mode (rescale_every={cfg.rescale_every}) but not "
                            f"its adapter's product, so PEFT's model would not be redline's; train with lora.targets "
                            f"that leave attn.proj and mlp.proj out, or export with --merge")
        return [(f"rwkv.blocks.{i}.{names[rest]}", slice(0, out_features))]
    if family.name == "xlstm":  # xlstm.py's names: mlstm_layer.* (weight_mode single), ffn.*
        names = {"attn.q": "mlstm_layer.q", "attn.k": "mlstm_layer.k", "attn.v": "mlstm_layer.v",
                 "attn.o": "mlstm_layer.ogate_preact", "attn.igate": "mlstm_layer.igate_preact",
                 "attn.fgate": "mlstm_layer.fgate_preact", "attn.proj": "mlstm_layer.out_proj",
                 "mlp.proj": "ffn.proj_down"}
        if rest == "mlp.fc":
            F_ = out_features // 2
            return [(f"backbone.blocks.{i}.ffn.proj_up_gate", slice(0, F_)),
                    (f"backbone.blocks.{i}.ffn.proj_up", slice(F_, 2 * F_))]
        if rest not in names:
            raise UserError(f"the adapter on {layer} has no counterpart in xLSTM; export with --merge")
        return [(f"backbone.blocks.{i}.{names[rest]}", slice(0, out_features))]
    if family.name == "dbrx":  # dbrx.py's names: Wqkv fused as redline's qkv, the router's Linear layer
        names = {"attn.qkv": "norm_attn_norm.attn.Wqkv", "attn.proj": "norm_attn_norm.attn.out_proj",
                 "mlp.router": "ffn.router.layer"}
        if rest not in names:
            raise UserError(f"the adapter on {layer} has no counterpart in DBRX (its experts are fused tensors, no "
                            f"Linear layers); export with --merge")
        return [(f"transformer.blocks.{i}.{names[rest]}", slice(0, out_features))]
    if family.name == "zamba":  # in_proj's rows interleave x and the gate; x_proj and dt_proj are bare tensors
        raise UserError(f"the adapter on {layer} has no counterpart in Zamba (its in_proj interleaves each channel's "
                        f"x and gate, its heads' x_proj and dt_proj are bare tensors, its shared block one module for "
                        f"all callers); export with --merge")
    if family.name == "jetmoe":  # jetmoe.py's names: a block's Linear layers are its routers and kv_proj
        names = {"attn.gate": "self_attention.experts.router.layer", "mlp.router": "mlp.router.layer"}
        if rest not in names:
            raise UserError(f"the adapter on {layer} has no counterpart in JetMoE (its queries, output projections "
                            f"and experts are bare tensors, and kv_proj holds no queries); train with lora.targets "
                            f"attn.gate mlp.router or export with --merge")
        return [(f"model.layers.{i}.{names[rest]}", slice(0, out_features))]
    if family.name == "dory":  # dory.py's names: the stored blocks renumbered, a looped pass's adapters its block's
        from redline.interop.dory import adapter_parts as dory_parts

        return dory_parts(layer, int(i), rest, out_features, cfg)
    if family.name == "axk2":  # axk2.py's names: DeepSeek's latent attention, q_b as q_gate_proj
        from redline.interop.axk2 import adapter_parts as axk2_parts

        return axk2_parts(layer, rest, f"model.layers.{i}.", out_features, cfg)
    if family.name == "longcat_flash":  # longcat_flash.py's names: block 2j + s is layer j's sublayers s
        from redline.interop.longcat_flash import adapter_parts as longcat_parts

        return longcat_parts(layer, int(i), rest, out_features, cfg)
    base = f"transformer.h.{i}." if gpt2 else f"model.decoder.layers.{i}." if family.name == "opt" else \
        f"biogpt.layers.{i}." if family.name == "biogpt" else f"model.layers.{i}."
    if gpt2:
        if rest not in _GPT2:
            raise UserError(f"the adapter on {layer} has no counterpart in GPT-2 (whose q/k/v are one fused c_attn); "
                            f"export with --merge")
        return [(base + _GPT2[rest], slice(0, out_features))]
    if family.name == "phi3":  # q/k/v and gate/up fused as redline's are (rows [q; k; v], [gate; up])
        if rest not in _PHI3 or (rest == "mlp.fc" and not cfg.fused_mlp):
            raise UserError(f"the adapter on {layer} has no counterpart in Phi-3 (whose q/k/v are one qkv_proj and "
                            f"gate and up one gate_up_proj); export with --merge")
        return [(base + _PHI3[rest], slice(0, out_features))]
    if family.name == "minimax" and int(i) in cfg.delta_layers and rest.startswith("attn."):  # minimax.py: Lightning's
        if rest not in ("attn.qkv_proj", "attn.output_gate", "attn.out_proj"):  # names, as transformers' are
            raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture}; export with --merge")
        return [(f"{base}self_attn.{rest[len('attn.'):]}", slice(0, out_features))]
    if family.name in _EXPERT_NAMES and rest.startswith(("mlp.fc", "mlp.up", "mlp.proj", "mlp.shared.")):
        raise UserError(f"the adapter on {layer} would be a gate_proj, up_proj or down_proj adapter, which PEFT moves "
                        f"onto {_EXPERT_NAMES[family.name]}'s experts (their fused gate_up_proj and down_proj) as it loads them; export "
                        f"with --merge")
    if qwen4 and rest in ("ngram.key", "ngram.value"):  # a layer's Per-Layer Embedding's projections
        return [(f"{base}ple.{rest[6:]}_proj", slice(0, out_features))]
    if qwen4 and rest.startswith(("attn_hc.", "mlp_hc.")):  # a layer's hyper-connection mixers
        where, part = rest.split(".")
        side = "attn_hyper_connection" if where == "attn_hc" else "mlp_hyper_connection"
        return [(f"{base}{side}.{_HYPER[part]}", slice(0, out_features))]
    if family.name in _QWEN3_5 or (family.name == "lara_mini" and int(i) in cfg.delta_layers):
        # qwen3_5.py's names (Lara Mini's delta nets as transformers splits their fused in_proj, its attention
        # Llama's); q_proj holds queries and gates together
        if int(i) in cfg.delta_layers:
            names = {"attn.in_proj": "linear_attn.in_proj_qkv", "attn.z": "linear_attn.in_proj_z",
                     "attn.b": "linear_attn.in_proj_b", "attn.a": "linear_attn.in_proj_a",
                     "attn.proj": "linear_attn.out_proj"}
            why = ""
            if family.name == "qwen3_next":  # one module's rows hold several of redline's layers, interleaved
                names = {"attn.proj": "linear_attn.out_proj"}
                why = " (its in_proj_qkvz and in_proj_ba hold q, k, v, z and b, a interleaved by key head)"
            if rest not in names and not rest.startswith("mlp."):
                raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture}{why}; export "
                                f"with --merge")
            if rest in names:
                return [(base + names[rest], slice(0, out_features))]
        elif rest == "attn.gate":  # into q_proj by _qwen3_5_q_proj, with the queries' adapter
            return []
        elif rest == "attn.qkv":  # k and v as Llama's; the queries into q_proj by _qwen3_5_q_proj
            q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
            return [(base + "self_attn.k_proj", slice(q, q + kv)),
                    (base + "self_attn.v_proj", slice(q + kv, q + 2 * kv))]
    if family.name == "olmo_hybrid" and int(i) in cfg.delta_layers:  # olmo_hybrid.py's names: q/k/v apart
        if rest == "attn.in_proj":
            qk, v = cfg.delta_key_heads * cfg.delta_key_dim, cfg.delta_heads * cfg.delta_value_dim
            return [(f"{base}linear_attn.{x}_proj", slice(start, start + width))
                    for x, start, width in (("q", 0, qk), ("k", qk, qk), ("v", 2 * qk, v))]
        names = {"attn.z": "linear_attn.g_proj", "attn.b": "linear_attn.b_proj", "attn.a": "linear_attn.a_proj",
                 "attn.proj": "linear_attn.o_proj"}
        if rest in names:
            return [(base + names[rest], slice(0, out_features))]
    if family.name in ("bamba", "falcon_h1") and rest != "attn.qkv":  # granite.py's Bamba names; q/k/v as Llama's
        names = {"mlp.proj": "feed_forward.down_proj", "attn.proj": "self_attn.o_proj",
                 "mamba.in_proj": "mamba.in_proj"}  # Falcon-H1's mixer beside attention
        if int(i) in cfg.delta_layers and not cfg.delta_parallel:  # Bamba's mixer in attention's place
            names.update({"attn.in_proj": "mamba.in_proj", "attn.proj": "mamba.out_proj"})
        if rest == "mamba.proj":  # peft refuses out_proj (and conv1d) targets in the Mamba models it knows
            raise UserError(f"the adapter on {layer} would be the Mamba-2 mixer's out_proj, which PEFT refuses to "
                            f"adapt in {family.architecture}; train with lora.targets leaving mamba.proj out (attn.*, "
                            f"mlp.*, mamba.in_proj) or export with --merge")
        if rest == "mlp.fc":
            return _gate_up(base + "feed_forward.", out_features)
        if rest not in names:
            raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture}; export with --merge")
        return [(base + names[rest], slice(0, out_features))]
    if family.name == "granitemoehybrid":  # granite.py's names: shared_mlp's fused input_linear, Mamba-2's mamba.*
        names = {"mlp.fc": "shared_mlp.input_linear", "mlp.proj": "shared_mlp.output_linear", **_GRANITE_SHARED}
        if int(i) in cfg.delta_layers:
            names.update({"attn.in_proj": "mamba.in_proj", "attn.proj": "mamba.out_proj"})
        elif rest != "attn.qkv":  # the attention's q/k/v as Llama's, below
            names["attn.proj"] = "self_attn.o_proj"
        if rest in names:
            return [(base + names[rest], slice(0, out_features))]
        if rest != "attn.qkv":
            raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture}; export with --merge")
    if family.name == "doge" and rest == "attn.dt_proj":  # the dynamic mask's projection; the rest Llama's
        return [(base + "self_attn.dt_proj", slice(0, out_features))]
    if family.name == "recurrent_gemma":  # recurrent_gemma.py's names: temporal_block.*, mlp_block.*
        t = base + "temporal_block."
        if rest == "attn.qkv":
            q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
            return [(t + "q_proj", slice(0, q)), (t + "k_proj", slice(q, q + kv)),
                    (t + "v_proj", slice(q + kv, q + 2 * kv))]
        if rest == "mlp.fc":
            return _gate_up(base + "mlp_block.", out_features)
        names = {"attn.proj": t + ("linear_out" if int(i) in cfg.delta_layers else "o_proj"),
                 "attn.linear_x": t + "linear_x", "attn.linear_y": t + "linear_y",
                 "mlp.proj": base + "mlp_block.down_proj"}
        if rest not in names:
            raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture}; export with --merge")
        return [(names[rest], slice(0, out_features))]
    if family.name in ("mamba", "falcon_mamba"):  # mamba.py's names: each layer a Mamba-1 mixer alone, mixer.*
        if rest == "attn.proj":
            raise UserError(f"the adapter on {layer} is on a Mamba-1 layer's out_proj, which PEFT refuses to adapt in "
                            f"{family.architecture} (the fused Mamba kernels read its weight directly); train with "
                            f"lora.targets that leave attn.proj out (attn.in_proj attn.x_proj attn.dt_proj) or export "
                            f"with --merge")
        names = {"attn.in_proj": "in_proj", "attn.x_proj": "x_proj", "attn.dt_proj": "dt_proj"}
        if rest not in names:
            raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture}; export with --merge")
        return [(f"backbone.layers.{i}.mixer.{names[rest]}", slice(0, out_features))]
    if family.name == "jamba" and rest != "attn.qkv":  # jamba.py's names; the attention's q/k/v as Llama's, below
        if rest == "mlp.router":  # JambaTopKRouter holds a bare weight, no Linear layer PEFT could adapt
            raise UserError(f"the adapter on {layer} adapts a mixture of experts' router, which is no Linear layer in "
                            f"transformers' JambaForCausalLM (PEFT cannot load it); train with lora.targets that "
                            f"leave mlp.router out (attn.*, mlp.fc, mlp.proj) or export with --merge")
        # PEFT refuses no Jamba out_proj (its mixer calls out_proj as a module, the fused Mamba path unused there)
        names = {"attn.in_proj": "mamba.in_proj", "attn.x_proj": "mamba.x_proj", "attn.dt_proj": "mamba.dt_proj",
                 "attn.proj": "mamba.out_proj"} if int(i) in cfg.delta_layers else {"attn.proj": "self_attn.o_proj"}
        names["mlp.proj"] = "feed_forward.down_proj"
        if rest == "mlp.fc" and cfg.fused_mlp:
            return _gate_up(base + "feed_forward.", out_features)
        if rest not in names:
            raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture}; export with --merge")
        return [(base + names[rest], slice(0, out_features))]
    if family.name == "zamba2":  # zamba2.py's names: a mixer under mamba. (a caller's under mamba_decoder.mamba.)
        caller = int(i) in cfg.shared_attn_layers
        mixer, module = (base + "mamba_decoder.mamba.", "mamba.") if caller else (base + "mamba.", "attn.")
        names = {module + "in_proj": mixer + "in_proj", module + "proj": mixer + "out_proj"}
        if caller:
            names["attn.shared_in"] = base + "linear"
        if rest not in names:
            raise UserError(f"the adapter on {layer} has no counterpart in Zamba2 (whose shared blocks and their "
                            f"adapter lists are one module for all their callers, as PEFT sees them); train with "
                            f"lora.targets attn.in_proj attn.proj mamba.* attn.shared_in or export with --merge")
        return [(names[rest], slice(0, out_features))]
    if family.name in ("nemotron_h", "mamba2"):  # nemotron_h.py's names: each layer's one sublayer is its mixer.*
        base = f"{'backbone' if family.name == 'mamba2' else 'model'}.layers.{i}.mixer."
        if rest == "attn.proj" and int(i) in cfg.delta_layers:
            raise UserError(f"the adapter on {layer} is on a Mamba-2 layer's out_proj, which PEFT refuses to adapt in "
                            f"{family.architecture} (the fused Mamba kernels read its weight directly); train with "
                            f"lora.targets that leave attn.proj out (e.g. attn.in_proj attn.qkv mlp.*) or export with "
                            f"--merge")
        if rest == "attn.qkv":
            q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
            return [(base + "q_proj", slice(0, q)), (base + "k_proj", slice(q, q + kv)),
                    (base + "v_proj", slice(q + kv, q + 2 * kv))]
        if rest == "mlp.router":  # NemotronHTopkRouter holds a bare weight, no Linear layer PEFT could adapt
            raise UserError(f"the adapter on {layer} adapts a mixture of experts' router, which is no Linear layer in "
                            f"transformers' {family.architecture} (PEFT cannot load it); train with lora.targets that "
                            f"leave mlp.router out (attn.*, mlp.fc, mlp.proj, mlp.shared.*) or export with --merge")
        names = {"attn.in_proj": "in_proj", "attn.proj": "out_proj" if int(i) in cfg.delta_layers else "o_proj",
                 "attn.q": "q_proj", "attn.k": "k_proj", "attn.v": "v_proj", "mlp.fc": "up_proj",
                 "mlp.proj": "down_proj", "mlp.shared.fc": "shared_experts.up_proj",
                 "mlp.shared.proj": "shared_experts.down_proj"}  # an E layer's shared expert
        if rest not in names:
            raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture}; export with --merge")
        return [(base + names[rest], slice(0, out_features))]
    if family.name == "bailing_hybrid":  # bailing_hybrid.py: transformers' in-memory module paths
        from redline.interop.bailing_hybrid import adapter_parts as ling3_parts

        return ling3_parts(layer, rest, base, out_features, cfg)
    if family.name == "dots3_note_text":  # dots3.py: DeepSeek's latent attention, interleaved rows, g_proj
        from redline.interop.dots3 import adapter_parts as dots3_parts

        return dots3_parts(layer, rest, base, out_features, cfg)
    if family.name == "zaya":  # zaya.py's names: the CCA projections and the MLP router's layers
        from redline.interop.zaya import adapter_parts as zaya_parts

        return zaya_parts(layer, rest, base, out_features)
    if family.name == "deepseek_v4":  # deepseek_v4.py: its attention's Linear layers, rows in its RoPE order
        from redline.interop.deepseek_v4 import adapter_parts as v4_parts

        return v4_parts(layer, rest, base, out_features, cfg)
    if family.name == "kimi_linear":  # kimi_linear.py's names: KDA's q/k/v apart, DeepSeek's latent attention
        from redline.interop.kimi_linear import adapter_parts as kimi_parts

        return kimi_parts(layer, rest, base, out_features, cfg)
    if family.name in ("deepseek_v3", "deepseek_v2", "minicpm3", "mistral4", "axk1"):  # deepseek.py's latent attention
        from redline.interop.deepseek import adapter_parts

        parts = adapter_parts(layer, rest, base, out_features, cfg, family.name)
        if parts is not None:
            return parts
    if family.name in ("glm", "glm4", "glm4_moe", "sarvam_moe"):  # Sarvam MoE: GLM-4-MoE's modules (sarvam.py)
        return _glm_parts(layer, base, rest, out_features, cfg, family)
    if gemma4 and rest in _GEMMA4_PLE:
        return [(base + _GEMMA4_PLE[rest], slice(0, out_features))]
    if family.name in ("gemma3n_text", "gemma3n") and rest in _LAUREL:
        return [(base + _LAUREL[rest], slice(0, out_features))]
    if family.name in ("llama4_text", "llama4") and rest != "attn.qkv":  # llama4.py's names: feed_forward.*
        if rest == "mlp.router":  # Llama4Router returns (scores, logits): a LoRA layer around it cannot add to that
            raise UserError(f"the adapter on {layer} adapts Llama 4's router, whose forward returns its scores and "
                            f"logits together (PEFT cannot wrap it); train with lora.targets that leave mlp.router out "
                            f"(attn.*, mlp.fc, mlp.proj, mlp.shared.*) or export with --merge")
        shared = "shared_expert." if rest.startswith("mlp.shared.") else ""
        if rest in ("mlp.fc", "mlp.shared.fc"):
            return _gate_up(f"{base}feed_forward.{shared}", out_features)
        if rest in ("mlp.proj", "mlp.shared.proj"):
            return [(f"{base}feed_forward.{shared}down_proj", slice(0, out_features))]
        if rest != "attn.proj":
            raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture}; export with --merge")
        return [(base + "self_attn.o_proj", slice(0, out_features))]
    if rest == "attn.qkv":
        q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        # q and k rows in RoPE's interleaved order, as cohere.py, ernie.py and llama4.py export them
        if family.name in ("cohere", "cohere2", "cohere2_moe", "ernie4_5_moe", "llama4_text", "llama4"):
            rows = torch.arange(q + kv)
            return [(base + "self_attn.q_proj", interleave_rope_rows(rows[:q], cfg.n_head, inverse=False)),
                    (base + "self_attn.k_proj", interleave_rope_rows(rows[q:], cfg.kv_heads, inverse=False)),
                    (base + "self_attn.v_proj", slice(q + kv, q + 2 * kv))]
        return [(base + "self_attn.q_proj", slice(0, q)), (base + "self_attn.k_proj", slice(q, q + kv)),
                (base + "self_attn.v_proj", slice(q + kv, q + 2 * kv))]
    if family.name in ("phi", "opt", "starcoder2", "nanochat", "biogpt"):  # BioGPT: OPT's names (biogpt.py)
        names = {"phi": _PHI, "opt": _OPT, "starcoder2": _STARCODER2, "nanochat": _NANOCHAT,
                 "biogpt": _OPT}[family.name]
        if rest not in names:
            raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture}; export with --merge")
        return [(base + names[rest], slice(0, out_features))]
    if family.name in ("lfm2", "lfm3"):  # their own names (lfm2.py): feed_forward.w1/w3/w2, a conv layer's in_proj
        # and out_proj, the attention's out_proj (LFM2) or o_proj and g_proj, the head gate's module (LFM3)
        conv = int(i) in cfg.conv_layers
        if rest == "mlp.fc":
            half = out_features // 2
            return [(base + "feed_forward.w1", slice(0, half)), (base + "feed_forward.w3", slice(half, out_features))]
        out_proj = "self_attn.out_proj" if family.name == "lfm2" else "self_attn.o_proj"
        names = {"mlp.proj": "feed_forward.w2", "attn.proj": "conv.out_proj" if conv else out_proj,
                 "attn.in_proj": "conv.in_proj", "attn.gate": "self_attn.g_proj"}
        if rest not in names:
            raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture}; export with --merge")
        return [(base + names[rest], slice(0, out_features))]
    if family.name == "laguna" and rest == "attn.gate":  # Laguna's softplus head gate (laguna.py)
        return [(base + "self_attn.g_proj", slice(0, out_features))]
    if family.name == "afmoe" and rest == "attn.gate":  # AFMoE's element-wise head gate, self_attn.gate_proj
        raise UserError(f"the adapter on {layer} adapts AFMoE's head gate, self_attn.gate_proj, which PEFT takes for "
                        f"an expert's gate_proj and refuses without up_proj (fused into the experts' gate_up_proj); "
                        f"train with lora.targets attn.qkv attn.proj or export with --merge")
    if rest == "mlp.router" and family.name == "phimoe":  # an nn.Linear whose forward returns a triple
        raise UserError(f"the adapter on {layer} adapts PhiMoE's router (PhimoeTopKRouter, whose forward returns its "
                        f"logits, weights and experts together: PEFT cannot wrap it); train with lora.targets that "
                        f"leave mlp.router out (attn.*) or export with --merge")
    if rest == "mlp.router":
        raise UserError(f"the adapter on {layer} adapts a mixture of experts' router, which is no Linear layer in "
                        f"transformers' {family.architecture} (PEFT cannot load it); train with lora.targets attn.* "
                        f"(and mlp.shared.* where there is a shared expert) or export with --merge")
    if rest.startswith("mlp.shared") and family.name in ("granitemoeshared", "granitemoe_swa"):
        return [(base + _GRANITE_SHARED[rest], slice(0, out_features))]
    if rest.startswith("mlp.shared"):  # Qwen2-MoE's shared expert: a SwiGLU MLP with its gate and up fused
        shared = {"mlp.shared.proj": "mlp.shared_expert.down_proj", "mlp.shared_gate": "mlp.shared_expert_gate"}
        if rest == "mlp.shared.fc":
            return _gate_up(base + "mlp.shared_expert.", out_features)
        return [(base + shared[rest], slice(0, out_features))]
    if rest == "mlp.fc":
        if not cfg.gated_mlp:  # a plain MLP's first product (Arcee's ReLU²): up_proj
            return [(base + "mlp.up_proj", slice(0, out_features))]
        if cfg.fused_mlp:  # (gate; up) stacked, as llama.py's export splits the weight
            return _gate_up(base + "mlp.", out_features)
        return [(base + "mlp.gate_proj", slice(0, out_features))]
    if rest not in _LLAMA:
        raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture}; export with --merge")
    return [(base + _LLAMA[rest], slice(0, out_features))]


def _neox_parts(layer: str, base: str, rest: str, out_features: int, cfg: ModelConfig,
                persimmon: bool = False) -> list[tuple[str, object]]:
    """GPT-NeoX's modules for redline layer `layer` (persimmon: Persimmon's names for the same layout):
    query_key_value takes B's rows in its own order, q, k and v grouped by head (gpt_neox.py regroups the weight
    alike), the others B as it is."""
    from redline.interop.gpt_neox import _regroup

    attention, names, arch = ("self_attn.", _PERSIMMON, "Persimmon") if persimmon else ("attention.", _NEOX, "GPT-NeoX")
    if rest == "attn.qkv":
        return [(base + attention + "query_key_value", _regroup(torch.arange(out_features), cfg, to_neox=True))]
    if rest not in names:
        raise UserError(f"the adapter on {layer} has no counterpart in {arch}; export with --merge")
    return [(base + names[rest], slice(0, out_features))]


def _glm_parts(layer: str, base: str, rest: str, out_features: int, cfg: ModelConfig,
               family: Family) -> list[tuple[str, object]]:
    """glm.py's names: q/k/v apart (GLM's and GLM-4's q and k rows in their interleaved RoPE order, as glm.py exports
    them), o_proj; GLM's and GLM-4's gate and up fused in gate_up_proj. GLM-4-MoE's attention alone: PEFT renames
    its MLP adapters (dense layers' and shared experts' gate_proj / up_proj / down_proj) onto the experts."""
    from redline.interop.glm import rope_rows

    if rest == "attn.qkv":
        q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        rows = torch.arange(q + 2 * kv)
        q_rows, k_rows = rows[:q], rows[q:q + kv]
        if family.name not in ("glm4_moe", "sarvam_moe"):
            q_rows, k_rows = rope_rows(q_rows, cfg.n_head, cfg, to_hf=True), rope_rows(k_rows, cfg.kv_heads, cfg,
                                                                                         to_hf=True)
        return [(base + "self_attn.q_proj", q_rows), (base + "self_attn.k_proj", k_rows),
                (base + "self_attn.v_proj", slice(q + kv, q + 2 * kv))]
    if family.name in ("glm4_moe", "sarvam_moe") and rest.startswith("mlp."):
        raise UserError(f"the adapter on {layer} would be a router, gate_proj, up_proj or down_proj adapter, which "
                        f"PEFT moves onto GLM-4-MoE's experts (their fused gate_up_proj and down_proj) as it loads "
                        f"them; train with lora.targets attn.* or export with --merge")
    if rest == "mlp.fc" and cfg.fused_mlp:
        return [(base + "mlp.gate_up_proj", slice(0, out_features))]
    names = {"attn.proj": "self_attn.o_proj", "mlp.proj": "mlp.down_proj"}
    if rest not in names:
        raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture} (whose q/k/v are rows "
                        f"of redline's fused attn.qkv, its gate and up of mlp.fc); export with --merge")
    return [(base + names[rest], slice(0, out_features))]


def _gate_up(prefix: str, out_features: int) -> list[tuple[str, slice]]:
    """A fused (gate; up) layer's B rows as prefix + gate_proj's and up_proj's halves."""
    half = out_features // 2
    return [(prefix + "gate_proj", slice(0, half)), (prefix + "up_proj", slice(half, out_features))]


def _bigcode_parts(layer: str, base: str, rest: str, out_features: int, cfg: ModelConfig) -> list[tuple[str, object]]:
    """GPTBigCode's modules (nn.Linear, not GPT-2's Conv1D) for redline layer `layer`: c_attn takes B's rows in its
    own order (multi-head: grouped by head, as gpt_bigcode.py regroups the weight), the others B as it is."""
    from redline.interop.gpt_bigcode import _regroup

    if rest == "attn.qkv":
        return [(base + "attn.c_attn", _regroup(torch.arange(out_features), cfg, to_hf=True))]
    if rest not in _BIGCODE:
        raise UserError(f"the adapter on {layer} has no counterpart in GPTBigCode (whose q/k/v are one fused c_attn); "
                        f"export with --merge")
    return [(base + _BIGCODE[rest], slice(0, out_features))]
def _alibi_parts(layer: str, i: str, rest: str, out_features: int, cfg: ModelConfig,
                 family: Family) -> list[tuple[str, object]]:
    """BLOOM's, Falcon's and MPT's modules for redline layer `layer`: all fuse q, k and v in one module, BLOOM's
    query_key_value taking B's rows grouped by head (bloom.py regroups the weight alike), Falcon's (BLOOM's names)
    grouped by KV head (falcon.py's regrouping), MPT's Wqkv as redline's."""
    from redline.interop import bloom as bloom_layout, falcon

    bloom = family.name in ("bloom", "falcon")
    base, names = (f"transformer.h.{i}.", _BLOOM) if bloom else (f"transformer.blocks.{i}.", _MPT)
    if rest == "attn.qkv":
        rows = torch.arange(out_features)
        if family.name == "falcon":
            return [(base + "self_attention.query_key_value",
                     falcon._regroup(rows, cfg.n_head, cfg.kv_heads, to_redline=False))]
        if bloom:
            return [(base + "self_attention.query_key_value", bloom_layout._regroup(rows, cfg.n_head, False))]
        return [(base + "attn.Wqkv", slice(0, out_features))]
    if rest not in names:
        raise UserError(f"the adapter on {layer} has no counterpart in {family.architecture} (whose q/k/v are one "
                        f"fused module); export with --merge")
    return [(base + names[rest], slice(0, out_features))]


def _modernbert_parts(layer: str, out_features: int, cfg: ModelConfig) -> list[tuple[str, slice]]:
    """ModernBERT-Decoder's modules: the head is its decoder, the prediction head's dense layer lm_head.dense."""
    if layer == "lm_head":
        return [("decoder", slice(0, cfg.head_width))]
    if layer == "head_transform.dense":
        return [("lm_head.dense", slice(0, out_features))]
    match = _LAYER.match(layer)
    if match is None or match.group(2) not in {"attn.qkv", *_MODERNBERT}:
        raise UserError(f"the adapter on {layer} has no counterpart in ModernBERT-Decoder; export with --merge")
    i, rest = match.groups()
    base = f"model.layers.{i}."
    if rest == "attn.qkv":
        C = cfg.n_head * cfg.head_dim
        return [(f"{base}attn.{x}_proj", slice(j * C, (j + 1) * C)) for j, x in enumerate("qkv")]
    return [(base + _MODERNBERT[rest], slice(0, out_features))]


def _full_module(name: str, cfg: ModelConfig, family: Family) -> tuple[str, int | None]:
    """A module trained in full -> (its exported name, rows kept (the unpadded vocabulary) or None)."""
    table = {"gpt2": "transformer.wte", "gpt_bigcode": "transformer.wte", "gpt_neo": "transformer.wte",
             "gptj": "transformer.wte", "gpt_neox": "gpt_neox.embed_in",
             "opt": "model.decoder.embed_tokens", "nemotron_h": "model.embeddings",
             "mamba2": "backbone.embeddings", "mamba": "backbone.embeddings",
             "falcon_mamba": "backbone.embeddings",
             "bloom": "transformer.word_embeddings", "falcon": "transformer.word_embeddings",
             "mpt": "transformer.wte", "dbrx": "transformer.wte", "openai-gpt": "transformer.tokens_embed",
             "biogpt": "biogpt.embed_tokens",
             "modernbert-decoder": "model.embeddings.tok_embeddings"}.get(family.name, "model.embed_tokens")
    head = {"biogpt": "output_projection", "modernbert-decoder": "decoder"}.get(family.name, "lm_head")
    top = {"wte": (table, cfg.vocab_size), "lm_head": (head, cfg.head_width)}
    if name not in top:
        raise UserError(f"lora.train_modules trained {name} in full; a PEFT adapter carries only wte or lm_head "
                        f"that way: export with --merge")
    if name == "lm_head" and cfg.head_bias:
        raise UserError("lm_head was trained in full in a model whose head has a bias, which the adapter does not "
                        "carry; export with --merge")
    if cfg.tie_embeddings:
        raise UserError(f"{name} was trained in full in a model with tied embeddings, which PEFT's modules_to_save "
                        f"would untie; export with --merge")
    return top[name]


def _rows_as_exported(B: torch.Tensor, module: str, cfg: ModelConfig, family: Family) -> torch.Tensor:
    """A part's rows of B as the exported weight's rows run: nanochat's q and k rows with each head's second half
    negated, as nanochat.py exports the weights (B·A then adapts the weight as exported)."""
    if family.name == "nanochat" and module.endswith(("q_proj", "k_proj")):
        from redline.interop.nanochat import flip_rope_rows

        return flip_rope_rows(B, cfg.n_head if module.endswith("q_proj") else cfg.kv_heads).contiguous()
    return B.contiguous()


def _qwen3_5_q_proj(saved: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, tuple[torch.Tensor, ...]]:
    """Qwen3.5's q_proj of each attention layer -> (A, B): its rows hold, head by head, the head's queries then its
    output gate, which redline adapts apart (attn.qkv's first H·D rows, attn.gate). Each adapter's A stacked, B's
    rows put where the exported weight has them, block by block: the same update, at the sum of the two ranks
    (adapter_config's rank_pattern, its alpha_pattern keeping the scale alpha / r)."""
    H, D = cfg.n_head, cfg.head_dim
    rows = torch.arange(2 * H * D).view(H, 2, D)  # q_proj's row of (head, queries or gate, dimension)
    out = {}
    for i in range(cfg.n_layer):
        parts = [(saved[f"blocks.{i}.attn.{name}.lora_A"], saved[f"blocks.{i}.attn.{name}.lora_B"][:H * D], at)
                 for name, at in (("qkv", rows[:, 0].flatten()), ("gate", rows[:, 1].flatten()))
                 if f"blocks.{i}.attn.{name}.lora_A" in saved]
        if not parts:
            continue
        A = torch.cat([a for a, _, _ in parts])
        B = A.new_zeros(2 * H * D, A.shape[0])
        col = 0
        for a, b, at in parts:
            B[at, col:col + a.shape[0]] = b
            col += a.shape[0]
        out[f"model.layers.{i}.self_attn.q_proj"] = (A, B)
    return out


def peft_tensors(saved: Mapping[str, torch.Tensor], cfg: ModelConfig,
                 family: Family) -> tuple[dict[str, torch.Tensor], list[str], list[str], dict[str, int]]:
    """An adapter checkpoint's tensors -> (PEFT's tensors, target module names, modules_to_save, the ranks of
    modules that take more than one redline adapter (rank_pattern))."""
    tensors, targets, full, ranks = {}, [], [], {}
    if family.name in _QWEN3_5:
        r = next((t.shape[0] for n, t in saved.items() if n.endswith(".lora_A")), 0)
        for module, (A, B) in _qwen3_5_q_proj(saved, cfg).items():
            tensors[f"{PREFIX}{module}.lora_A.weight"], tensors[f"{PREFIX}{module}.lora_B.weight"] = A, B
            targets.append(module)
            if A.shape[0] != r:
                ranks[module] = A.shape[0]
    for name, tensor in saved.items():
        if name.endswith(".lora_A"):
            layer = name.removesuffix(".lora_A")
            A, B = tensor, saved[layer + ".lora_B"]  # (r, in), (out, r)
            for module, rows in _parts(layer, B.shape[0], cfg, family):
                tensors[f"{PREFIX}{module}.lora_A.weight"] = A.clone()  # one copy per part: safetensors refuses shared storage
                tensors[f"{PREFIX}{module}.lora_B.weight"] = _rows_as_exported(B[rows], module, cfg, family)
                targets.append(module)
        elif not name.endswith(".lora_B"):
            module, rows = _full_module(name.rsplit(".", 1)[0], cfg, family)
            tensors[f"{PREFIX}{module}.weight"] = tensor[:rows].contiguous()
            full.append(module.rsplit(".", 1)[-1])
    return tensors, targets, full, ranks


def adapter_config(cfg, targets: list[str], modules_to_save: list[str], family: Family, base: str,
                   ranks: dict[str, int] | None = None) -> dict:
    """adapter_config.json as peft's LoraConfig writes it. cfg: the run's TrainConfig; ranks: modules of another rank
    than lora.rank (rank_pattern, by full name), each with alpha scaled alike (alpha_pattern: the same alpha / r)."""
    ranks = ranks or {}
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "revision": None,
            "r": cfg.lora.rank, "lora_alpha": cfg.lora.alpha, "lora_dropout": cfg.lora.dropout,
            "target_modules": sorted(set(targets)), "modules_to_save": sorted(set(modules_to_save)) or None,
            "fan_in_fan_out": family.name in ("gpt2", "openai-gpt"), "bias": "none", "use_rslora": False,
            "use_dora": False,
            "init_lora_weights": True, "inference_mode": True, "layers_to_transform": None, "layers_pattern": None,
            "rank_pattern": {re.escape(m): r for m, r in ranks.items()},  # peft matches them at a name's end
            "alpha_pattern": {re.escape(m): cfg.lora.alpha * r / cfg.lora.rank for m, r in ranks.items()}}


def write_adapter(out: str | Path, saved: Mapping[str, torch.Tensor], cfg, family: Family, base: str,
                  dtype: torch.dtype = torch.float32) -> Path:
    """The PEFT adapter folder `out` (atomic) for an adapter checkpoint's tensors `saved` of TrainConfig `cfg`."""
    from safetensors.torch import save_file

    from redline.interop.hf import write_atomic_folder

    tensors, targets, full, ranks = peft_tensors(saved, cfg.model, family)
    tensors = {k: v.to(dtype) for k, v in tensors.items()}
    config = adapter_config(cfg, targets, full, family, base, ranks)

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")

    return write_atomic_folder(Path(out), write)
