"""GGUF files of Apertus (Swiss AI's Apertus-8B/70B: ApertusForCausalLM) as llama.cpp's apertus architecture holds
them (its convert_hf_to_gguf.py ApertusModel, LlamaModel's with undo_permute off; its graph src/models/apertus.cpp).
gguf_file.py calls in here for that architecture; the tensors pass through transformers' names (apertus.to_hf), so
the map below is the converter's own from those names (the gguf package's MODEL_TENSORS[APERTUS]).

What the file holds, and how llama.cpp's graph reads it:
- Llama's names with the per-head QK-norm before RoPE as attn_q_norm / attn_k_norm, q/k rows as transformers holds
  them (llama.cpp rotates apertus as NeoX does), Llama 3 scaling as the rope_freqs tensor; scores by
  head_dim ** -0.5;
- the ungated MLP ffn_down(xielu(ffn_up(x))); xIELU's scalars are keys, one entry a layer, not tensors:
  xielu.alpha_p and xielu.alpha_n the raw parameters as transformers' XIELUActivation stores them (ggml_xielu takes
  softplus(alpha_p) and beta + softplus(alpha_n) itself, as transformers does), xielu.beta and xielu.eps its
  buffers (redline's model.xielu_beta / xielu_eps on every layer).
Read back refused by name: RoPE scaling other than Llama 3's rope_freqs, xIELU arrays that are not one entry a layer;
beta or eps differing between layers is refused by apertus.py as for a Hugging Face folder.
"""

from __future__ import annotations

import torch

from redline.errors import UserError
from redline.interop.gguf_named import (ATTENTION_NAMES, QK_NORM_NAMES, TOP_NAMES, in_file_names, map_file_tensors,
                                        refuse_rope_scaling, rope_parameters, source, text_config,
                                        write_attention_metadata)
from redline.model import ModelConfig

ARCH = "apertus"
_BLOCK = {"attention_layernorm.weight": "attn_norm.weight", "feedforward_layernorm.weight": "ffn_norm.weight",
          **ATTENTION_NAMES, **QK_NORM_NAMES, "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight"}
_ACT = "mlp.act_fn."
XIELU = ("alpha_p", "alpha_n", "beta", "eps")  # the gguf package's Keys.xIELU: "xielu.<name>", no architecture prefix
ROPE_FREQS = "rope_freqs.weight"


def check(cfg: ModelConfig) -> None:
    """A UserError for an Apertus model redline does not write as apertus (apertus.check_exportable, through
    export_family, has refused what Apertus itself lacks)."""
    if cfg.rope_scaling not in ("none", "llama3"):
        raise UserError(f"model.rope_scaling={cfg.rope_scaling} on an Apertus model: redline writes apertus GGUF files "
                        f"unscaled or with Llama 3 scaling (rope_freqs); export with --format hf")


def write_metadata(writer, gguf, cfg: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for ApertusModel past the common ones, less the xIELU arrays
    (file_tensors' state has them: write_keyed_tensors)."""
    from redline.interop.gguf_file import write_llama3_rope

    write_attention_metadata(writer, cfg)
    write_llama3_rope(writer, cfg)


def write_keyed_tensors(writer, state, cfg: ModelConfig) -> None:
    """xIELU's scalars as the converter writes them: one fp32 entry a layer under xielu.alpha_p / alpha_n / beta /
    eps."""
    n = cfg.n_layer
    writer.add_xielu_alpha_p([float(state[f"blocks.{i}.mlp.alpha_p"]) for i in range(n)])
    writer.add_xielu_alpha_n([float(state[f"blocks.{i}.mlp.alpha_n"]) for i in range(n)])
    writer.add_xielu_beta([float(cfg.xielu_beta)] * n)
    writer.add_xielu_eps([float(cfg.xielu_eps)] * n)


def feed_forward_length(cfg: ModelConfig) -> int:
    return cfg.hidden_dim


def file_tensors(state, cfg: ModelConfig) -> dict:
    """redline's state -> {GGUF name: tensor} in llama.cpp's layout (xIELU's scalars go in as keys: write_keyed_tensors)."""
    from redline.interop.apertus import to_hf

    return in_file_names(to_hf(state, cfg), _BLOCK, skip=lambda rest: rest.startswith(_ACT))


def hf_config(fields: dict, key, vocab: int, tensor_names: set[str], divisors: torch.Tensor | None) -> dict:
    """An apertus config.json for an apertus GGUF, from the keys llama.cpp's loader reads."""
    refuse_rope_scaling(key, ARCH, " (Llama 3 scaling travels as rope_freqs)")
    n = int(key("block_count"))
    for name in XIELU:
        values = fields.get(f"xielu.{name}")
        if not isinstance(values, (list, tuple)) or len(values) != n:
            raise UserError(f"the GGUF's xielu.{name} is {values!r}: llama.cpp's apertus reads one value a layer ({n})")
    config = {**text_config(key, vocab, tensor_names, "apertus", 65536), "hidden_act": "xielu", "attention_bias": False}
    return {**config, "rope_parameters": rope_parameters(key, fields, divisors, config)}


def hf_tensors(file_names: set[str], read_file, config: dict, fields: dict):
    """(transformers names, read) of an apertus file's tensors, xIELU's scalars among them from the keys (alpha_p /
    alpha_n (1,), beta / eps 0-d, as XIELUActivation holds them); rope_freqs (read into the config) left out."""
    names = map_file_tensors(file_names - {ROPE_FREQS}, read_file, _BLOCK, TOP_NAMES, ARCH)
    for name in XIELU:
        for i, value in enumerate(fields[f"xielu.{name}"]):
            shape = (1,) if name.startswith("alpha") else ()
            names[f"model.layers.{i}.{_ACT}{name}"] = lambda v=float(value), s=shape: torch.full(s, v)
    return source(names)
