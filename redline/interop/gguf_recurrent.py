"""GGUF files of the recurrent hybrids, as llama.cpp's converter writes them and its loaders read them: Granite 4.0's
Mamba-2 hybrids (granitehybrid) and Qwen3.5's gated delta nets (qwen35). gguf_file.py calls in here for these two
architectures; the tensors pass through Hugging Face's names (granite.hybrid_to_hf, qwen3_5.to_hf), so each map
below is the converter's own from those names.

granitehybrid (llama.cpp's convert_hf_to_gguf.py GraniteHybridModel, built on Mamba2Model and GraniteMoeModel; its
loader's LLM_ARCH_GRANITE_HYBRID case and src/models/granite-hybrid.cpp):
- a Mamba-2 layer is one with no kv heads: attention.head_count_kv is one entry a layer, 0 on those;
- ssm_in / ssm_out are in_proj / out_proj; ssm_conv1d.weight (channels, kernel) with its bias (channels,);
  ssm_dt.bias the (H,) dt_bias; ssm_a the (H, 1) A = −exp(A_log) and ssm_d the (H, 1) D, both without a .weight
  suffix; ssm_norm.weight the gated norm's (I,) weight as (G, I / G), one row a group;
- ssm.conv_kernel, ssm.state_size (N), ssm.group_count (G), ssm.inner_size (I = H·P), ssm.time_step_rank (H, the
  head count: the converter's note says mamba_dt_rank is not what llama.cpp means by it);
- attention q/k rows permuted as llama's (llama.cpp rotates granitehybrid as NORM RoPE); rope.scaling.finetuned is
  the switch for RoPE (llama.cpp's loader reads it so, true where absent). The converter writes it false for every
  model with a Mamba layer (Granite 4.0-H's attention has no positions) and then the context as 2**20; redline writes
  the model's own (true for a hybrid with RoPE, which llama.cpp then rotates) and keeps its context in
  CONTEXT_KEY;
- Granite's four scalars (as granite files), the MLP's input_linear split into ffn_gate / ffn_up and output_linear
  as ffn_down, expert_shared_feed_forward_length = shared_intermediate_size (the converter writes it for the dense
  models too); with experts, GraniteMoE's router and stacked experts (ffn_gate_inp, ffn_{gate,up,down}_exps of width
  feed_forward_length) and the shared MLP as ffn_{gate,up,down}_shexp, added ungated (llama.cpp's graph:
  softmax, the top k rescaled).
The converter writes an attention-only Granite 4.0 as granite / granitemoe (with rope.scaling.finetuned true even
for the NoPE form). redline's export routes one with RoPE to Granite 3 or GraniteMoeShared, so to granite /
granitemoe too (families.export_family); one without positions it writes as granitehybrid with the key false, which
llama.cpp runs unrotated.

qwen35 (the converter's Qwen3_5TextModel: _LinearAttentionVReorderBase on Qwen3NextModel; llama.cpp's
src/models/qwen35.cpp):
- every RMSNorm but the delta net's gated one is stored as its scale, 1 + weight (Qwen3NextModel.modify_tensors);
- the delta net: in_proj_qkv as attn_qkv, in_proj_z as attn_gate, in_proj_b / in_proj_a as ssm_beta / ssm_alpha,
  conv1d (channels, kernel) as ssm_conv1d, A_log as ssm_a (H,) = −exp(A_log), dt_bias as ssm_dt.bias, norm as
  ssm_norm, out_proj as ssm_out; where key heads are fewer than value heads, the value heads are reordered from
  grouped by key head (Hugging Face's [k0: v0..v(r-1), k1: ...]) to tiled ([v0 of every k, v1 of every k, ...]) in
  v's rows of attn_qkv and of ssm_conv1d, attn_gate's rows, ssm_beta / ssm_alpha / ssm_a / ssm_dt's entries and
  ssm_out's columns (_reorder_v_heads, for ggml's broadcast);
- the attention's q_proj as it is, each head's queries then its output gate (attn_q, 2·H·D rows), q/k unpermuted
  (llama.cpp rotates qwen35 as interleaved multimodal RoPE: text positions make it NeoX rotation), QK-norm as
  attn_q_norm / attn_k_norm, the MLP's norm as post_attention_norm;
- keys: ssm.conv_kernel, ssm.state_size (the key heads' width, which llama.cpp takes for the value heads' too),
  ssm.group_count (key heads), ssm.time_step_rank (value heads), ssm.inner_size (value heads x width),
  full_attention_interval (llama.cpp's loader makes layer i full attention where (i + 1) % it == 0: the only
  layout it holds), rope.dimension_count (the rotated dimensions), rope.dimension_sections (the converter's default
  [11, 11, 10, 0] where the config gives no mrope_section), key_length / value_length.
mamba (the converter's MambaModel; llama.cpp's LLM_ARCH_MAMBA loader and src/models/mamba.cpp): Mamba-1 alone on every
layer, redline's model_type "mamba" (delta_rule=mamba1):
- backbone.layers.N.norm as attn_norm, the mixer's in_proj / x_proj / dt_proj / out_proj as ssm_in / ssm_x / ssm_dt
  (weight and bias) / ssm_out, conv1d as ssm_conv1d (channels, kernel) with its bias, A_log as ssm_a (I, N) =
  −exp(A_log), D as ssm_d (I,), both without a .weight suffix; norm_f as output_norm, the head tied unless untied;
- keys: ssm.conv_kernel, ssm.inner_size (I), ssm.state_size (N), ssm.time_step_rank (dt's rank R),
  attention.layer_norm_rms_epsilon, ssm.dt_b_c_rms false (true is Falcon-Mamba's, which redline does not write);
  feed_forward_length and attention.head_count 0 and context_length 2**20, as the converter writes them (the model's
  own context in CONTEXT_KEY). llama.cpp's mamba loads no in/out projection biases and requires the conv bias.
  Falcon-Mamba (model.delta_bcdt_norm_eps) is the same file with ssm.dt_b_c_rms true, as MambaModel writes it for
  falcon_mamba: llama.cpp then norms dt, B and C at the blocks' RMS epsilon, so the model's own mixer_rms_eps goes
  in BCDT_EPS_KEY too (read back on import; the export says so where the two differ, as for falcon-mamba-7b).
mamba2 (the converter's Mamba2Model; llama.cpp's LLM_ARCH_MAMBA2 loader and src/models/mamba.cpp's Mamba-2 layer):
Mamba-2 alone on every layer, redline's model_type "mamba2":
- backbone.layers.N.norm as attn_norm, the mixer's tensors as granitehybrid's Mamba-2 layers hold them (ssm_in,
  ssm_conv1d (channels, kernel) with its bias, ssm_dt.bias, ssm_a (H, 1) = −exp(A_log) and ssm_d (H, 1) without a
  .weight suffix, ssm_norm (G, I / G), ssm_out); norm_f as output_norm, the head tied unless untied;
- keys: ssm.conv_kernel, ssm.inner_size (I), ssm.state_size (N), ssm.time_step_rank (I / head width: the heads),
  ssm.group_count (G), attention.layer_norm_rms_epsilon; feed_forward_length and attention.head_count 0 and
  context_length 2**20, as the converter writes them (the model's own context in CONTEXT_KEY). llama.cpp's mamba2
  loads no in/out projection biases and requires the conv bias.
nemotron_h (the converter's NemotronHModel, built on GraniteHybridModel; llama.cpp's LLM_ARCH_NEMOTRON_H loader and
src/models/nemotron-h.cpp), redline's model_type "nemotron_h" without experts: one sublayer a layer under
backbone.layers.N.norm (attn_norm on every layer), told apart by two per-layer keys, as llama.cpp's loader does:
- attention.head_count_kv > 0: attention (mixer.q/k/v/o_proj as attn_q / attn_k / attn_v / attn_output, q/k rows
  permuted as llama's by the converter's GraniteHybridModel (undo_permute): no positions, so q·k is unchanged);
- feed_forward_length > 0: the ReLU² MLP (mixer.up_proj / down_proj as ffn_up / ffn_down);
- both 0: Mamba-2 (mamba2's tensors above);
- keys: GraniteHybridModel's ssm keys (time_step_rank = the heads, inner_size = heads x head width), key_length /
  value_length = head_dim, rope.dimension_count, rope.scaling.finetuned false and context_length 2**20 (no
  positions: the model's own in CONTEXT_KEY). Nemotron-H's time-step floor (time_step_min) is DT_MIN_KEY; a file
  without it reads as NemotronHConfig's default and every released model's, NEMOTRON_H_DT_MIN.
falcon-h1 (the converter's FalconH1Model on Mamba2Model; llama.cpp's LLM_ARCH_FALCON_H1 and src/models/falcon-h1.cpp):
attention and Mamba-2 side by side on every layer, then the SwiGLU MLP:
- input_layernorm as attn_norm, pre_ff_layernorm as ffn_norm, final_layernorm as output_norm; self_attn's q/k/v/o
  unpermuted (llama.cpp rotates falcon-h1 as NeoX does, redline's halves); the mixer as mamba2's tensors, ssm_norm
  only where the model has the gated norm (mamba_rms_norm: llama.cpp norms after the gate, so a norm before it is
  refused); feed_forward's gate / up / down as ffn_gate / ffn_up / ffn_down;
- the converter folds every µP multiplier into the weights, embedding_multiplier into token_embd and
  lm_head_multiplier into output, as redline's import does for an untied head; a tied head with those multipliers
  is written as the converter would write it untied: token_embd scaled, output the embeddings over logit_divisor;
- keys: context_length, feed_forward_length, head_count, head_count_kv, key_length / value_length (head_dim),
  rope.freq_base, the ssm keys (time_step_rank = the heads), attention.layer_norm_rms_epsilon.
A Mamba-2 time-step floor (transformers' time_step_limit (min, inf), model.delta_dt_min) has no llama.cpp key: its
ssm_scan never clamps dt. redline writes it as DT_MIN_KEY, read back on import, and says so on export where it is
above 0 (the two agree wherever softplus(dt + dt_bias) is above the floor).
transformers' GGUF loader (5.x) has mamba (its MambaTensorProcessor undoes the conv squeeze and A), not the others.
"""

