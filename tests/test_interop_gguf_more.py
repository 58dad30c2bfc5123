"""GGUF files of Llama 4's text model as llama.cpp's llama4 (redline/interop/gguf_llama4.py): exported by redline and
read back with the logits and greedy tokens of the transformers model they came from (interleaved RoPE rows as
transformers holds them, Llama 3 scaling as rope_freqs, experts on every interleave_moe_layer_step-th layer beside a
shared one, dense layers between); the tensor names against the gguf package's MODEL_TENSORS[LLAMA4] and the keys
against those llama.cpp's converter writes (ggml-org/llama.cpp convert_hf_to_gguf.py Llama4Model); a file written the
way that converter writes one imported by redline; what llama.cpp's llama4 fixes in its code (chunks of 8192, RoPE
left out of every fourth layer, the query temperature, the QK-norm by expert count) refused in one line where a
model differs, both ways. transformers' GGUF loader has no llama4: redline's reader is the check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.interop_models import VOCAB, hf_model
from tests.test_interop import TOKENS
from tests.test_interop_gguf import _add_llama_cpp_vocab, _write_out, import_gguf
from tests.test_interop_gguf_classic import assert_reads_back_as
from tests.test_interop_gguf_exaone_hunyuan import export_folder, fields_of, tensors_of
from tests.test_interop_gguf_moe import add_converter_tensors, converter_writer, export_checked

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


# (test model, the gguf package's architecture, fields of the model read back)
READ_BACK = [
    # Llama 4: chunked layers, RoPE left out of every fourth, QK-norm (4 experts); tied or not
    ("llama4_text-gguf", "LLAMA4", dict(attn_chunk=8192, nope_interval=4, rope_qk_norm=True)),
    ("llama4_text-gguf-tied", "LLAMA4", dict(attn_chunk=8192, nope_interval=4, rope_qk_norm=True)),
    # GLM-4: the sandwich norms, q/k/v biases (or none), half or a quarter of each head rotated in interleaved pairs
    # (q/k rows as transformers holds them), tied or not
    ("glm4", "GLM4", {}), ("glm4-gguf", "GLM4", {}),
    # ERNIE 4.5 MoE: interleaved RoPE rows as the checkpoints hold them, a dense first layer, softmax experts chosen
    # with the routing bias and rescaled, two shared experts; tied or not
    ("ernie4_5_moe", "ERNIE4_5_MOE", {}), ("ernie4_5_moe-gguf", "ERNIE4_5_MOE", {}),
    # dots.llm1: Qwen3's attention, sigmoid experts chosen with the routing bias, rescaled and scaled, shared experts,
    # a dense first layer (dots1-gguf); Hy-V3 is read as the dots.llm1 it computes as (dots1.py), its experts on
    # every layer, and written so
    ("dots1-gguf", "DOTS1", {}), ("hy_v3", "DOTS1", {}),
]


@pytest.mark.parametrize("kind, arch, fields", READ_BACK)
def test_gguf_read_back(kind, arch, fields, tmp_path, capsys):
    """Exported as llama.cpp's architecture, its tensors named as the gguf package names them, and read back with
    the transformers model's logits and greedy tokens."""
    hf = hf_model(kind)
    cfg = assert_reads_back_as(hf, export_checked(hf, tmp_path, capsys, gguf.MODEL_ARCH[arch]), tmp_path, capsys)
    assert {k: getattr(cfg.model, k) for k in fields} == fields


