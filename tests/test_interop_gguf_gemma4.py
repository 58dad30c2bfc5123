"""GGUF files of Gemma 4's text model as llama.cpp's gemma4 holds them (redline/interop/gguf_gemma4.py): exported by
redline and read back with the logits and greedy tokens of the transformers model they came from (per-layer inputs,
shared KV layers with double-wide MLPs, the full layers' own head width, values from keys, the experts beside the
dense MLP); the tensor names against the gguf package's MODEL_TENSORS[GEMMA4] and the keys against those llama.cpp's
converter writes (ggml-org/llama.cpp convert_hf_to_gguf.py Gemma4Model); transformers' GGUF loader reading the same
file; a file written the way that converter writes one imported by redline; what llama.cpp's gemma4 would run
otherwise refused in one line, both ways."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.interop_models import VOCAB, hf_model
from tests.test_interop import TOKENS
from tests.test_interop_gguf import (_add_llama_cpp_vocab, _write_out, assert_gguf_export_refused,
                                     import_gguf)
from tests.test_interop_gguf_classic import assert_reads_back_as
from tests.test_interop_gguf_exaone_hunyuan import export_folder, fields_of, tensors_of
from tests.test_interop_gguf_moe import names_in_gguf_package

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


def _unit_layer_scalars(hf):
    """hf with every layer_scalar 1: transformers' GGUF loader (5.24) looks for blk.N.layer_output_scale without the
    .weight suffix llama.cpp's converter writes and its loader reads, so it leaves layer_scalar at its initial 1."""
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.layer_scalar.fill_(1.0)
    return hf


@pytest.mark.parametrize("kind", ["gemma4-gguf", "gemma4-k-eq-v", "gemma4-moe"])
def test_gemma4_gguf_read_back(kind, tmp_path, capsys):
    hf = hf_model(kind)
    (code, _, err), path = export_folder(hf, tmp_path, capsys)
    assert code == 0, err
    reader = gguf.GGUFReader(str(path))
    names_in_gguf_package(reader, gguf.MODEL_ARCH.GEMMA4)
    assert_reads_back_as(hf, path, tmp_path, capsys)