from __future__ import annotations

import torch

from redline.errors import UserError
from redline.interop.families import Family, interleave_rope_rows
from redline.model import ModelConfig

GRANITE_HYBRID, QWEN35, MAMBA, MAMBA2, NEMOTRON_H = "granitehybrid", "qwen35", "mamba", "mamba2", "nemotron_h"
FALCON_H1 = "falcon-h1"
RECURRENT_ARCHES = (GRANITE_HYBRID, QWEN35, MAMBA, MAMBA2, NEMOTRON_H, FALCON_H1)
NEMOTRON_H_DT_MIN = 0.001  # NemotronHConfig's time_step_min
# redline's own key: a Mamba-2 model's time-step floor (model.delta_dt_min), which no llama.cpp key holds
DT_MIN_KEY = "redline.ssm.dt_min"
# and Falcon-Mamba's dt/B/C norm epsilon (mixer_rms_eps), which llama.cpp takes from layer_norm_rms_epsilon
BCDT_EPS_KEY = "redline.ssm.dt_b_c_rms_epsilon"
# redline's own key: the model's context, where a granitehybrid file without RoPE or a mamba file carries the
# converter's 2**20
CONTEXT_KEY = "redline.context_length"
NOPE_CONTEXT = 2 ** 20  # what llama.cpp's converter writes as a NoPE Granite 4.0-H's or a Mamba's context
MROPE_SECTIONS = [11, 11, 10, 0]  # the converter's _QWEN35_DEFAULT_MROPE_SECTION
# tensors llama.cpp's converter and kernels keep in F32 whatever the file's type: the convolution (ggml_ssm_conv),
# A, D, dt (Mamba's projection too) and the grouped norm
F32_KINDS = ("ssm_conv1d", "ssm_a", "ssm_d", "ssm_dt", "ssm_norm")


