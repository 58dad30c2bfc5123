"""GGUF files of the mixtures of experts llama.cpp holds in architectures of their own: DeepSeek-V2/V3's latent
attention and experts as its deepseek2 (redline/interop/gguf_deepseek2.py; GLM-4.7-Flash through it as DeepSeek-V3)
and GLM-4-MoE as its glm4moe (gguf_glm4moe.py). Exported by redline and read back with the logits and greedy tokens
of the transformers model they came from (deepseek2: kv_b split into k_b / v_b, interleaved RoPE rows, sigmoid or
softmax routers; glm4moe: partial RoPE, QK-norm, q/k/v biases, the routing bias); the tensor names against the gguf
package's MODEL_TENSORS and the keys against those llama.cpp's converter writes (ggml-org/llama.cpp
convert_hf_to_gguf.py DeepseekV2Model, Glm4MoeModel); files written the way that converter writes them (deepseek2:
its current split kv_b and its older whole attn_kv_b; glm4moe with a multi-token-prediction layer) imported by
redline; what llama.cpp would run otherwise refused in one line, both ways. transformers' GGUF loader has neither
architecture: redline's reader is the check. Gemma 4 (gemma4) is in tests/test_interop_gguf_gemma4.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.interop_models import VOCAB, hf_model
from tests.test_interop import TOKENS
from tests.test_interop_gguf import _add_llama_cpp_vocab, _write_out, import_gguf
from tests.test_interop_gguf_classic import assert_reads_back_as
from tests.test_interop_gguf_exaone_hunyuan import export_folder, fields_of, tensors_of

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


def names_in_gguf_package(reader, arch) -> None:
    """Every tensor's name (less its .weight, .bias or llama.cpp's .scale suffix) is one MODEL_TENSORS gives arch."""
    allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]}
    for t in reader.tensors:
        parts = t.name.rsplit(".", 1)[0].split(".")
        assert (".".join(parts) if parts[0] != "blk" else f"blk.{{bid}}.{'.'.join(parts[2:])}") in allowed, t.name


def export_checked(hf, tmp_path, capsys, arch):
    """The GGUF redline exports for hf: written, its general.architecture arch's, every tensor named as the gguf
    package's MODEL_TENSORS gives that architecture (arch: the gguf package's MODEL_ARCH)."""
    (code, _, err), path = export_folder(hf, tmp_path, capsys)
    assert code == 0, err
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == gguf.MODEL_ARCH_NAMES[arch]
    names_in_gguf_package(reader, arch)
    return path


def converter_writer(path, arch: str, c, blocks: int, ffn: int, kv_heads: int | None = None):
    """A GGUFWriter for arch with the keys llama.cpp's converter writes for every text model (TextModel's) from
    transformers' config c: context, width, blocks, feed_forward_length, heads, KV heads (c's unless given), the RoPE
    base and RMSNorm's epsilon."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(blocks)
    w.add_feed_forward_length(ffn)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads if kv_heads is None else kv_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    return w


def add_converter_tensors(w, hf, arch, blocks: int, transposed: bool = False, special=None) -> None:
    """hf's tensors as llama.cpp's converter writes them: names from the gguf package's name map for arch (the tied
    head left out), the experts' gate_up_proj split into ffn_gate_exps / ffn_up_exps (E, F, C) and down_proj as
    ffn_down_exps (E, C, F) (from (E, C, 2F) / (E, F, C) where transposed: Llama 4's), the routing bias as
    exp_probs_b; special(name, data, bid) writes a tensor its own way first (True: written)."""
    names = gguf.get_tensor_name_map(arch, blocks)
    turn = (lambda x: x.transpose(1, 2)) if transposed else (lambda x: x)
    for name, t in hf.state_dict().items():
        data = t.float()
        bid = name.split(".")[2] if name.startswith("model.layers.") else None
        if name == "lm_head.weight" and hf.config.tie_word_embeddings or special and special(name, data, bid):
            continue
        if name.endswith("experts.gate_up_proj"):
            gate, up = turn(data).chunk(2, dim=1)
            w.add_tensor(f"blk.{bid}.ffn_gate_exps.weight", gate.contiguous().numpy())
            w.add_tensor(f"blk.{bid}.ffn_up_exps.weight", up.contiguous().numpy())
        elif name.endswith("experts.down_proj"):
            w.add_tensor(f"blk.{bid}.ffn_down_exps.weight", turn(data).contiguous().numpy())
        elif name.endswith("e_score_correction_bias"):
            w.add_tensor(f"blk.{bid}.exp_probs_b.bias", data.numpy())
        else:
            base, kind = name.rsplit(".", 1) if name.endswith((".weight", ".bias")) else (name, "weight")
            w.add_tensor(f"{names.get_name(base)}.{kind}", data.numpy())


