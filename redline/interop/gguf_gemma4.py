"""GGUF files of Gemma 4's text model as llama.cpp's gemma4 architecture holds them (its convert_hf_to_gguf.py
Gemma4Model, built on Gemma3Model; its loader llama_model_gemma4 and src/models/gemma4.cpp). gguf_file.py calls in
here for that architecture; the tensors pass through transformers' names (gemma4.to_hf), so the map below is the
converter's own from those names (the gguf package's MODEL_TENSORS[GEMMA4]).

What the file holds, and how llama.cpp's graph reads it:
- every RMSNorm weight as it is (Gemma 4's norms scale by weight, not 1 + weight: the converter's norm_shift is 0);
- the full-attention layers' head width as attention.key_length / value_length, the sliding ones' as
  key_length_swa / value_length_swa; attention.head_count_kv one entry a layer where the two kinds differ
  (num_global_key_value_heads), else one number; a full layer without attn_v takes its values from attn_k (llama.cpp
  reads Vcur = Kcur before k's norm: attention_k_eq_v);
- attention.sliding_window_pattern one bool a layer (true: windowed), attention.sliding_window the window;
- proportional RoPE on the full layers as the rope_freqs tensor (head_dim / 2,): each turning pair's divisor
  (1, or the scaling factor), 1e30 on the pairs that stay still, with rope.dimension_count the whole head (the
  frequencies counted over it, as transformers' proportional RoPE counts them); rope.freq_base the full layers'
  base, rope.freq_base_swa the sliding ones', rope.dimension_count_swa their whole head;
- attention.shared_kv_layers: the last layers read the keys and values of layer n - shared - 2 (a windowed layer)
  or n - shared - 1 (a full one), a rule of llama.cpp's KV cache (its layer_reuse callback), so only a model whose
  last two layers before the shared ones are windowed then full is written; feed_forward_length one entry a layer
  where the shared layers' MLPs are twice as wide (use_double_wide_mlp);
- per-layer inputs: per_layer_token_embd (V, L·P), per_layer_model_proj (L·P, C), per_layer_proj_norm (P,), and each
  layer's inp_gate / proj / post_norm, embedding_length_per_layer_input P (0: none);
- each layer's layer_scalar as layer_output_scale.weight (1,); final_logit_softcapping where the logits are capped;
- the experts beside the dense MLP (gemma-4-26B-A4B): the router's proj as ffn_gate_inp.weight and its scale as
  ffn_gate_inp.scale (C,), per_expert_scale as ffn_down_exps.scale (E,), the experts as ffn_gate_up_exps (E, 2F, C)
  and ffn_down_exps (E, C, F) (files with ffn_gate_exps / ffn_up_exps apart are read too), the norms as
  pre_ffw_norm_2, post_ffw_norm_1, post_ffw_norm_2; expert_count, expert_used_count, expert_feed_forward_length.
llama.cpp's graph scales nothing else: unscaled scores (attention scale 1), the values RMS-normed without a weight,
the tanh GELU, the embeddings times sqrt(C): the rest of Gemma 4 as redline's model computes it.
"""

from __future__ import annotations

import re

import torch

from redline.errors import UserError
from redline.model import ModelConfig

ARCH = "gemma4"
# llama.cpp marks a pair that does not turn by a divisor this large (the converter's 1e30): its angle is 0
STILL = 1e30
_FULL, _SLIDING = "full_attention", "sliding_attention"
# transformers' name after model.layers.N. -> the GGUF's after blk.N.
_BLOCK = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
          "pre_feedforward_layernorm.weight": "ffn_norm.weight",
          "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
          "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight", "layer_scalar": "layer_output_scale.weight",
          "per_layer_input_gate.weight": "inp_gate.weight", "per_layer_projection.weight": "proj.weight",
          "post_per_layer_input_norm.weight": "post_norm.weight",
          "router.proj.weight": "ffn_gate_inp.weight", "router.scale": "ffn_gate_inp.scale",
          "router.per_expert_scale": "ffn_down_exps.scale", "experts.gate_up_proj": "ffn_gate_up_exps.weight",
          "experts.down_proj": "ffn_down_exps.weight",
          "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
          "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
          "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight", "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
        "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
        "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight"}
ROPE_FREQS = "rope_freqs.weight"


# -- writing -----------------------------------------------------------------------------------------------------


def _kv_reuse(cfg_layers: int, shared: int, windowed: bool) -> int:
    """The layer whose keys and values llama.cpp's KV cache gives a shared layer (its layer_reuse callback)."""
    return cfg_layers - shared - (2 if windowed else 1)