def recurrent_arch(family: Family, cfg: ModelConfig) -> str | None:
    """granitehybrid, qwen35 or mamba for a family written so (after families.export_family's checks), else None; a
    UserError for what llama.cpp's architecture cannot hold."""
    if family.name == "granitemoehybrid":
        if cfg.head_dim * cfg.n_head != cfg.n_embd:
            raise UserError("model.head_size apart from n_embd / n_head: llama.cpp's granitehybrid takes heads "
                            "n_embd / n_head wide; export with --format hf")
        if cfg.delta_layers and (cfg.delta_proj_bias or not cfg.delta_conv_bias):
            raise UserError("model.delta_proj_bias or model.delta_conv_bias=false: llama.cpp's granitehybrid loads "
                            "no in/out projection biases and a convolution bias; export with --format hf")
        return GRANITE_HYBRID
    if family.name == "falcon_h1":  # falcon_h1.check_exportable has refused what Falcon-H1 lacks
        if cfg.bias or cfg.has_qkv_bias or cfg.delta_proj_bias or not cfg.delta_conv_bias:
            raise UserError("model.bias, qkv_bias, delta_proj_bias or delta_conv_bias=false on a Falcon-H1 model: "
                            "llama.cpp's falcon-h1 loads no biases but the convolution's, which it requires; export "
                            "with --format hf")
        if cfg.delta_gate_norm == "before_gate":
            raise UserError("model.delta_gate_norm=before_gate: llama.cpp's falcon-h1 norms the mixer's output after "
                            "its SiLU gate; export with --format hf")
        if cfg.rope_scaling != "none":
            raise UserError(f"model.rope_scaling={cfg.rope_scaling} on a Falcon-H1 model: redline writes falcon-h1 "
                            f"files without RoPE scaling; export with --format hf")
        return FALCON_H1
    if family.name in (MAMBA2, NEMOTRON_H):
        if cfg.moe_experts:  # llama.cpp's nemotron_h_moe: its own architecture, with no writer here
            raise UserError("Nemotron-H's expert (E) layers are not written as GGUF by redline (no writer here for "
                            "llama.cpp's nemotron_h_moe layout); export with --format hf")
        if cfg.delta_layers and (cfg.delta_proj_bias or not cfg.delta_conv_bias):
            raise UserError(f"model.delta_proj_bias or model.delta_conv_bias=false: llama.cpp's {family.name} loads "
                            f"no in/out projection biases and a convolution bias; export with --format hf")
        return family.name
    if family.name in ("mamba", "falcon_mamba"):
        if cfg.delta_proj_bias or not cfg.delta_conv_bias:
            raise UserError("model.delta_proj_bias or model.delta_conv_bias=false: llama.cpp's mamba loads no in/out "
                            "projection biases and a convolution bias; export with --format hf")
        return MAMBA
    if family.name in ("qwen3_5_text", "qwen3_5"):
        if cfg.delta_layers and cfg.delta_key_dim != cfg.delta_value_dim:
            raise UserError(f"model.delta_key_dim={cfg.delta_key_dim} apart from model.delta_value_dim="
                            f"{cfg.delta_value_dim}: llama.cpp's qwen35 takes both head widths from ssm.state_size; "
                            f"export with --format hf")
        full_attention_interval(cfg)
        return QWEN35
    return None


def export_note(cfg: ModelConfig, arch: str) -> str | None:
    """What a file of this model holds only in redline's own keys (llama.cpp computes otherwise there), or None."""
    if arch in (MAMBA2, GRANITE_HYBRID, NEMOTRON_H, FALCON_H1) and cfg.delta_layers and cfg.delta_dt_min:
        return (f"its Mamba-2 time-step floor model.delta_dt_min={cfg.delta_dt_min:g} is kept in {DT_MIN_KEY}: "
                f"llama.cpp's {arch} never clamps dt, which matches wherever softplus(dt + dt_bias) is above it")
    if arch == MAMBA and cfg.delta_bcdt_norm_eps and cfg.delta_bcdt_norm_eps != cfg.norm_eps:
        return (f"dt/B/C norm epsilon model.delta_bcdt_norm_eps={cfg.delta_bcdt_norm_eps:g} is kept in "
                f"{BCDT_EPS_KEY}: llama.cpp's mamba norms them at the blocks' {cfg.norm_eps:g}")
    return None


def full_attention_interval(cfg: ModelConfig) -> int:
    """The k with layer i full attention exactly where (i + 1) % k == 0 (n_layer + 1 for none), or a UserError:
    llama.cpp's qwen35 takes the layers' kinds from full_attention_interval alone."""
    full = [i not in cfg.delta_layers for i in range(cfg.n_layer)]
    for k in range(1, cfg.n_layer + 2):
        if full == [(i + 1) % k == 0 for i in range(cfg.n_layer)]:
            return k
    raise UserError(f"model.delta_layers={list(cfg.delta_layers)}: llama.cpp's qwen35 makes every "
                    f"full_attention_interval-th layer full attention (its only key for the layers' kinds), and "
                    f"these layers follow no such period; export with --format hf")


# ----------------------------------------------------------------------------------------------------
# metadata


def write_metadata(writer, gguf, arch: str, cfg: ModelConfig) -> None:
    """The keys after gguf_file._metadata's common ones (context, widths, block count, heads, vocabulary size, file
    type) that llama.cpp's converter writes for the architecture."""
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    if arch == MAMBA:  # MambaModel.set_gguf_parameters' keys
        writer.add_ssm_conv_kernel(cfg.delta_conv_kernel)
        writer.add_ssm_inner_size(cfg.delta_heads)
        writer.add_ssm_state_size(cfg.delta_key_dim)
        writer.add_ssm_time_step_rank(cfg.dt_rank)
        writer.add_ssm_dt_b_c_rms(bool(cfg.delta_bcdt_norm_eps))  # MambaModel: true for falcon_mamba
        if cfg.delta_bcdt_norm_eps:
            writer.add_float32(BCDT_EPS_KEY, cfg.delta_bcdt_norm_eps)
        writer.add_uint32(CONTEXT_KEY, cfg.context_len)
        return
    if cfg.delta_dt_min:
        writer.add_float32(DT_MIN_KEY, cfg.delta_dt_min)
    if arch == MAMBA2:  # Mamba2Model.set_gguf_parameters' keys: the heads as time_step_rank
        writer.add_ssm_conv_kernel(cfg.delta_conv_kernel)
        writer.add_ssm_inner_size(cfg.delta_heads * cfg.delta_value_dim)
        writer.add_ssm_state_size(cfg.delta_key_dim)
        writer.add_ssm_time_step_rank(cfg.delta_heads)
        writer.add_ssm_group_count(cfg.delta_key_heads)
        writer.add_uint32(CONTEXT_KEY, cfg.context_len)
        return
    if arch == FALCON_H1:  # FalconH1Model's keys, its overrides of Mamba2Model's
        writer.add_head_count_kv(cfg.kv_heads)
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_rope_freq_base(cfg.rope_theta)
        writer.add_ssm_conv_kernel(cfg.delta_conv_kernel)
        writer.add_ssm_inner_size(cfg.delta_heads * cfg.delta_value_dim)
        writer.add_ssm_state_size(cfg.delta_key_dim)
        writer.add_ssm_time_step_rank(cfg.delta_heads)
        writer.add_ssm_group_count(cfg.delta_key_heads)
        return
    if arch == NEMOTRON_H:  # NemotronHModel's keys (GraniteHybridModel's, LlamaModel's) for a dense model
        writer.add_head_count_kv([cfg.kv_heads if i in cfg.attention_layers else 0 for i in range(cfg.n_layer)])
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_rope_dimension_count(cfg.head_dim)
        if cfg.delta_layers:
            writer.add_ssm_conv_kernel(cfg.delta_conv_kernel)
            writer.add_ssm_state_size(cfg.delta_key_dim)
            writer.add_ssm_group_count(cfg.delta_key_heads)
            writer.add_ssm_inner_size(cfg.delta_heads * cfg.delta_value_dim)
            writer.add_ssm_time_step_rank(cfg.delta_heads)
        writer.add_rope_scaling_finetuned(False)
        writer.add_uint32(CONTEXT_KEY, cfg.context_len)
        return
    writer.add_rope_freq_base(cfg.rope_theta)
    H, P = cfg.delta_heads, cfg.delta_value_dim
    if arch == QWEN35:
        writer.add_head_count_kv(cfg.kv_heads)
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_rope_dimension_count(cfg.rope_dims or cfg.head_dim)
        writer.add_rope_dimension_sections(MROPE_SECTIONS)
        writer.add_full_attention_interval(full_attention_interval(cfg))
        # Qwen3NextModel's ssm keys: the key heads' width as the state size, the value heads as time_step_rank
        writer.add_ssm_conv_kernel(cfg.delta_conv_kernel)
        writer.add_ssm_state_size(cfg.delta_key_dim)
        writer.add_ssm_group_count(cfg.delta_key_heads or 1)
        writer.add_ssm_time_step_rank(H or 1)
        writer.add_ssm_inner_size(H * P)
        return
    # granitehybrid: LlamaModel's keys (rope.dimension_count n_embd / n_head), Granite's scalars, the shared MLP's
    # width, the experts', the ssm keys and one head_count_kv a layer
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_embedding_scale(cfg.embed_multiplier or 1.0)
    writer.add_residual_scale(cfg.residual_multiplier or 1.0)
    writer.add_logit_scale(cfg.logit_divisor or 1.0)
    writer.add_attention_scale(cfg.attn_scale or cfg.head_dim ** -0.5)
    writer.add_expert_count(cfg.moe_experts)
    writer.add_expert_used_count(cfg.moe_top_k if cfg.moe_experts else 0)
    writer.add_expert_shared_feed_forward_length(cfg.moe_shared_hidden if cfg.moe_experts else cfg.hidden_dim)
    if cfg.delta_layers:
        writer.add_ssm_conv_kernel(cfg.delta_conv_kernel)
        writer.add_ssm_state_size(cfg.delta_key_dim)
        writer.add_ssm_group_count(cfg.delta_key_heads)
        writer.add_ssm_inner_size(H * P)
        writer.add_ssm_time_step_rank(H)
    writer.add_head_count_kv([0 if i in cfg.delta_layers else cfg.kv_heads for i in range(cfg.n_layer)])
    writer.add_rope_scaling_finetuned(cfg.pos_emb == "rope")
    if cfg.pos_emb != "rope":
        writer.add_uint32(CONTEXT_KEY, cfg.context_len)