def test_llama4_gguf_layout(tmp_path, capsys):
    """The keys llama.cpp's llama4 reads (the dense width as feed_forward_length, the experts' and the shared
    expert's as expert_feed_forward_length, the MoE step), no sliding_window key (llama.cpp's chunked form), Llama 3
    scaling as rope_freqs; q/k rows as transformers holds them (llama.cpp rotates llama4 as consecutive pairs), the
    experts split and transposed as the converter does it."""
    hf = hf_model("llama4_text-gguf")
    (code, _, err), path = export_folder(hf, tmp_path, capsys)
    assert code == 0, err
    f = {k.removeprefix("llama4."): v for k, v in fields_of(path).items()}
    assert (f["feed_forward_length"], f["expert_feed_forward_length"], f["interleave_moe_layer_step"]) == (80, 32, 2)
    assert (f["expert_count"], f["expert_used_count"], f["rope.dimension_count"]) == (4, 1, 16)
    assert "attention.sliding_window" not in f
    t, state = tensors_of(path), hf.state_dict()
    assert "blk.0.ffn_gate_inp.weight" not in t and "blk.0.ffn_gate.weight" in t and "output.weight" in t
    np.testing.assert_array_equal(t["blk.1.attn_q.weight"], state["model.layers.1.self_attn.q_proj.weight"].numpy())
    gate_up = state["model.layers.1.feed_forward.experts.gate_up_proj"]  # (E, C, 2F)
    np.testing.assert_array_equal(t["blk.1.ffn_up_exps.weight"], gate_up[..., 32:].transpose(1, 2).numpy())
    np.testing.assert_array_equal(t["blk.1.ffn_down_exps.weight"],
                                  state["model.layers.1.feed_forward.experts.down_proj"].transpose(1, 2).numpy())
    np.testing.assert_array_equal(t["blk.3.ffn_gate_shexp.weight"],
                                  state["model.layers.3.feed_forward.shared_expert.gate_proj.weight"].numpy())
    assert t["rope_freqs.weight"].shape == (8,) and t["rope_freqs.weight"].max() == pytest.approx(16.0)


def write_converter_style_llama4(hf, path):
    """A llama4 GGUF of a transformers Llama4ForCausalLM as llama.cpp's converter writes one (Llama4Model): its keys
    (no redline ones), names from the gguf package's name map for LLAMA4, the experts' gate_up_proj transposed and
    split, down_proj transposed, Llama 3 scaling only as the rope_freqs tensor."""
    from redline.interop.gguf_file import llama3_rope_freqs
    from redline.interop.llama4 import model_config

    c = hf.config
    n = c.num_hidden_layers
    w = converter_writer(path, "llama4", c, n, c.intermediate_size_mlp)
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_rope_dimension_count(c.head_dim)
    w.add_interleave_moe_layer_step(c.interleave_moe_layer_step)
    w.add_expert_feed_forward_length(c.intermediate_size)
    _add_llama_cpp_vocab(w, path, c.vocab_size)
    add_converter_tensors(w, hf, gguf.MODEL_ARCH.LLAMA4, n, transposed=True)
    w.add_tensor("rope_freqs.weight", llama3_rope_freqs(model_config(c.to_dict())).numpy())
    return _write_out(w, path)


def test_import_converter_style_llama4_gguf(tmp_path, capsys):
    """A llama4 file as llama.cpp's converter writes one (Llama 3 scaling recovered from rope_freqs alone) imports
    with the transformers model's logits."""
    hf = hf_model("llama4_text-gguf")
    path = write_converter_style_llama4(hf, tmp_path / "model.gguf")
    model, _, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    m = train_cfg.model
    assert (m.rope_scaling, m.rope_factor, m.moe_layers, m.moe_dense_hidden) == ("llama3", 16.0, (1, 3), 80)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind, change, named", [
    ("llama4_text-gguf", dict(attention_chunk_size=16), "model.attn_chunk=16"),
    ("llama4_text-gguf", dict(attn_temperature_tuning=False), "model.nope_temperature=0.0"),
    ("llama4_text-gguf", dict(use_qk_norm=False), "model.rope_qk_norm=false with 4 experts"),
    ("llama4_text-gguf", dict(no_rope_layer_interval=2), "layers without RoPE other than every 4th"),
    ("llama4_text-gguf", dict(moe_layers=[0, 3]), "experts on layers other than every"),
])
def test_llama4_gguf_refusals(kind, change, named, tmp_path, capsys):
    """What llama.cpp's llama4 fixes in its code, refused in one line naming the option, nothing written."""
    from tests.interop_models import GGUF_FAMILIES

    config_name, model_name, extra = GGUF_FAMILIES[kind]
    config = getattr(transformers, config_name)(**{**extra, **change}, vocab_size=VOCAB, hidden_size=64)
    hf = getattr(transformers, model_name)(config).eval()
    (code, _, err), path = export_folder(hf, tmp_path, capsys)
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1 and not path.exists(), err