def test_gemma4_gguf_layout(tmp_path, capsys):
    """The keys llama.cpp's converter writes for Gemma4Model and its loader reads, norms as they are (no 1 +),
    proportional RoPE as rope_freqs, the layer scalars and the per-layer inputs under llama.cpp's names."""
    hf = hf_model("gemma4-gguf")
    (code, _, err), path = export_folder(hf, tmp_path, capsys)
    assert code == 0, err
    f = fields_of(path)
    assert f["general.architecture"] == "gemma4"
    assert (f["gemma4.attention.key_length"], f["gemma4.attention.key_length_swa"],
            f["gemma4.attention.value_length"], f["gemma4.attention.value_length_swa"]) == (32, 16, 32, 16)
    assert (f["gemma4.rope.dimension_count"], f["gemma4.rope.dimension_count_swa"]) == (32, 16)
    assert (f["gemma4.rope.freq_base"], f["gemma4.rope.freq_base_swa"]) == (5000.0, 300.0)
    assert f["gemma4.attention.sliding_window_pattern"] == [True, True, False, True, False]
    assert (f["gemma4.attention.sliding_window"], f["gemma4.attention.shared_kv_layers"]) == (5, 2)
    assert f["gemma4.feed_forward_length"] == [96, 96, 96, 192, 192]  # the shared layers' double-wide MLPs
    assert (f["gemma4.attention.head_count_kv"], f["gemma4.embedding_length_per_layer_input"]) == (2, 8)
    assert f["gemma4.final_logit_softcapping"] == pytest.approx(3.0)
    t = tensors_of(path)
    # 16 pairs over the full layers' 32-wide heads, a quarter turning: llama.cpp's 1e30 leaves the rest still
    np.testing.assert_array_equal(t["rope_freqs.weight"], np.array([1.0] * 4 + [1e30] * 12, dtype=np.float32))
    state = hf.state_dict()
    for name, theirs in (("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
                         ("blk.2.attn_k_norm.weight", "model.layers.2.self_attn.k_norm.weight"),
                         ("blk.1.layer_output_scale.weight", "model.layers.1.layer_scalar"),
                         ("per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight"),
                         ("blk.0.inp_gate.weight", "model.layers.0.per_layer_input_gate.weight")):
        np.testing.assert_array_equal(t[name], state[theirs].numpy())
    assert not any(f"blk.{i}.attn_{p}.weight" in t for i in (3, 4) for p in ("k", "v"))  # the shared layers'
    assert "output.weight" not in t  # tied


def test_gemma4_moe_gguf_layout(tmp_path, capsys):
    """The experts as llama.cpp's gemma4 loads them: gate and up in one ffn_gate_up_exps (E, 2F, C), the router's
    scale and the per-expert scale as .scale tensors of ffn_gate_inp and ffn_down_exps; a full layer's values its
    keys (no attn_v) and one KV head a full layer (head_count_kv one entry a layer)."""
    hf = hf_model("gemma4-moe")
    (code, _, err), path = export_folder(hf, tmp_path, capsys)
    assert code == 0, err
    f, t = fields_of(path), tensors_of(path)
    assert (f["gemma4.expert_count"], f["gemma4.expert_used_count"], f["gemma4.expert_feed_forward_length"]) == \
        (4, 2, 32)
    assert f["gemma4.attention.head_count_kv"] == [2, 2, 1]
    state = hf.state_dict()
    for name, theirs in (("blk.1.ffn_gate_up_exps.weight", "model.layers.1.experts.gate_up_proj"),
                         ("blk.1.ffn_down_exps.weight", "model.layers.1.experts.down_proj"),
                         ("blk.1.ffn_gate_inp.scale", "model.layers.1.router.scale"),
                         ("blk.1.ffn_down_exps.scale", "model.layers.1.router.per_expert_scale"),
                         ("blk.1.pre_ffw_norm_2.weight", "model.layers.1.pre_feedforward_layernorm_2.weight")):
        np.testing.assert_array_equal(t[name], state[theirs].numpy())
    assert "blk.2.attn_v.weight" not in t and "blk.1.attn_v.weight" in t


@pytest.mark.parametrize("kind", ["gemma4-gguf", "gemma4-k-eq-v"])
def test_gemma4_gguf_read_by_transformers_loader(kind, tmp_path, capsys):
    """transformers' GGUF loader reads redline's gemma4 file into the model's own config with the model's logits.
    Its GGUF_CONFIG_MAPPING["gemma4"] maps only the common keys (key_length as global_head_dim), takes no per-layer
    array (feed_forward_length with double-wide MLPs, head_count_kv with num_global_key_value_heads, as llama.cpp's
    converter writes them) and leaves the rest at Gemma4TextConfig's defaults, whose 262144 × 256·L per-layer table no
    tiny model has: the config is given.
    (The experts' router.scale and per_expert_scale have no place in its name map: the MoE file is read by redline.)"""
    hf = _unit_layer_scalars(hf_model(kind))
    (code, _, err), path = export_folder(hf, tmp_path, capsys)
    assert code == 0, err
    back = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, config=hf.config).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(TOKENS).logits, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def write_converter_style_gemma4(hf, path, quant="F32", split_experts=False):
    """A gemma4 GGUF of a transformers Gemma4ForCausalLM as llama.cpp's converter writes one for Gemma4Model: its keys,
    tensor names from the gguf package's name map for GEMMA4 (layer_scalar with a .weight suffix, the router's scale
    and per_expert_scale as .scale tensors), norms as they are, rope_freqs for proportional RoPE, 2-D tensors in
    `quant`; split_experts: gate and up apart (ffn_gate_exps / ffn_up_exps, which llama.cpp's loader also takes)."""
    from types import SimpleNamespace

    c = SimpleNamespace(**hf.config.to_dict())  # transformers 5's config refuses c.head_dim where layers differ
    kinds = c.layer_types
    full = c.per_layer_config[next(k for k in c.per_layer_config)]
    head_full, kv_full = full["head_dim"], full.get("num_key_value_heads", c.num_key_value_heads)
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    first = c.num_hidden_layers - c.num_kv_shared_layers
    w.add_feed_forward_length([c.intermediate_size * (2 if c.use_double_wide_mlp and i >= first else 1)
                               for i in range(c.num_hidden_layers)] if c.use_double_wide_mlp else c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    swa = [k == "sliding_attention" for k in kinds]
    w.add_head_count_kv([c.num_key_value_heads if s else kv_full for s in swa] if kv_full != c.num_key_value_heads
                        else c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_key_length(head_full)
    w.add_value_length(head_full)
    w.add_key_length_swa(c.head_dim)
    w.add_value_length_swa(c.head_dim)
    w.add_rope_dimension_count(head_full)
    w.add_rope_dimension_count_swa(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(c.rope_parameters["sliding_attention"]["rope_theta"])
    if c.final_logit_softcapping:
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    w.add_sliding_window(c.sliding_window)
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(c.num_kv_shared_layers)
    w.add_embedding_length_per_layer_input(c.hidden_size_per_layer_input or 0)
    if c.enable_moe_block:
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.top_k_experts)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    _add_llama_cpp_vocab(w, path, c.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, c.num_hidden_layers)

    def add(name, data):
        if data.ndim == 2 and quant != "F32" and data.shape[-1] % 32 == 0:
            qtype = getattr(gguf.GGMLQuantizationType, quant)
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, data)

    rope = c.rope_parameters["full_attention"]
    turning = int(head_full * rope.get("partial_rotary_factor", 1.0) / 2)
    add("rope_freqs.weight", np.array([1.0] * turning + [1e30] * (head_full // 2 - turning), dtype=np.float32))
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        data = t.float().numpy()
        bid = name.split(".")[2] if name.startswith("model.layers.") else None
        if name.endswith("router.scale"):
            add(f"blk.{bid}.ffn_gate_inp.scale", data)
        elif name.endswith("router.per_expert_scale"):
            add(f"blk.{bid}.ffn_down_exps.scale", data)
        elif name.endswith("experts.gate_up_proj") and split_experts:
            gate, up = np.split(data, 2, axis=1)
            add(f"blk.{bid}.ffn_gate_exps.weight", np.ascontiguousarray(gate))
            add(f"blk.{bid}.ffn_up_exps.weight", np.ascontiguousarray(up))
        else:
            base = name.rsplit(".", 1)[0] if name.endswith(".weight") else name
            add(f"{names.get_name(base)}.weight", data)
    return _write_out(w, path)


@pytest.mark.parametrize("kind, quant", [("gemma4-gguf", "F32"), ("gemma4-gguf", "Q8_0"), ("gemma4-k-eq-v", "F32"),
                                         ("gemma4-k-eq-v", "Q8_0"), ("gemma4-moe", "F32")])
def test_import_converter_style_gemma4_gguf(kind, quant, tmp_path, capsys):
    """A gemma4 file as llama.cpp's converter writes one imports with the transformers model's logits (F32), or with
    those of transformers' loader reading the same Q8_0 file (the same dequantized weights; its layer scalars 1, which
    that loader does not find: _unit_layer_scalars); the MoE file with its experts' gate and up apart."""
    hf = hf_model(kind)
    if quant != "F32":
        _unit_layer_scalars(hf)
    path = write_converter_style_gemma4(hf, tmp_path / "model.gguf", quant, split_experts=kind == "gemma4-moe")
    model, _, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    m = train_cfg.model
    assert m.v_norm and m.layer_scalars and m.attn_scale == 1.0
    reference = hf if quant == "F32" else transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, config=hf.config).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), reference(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_gemma4_gguf_export_refusals(tmp_path, capsys):
    """What llama.cpp's gemma4 would run otherwise, refused in one line with nothing written: shared layers whose
    source is not llama.cpp's (the "gemma4" test model: windowed layer 3 reads layer 2, llama.cpp gives it layer 1),
    a per-layer table narrower than the vocabulary."""
    hf = hf_model("gemma4")
    (code, _, err), path = export_folder(hf, tmp_path, capsys)
    assert code == 2 and "model.kv_shared_layers=2" in err and "layer 1's" in err and not path.exists(), err
    from redline.interop.gemma4 import model_config

    cfg = model_config({**hf_model("gemma4-gguf").config.to_dict(), "vocab_size_per_layer_input": VOCAB - 8})
    (tmp_path / "v").mkdir()
    assert_gguf_export_refused(cfg, "model.per_layer_vocab", tmp_path / "v", capsys)


@pytest.mark.parametrize("change, named", [
    (lambda f: f.pop("gemma4.attention.key_length_swa"), "gemma4.attention.key_length_swa"),
    (lambda f: f.update({"gemma4.rope.dimension_count_swa": 8}), "rope.dimension_count_swa"),
    (lambda f: f.update({"gemma4.attention.sliding_window_pattern": 6}), "sliding_window_pattern"),
    (lambda f: f.update({"gemma4.attention.shared_kv_layers": 1}), "layer 4"),
])
def test_gemma4_gguf_import_refusals(change, named):
    """A gemma4 file redline would read otherwise than llama.cpp: one line naming the key."""
    from redline.errors import UserError
    from redline.interop.gguf_gemma4 import hf_config

    fields = {"gemma4.block_count": 5, "gemma4.embedding_length": 64, "gemma4.feed_forward_length": 96,
              "gemma4.attention.head_count": 4, "gemma4.attention.head_count_kv": 2,
              "gemma4.attention.key_length": 32, "gemma4.attention.key_length_swa": 16,
              "gemma4.attention.sliding_window": 5, "gemma4.embedding_length_per_layer_input": 0,
              "gemma4.attention.sliding_window_pattern": [True, True, False, True, False]}
    names = {f"blk.{i}.attn_{p}.weight" for i in range(5) for p in ("k", "v")} | {"blk.0.attn_q.weight"}
    hf_config(fields, lambda n, d=None: fields.get(f"gemma4.{n}", d), VOCAB, names, None)  # as it is: read
    change(fields)
    with pytest.raises(UserError, match=named) as e:
        hf_config(fields, lambda n, d=None: fields.get(f"gemma4.{n}", d), VOCAB, names, None)
    assert "\n" not in str(e.value)