def context_length(cfg: ModelConfig, arch: str) -> int:
    """The file's {arch}.context_length: the converter's 2**20 for a granitehybrid model without RoPE, a mamba and a
    mamba2."""
    nope = arch in (MAMBA, MAMBA2, NEMOTRON_H) or (arch == GRANITE_HYBRID and cfg.pos_emb != "rope")
    return NOPE_CONTEXT if nope else cfg.context_len


def widths(cfg: ModelConfig, arch: str) -> tuple[int, int]:
    """The file's (feed_forward_length, attention.head_count): 0 and 0 for mamba and mamba2, as the converter writes
    them."""
    if arch == NEMOTRON_H:  # one width a layer: the MLP's on MLP layers, 0 on the others
        return [cfg.hidden_dim if i in cfg.mixer_free_layers else 0 for i in range(cfg.n_layer)], cfg.n_head
    return (0, 0) if arch in (MAMBA, MAMBA2) else (cfg.hidden_dim, cfg.n_head)


def hf_config(fields: dict, arch: str, tensor_names: set[str]) -> dict:
    """A Hugging Face config.json (granitemoehybrid, qwen3_5_text or mamba) for a granitehybrid, qwen35 or mamba
    file."""

    from redline.interop.gguf_file import arch_keys

    key, vocab = arch_keys(fields, arch)
    if key("rope.scaling.type") not in (None, "none"):
        raise UserError(f"the GGUF's RoPE scaling {key('rope.scaling.type')!r} on a {arch} model is not read by "
                        f"redline; import the model's Hugging Face folder")
    width, heads, n = key("embedding_length"), key("attention.head_count"), key("block_count")
    tied = "output.weight" not in tensor_names
    if arch == MAMBA:
        return _mamba_config(fields, key, vocab, tied, tensor_names)
    if arch == MAMBA2:
        return _mamba2_config(fields, key, vocab, tied, tensor_names)
    if arch == NEMOTRON_H:
        return _nemotron_h_config(fields, key, vocab, tied, tensor_names)
    if arch == FALCON_H1:
        return _falcon_h1_config(fields, key, vocab, tied, tensor_names)
    inner, value_heads = key("ssm.inner_size") or 0, key("ssm.time_step_rank") or 1
    common = {"vocab_size": vocab, "hidden_size": width, "num_hidden_layers": n, "num_attention_heads": heads,
              "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-6), "tie_word_embeddings": tied,
              "hidden_act": "silu"}
    if arch == QWEN35:
        head_dim = key("attention.key_length") or width // heads
        interval = key("full_attention_interval", 4)
        return {**common, "model_type": "qwen3_5_text", "intermediate_size": key("feed_forward_length"),
                "num_key_value_heads": key("attention.head_count_kv") or heads, "head_dim": head_dim,
                "max_position_embeddings": key("context_length", 4096),
                "rope_parameters": {"rope_type": "default", "rope_theta": key("rope.freq_base", 1e7),
                                    "partial_rotary_factor": key("rope.dimension_count", head_dim) / head_dim},
                "layer_types": ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                for i in range(n)],
                "linear_num_key_heads": key("ssm.group_count") or 1, "linear_num_value_heads": value_heads,
                "linear_key_head_dim": key("ssm.state_size"), "linear_value_head_dim": inner // value_heads,
                "linear_conv_kernel_dim": key("ssm.conv_kernel", 4)}
    kv = key("attention.head_count_kv") or heads
    kv = list(kv) if isinstance(kv, (list, tuple)) else [kv] * n
    if len(kv) != n:
        raise UserError(f"the GGUF's granitehybrid file gives {len(kv)} attention.head_count_kv entries for {n} "
                        f"layers; the file is damaged")
    experts = key("expert_count") or 0
    rope = bool(key("rope.scaling.finetuned", True))  # llama.cpp's switch for RoPE, true where absent
    context = fields.get(CONTEXT_KEY) or key("context_length", NOPE_CONTEXT)
    config = {**common, "model_type": "granitemoehybrid", "intermediate_size": key("feed_forward_length"),
              "shared_intermediate_size": key("expert_shared_feed_forward_length") or key("feed_forward_length"),
              "num_key_value_heads": max(kv) or heads, "max_position_embeddings": context,
              "rope_theta": key("rope.freq_base", 1e4), "position_embedding_type": "rope" if rope else None,
              "layer_types": ["attention" if h else "mamba" for h in kv], "num_local_experts": experts,
              "num_experts_per_tok": key("expert_used_count") or 0, "attention_bias": False,
              "embedding_multiplier": key("embedding_scale") or 1.0, "residual_multiplier": key("residual_scale") or 1.0,
              "logits_scaling": key("logit_scale") or 1.0,
              "attention_multiplier": key("attention.scale") or (width // heads) ** -0.5}
    if not all(kv):
        mamba = kv.index(0)
        config.update(mamba_n_heads=value_heads, mamba_n_groups=key("ssm.group_count") or 1,
                      mamba_d_state=key("ssm.state_size"), mamba_d_head=inner // value_heads,
                      mamba_d_conv=key("ssm.conv_kernel", 4), mamba_expand=inner // width,
                      mamba_conv_bias=f"blk.{mamba}.ssm_conv1d.bias" in tensor_names, mamba_proj_bias=False,
                      time_step_limit=[float(fields.get(DT_MIN_KEY, 0.0)), float("inf")])
    return config


def _mamba2_config(fields: dict, key, vocab: int, tied: bool, tensor_names: set[str]) -> dict:
    """A mamba2 config.json for a mamba2 file (the time-step floor from DT_MIN_KEY, else none)."""
    if "blk.0.ssm_in.bias" in tensor_names or "blk.0.ssm_conv1d.bias" not in tensor_names:
        raise UserError("the GGUF's mamba2 file has in_proj biases or no convolution bias, which llama.cpp's mamba2 "
                        "has not; the file is damaged")
    width, inner, heads = key("embedding_length"), key("ssm.inner_size"), key("ssm.time_step_rank")
    return {"model_type": "mamba2", "vocab_size": vocab, "hidden_size": width, "num_hidden_layers": key("block_count"),
            "num_heads": heads, "head_dim": inner // heads, "expand": inner / width,
            "n_groups": key("ssm.group_count") or 1, "state_size": key("ssm.state_size"),
            "conv_kernel": key("ssm.conv_kernel", 4), "use_conv_bias": True, "use_bias": False, "hidden_act": "silu",
            "layer_norm_epsilon": key("attention.layer_norm_rms_epsilon", 1e-5),
            "time_step_limit": [float(fields.get(DT_MIN_KEY, 0.0)), float("inf")], "tie_word_embeddings": tied,
            "max_position_embeddings": fields.get(CONTEXT_KEY) or key("context_length", NOPE_CONTEXT)}


def _per_layer(value, n: int, name: str) -> list[int]:
    """A per-layer key (one int for every layer, or a list of n)."""
    values = list(value) if isinstance(value, (list, tuple)) else [value or 0] * n
    if len(values) != n:
        raise UserError(f"the GGUF gives {len(values)} {name} entries for {n} layers; the file is damaged")
    return [int(v) for v in values]


def _nemotron_h_config(fields: dict, key, vocab: int, tied: bool, tensor_names: set[str]) -> dict:
    """A nemotron_h config.json for a nemotron_h file: each layer's kind from its kv heads and MLP width (llama.cpp's
    loader's rule), the time-step floor from DT_MIN_KEY, else NEMOTRON_H_DT_MIN."""
    n, heads = key("block_count"), key("attention.head_count")
    kv = _per_layer(key("attention.head_count_kv"), n, "attention.head_count_kv")
    ff = _per_layer(key("feed_forward_length"), n, "feed_forward_length")
    if key("expert_count"):
        raise UserError("the GGUF's nemotron_h file has experts, which redline reads from Hugging Face folders alone "
                        "(no reader here for llama.cpp's expert layers); import the model's Hugging Face folder")
    kinds = ["full_attention" if h else "mlp" if f else "linear_attention" for h, f in zip(kv, ff)]
    dt_min = float(fields.get(DT_MIN_KEY, NEMOTRON_H_DT_MIN))
    config = {"model_type": "nemotron_h", "vocab_size": vocab, "hidden_size": key("embedding_length"),
              "layers_block_type": kinds, "num_attention_heads": heads, "num_key_value_heads": max(kv) or heads,
              "head_dim": key("attention.key_length") or key("embedding_length") // heads,
              "intermediate_size": max(ff) or 1, "mlp_hidden_act": "relu2", "mamba_hidden_act": "silu",
              "attention_bias": False, "mlp_bias": False,
              "layer_norm_epsilon": key("attention.layer_norm_rms_epsilon", 1e-5), "tie_word_embeddings": tied,
              "max_position_embeddings": fields.get(CONTEXT_KEY) or key("context_length", NOPE_CONTEXT)}
    if "linear_attention" in kinds:
        mamba = kinds.index("linear_attention")
        if f"blk.{mamba}.ssm_in.bias" in tensor_names or f"blk.{mamba}.ssm_conv1d.bias" not in tensor_names:
            raise UserError("the GGUF's nemotron_h file has in_proj biases or no convolution bias, which llama.cpp's "
                            "nemotron_h has not; the file is damaged")
        value_heads, inner = key("ssm.time_step_rank"), key("ssm.inner_size")
        config.update(mamba_num_heads=value_heads, mamba_head_dim=inner // value_heads,
                      n_groups=key("ssm.group_count") or 1, ssm_state_size=key("ssm.state_size"),
                      conv_kernel=key("ssm.conv_kernel", 4), use_conv_bias=True, use_bias=False,
                      time_step_min=dt_min, time_step_limit=[dt_min, float("inf")])
    return config


def _falcon_h1_config(fields: dict, key, vocab: int, tied: bool, tensor_names: set[str]) -> dict:
    """A falcon_h1 config.json for a falcon-h1 file: every µP multiplier 1.0 (the file's weights carry them), the gated
    norm after the gate where the file has ssm_norm, the time-step floor from DT_MIN_KEY."""
    if key("rope.scaling.type") not in (None, "none"):
        raise UserError(f"the GGUF's RoPE scaling {key('rope.scaling.type')!r} on a falcon-h1 model is not read by "
                        f"redline; import the model's Hugging Face folder")
    if any(n.endswith(".bias") and ".ssm_conv1d." not in n and ".ssm_dt." not in n for n in tensor_names):
        raise UserError("the GGUF's falcon-h1 file has biases on its projections, which llama.cpp's falcon-h1 does not "
                        "load; the file is damaged")
    width, heads, inner = key("embedding_length"), key("attention.head_count"), key("ssm.inner_size")
    value_heads, dt_min = key("ssm.time_step_rank"), float(fields.get(DT_MIN_KEY, 0.0))
    return {"model_type": "falcon_h1", "vocab_size": vocab, "hidden_size": width,
            "intermediate_size": key("feed_forward_length"), "num_hidden_layers": key("block_count"),
            "num_attention_heads": heads, "num_key_value_heads": key("attention.head_count_kv") or heads,
            "head_dim": key("attention.key_length") or width // heads, "hidden_act": "silu",
            "max_position_embeddings": key("context_length", 16384),
            "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5), "tie_word_embeddings": tied,
            "rope_parameters": {"rope_type": "default", "rope_theta": key("rope.freq_base", 1e11)},
            "attention_bias": False, "mlp_bias": False, "projectors_bias": False, "mamba_proj_bias": False,
            "mamba_conv_bias": True, "mamba_d_ssm": inner, "mamba_n_heads": value_heads,
            "mamba_d_head": inner // value_heads, "mamba_n_groups": key("ssm.group_count") or 1,
            "mamba_d_state": key("ssm.state_size"), "mamba_d_conv": key("ssm.conv_kernel", 4),
            "mamba_rms_norm": "blk.0.ssm_norm.weight" in tensor_names, "mamba_norm_before_gate": False,
            "time_step_limit": [dt_min, float("inf")], "ssm_multipliers": [1.0] * 5, "mlp_multipliers": [1.0, 1.0],
            "embedding_multiplier": 1.0, "lm_head_multiplier": 1.0, "key_multiplier": 1.0,
            "attention_in_multiplier": 1.0, "attention_out_multiplier": 1.0, "ssm_in_multiplier": 1.0,
            "ssm_out_multiplier": 1.0}


def _mamba_config(fields: dict, key, vocab: int, tied: bool, tensor_names: set[str]) -> dict:
    """A mamba config.json for a mamba file, falcon_mamba where ssm.dt_b_c_rms is true (its norms' epsilon from
    BCDT_EPS_KEY, else llama.cpp's: the blocks')."""
    if "blk.0.ssm_in.bias" in tensor_names or "blk.0.ssm_conv1d.bias" not in tensor_names:
        raise UserError("the GGUF's mamba file has in_proj biases or no convolution bias, which llama.cpp's mamba "
                        "has not; the file is damaged")
    width, eps = key("embedding_length"), key("attention.layer_norm_rms_epsilon", 1e-5)
    inner = key("ssm.inner_size")
    falcon = {"model_type": "falcon_mamba", "mixer_rms_eps": float(fields.get(BCDT_EPS_KEY, eps))} \
        if key("ssm.dt_b_c_rms") else {}
    return {"model_type": "mamba", **falcon, "vocab_size": vocab, "hidden_size": width,
            "num_hidden_layers": key("block_count"), "state_size": key("ssm.state_size"), "intermediate_size": inner,
            "expand": max(1, round(inner / width)), "conv_kernel": key("ssm.conv_kernel", 4),
            "time_step_rank": key("ssm.time_step_rank"), "layer_norm_epsilon": eps, "use_bias": False,
            "use_conv_bias": True, "hidden_act": "silu", "tie_word_embeddings": tied,
            "max_position_embeddings": fields.get(CONTEXT_KEY) or key("context_length", NOPE_CONTEXT)}


# ----------------------------------------------------------------------------------------------------
# tensors


def _reorder_v_heads(t: torch.Tensor, dim: int, key_heads: int, per_key: int, width: int,
                     inverse: bool = False) -> torch.Tensor:
    """t's value heads along dim (key_heads·per_key heads of `width`) from Hugging Face's grouping by key head to the
    tiled order llama.cpp's converter stores (its _reorder_v_heads: (Hk, r, width) -> (r, Hk, width)); inverse: back."""
    shape = list(t.shape)
    dim %= len(shape)
    groups = [per_key, key_heads] if inverse else [key_heads, per_key]
    t = t.reshape(*shape[:dim], *groups, width, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).reshape(shape).contiguous()


# Hugging Face names (after model.layers.N.) -> GGUF names (after blk.N.) kept as they are but for the renaming
_GRANITE_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "mamba.in_proj.weight": "ssm_in.weight", "mamba.out_proj.weight": "ssm_out.weight",
    "mamba.conv1d.weight": "ssm_conv1d.weight", "mamba.conv1d.bias": "ssm_conv1d.bias",
    "mamba.dt_bias": "ssm_dt.bias", "mamba.A_log": "ssm_a", "mamba.D": "ssm_d", "mamba.norm.weight": "ssm_norm.weight",
    "block_sparse_moe.router.layer.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.output_linear.weight": "ffn_down_exps.weight",
}
# input_linear (rows [gate; up]) -> the two GGUF halves; output_linear, by whether the layer has experts
_GRANITE_SPLIT = {"block_sparse_moe.input_linear.weight": ("ffn_gate_exps.weight", "ffn_up_exps.weight")}
_QWEN35_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight", "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight", "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt.bias", "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
}
# Mamba (after backbone.layers.N.)
_MAMBA_NAMES = {
    "norm.weight": "attn_norm.weight", "mixer.in_proj.weight": "ssm_in.weight", "mixer.x_proj.weight": "ssm_x.weight",
    "mixer.dt_proj.weight": "ssm_dt.weight", "mixer.dt_proj.bias": "ssm_dt.bias",
    "mixer.conv1d.weight": "ssm_conv1d.weight", "mixer.conv1d.bias": "ssm_conv1d.bias", "mixer.A_log": "ssm_a",
    "mixer.D": "ssm_d", "mixer.out_proj.weight": "ssm_out.weight",
}
# Mamba-2 (after backbone.layers.N.): the mixer's tensors under granitehybrid's GGUF names
_MAMBA2_NAMES = {"norm.weight": "attn_norm.weight",
                 **{"mixer." + k.removeprefix("mamba."): v for k, v in _GRANITE_NAMES.items()
                    if k.startswith("mamba.")}}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}
