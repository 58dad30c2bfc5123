"""A.X-K2 (AXK2ForCausalLM, model_type "axk2": SK Telecom's A.X-K2 and A.X-K2-Light), as transformers' models/axk2
computes it: DeepSeek-V3.2's layers (deepseek.py's names, RoPE on interleaved pairs, its sigmoid router with
`e_score_correction_bias` and an ungated shared expert, the dense layers as `mlp_layer_types`) with

- gated norms (AXK2GatedRMSNorm: `input_layernorm` on every layer, `post_attention_layernorm` on the expert layers):
  the RMSNorm's output y times sigmoid(fc2(silu(fc1(y)))), fc1 hidden_size -> `gated_norm_rank`: model.norm_gate_rank
  (`*.norm.weight` as norm1's / norm2's weight, `*.W_down` / `W_up` (transformers' modules: `mlp.fc1` / `fc2`) as
  their gate_down / gate_up);
- a query gate (AXK2Attention's q_gate_proj, no q_b_proj): the query latent after and before its norm,
  [q_a_layernorm(l); l], projected to each head's query and a gate as wide as its value, the heads' outputs times
  sigmoid(gate) before o_proj: model.q_latent_gate (q_gate_proj, which the Hub's files name q_b_proj, as
  LatentAttention's q_b);
- DeepSeek Sparse Attention's lightning indexer (`self_attn.indexer.*`), which over at most `index_topk` keys keeps
  them all: as deepseek_kin.py reads DeepSeek-V3.2, the import's context stops there and the indexer's weights are
  left out, said in one line; the export writes an indexer of zeros (it keeps every key within index_topk, the
  context written).

Refused by name: `n_group` other than null or 1 (A.X-K2's grouped routing fills the other groups' scores with 0.0,
not -inf, and so can choose them; redline's groups never do), a null `q_lora_rank`, mlp_layer_types with a dense
layer after a sparse one, and what deepseek.py refuses. Exported as A.X-K2 wherever a model has gated norms or the
query gate; PEFT adapters on the latent attention (q_gate_proj's rotated rows interleaved again), MLP adapters
refused as DeepSeek-V3's; not as GGUF.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from redline.errors import UserError
from redline.interop import deepseek
from redline.interop.deepseek_kin import leave_out_indexer
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig

_DEFAULTS = dict(vocab_size=163840, hidden_size=2048, intermediate_size=5120, moe_intermediate_size=512,
                 num_hidden_layers=48, num_attention_heads=32, n_shared_experts=1, n_routed_experts=128,
                 routed_scaling_factor=2.5, kv_lora_rank=128, q_lora_rank=384, qk_rope_head_dim=32, v_head_dim=64,
                 qk_nope_head_dim=64, num_experts_per_tok=8, max_position_embeddings=131072, rms_norm_eps=1e-6,
                 norm_topk_prob=True, index_topk=2048, gated_norm_rank=16)
"""AXK2Config's defaults for the fields a config.json may leave out."""
_INDEXER = ".self_attn.indexer."


def _mlp_layer_types(hf: dict) -> list[str]:
    """mlp_layer_types, or as AXK2Config derives them from first_k_dense_replace and moe_layer_freq."""
    if hf.get("mlp_layer_types"):
        return list(hf["mlp_layer_types"])
    first, every = int(hf.get("first_k_dense_replace", 1)), int(hf.get("moe_layer_freq", 1))
    return ["sparse" if i >= first and i % every == 0 else "dense" for i in range(int(hf["num_hidden_layers"]))]


def model_config(hf: dict) -> ModelConfig:
    hf = {**_DEFAULTS, **{k: v for k, v in hf.items() if v is not None or k in ("q_lora_rank", "n_group")}}
    raise_first([
        (not hf.get("q_lora_rank"), "q_lora_rank=null on axk2: A.X-K2's query gate reads the query latent"),
        (hf.get("n_group") not in (None, 1),
         f"n_group={hf.get('n_group')} on axk2: A.X-K2's grouped routing fills the other groups' scores with 0.0 and "
         f"can choose them where the chosen ones' biased scores are below 0; redline's groups never do"),
        (int(hf["gated_norm_rank"]) < 1, f"gated_norm_rank={hf['gated_norm_rank']} on axk2: its norms' gates are "
                                         f"1 wide or more"),
        (int(hf["index_topk"]) < 1, f"index_topk={hf['index_topk']} on axk2: the indexer keeps at least one key a "
                                    f"query"),
    ])
    plain = {k: v for k, v in hf.items() if k not in ("moe_layer_freq", "first_k_dense_replace")}
    plain.update(mlp_layer_types=_mlp_layer_types(hf), n_group=1, topk_group=1, rope_interleave=True)
    cfg = deepseek.model_config_for("deepseek_v3")(deepseek.lite_as_deepseek_v3(plain, defaults={}))
    return dataclasses.replace(cfg, q_latent_gate=True, norm_gate_rank=int(hf["gated_norm_rank"]),
                               context_len=min(cfg.context_len, int(hf["index_topk"])))