# -- deepseek2 ---------------------------------------------------------------------------------------------------


# Youtu-LLM, DeepSeek-V3.2 and Sarvam MLA are read as the DeepSeek-V3 they compute as (deepseek_kin.py, sarvam.py),
# and written so
@pytest.mark.parametrize("kind", ["deepseek_v2", "deepseek_v3-dense", "glm4_moe_lite", "youtu", "deepseek_v32",
                                  "sarvam_mla"])
def test_deepseek2_gguf_read_back(kind, tmp_path, capsys):
    hf = hf_model(kind)
    assert_reads_back_as(hf, export_checked(hf, tmp_path, capsys, gguf.MODEL_ARCH.DEEPSEEK2), tmp_path, capsys)


def test_deepseek2_gguf_layout(tmp_path, capsys):
    """GLM-4.7-Flash's layout (DeepSeek-V3's attention and router, RoPE rows interleaved as its checkpoints hold
    them, which llama.cpp's deepseek2 rotates so): q and kv_a as transformers holds them, kv_b split per head into
    attn_k_b (H, kv_lora_rank, nope) and attn_v_b (H, v, kv_lora_rank) with one KV head of kv_lora_rank + rope in the
    keys, the heads' own widths as key_length_mla / value_length_mla; the router's keys and bias, stacked experts."""
    hf = hf_model("glm4_moe_lite")
    (code, _, err), path = export_folder(hf, tmp_path, capsys)
    assert code == 0, err
    f = {k.removeprefix("deepseek2."): v for k, v in fields_of(path).items()}
    assert (f["attention.head_count_kv"], f["attention.key_length"], f["attention.value_length"]) == (1, 24, 16)
    assert (f["attention.key_length_mla"], f["attention.value_length_mla"], f["rope.dimension_count"]) == (24, 16, 8)
    assert (f["attention.q_lora_rank"], f["attention.kv_lora_rank"], f["leading_dense_block_count"]) == (16, 16, 1)
    assert (f["expert_count"], f["expert_used_count"], f["expert_shared_count"], f["expert_gating_func"]) == \
        (8, 2, 1, 2)
    assert (f["expert_group_count"], f["expert_group_used_count"], f["expert_weights_norm"]) == (4, 2, True)
    assert f["expert_weights_scale"] == pytest.approx(1.8)
    t, state = tensors_of(path), hf.state_dict()
    p = "model.layers.1."
    kv_b = state[p + "self_attn.kv_b_proj.weight"].reshape(4, 32, 16)  # (H, nope + v, kv_lora_rank)
    for name, want in (("blk.1.attn_q_b.weight", state[p + "self_attn.q_b_proj.weight"]),
                       ("blk.1.attn_kv_a_mqa.weight", state[p + "self_attn.kv_a_proj_with_mqa.weight"]),
                       ("blk.1.attn_k_b.weight", kv_b[:, :16].transpose(1, 2)), ("blk.1.attn_v_b.weight", kv_b[:, 16:]),
                       ("blk.1.exp_probs_b.bias", state[p + "mlp.gate.e_score_correction_bias"]),
                       ("blk.1.ffn_up_exps.weight", state[p + "mlp.experts.gate_up_proj"][:, 32:]),
                       ("blk.1.ffn_down_exps.weight", state[p + "mlp.experts.down_proj"]),
                       ("blk.1.ffn_gate_shexp.weight", state[p + "mlp.shared_experts.gate_proj.weight"])):
        np.testing.assert_allclose(t[name], want.numpy(), rtol=1e-6, err_msg=name)