_MAMBA_TOP = {"backbone.embeddings.weight": "token_embd.weight", "backbone.norm_f.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
# Nemotron-H (after backbone.layers.N.): Mamba-2's, attention and the MLP under mixer.
_NEMOTRON_H_NAMES = {**_MAMBA2_NAMES, "mixer.q_proj.weight": "attn_q.weight", "mixer.k_proj.weight": "attn_k.weight",
                     "mixer.v_proj.weight": "attn_v.weight", "mixer.o_proj.weight": "attn_output.weight",
                     "mixer.up_proj.weight": "ffn_up.weight", "mixer.down_proj.weight": "ffn_down.weight"}
# Falcon-H1 (after model.layers.N.): attention, Granite 4.0's mamba.* names, Bamba's norms and feed_forward
_FALCON_H1_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "pre_ff_layernorm.weight": "ffn_norm.weight",
    **{k: v for k, v in _GRANITE_NAMES.items() if k.startswith(("self_attn.", "mamba."))},
    "feed_forward.gate_proj.weight": "ffn_gate.weight", "feed_forward.up_proj.weight": "ffn_up.weight",
    "feed_forward.down_proj.weight": "ffn_down.weight"}
_FALCON_H1_TOP = {"model.embed_tokens.weight": "token_embd.weight",
                  "model.final_layernorm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
# Hugging Face's block prefix where it is not model.layers.
_PREFIX = {MAMBA: "backbone.layers.", MAMBA2: "backbone.layers.", NEMOTRON_H: "backbone.layers."}


def _mamba_tensor(inner: str, w: torch.Tensor, to_file: bool) -> torch.Tensor:
    """One Mamba mixer tensor between Hugging Face's layout and the file's: conv1d (I, 1, K) <-> (I, K), A_log (I, N)
    <-> A = −exp(A_log) (MambaModel.modify_tensors)."""
    if inner == "mixer.conv1d.weight":
        return w[:, 0] if to_file else w[:, None]
    if inner == "mixer.A_log":
        return -w.exp() if to_file else (-w).log()
    return w


def _mamba2_tensor(kind: str, w: torch.Tensor, groups: int, to_file: bool) -> torch.Tensor:
    """One Mamba-2 mixer tensor (by its GGUF kind) between Hugging Face's layout and the file's, as
    Mamba2Model.modify_tensors writes it: conv1d (C, 1, K) <-> (C, K); A_log (H,) <-> A = −exp(A_log) as (H, 1) and
    D (H,) <-> (H, 1) (Mamba-1's shape semantics in llama.cpp); the gated norm's (I,) <-> (G, I / G), a row a group."""
    if kind == "ssm_conv1d.weight":
        return w[:, 0] if to_file else w[:, None]
    if kind == "ssm_a":
        return -w.exp()[:, None] if to_file else (-w.reshape(-1)).log()
    if kind == "ssm_d":
        return w[:, None] if to_file else w.reshape(-1)
    if kind == "ssm_norm.weight":
        return w.reshape(groups, -1) if to_file else w.reshape(-1)
    return w


def _qwen35_dims(cfg_or_hf) -> tuple[int, int, int, int]:
    """(key heads, value heads per key head, key width, value width) of a ModelConfig or a qwen3_5_text config."""
    if isinstance(cfg_or_hf, ModelConfig):
        c = cfg_or_hf
        return c.delta_key_heads or 1, (c.delta_heads or 1) // (c.delta_key_heads or 1), c.delta_key_dim, \
            c.delta_value_dim
    h = cfg_or_hf
    return (h["linear_num_key_heads"], h["linear_num_value_heads"] // h["linear_num_key_heads"],
            h["linear_key_head_dim"], h["linear_value_head_dim"])


def _qwen35_tensor(inner: str, w: torch.Tensor, dims: tuple[int, int, int, int], to_file: bool) -> torch.Tensor:
    """One Qwen3.5 block tensor between Hugging Face's layout and the file's (to_file) or back: the norms' 1 + weight,
    −exp(A_log), the convolution's kernel axis, the value heads' order (_reorder_v_heads)."""
    Hk, r, Dk, Dv = dims
    if inner.endswith("norm.weight") and inner != "linear_attn.norm.weight":
        return w + 1 if to_file else w - 1
    if inner == "linear_attn.conv1d.weight":
        w = w[:, 0] if to_file else w
    if inner == "linear_attn.A_log" and to_file:
        w = -w.exp()
    if r > 1 and inner.startswith("linear_attn."):  # grouped value heads <-> tiled, as the converter stores them
        inverse = not to_file
        if inner in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
            qk = 2 * Hk * Dk
            w = torch.cat([w[:qk], _reorder_v_heads(w[qk:], 0, Hk, r, Dv, inverse)])
        elif inner == "linear_attn.in_proj_z.weight":
            w = _reorder_v_heads(w, 0, Hk, r, Dv, inverse)
        elif inner in ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight", "linear_attn.A_log",
                       "linear_attn.dt_bias"):
            w = _reorder_v_heads(w, 0, Hk, r, 1, inverse)
        elif inner == "linear_attn.out_proj.weight":
            w = _reorder_v_heads(w, 1, Hk, r, Dv, inverse)
    if inner == "linear_attn.A_log" and not to_file:
        w = (-w).log()
    if inner == "linear_attn.conv1d.weight" and not to_file:
        w = w[:, None]
    return w