_GATES = (("W_down", "mlp.fc1"), ("W_up", "mlp.fc2"))
"""A gated norm's gate_down and gate_up: the Hub's and save_pretrained's names, then transformers' module names."""


class _Renaming:
    """A source read under DeepSeek-V3's names (deepseek.to_redline's): a gated norm's weight is its `.norm.weight`,
    q_b_proj (the Hub's and save_pretrained's name) may be q_gate_proj (transformers' module)."""

    def __init__(self, src: TensorSource, cfg: ModelConfig):
        self.src, self.where, self.used = src, src.where, src.used
        self.gated = {f"model.layers.{i}.{theirs}.weight" for i, _, theirs in _gated_norms(cfg)}
        self.names = {n.replace("layernorm.norm.weight", "layernorm.weight").replace("q_gate_proj", "q_b_proj")
                      for n in src.names}

    def theirs(self, name: str) -> str:
        if name in self.gated:
            return name.replace(".weight", ".norm.weight")
        if name not in self.src and "q_b_proj" in name:
            return name.replace("q_b_proj", "q_gate_proj")
        return name

    def __contains__(self, name: str) -> bool:
        return self.theirs(name) in self.src

    def take(self, name: str) -> torch.Tensor:
        return self.src.take(self.theirs(name))


def _gated_norms(cfg: ModelConfig):
    """(block i, redline's norm, A.X-K2's module) of every gated norm."""
    for i in range(cfg.n_layer):
        yield i, "norm1", "input_layernorm"
        if cfg.layer_has_experts(i):
            yield i, "norm2", "post_attention_layernorm"


def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    out = deepseek.to_redline(_Renaming(src, cfg), cfg)  # type: ignore[arg-type]: take / names / used
    for i, ours, theirs in _gated_norms(cfg):
        p = f"model.layers.{i}.{theirs}."
        for mine, names in zip(("gate_down", "gate_up"), _GATES):
            name = next((p + n + ".weight" for n in names if p + n + ".weight" in src), p + names[0] + ".weight")
            out[f"blocks.{i}.{ours}.{mine}.weight"] = src.take(name)
    leave_out_indexer(src, cfg)
    return out


def q_rope_rows(w: torch.Tensor, cfg: ModelConfig, inverse: bool) -> torch.Tensor:
    """q_b's rows (H·(D + Dv), ...), each head's query rows reordered as deepseek.q_rope_rows reorders them (its
    last rope_dims between redline's halves and interleaved pairs), its gate rows as they are."""
    H, D = cfg.n_head, cfg.head_dim
    heads = w.reshape(H, -1, *w.shape[1:])
    q = deepseek.q_rope_rows(heads[:, :D].reshape(H * D, *w.shape[1:]), cfg, inverse)
    return torch.cat([q.reshape(H, D, *w.shape[1:]), heads[:, D:]], dim=1).reshape(w.shape)


def _rope_rows(state: dict, cfg: ModelConfig, inverse: bool) -> dict:
    out = dict(state)
    for i in range(cfg.n_layer):
        r = f"blocks.{i}.attn."
        out[r + "q_b.weight"] = q_rope_rows(out[r + "q_b.weight"], cfg, inverse)
        out[r + "kv_a.weight"] = deepseek.kv_rope_rows(out[r + "kv_a.weight"], cfg, inverse)
    return out


def fold(hf: dict, cfg: ModelConfig, state: dict) -> dict:
    """The rotated rows of q_b and kv_a from A.X-K2's interleaved pairs into redline's halves."""
    return _rope_rows(state, cfg, inverse=True)


def wants_axk2(cfg: ModelConfig) -> bool:
    return bool(cfg.q_latent_gate or cfg.norm_gate_rank)


def check_exportable(cfg: ModelConfig) -> None:
    raise_first([
        (cfg.moe_shortcut or cfg.moe_identity_experts, "model.moe_shortcut and model.moe_identity_experts are "
                                                       "LongCat-Flash's: A.X-K2 has neither"),
        (not (cfg.kv_lora_rank and cfg.q_latent_gate and cfg.norm_gate_rank and cfg.moe_experts),
         "model.q_latent_gate and model.norm_gate_rank: of the architectures redline exports to, A.X-K2 alone has "
         "them, and it has both, with latent attention (model.kv_lora_rank) and experts (model.moe_experts)"),
        (cfg.moe_post_norm, "model.moe_post_norm with A.X-K2's gates: A.X-K2 has no norm on its experts' output"),
        (cfg.moe_groups > 1, f"model.moe_groups={cfg.moe_groups} with A.X-K2's gates: A.X-K2's groups choose as "
                             f"redline's do not (axk2.py)"),
    ])
    deepseek.check_exportable(dataclasses.replace(cfg, q_latent_gate=False, norm_gate_rank=0), "deepseek_v3")