def check(cfg: ModelConfig) -> None:
    """A UserError for a Gemma 4 model llama.cpp's gemma4 would run as another (gemma4.check_exportable has refused
    what no Gemma 4 has)."""
    from redline.interop.gemma4 import check_exportable

    check_exportable(cfg)
    if cfg.per_layer_embd and cfg.per_layer_vocab not in (0, cfg.vocab_size):
        raise UserError(f"model.per_layer_vocab={cfg.per_layer_vocab} apart from model.vocab_size={cfg.vocab_size}: "
                        f"llama.cpp's gemma4 holds one per-layer input row a token of the vocabulary; export with "
                        f"--format hf")
    for i in range(cfg.n_layer - cfg.kv_shared_layers, cfg.n_layer):
        reuse = _kv_reuse(cfg.n_layer, cfg.kv_shared_layers, bool(cfg.layer_window(i)))
        if cfg.kv_source(i) != reuse:
            raise UserError(f"model.kv_shared_layers={cfg.kv_shared_layers}: layer {i} reads layer "
                            f"{cfg.kv_source(i)}'s keys and values, and llama.cpp's gemma4 gives it layer {reuse}'s "
                            f"(the last two layers before the shared ones must be windowed, then full); export with "
                            f"--format hf")


def _full_layer(cfg: ModelConfig) -> int:
    return next(i for i in range(cfg.n_layer) if not cfg.layer_window(i))