@pytest.mark.parametrize("change, named", [({"llama4.attention.sliding_window": 0}, "sliding_window is 0"),
                                           ({"llama4.attention.sliding_window_pattern": 2}, "pattern is 2"),
                                           ({"llama4.rope.freq_base_swa": 1.0}, "RoPE base of their own"),
                                           ({"llama4.rope.dimension_count": 8}, "rotates whole heads")])
def test_llama4_gguf_read_refusals(change, named):
    """A llama4 file llama.cpp would run otherwise than any Llama 4 redline builds: a UserError naming the key."""
    from redline.errors import UserError
    from redline.interop.gguf_llama4 import hf_config

    fields = {"llama4.block_count": 4, "llama4.embedding_length": 64, "llama4.attention.head_count": 4,
              "llama4.attention.key_length": 16, "llama4.rope.freq_base": 500.0, "llama4.expert_count": 4,
              "llama4.feed_forward_length": 80, "llama4.expert_feed_forward_length": 32}
    assert hf_config(fields, lambda k, d=None: fields.get(f"llama4.{k}", d), VOCAB, set(), None)["use_qk_norm"]
    f = {**fields, **change}
    with pytest.raises(UserError, match=named):
        hf_config(f, lambda k, d=None: f.get(f"llama4.{k}", d), VOCAB, set(), None)


# -- glm4 ----------------------------------------------------------------------------------------------------------


def test_glm4_gguf_layout(tmp_path, capsys):
    """The keys llama.cpp's converter writes for Glm4Model (rope.dimension_count the rotated part, the head width),
    the four norms under llama.cpp's names, gate_up_proj as ffn_up and q/k as transformers holds them."""
    hf = hf_model("glm4")
    (code, _, err), path = export_folder(hf, tmp_path, capsys)
    assert code == 0, err
    f = {k.removeprefix("glm4."): v for k, v in fields_of(path).items()}
    assert (f["rope.dimension_count"], f["attention.key_length"], f["attention.head_count_kv"]) == (12, 24, 2)
    t, state = tensors_of(path), hf.state_dict()
    assert "output.weight" not in t
    for name, theirs in (("blk.1.post_attention_norm.weight", "post_self_attn_layernorm.weight"),
                         ("blk.1.ffn_norm.weight", "post_attention_layernorm.weight"),
                         ("blk.1.post_ffw_norm.weight", "post_mlp_layernorm.weight"),
                         ("blk.1.ffn_up.weight", "mlp.gate_up_proj.weight"),
                         ("blk.1.attn_k.weight", "self_attn.k_proj.weight"),
                         ("blk.1.attn_q.bias", "self_attn.q_proj.bias")):
        np.testing.assert_array_equal(t[name], state[f"model.layers.1.{theirs}"].numpy())


def write_converter_style_glm4(hf, path, nextn: int = 1):
    """A glm4 GGUF of a transformers Glm4ForCausalLM as llama.cpp's converter writes one (Glm4Model, GLM-OCR's
    multi-token-prediction layers after the last): its keys, names from the gguf package's name map for GLM4."""
    c = hf.config
    n = c.num_hidden_layers
    w = converter_writer(path, "glm4", c, n + nextn, c.intermediate_size)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_dimension_count(int(c.head_dim * c.rope_parameters["partial_rotary_factor"]))
    w.add_nextn_predict_layers(nextn)
    _add_llama_cpp_vocab(w, path, c.vocab_size)
    add_converter_tensors(w, hf, gguf.MODEL_ARCH.GLM4, n + nextn)
    for i in range(n, n + nextn):  # a multi-token-prediction layer's own parts
        w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", np.ones((c.hidden_size, 2 * c.hidden_size), np.float32))
        w.add_tensor(f"blk.{i}.nextn.enorm.weight", np.ones(c.hidden_size, np.float32))
    return _write_out(w, path)