def hf_config(cfg: ModelConfig) -> dict:
    check_exportable(cfg)
    out = deepseek.hf_config_for("deepseek_v3")(dataclasses.replace(cfg, q_latent_gate=False, norm_gate_rank=0))
    dense = out.pop("first_k_dense_replace")  # AXK2Config takes mlp_layer_types alone
    for key in ("rope_interleave", "n_group", "topk_group"):
        out.pop(key, None)
    R = cfg.rope_dims
    # the indexer written as zeros keeps every key of the index_topk = context_len a query can see
    return {**out, "model_type": "axk2", "mlp_layer_types": ["dense"] * dense + ["sparse"] * (cfg.n_layer - dense),
            "gated_norm_rank": cfg.norm_gate_rank, "index_topk": cfg.context_len, "index_n_heads": 1,
            "index_head_dim": 2 * R, "n_group": None, "topk_group": None}


def to_hf(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    state = _rope_rows(dict(state), cfg, inverse=False)  # A.X-K2's RoPE is always on interleaved pairs
    plain = dataclasses.replace(cfg, q_latent_gate=False, norm_gate_rank=0)
    v3 = deepseek.to_hf_for("deepseek_v3")(state, plain)
    gated = {f"model.layers.{i}.post_attention_layernorm.weight" for i in range(cfg.n_layer)
             if cfg.layer_has_experts(i)}
    gated |= {f"model.layers.{i}.input_layernorm.weight" for i in range(cfg.n_layer)}
    # the Hub's names (q_b_proj, W_down, W_up), which transformers converts to its modules' as it loads them
    out = {(n.replace(".weight", ".norm.weight") if n in gated else n): t for n, t in v3.items()}
    for i, ours, theirs in _gated_norms(cfg):
        p = f"model.layers.{i}.{theirs}."
        out[p + "W_down.weight"] = state[f"blocks.{i}.{ours}.gate_down.weight"]
        out[p + "W_up.weight"] = state[f"blocks.{i}.{ours}.gate_up.weight"]
    C, R, like = cfg.n_embd, cfg.rope_dims, state["blocks.0.attn.q_a.weight"]
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}{_INDEXER}"
        out[p + "wq_b.weight"] = like.new_zeros(2 * R, cfg.q_lora_rank)
        out[p + "wk.weight"] = like.new_zeros(2 * R, C)
        out[p + "k_norm.weight"], out[p + "k_norm.bias"] = like.new_ones(2 * R), like.new_zeros(2 * R)
        out[p + "weights_proj.weight"] = like.new_zeros(1, C)
    return out


def adapter_parts(layer: str, rest: str, base: str, out_features: int, cfg: ModelConfig):
    """PEFT's modules for redline layer `layer` (peft_adapter's _parts): the latent attention's under self_attn.
    (q_b as q_gate_proj, its query rows' rotated part and kv_a's interleaved again, as to_hf writes them); a
    UserError for the MLPs' layers and the norms' gates, as deepseek.adapter_parts refuses DeepSeek's MLPs."""
    if rest.startswith("attn."):
        module = rest[len("attn."):]
        if module not in deepseek._ATTN or module.endswith("_norm"):
            raise UserError(f"the adapter on {layer} has no counterpart in AXK2ForCausalLM; export with --merge")
        rows = torch.arange(out_features)
        if module == "q_b":
            rows = q_rope_rows(rows[:, None], cfg, inverse=False)[:, 0]
        elif module == "kv_a":
            rows = deepseek.kv_rope_rows(rows, cfg, inverse=False)
        name = "q_gate_proj" if module == "q_b" else deepseek._ATTN[module]
        return [(f"{base}self_attn.{name}", rows)]
    raise UserError(f"the adapter on {layer} would be on an MLP (which PEFT moves onto AXK2ForCausalLM's experts "
                    f"as it loads them) or a norm's gate; train with lora.targets attn.* or export with --merge")


FAMILY = Family(name="axk2", architecture="AXK2ForCausalLM", model_config=model_config, hf_config=hf_config,
                to_redline=to_redline, to_hf=to_hf, ignorable=deepseek._ignorable, fold=fold)