def file_tensors(tensors: dict, cfg: ModelConfig, arch: str) -> dict:
    """Hugging Face-named tensors (the family's to_hf) -> {GGUF name: fp32 tensor in the file's layout}, as llama.cpp's
    converter writes them (the module docstring)."""
    out, dims = {}, _qwen35_dims(cfg)
    for name, t in tensors.items():
        w = t.float()
        if arch in (MAMBA, MAMBA2, NEMOTRON_H):
            if name in _MAMBA_TOP:
                out[_MAMBA_TOP[name]] = w
                continue
            layer, inner = name[len(_PREFIX[arch]):].split(".", 1)
            if arch == MAMBA:
                out[f"blk.{layer}.{_MAMBA_NAMES[inner]}"] = _mamba_tensor(inner, w, to_file=True)
                continue
            kind = (_NEMOTRON_H_NAMES if arch == NEMOTRON_H else _MAMBA2_NAMES)[inner]
            if kind in ("attn_q.weight", "attn_k.weight"):  # llama's rows, as GraniteHybridModel permutes them
                w = interleave_rope_rows(w, cfg.n_head if kind == "attn_q.weight" else cfg.kv_heads, inverse=False)
            out[f"blk.{layer}.{kind}"] = _mamba2_tensor(kind, w, cfg.delta_key_heads, to_file=True)
            continue
        if arch == FALCON_H1:
            if name in _FALCON_H1_TOP:
                out[_FALCON_H1_TOP[name]] = w
                continue
            layer, inner = name[len("model.layers."):].split(".", 1)
            kind = _FALCON_H1_NAMES[inner]
            out[f"blk.{layer}.{kind}"] = _mamba2_tensor(kind, w, cfg.delta_key_heads, to_file=True)
            continue
        if name in _TOP:
            out[_TOP[name]] = w + 1 if arch == QWEN35 and name == "model.norm.weight" else w
            continue
        layer, inner = name[len("model.layers."):].split(".", 1)
        b = f"blk.{layer}."
        if arch == QWEN35:
            out[b + _QWEN35_NAMES[inner]] = _qwen35_tensor(inner, w, dims, to_file=True)
            continue
        experts = cfg.moe_experts > 0
        if inner in _GRANITE_SPLIT or inner == "shared_mlp.input_linear.weight":  # rows [gate; up]
            gate, up = _GRANITE_SPLIT.get(inner, ("ffn_gate_shexp.weight", "ffn_up_shexp.weight") if experts
                                          else ("ffn_gate.weight", "ffn_up.weight"))
            out[b + gate], out[b + up] = w.chunk(2, dim=-2)
            continue
        if inner == "shared_mlp.output_linear.weight":
            out[b + ("ffn_down_shexp.weight" if experts else "ffn_down.weight")] = w
            continue
        kind = _GRANITE_NAMES[inner]
        if kind in ("attn_q.weight", "attn_k.weight"):  # llama's rows, interleaved for llama.cpp's NORM RoPE
            w = interleave_rope_rows(w, cfg.n_head if kind == "attn_q.weight" else cfg.kv_heads, inverse=False)
        elif kind == "ssm_conv1d.weight":
            w = w[:, 0]  # (channels, 1, kernel) -> (channels, kernel)
        elif kind == "ssm_a":
            w = -w.exp()[:, None]  # (H,) A_log -> (H, 1) A
        elif kind == "ssm_d":
            w = w[:, None]
        elif kind == "ssm_norm.weight":
            w = w.reshape(cfg.delta_key_heads, -1)  # (G, I / G)
        out[b + kind] = w
    return _falcon_h1_head(out, cfg) if arch == FALCON_H1 else out