def write_converter_style_deepseek2(hf, path, absorbed=True):
    """A deepseek2 GGUF of a transformers DeepSeek-V2 / GLM-4.7-Flash model as llama.cpp's converter writes one
    (DeepseekV2Model): its keys, tensor names from the gguf package's name map for DEEPSEEK2, rows as the checkpoint
    holds them (interleaved RoPE pairs), the experts stacked; absorbed: kv_b split into attn_k_b / attn_v_b with one KV
    head (the current converter), else kv_b whole as attn_kv_b with the heads' widths in key_length / value_length
    (older converters)."""
    c = hf.config
    H, L, R, nope, v = (c.num_attention_heads, c.kv_lora_rank, c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim)
    sigmoid = c.model_type != "deepseek_v2"
    dense = c.mlp_layer_types.count("dense") if hasattr(c, "mlp_layer_types") else c.first_k_dense_replace
    w = converter_writer(path, "deepseek2", c, c.num_hidden_layers, c.intermediate_size, 1 if absorbed else H)
    w.add_rope_dimension_count(R)
    if c.q_lora_rank:
        w.add_q_lora_rank(c.q_lora_rank)
    w.add_kv_lora_rank(L)
    w.add_key_length(L + R if absorbed else nope + R)
    w.add_value_length(L if absorbed else v)
    if absorbed:
        w.add_key_length_mla(nope + R)
        w.add_value_length_mla(v)
    w.add_leading_dense_block_count(dense)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_expert_count(c.n_routed_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_shared_count(c.n_shared_experts)
    w.add_expert_weights_scale(c.routed_scaling_factor)
    w.add_expert_weights_norm(bool(sigmoid and c.norm_topk_prob))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if sigmoid else gguf.ExpertGatingFuncType.SOFTMAX)
    if sigmoid:
        w.add_expert_group_count(c.n_group)
        w.add_expert_group_used_count(c.topk_group)
    _add_llama_cpp_vocab(w, path, c.vocab_size)

    def split_kv_b(name, data, bid) -> bool:
        if not (name.endswith("kv_b_proj.weight") and absorbed):
            return False
        kv = data.reshape(H, nope + v, L)
        w.add_tensor(f"blk.{bid}.attn_k_b.weight", kv[:, :nope].transpose(1, 2).contiguous().numpy())
        w.add_tensor(f"blk.{bid}.attn_v_b.weight", kv[:, nope:].contiguous().numpy())
        return True

    add_converter_tensors(w, hf, gguf.MODEL_ARCH.DEEPSEEK2, c.num_hidden_layers, special=split_kv_b)
    return _write_out(w, path)


@pytest.mark.parametrize("kind", ["deepseek_v2", "glm4_moe_lite"])
@pytest.mark.parametrize("absorbed", [True, False])
def test_import_converter_style_deepseek2_gguf(kind, absorbed, tmp_path, capsys):
    """A deepseek2 file as llama.cpp's converter writes one, kv_b split (current) or whole (older), imports with the
    transformers model's logits: DeepSeek-V2's softmax router read as DeepSeek-V2, GLM-4.7-Flash's sigmoid one as
    DeepSeek-V3."""
    hf = hf_model(kind)
    path = write_converter_style_deepseek2(hf, tmp_path / "model.gguf", absorbed)
    model, _, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    assert train_cfg.model.moe_gating == ("softmax" if kind == "deepseek_v2" else "sigmoid")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_deepseek2_gguf_refusals(tmp_path, capsys):
    """YaRN (DeepSeek-V3's: llama.cpp's deepseek2 takes yarn_log_multiplier and its own attention factor), refused in
    one line with nothing written; a file with it, or with a softmax router that rescales, refused on import."""
    from redline.errors import UserError
    from redline.interop.gguf_deepseek2 import hf_config

    (code, _, err), path = export_folder(hf_model("deepseek_v3"), tmp_path, capsys)
    assert code == 2 and "model.rope_scaling=yarn" in err and len(err.strip().splitlines()) == 1, err
    assert not path.exists()
    fields = {"block_count": 2, "attention.head_count": 4, "attention.key_length_mla": 24,
              "attention.value_length_mla": 16, "rope.dimension_count": 8, "expert_count": 4,
              "leading_dense_block_count": 1, "expert_gating_func": 1, "attention.kv_lora_rank": 16}
    hf_config(lambda n, d=None: fields.get(n, d), VOCAB, set())  # as it is: DeepSeek-V2
    for change, named in ((dict(expert_weights_norm=True), "expert_weights_norm"),
                          ({"rope.scaling.type": "yarn"}, "RoPE scaling 'yarn'")):
        with pytest.raises(UserError, match=named):
            hf_config(lambda n, d=None, f={**fields, **change}: f.get(n, d), VOCAB, set())