def test_import_converter_style_glm4_gguf(tmp_path, capsys):
    """A glm4 file as llama.cpp's converter writes one, its multi-token-prediction layer left out, imports with the
    transformers model's logits; multimodal RoPE sections (GLM-4V's) refused by name."""
    from redline.errors import UserError
    from redline.interop.gguf_glm4 import hf_config

    hf = hf_model("glm4")
    path = write_converter_style_glm4(hf, tmp_path / "model.gguf")
    model, _, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    assert (train_cfg.model.n_layer, train_cfg.model.rope_dims, train_cfg.model.tie_embeddings) == (2, 12, True)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    fields = {"rope.dimension_sections": [8, 12, 12, 0]}
    with pytest.raises(UserError, match="multimodal RoPE sections"):
        hf_config(lambda k, d=None: fields.get(k, d), VOCAB, set())


# -- ernie4_5-moe --------------------------------------------------------------------------------------------------


def test_ernie_moe_gguf_layout_and_refusal(tmp_path, capsys):
    """The keys llama.cpp's ernie4_5-moe reads (the dense width, the experts', the shared experts' as one MLP, the
    leading dense layers, a step of 1), the routing bias as exp_probs_b (E,); experts interleaved with dense layers
    (which llama.cpp's loader cannot load) refused in one line."""
    hf = hf_model("ernie4_5_moe")
    (code, _, err), path = export_folder(hf, tmp_path / "a", capsys)
    assert code == 0, err
    f = {k.removeprefix("ernie4_5-moe."): v for k, v in fields_of(path).items()}
    assert (f["feed_forward_length"], f["expert_feed_forward_length"], f["expert_shared_feed_forward_length"]) == \
        (96, 32, 64)
    assert (f["leading_dense_block_count"], f["interleave_moe_layer_step"], f["expert_shared_count"]) == (1, 1, 2)
    t = tensors_of(path)
    assert t["blk.1.exp_probs_b.bias"].shape == (4,) and "blk.0.ffn_gate.weight" in t
    assert t["blk.1.ffn_gate_exps.weight"].shape == (4, 32, 64) and "output.weight" not in t
    (code, _, err), path = export_folder(hf_model("ernie4_5_moe-interval"), tmp_path / "b", capsys)
    assert code == 2 and "experts on layers [1, 3]" in err and len(err.strip().splitlines()) == 1 and \
        not path.exists(), err