def _falcon_h1_head(out: dict, cfg: ModelConfig) -> dict:
    """A tied Falcon-H1 head with embedding_multiplier / lm_head_multiplier (model.embed_multiplier, logit_divisor)
    as the converter writes an untied one: both folded, token_embd times the one, output the embeddings over the
    other (llama.cpp's falcon-h1 has no key for either)."""
    if cfg.tie_embeddings and (cfg.embed_multiplier or cfg.logit_divisor):
        wte = out["token_embd.weight"]
        out["output.weight"] = wte / (cfg.logit_divisor or 1.0)
        out["token_embd.weight"] = wte * (cfg.embed_multiplier or 1.0)
    return out


def hf_tensors(file_names: set[str], read_file, arch: str, config: dict):
    """(Hugging Face names, read) for a recurrent architecture's file tensors: read_file(GGUF name) gives a tensor
    in the file's layout (fp32, torch shape = reversed GGUF shape); read(HF name) gives it in Hugging Face's."""
    top = {v: k for k, v in (_MAMBA_TOP if arch in (MAMBA, MAMBA2, NEMOTRON_H) else _FALCON_H1_TOP
                             if arch == FALCON_H1 else _TOP).items()}
    names = {v: k for k, v in {QWEN35: _QWEN35_NAMES, MAMBA: _MAMBA_NAMES, MAMBA2: _MAMBA2_NAMES,
                               NEMOTRON_H: _NEMOTRON_H_NAMES, FALCON_H1: _FALCON_H1_NAMES}
             .get(arch, _GRANITE_NAMES).items()}
    derived, unknown = {}, []
    dims = _qwen35_dims(config) if arch == QWEN35 and "linear_num_key_heads" in config else None
    experts = bool(config.get("num_local_experts"))
    for name in sorted(file_names):
        if name in top:
            hf = top[name]
            fix = (lambda w: w - 1) if arch == QWEN35 and hf == "model.norm.weight" else (lambda w: w)
            derived[hf] = lambda name=name, fix=fix: fix(read_file(name))
            continue
        parts = name.split(".", 2)
        if len(parts) < 3 or parts[0] != "blk" or not parts[1].isdigit():
            unknown.append(name)
            continue
        p, kind = f"{_PREFIX.get(arch, 'model.layers.')}{parts[1]}.", parts[2]
        if arch == MAMBA and kind in names:
            derived[p + names[kind]] = lambda name=name, inner=names[kind]: _mamba_tensor(
                inner, read_file(name), to_file=False)
        elif arch in (MAMBA2, NEMOTRON_H) and kind in names:
            derived[p + names[kind]] = lambda name=name, kind=kind: _mamba2_from_file(kind, read_file(name), config)
        elif arch == FALCON_H1 and kind in names:  # q/k unpermuted in the file
            derived[p + names[kind]] = lambda name=name, kind=kind: _mamba2_tensor(kind, read_file(name), 0,
                                                                                  to_file=False)
        elif arch == QWEN35 and kind in names:
            derived[p + names[kind]] = lambda name=name, inner=names[kind]: _qwen35_tensor(
                inner, read_file(name), dims, to_file=False)
        elif arch == GRANITE_HYBRID and kind in names:
            derived[p + names[kind]] = lambda name=name, kind=kind: _granite_from_file(kind, read_file(name), config)
        elif arch == GRANITE_HYBRID and kind in ("ffn_gate.weight", "ffn_gate_shexp.weight", "ffn_gate_exps.weight"):
            up, hf = kind.replace("gate", "up", 1), ("block_sparse_moe.input_linear.weight"
                                                      if kind == "ffn_gate_exps.weight"
                                                      else "shared_mlp.input_linear.weight")
            derived[p + hf] = lambda g=name, u=f"blk.{parts[1]}.{up}": torch.cat([read_file(g), read_file(u)], -2)
        elif arch == GRANITE_HYBRID and kind in ("ffn_up.weight", "ffn_up_shexp.weight", "ffn_up_exps.weight"):
            continue  # read with its gate
        elif arch == GRANITE_HYBRID and kind == ("ffn_down_shexp.weight" if experts else "ffn_down.weight"):
            derived[p + "shared_mlp.output_linear.weight"] = lambda name=name: read_file(name)
        else:
            unknown.append(name)
    if unknown:
        raise UserError(f"tensors {', '.join(unknown[:3])} have no place in a {arch} model redline builds")
    return set(derived), lambda hf_name: derived[hf_name]()


def _mamba2_from_file(kind: str, w: torch.Tensor, config: dict) -> torch.Tensor:
    """One mamba2 / nemotron_h tensor from the file's layout back to Hugging Face's (q/k rows unpermuted)."""
    if kind in ("attn_q.weight", "attn_k.weight"):
        heads = config["num_attention_heads"] if kind == "attn_q.weight" else config["num_key_value_heads"]
        return interleave_rope_rows(w, heads, inverse=True)
    return _mamba2_tensor(kind, w, 0, to_file=False)


def _granite_from_file(kind: str, w: torch.Tensor, config: dict) -> torch.Tensor:
    """One granitehybrid tensor from the file's layout back to Hugging Face's."""
    if kind in ("attn_q.weight", "attn_k.weight"):
        heads = config["num_attention_heads"] if kind == "attn_q.weight" else config["num_key_value_heads"]
        return interleave_rope_rows(w, heads, inverse=True)
    if kind == "ssm_conv1d.weight":
        return w[:, None]
    if kind == "ssm_a":
        return (-w.reshape(-1)).log()
    if kind in ("ssm_d", "ssm_norm.weight"):
        return w.reshape(-1)
    return w