def rope_freqs(cfg: ModelConfig) -> torch.Tensor:
    """llama.cpp's rope_freqs for the full layers, (full head width / 2,) fp32: the turning pairs' divisor, STILL on
    the others (the converter's generate_extra_tensors, with the scaling's factor where it has one)."""
    pairs = cfg.layer_head_dim(_full_layer(cfg)) // 2
    if cfg.rope_scaling != "proportional":
        return torch.ones(pairs)
    turning = int(cfg.rope_proportion * 2 * pairs // 2)  # as model.rope_frequencies counts them
    return torch.tensor([cfg.rope_factor] * turning + [STILL] * (pairs - turning), dtype=torch.float32)


def feed_forward_length(cfg: ModelConfig) -> int | list[int]:
    """feed_forward_length: the dense MLP's width, one entry a layer where the shared layers' MLPs are wider."""
    from redline.interop.gemma4 import dense_width

    width = dense_width(cfg)
    if not cfg.kv_shared_mlp_hidden or cfg.kv_shared_mlp_hidden == width:
        return width
    first = cfg.n_layer - cfg.kv_shared_layers
    return [width if i < first else cfg.kv_shared_mlp_hidden for i in range(cfg.n_layer)]


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for Gemma4Model past the common ones (context, widths, blocks, heads)."""
    full = _full_layer(cfg)
    windowed = [bool(cfg.layer_window(i)) for i in range(cfg.n_layer)]
    kv_full, kv_swa = cfg.layer_kv_heads(full), cfg.kv_heads
    writer.add_head_count_kv(kv_swa if kv_full == kv_swa else [kv_swa if w else kv_full for w in windowed])
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    head_full, head_swa = cfg.layer_head_dim(full), cfg.head_dim
    writer.add_key_length(head_full)
    writer.add_value_length(head_full)
    writer.add_key_length_swa(head_swa)
    writer.add_value_length_swa(head_swa)
    writer.add_rope_dimension_count(head_full)
    writer.add_rope_dimension_count_swa(head_swa)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_freq_base_swa(cfg.rope_local_theta or cfg.rope_theta)
    # llama.cpp requires the window: the context where no layer is windowed (as gemma4.hf_config writes it)
    writer.add_sliding_window(cfg.sliding_window or cfg.context_len)
    writer.add_sliding_window_pattern(windowed)
    writer.add_shared_kv_layers(cfg.kv_shared_layers)
    writer.add_embedding_length_per_layer_input(cfg.per_layer_embd)
    if cfg.logit_softcap:
        writer.add_final_logit_softcapping(cfg.logit_softcap)
    if cfg.moe_experts:
        writer.add_expert_count(cfg.moe_experts)
        writer.add_expert_used_count(cfg.moe_top_k)
        writer.add_expert_feed_forward_length(cfg.hidden_dim)


def file_tensors(tensors: dict, cfg: ModelConfig) -> dict:
    """transformers-named tensors (gemma4.to_hf) -> {GGUF name: tensor} in llama.cpp's layout, with rope_freqs."""
    out = {}
    for name, t in tensors.items():
        if m := re.match(r"model\.layers\.(\d+)\.(.+)$", name):
            out[f"blk.{m[1]}.{_BLOCK[m[2]]}"] = t
        else:
            out[_TOP[name]] = t
    out[ROPE_FREQS] = rope_freqs(cfg)
    return out


# -- reading -----------------------------------------------------------------------------------------------------


def _rope_parameters(divisors: torch.Tensor | None, head_full: int, theta: float) -> dict:
    """The full layers' rope_parameters from a rope_freqs tensor: divisors f on the first pairs and STILL on the rest
    are proportional RoPE (partial_rotary_factor 2·turning / head width, factor f); all 1 (or no tensor) default."""
    if divisors is None:
        return {"rope_type": "default", "rope_theta": theta}
    d = divisors.double()
    still = d >= 1e20
    turning = int((~still).sum())
    if d.numel() != head_full // 2 or bool(still[:turning].any()) or (turning and not torch.allclose(
            d[:turning], d[0].expand(turning))):
        raise UserError(f"the GGUF's gemma4 rope_freqs ({d.numel()} entries) is not proportional RoPE over "
                        f"{head_full // 2} pairs (equal divisors on the first pairs, {STILL:g} on the rest); redline "
                        f"reads no other")
    factor = float(d[0]) if turning else 1.0
    if turning == d.numel() and factor == 1.0:
        return {"rope_type": "default", "rope_theta": theta}
    out = {"rope_type": "proportional", "partial_rotary_factor": 2 * turning / head_full, "rope_theta": theta}
    if int(out["partial_rotary_factor"] * head_full // 2) != turning:
        raise UserError(f"the GGUF's gemma4 rope_freqs turns {turning} of {head_full // 2} pairs, a share redline's "
                        f"proportional RoPE cannot give")
    return {**out, "factor": factor} if factor != 1.0 else out


def hf_config(fields: dict, key, vocab: int, tensor_names: set[str], divisors: torch.Tensor | None) -> dict:
    """A gemma4_text config.json for a gemma4 GGUF, from the keys llama.cpp's loader reads (each it requires is a
    UserError where absent), or a UserError for what llama.cpp would run otherwise than transformers."""
    need = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count", "attention.key_length",
            "attention.key_length_swa", "attention.sliding_window", "embedding_length_per_layer_input")
    if missing := [k for k in need if key(k) is None]:
        raise UserError(f"the GGUF's gemma4 file gives no {', '.join(f'gemma4.{k}' for k in missing)}, which "
                        f"llama.cpp's gemma4 requires; the file is incomplete")
    n = int(key("block_count"))
    pattern = key("attention.sliding_window_pattern")
    if not isinstance(pattern, (list, tuple)) or len(pattern) != n:
        raise UserError(f"the GGUF's gemma4.attention.sliding_window_pattern is {pattern!r}: redline reads one bool a "
                        f"layer ({n}), as llama.cpp's converter writes it")
    kinds = [_SLIDING if w else _FULL for w in pattern]
    head_full, head_swa = int(key("attention.key_length")), int(key("attention.key_length_swa"))
    for name, got, want in (("attention.value_length", key("attention.value_length", head_full), head_full),
                            ("attention.value_length_swa", key("attention.value_length_swa", head_swa), head_swa),
                            ("rope.dimension_count", key("rope.dimension_count", head_full), head_full),
                            ("rope.dimension_count_swa", key("rope.dimension_count_swa", head_swa), head_swa)):
        if int(got) != want:
            raise UserError(f"the GGUF's gemma4.{name} = {got}, not {want}: Gemma 4's values are as wide as its keys "
                            f"and its heads rotate whole (proportional RoPE through rope_freqs); redline reads no "
                            f"other")
    heads = int(key("attention.head_count"))
    kv = key("attention.head_count_kv", heads)
    kv = list(kv) if isinstance(kv, (list, tuple)) else [kv] * n
    kv_swa = {int(h) for h, kind in zip(kv, kinds) if kind == _SLIDING} or {int(kv[0])}
    kv_full = {int(h) for h, kind in zip(kv, kinds) if kind == _FULL}
    if len(kv) != n or len(kv_swa) != 1 or len(kv_full) != 1:
        raise UserError(f"the GGUF's gemma4.attention.head_count_kv {kv}: redline reads one count for the windowed "
                        f"layers and one for the full ones")
    kv_swa_heads, kv_full_heads = kv_swa.pop(), kv_full.pop()
    shared = int(key("attention.shared_kv_layers", 0))
    first = n - shared
    for i in range(first, n):
        own = [j for j in range(first) if kinds[j] == kinds[i]]
        if not own or own[-1] != _kv_reuse(n, shared, kinds[i] == _SLIDING):
            raise UserError(f"the GGUF's gemma4 file shares keys and values over its last {shared} layers with "
                            f"layers {kinds[first - 2:first]} before them: llama.cpp gives layer {i} layer "
                            f"{_kv_reuse(n, shared, kinds[i] == _SLIDING)}'s, transformers the last earlier layer of "
                            f"its kind; redline reads the two alike only")
    ffn = key("feed_forward_length")
    ffn = list(ffn) if isinstance(ffn, (list, tuple)) else [ffn] * n
    width = int(ffn[0])
    double = len(ffn) == n and shared and all(int(f) == (2 * width if i >= first else width) for i, f in enumerate(ffn))
    if not double and (len(ffn) != n or any(int(f) != width for f in ffn)):
        raise UserError(f"the GGUF's gemma4.feed_forward_length {ffn}: redline reads one width, or twice it on the "
                        f"shared layers (use_double_wide_mlp)")
    v_layers = {i for i in range(first) if f"blk.{i}.attn_v.weight" in tensor_names}
    k_eq_v = not any(i in v_layers for i in range(first) if kinds[i] == _FULL)
    if any(i not in v_layers for i in range(first) if kinds[i] == _SLIDING) or (
            k_eq_v and any(f"blk.{i}.attn_k.weight" not in tensor_names for i in range(first))):
        raise UserError("the GGUF's gemma4 file leaves attn_v out of a windowed layer or holds it on some full layers "
                        "only: redline reads values of their own on every windowed layer and, on the full ones, "
                        "on all or none (attention_k_eq_v)")
    experts = "blk.0.ffn_gate_inp.weight" in tensor_names
    if any((f"blk.{i}.ffn_gate_inp.weight" in tensor_names) != experts for i in range(n)):
        raise UserError("the GGUF's gemma4 file has experts on some layers only: Gemma 4's are on every layer")
    theta = float(key("rope.freq_base", 1_000_000.0))
    ple = int(key("embedding_length_per_layer_input"))
    config = {
        "model_type": "gemma4_text", "vocab_size": vocab, "hidden_size": key("embedding_length"),
        "intermediate_size": width, "num_hidden_layers": n, "num_attention_heads": heads,
        "num_key_value_heads": kv_swa_heads, "head_dim": head_swa, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": key("context_length", 131_072),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-6), "tie_word_embeddings": "output.weight" not in
        tensor_names, "sliding_window": key("attention.sliding_window"), "layer_types": kinds,
        "final_logit_softcapping": key("final_logit_softcapping"),
        "rope_parameters": {_FULL: _rope_parameters(divisors, head_full, theta),
                            _SLIDING: {"rope_type": "default",
                                       "rope_theta": float(key("rope.freq_base_swa", theta))}},
        "hidden_size_per_layer_input": ple, "vocab_size_per_layer_input": vocab,
        "attention_k_eq_v": k_eq_v, "num_kv_shared_layers": shared, "use_double_wide_mlp": bool(double),
        "per_layer_config": {str(i): {"head_dim": head_full, "num_key_value_heads": kv_full_heads}
                             for i, kind in enumerate(kinds) if kind == _FULL},
        "enable_moe_block": experts,
    }
    if experts:
        config.update(num_experts=key("expert_count"), top_k_experts=key("expert_used_count"),
                      moe_intermediate_size=key("expert_feed_forward_length"))
    return config