def write_converter_style_ernie_moe(hf, path):
    """An ernie4_5-moe GGUF of a transformers Ernie4_5_MoeForCausalLM as llama.cpp's converter writes one
    (Ernie4_5MoeModel): its keys (the shared width as intermediate_size / num_key_value_heads), names from the gguf
    package's name map, the experts stacked apart, the routing bias (1, E) as it is."""
    c = hf.config
    n = c.num_hidden_layers
    w = converter_writer(path, "ernie4_5-moe", c, n, c.intermediate_size)
    w.add_expert_count(c.moe_num_experts)
    w.add_expert_used_count(c.moe_k)
    w.add_interleave_moe_layer_step(c.moe_layer_interval)
    w.add_leading_dense_block_count(c.moe_layer_start_index)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_expert_shared_count(c.moe_num_shared_experts)
    w.add_expert_shared_feed_forward_length(c.intermediate_size // c.num_key_value_heads)
    _add_llama_cpp_vocab(w, path, c.vocab_size)
    add_converter_tensors(w, hf, gguf.MODEL_ARCH.ERNIE4_5_MOE, n)
    return _write_out(w, path)


def test_import_converter_style_ernie_moe_gguf(tmp_path, capsys):
    """An ernie4_5-moe file as llama.cpp's converter writes one imports with the transformers model's logits; a
    file with an interleave llama.cpp cannot load, refused by name."""
    from redline.errors import UserError
    from redline.interop.gguf_ernie import hf_config

    hf = hf_model("ernie4_5_moe-gguf")
    path = write_converter_style_ernie_moe(hf, tmp_path / "model.gguf")
    model, _, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    m = train_cfg.model
    assert (m.moe_dense_layers, m.moe_dense_hidden, m.moe_shared_hidden, m.moe_expert_bias) == (1, 128, 64, True)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    fields = {"interleave_moe_layer_step": 2}
    with pytest.raises(UserError, match="interleave_moe_layer_step is 2"):
        hf_config(lambda k, d=None: fields.get(k, d), VOCAB, set())


# -- hunyuan-moe ---------------------------------------------------------------------------------------------------


def test_hunyuan_moe_gguf_read_back(tmp_path, capsys):
    """Hunyuan MoE as llama.cpp's hunyuan-moe: QK-norm after RoPE, head_dim 24 != 64 / 4, the alpha-stretched base
    as rope.freq_base, experts on every layer (top 2 of 4, rescaled) beside the shared MLP; the keys llama.cpp reads
    (the experts' and the shared MLP's width feed_forward_length and expert_shared_feed_forward_length)."""
    hf = hf_model("hunyuan_v1_moe")
    path = export_checked(hf, tmp_path, capsys, gguf.MODEL_ARCH.HUNYUAN_MOE)
    f = {k.removeprefix("hunyuan-moe."): v for k, v in fields_of(path).items()}
    assert (f["feed_forward_length"], f["expert_shared_feed_forward_length"], f["attention.key_length"]) == (32, 32, 24)
    assert f["rope.freq_base"] == pytest.approx(500.0 * 5.0 ** (24 / 22), rel=1e-6)
    t, state = tensors_of(path), hf.state_dict()
    np.testing.assert_array_equal(t["blk.1.attn_q_norm.weight"],
                                  state["model.layers.1.self_attn.query_layernorm.weight"].numpy())
    assert t["blk.1.ffn_gate_exps.weight"].shape == (4, 32, 64)
    assert_reads_back_as(hf, path, tmp_path, capsys)


def test_hunyuan_moe_gguf_read_refusals():
    """A hunyuan-moe file llama.cpp would run as another model than redline's Hunyuan MoE: a UserError naming the
    key."""
    from redline.errors import UserError
    from redline.interop.gguf_hunyuan_moe import hf_config

    fields = {"embedding_length": 64, "attention.head_count": 4, "feed_forward_length": 32, "block_count": 2,
              "expert_count": 4, "expert_used_count": 2}
    assert hf_config(lambda k, d=None: fields.get(k, d), VOCAB, set())["intermediate_size"] == 32
    for change, named in (({"expert_shared_feed_forward_length": 64}, "shared_feed_forward_length 64"),
                          ({"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}, "RoPE scaling 'linear'")):
        f = {**fields, **change}
        with pytest.raises(UserError, match=named):
            hf_config(lambda k, d=None, f=f: f.get(k, d), VOCAB, set())


# -- apertus -------------------------------------------------------------------------------------------------------


def test_apertus_gguf_read_back(tmp_path, capsys):
    """Apertus as llama.cpp's apertus: QK-norm before RoPE, Llama 3 scaling as rope_freqs, the xIELU MLP with its
    scalars as the converter writes them (xielu.* keys, one raw entry a layer; no act_fn tensors)."""
    hf = hf_model("apertus")
    path = export_checked(hf, tmp_path, capsys, gguf.MODEL_ARCH.APERTUS)
    f, state = fields_of(path), hf.state_dict()
    for name in ("alpha_p", "alpha_n", "beta", "eps"):
        want = [float(state[f"model.layers.{i}.mlp.act_fn.{name}"]) for i in range(hf.config.num_hidden_layers)]
        assert f[f"xielu.{name}"] == pytest.approx(want, rel=1e-7)
    assert "rope_freqs.weight" in tensors_of(path)
    assert_reads_back_as(hf, path, tmp_path, capsys)


def test_apertus_gguf_read_refusal():
    """xIELU's arrays not one entry a layer: a UserError naming the key."""
    from redline.errors import UserError
    from redline.interop.gguf_apertus import hf_config

    fields = {"apertus.embedding_length": 64, "apertus.attention.head_count": 4, "apertus.block_count": 2,
              **{f"xielu.{k}": [0.5, 0.5] for k in ("alpha_p", "alpha_n", "beta", "eps")}}
    key = lambda k, d=None: fields.get(f"apertus.{k}", d)  # noqa: E731
    assert hf_config(fields, key, VOCAB, set(), None)["hidden_act"] == "xielu"
    fields["xielu.beta"] = [0.5]
    with pytest.raises(UserError, match="xielu.beta"):
        hf_config(fields, key, VOCAB, set(), None)


# -- dots1 ---------------------------------------------------------------------------------------------------------


def test_dots1_gguf_layout_and_refusals(tmp_path, capsys):
    """The keys llama.cpp's dots1 reads (the router's, the dense first layers, sigmoid scores) and the routing bias as
    exp_probs_b; expert groups (the "dots1" model's 4) and windowed layers ("dots1-window"), which llama.cpp's dots1
    has not, refused in one line each."""
    hf = hf_model("dots1-gguf")
    (code, _, err), path = export_folder(hf, tmp_path / "a", capsys)
    assert code == 0, err
    f = {k.removeprefix("dots1."): v for k, v in fields_of(path).items()}
    assert (f["leading_dense_block_count"], f["expert_shared_count"], f["expert_gating_func"]) == (1, 2, 2)
    assert f["expert_weights_norm"] is True and f["expert_weights_scale"] == pytest.approx(2.0)
    t, state = tensors_of(path), hf.state_dict()
    np.testing.assert_array_equal(t["blk.1.exp_probs_b.bias"],
                                  state["model.layers.1.mlp.gate.e_score_correction_bias"].numpy())
    for kind, named in (("dots1", "model.moe_groups=4"), ("dots1-window", "windowed layers [1, 2]")):
        (code, _, err), path = export_folder(hf_model(kind), tmp_path / kind, capsys)
        assert code == 2 and named in err and len(err.strip().splitlines()) == 1 and not path.exists(), err


# -- jais2 ---------------------------------------------------------------------------------------------------------


def test_jais2_gguf_read_back(tmp_path, capsys):
    """Jais 2 as llama.cpp's jais2: LayerNorms with biases, q/k/v/o and MLP biases, the ReLU² MLP, q/k rows as
    transformers holds them; the LayerNorm epsilon as attention.layer_norm_epsilon."""
    hf = hf_model("jais2-gguf")
    path = export_checked(hf, tmp_path, capsys, gguf.MODEL_ARCH.JAIS2)
    t, state = tensors_of(path), hf.state_dict()
    for name, theirs in (("blk.1.attn_norm.bias", "input_layernorm.bias"), ("blk.1.attn_k.bias", "self_attn.k_proj.bias"),
                         ("blk.1.ffn_up.weight", "mlp.up_proj.weight")):
        np.testing.assert_array_equal(t[name], state[f"model.layers.1.{theirs}"].numpy())
    assert fields_of(path)["jais2.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    assert_reads_back_as(hf, path, tmp_path, capsys)


def test_jais2_gguf_refusal(tmp_path, capsys):
    """Grouped KV heads (the "jais2" model's 2 of 4), whose biases llama.cpp's jais2 loader sizes n_embd wide and so
    cannot load, refused in one line."""
    (code, _, err), path = export_folder(hf_model("jais2"), tmp_path, capsys)
    assert code == 2 and "model.kv_heads=2" in err and len(err.strip().splitlines()) == 1 and not path.exists(), err