# -- glm4moe -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["glm4_moe-gguf", "glm4_moe-air"])
def test_glm4moe_gguf_read_back(kind, tmp_path, capsys):
    hf = hf_model(kind)
    assert_reads_back_as(hf, export_checked(hf, tmp_path, capsys, gguf.MODEL_ARCH.GLM4_MOE), tmp_path, capsys)


def write_converter_style_glm4moe(hf, path, nextn: int = 1):
    """A glm4moe GGUF of a transformers Glm4MoeForCausalLM as llama.cpp's converter writes one (Glm4MoeModel): its
    keys, names from the gguf package's name map for GLM4_MOE, the experts stacked, and `nextn` multi-token-prediction
    layers after the last (block_count counting them), which llama.cpp loads and does not run."""
    c = hf.config
    n = c.num_hidden_layers
    w = converter_writer(path, "glm4moe", c, n + nextn, c.intermediate_size)
    w.add_rope_dimension_count(int(c.head_dim * c.rope_parameters["partial_rotary_factor"]))
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_leading_dense_block_count(c.first_k_dense_replace)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_expert_count(c.n_routed_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_shared_count(c.n_shared_experts)
    w.add_expert_weights_scale(c.routed_scaling_factor)
    w.add_expert_weights_norm(c.norm_topk_prob)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_nextn_predict_layers(nextn)
    _add_llama_cpp_vocab(w, path, c.vocab_size)
    add_converter_tensors(w, hf, gguf.MODEL_ARCH.GLM4_MOE, n + nextn)
    for i in range(n, n + nextn):  # a multi-token-prediction layer's own parts
        w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", np.ones((c.hidden_size, 2 * c.hidden_size), np.float32))
        w.add_tensor(f"blk.{i}.nextn.enorm.weight", np.ones(c.hidden_size, np.float32))
    return _write_out(w, path)


def test_import_converter_style_glm4moe_gguf(tmp_path, capsys):
    """A glm4moe file as llama.cpp's converter writes one, with a multi-token-prediction layer after the last (left
    out, as transformers and llama.cpp's graph leave it out), imports with the transformers model's logits."""
    hf = hf_model("glm4_moe-gguf")
    path = write_converter_style_glm4moe(hf, tmp_path / "model.gguf")
    model, _, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    m = train_cfg.model
    assert (m.n_layer, m.rope_dims, m.qk_norm, m.has_qkv_bias, m.moe_gating) == (3, 8, True, True, "sigmoid")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_glm4moe_gguf_layout_and_refusal(tmp_path, capsys):
    """The keys llama.cpp's glm4moe reads (partial RoPE as rope.dimension_count, the router's, no
    multi-token-prediction layers) and the MLP's norm as post_attention_norm; a model with expert groups (the
    "glm4_moe" test model's 4), which llama.cpp's glm4moe does not read, refused in one line."""
    hf = hf_model("glm4_moe-gguf")
    (code, _, err), path = export_folder(hf, tmp_path / "a", capsys)
    assert code == 0, err
    f = {k.removeprefix("glm4moe."): v for k, v in fields_of(path).items()}
    assert (f["rope.dimension_count"], f["attention.key_length"], f["leading_dense_block_count"]) == (8, 16, 1)
    assert (f["expert_count"], f["expert_shared_count"], f["expert_gating_func"], f["nextn_predict_layers"]) == \
        (8, 1, 2, 0)
    assert f["expert_weights_norm"] is True and f["expert_weights_scale"] == pytest.approx(2.5)
    t, state = tensors_of(path), hf.state_dict()
    for name, theirs in (("blk.1.post_attention_norm.weight", "model.layers.1.post_attention_layernorm.weight"),
                         ("blk.1.attn_q.bias", "model.layers.1.self_attn.q_proj.bias"),
                         ("blk.1.exp_probs_b.bias", "model.layers.1.mlp.gate.e_score_correction_bias")):
        np.testing.assert_array_equal(t[name], state[theirs].numpy())
    (code, _, err), path = export_folder(hf_model("glm4_moe"), tmp_path / "b", capsys)
    assert code == 2 and "model.moe_groups=4" in err and len(err.strip().splitlines()) == 1 and not path.exists()