def hf_tensors(file_names: set[str], read_file, config: dict):
    """(transformers names, read) of a gemma4 file's tensors: the names above turned back, separate ffn_gate_exps /
    ffn_up_exps joined into experts.gate_up_proj [gate; up] (E, 2F, C), a missing layer_output_scale as 1 (llama.cpp
    scales by none then). A name outside the map is a UserError."""
    block = {v: k for k, v in _BLOCK.items()}
    top = {v: k for k, v in _TOP.items()}
    names, unknown = {}, []
    for name in file_names:
        if name == ROPE_FREQS:
            continue
        if m := re.match(r"blk\.(\d+)\.(.+)$", name):
            if m[2] in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
                names[f"model.layers.{m[1]}.experts.gate_up_proj"] = lambda i=m[1]: torch.cat(
                    [read_file(f"blk.{i}.ffn_gate_exps.weight"), read_file(f"blk.{i}.ffn_up_exps.weight")], dim=1)
                continue
            if m[2] in block:
                names[f"model.layers.{m[1]}.{block[m[2]]}"] = lambda name=name: read_file(name)
                continue
        elif name in top:
            names[top[name]] = lambda name=name: read_file(name)
            continue
        unknown.append(name)
    if unknown:
        raise UserError(f"tensors {', '.join(sorted(unknown)[:3])} have no place in a gemma4 model redline builds")
    for i in range(config["num_hidden_layers"]):
        names.setdefault(f"model.layers.{i}.layer_scalar", lambda: torch.ones(1))
    return set(names), lambda name: names[name]()
