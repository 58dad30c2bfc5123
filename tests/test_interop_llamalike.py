"""The Llama-derived families beyond the FAMILIES tables (CWM, Solar Open, HY-V3, Jais2): their configs' defaults,
the options that show in the logits (so the parity tests would catch any read wrong), each family's own folder
written back, and the one-line refusals on import and export."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.model import GPT, ModelConfig
from tests.interop_models import VOCAB, hf_model

transformers = pytest.importorskip("transformers")
TOKENS = torch.tensor([[5, 17, 42, 99, 3, 64, 7, 120, 31, 8, 250, 11], [9, 8, 7, 6, 5, 4, 3, 2, 200, 150, 100, 50]])


def _family(name: str):
    from redline.interop.families import _families

    return _families()[name]


def _imported(kind: str):
    """(transformers' model, redline's GPT with its weights) of tests/interop_models.py's `kind`, read from
    transformers' own state dict."""
    from redline.interop.families import TensorSource, family_for

    hf = hf_model(kind)
    state = hf.state_dict()
    family = family_for(hf.config.to_dict(), "test")
    cfg = family.model_config(hf.config.to_dict())
    model = GPT(cfg).eval()
    src = TensorSource(state, state.__getitem__, "test")
    missing, unexpected = model.load_state_dict(family.to_redline(src, cfg), strict=False)
    assert not unexpected and not [k for k in missing if not k.endswith("lm_head.weight") or not cfg.tie_embeddings]
    return hf, model


def _written_as(tmp_path, model: GPT, name: str):
    """`model` written as family `name`'s folder and loaded by transformers (no missing or unexpected keys)."""
    from redline.interop.hf import write_folder
    from redline.tokenizer import load_tokenizer
    from tests.interop_models import byte_level_tokenizer

    family = _family(name)
    tokenizer = load_tokenizer(byte_level_tokenizer(tmp_path / "tok"))
    write_folder(tmp_path / "out", model.state_dict(), model.cfg, tokenizer, family, torch.float32)
    back, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(back).__name__ == family.architecture
    return back.eval()


# ----------------------------------------------------------------------------------------------------
# CWM


def test_cwm_windows_and_rope_show_in_the_logits():
    hf, model = _imported("cwm")
    cfg = model.cfg
    assert (cfg.sliding_window, cfg.window_layers, cfg.rope_scaling, cfg.bias, cfg.has_qkv_bias) == (
        5, (1, 2), "llama3", False, False)
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        for changed in (replace(cfg, window_layers=(1,)), replace(cfg, rope_scaling="none")):
            other = GPT(changed).eval()
            other.load_state_dict(model.state_dict())
            assert (other(TOKENS) - expected).abs().max() > 1e-4, changed


def test_cwm_config_defaults_are_cwmconfigs():
    """Without rope_parameters, layer_types or sliding_window, CwmConfig's own: Llama 3 scaling of base 1e6 (16x from
    8192), every fourth layer from the first full, a window of 8192."""
    from redline.interop.llama import cwm_model_config

    hf = transformers.CwmConfig(num_hidden_layers=6, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                head_dim=16, intermediate_size=96, vocab_size=VOCAB)
    bare = {k: v for k, v in hf.to_dict().items() if k not in ("rope_parameters", "layer_types", "sliding_window")}
    for source in (hf.to_dict(), bare):
        cfg = cwm_model_config(source)
        assert (cfg.rope_scaling, cfg.rope_theta, cfg.rope_factor, cfg.rope_original_context) == (
            "llama3", 1e6, 16.0, 8192)
        assert (cfg.sliding_window, cfg.window_layers) == (8192, (1, 2, 3, 5))


def test_cwm_written_as_cwm(tmp_path):
    """The CWM family's own folder (export_family sends such a model to Ministral) loads with the same logits."""
    hf, model = _imported("cwm")
    back = _written_as(tmp_path, model, "cwm")
    with torch.no_grad():
        torch.testing.assert_close(back(TOKENS).logits, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_cwm_mlp_bias_is_refused():
    from redline.interop.llama import cwm_model_config

    hf = hf_model("cwm").config.to_dict()
    with pytest.raises(UserError, match="mlp_bias=true on a CWM model"):
        cwm_model_config({**hf, "mlp_bias": True})


# ----------------------------------------------------------------------------------------------------
# Solar Open


def test_solar_open_routing_and_biases_show_in_the_logits():
    hf, model = _imported("solar_open")
    cfg = model.cfg
    assert (cfg.moe_experts, cfg.moe_top_k, cfg.moe_groups, cfg.moe_topk_groups) == (8, 3, 4, 2)
    assert cfg.moe_dense_layers == 0 and not cfg.moe_layers
    assert (cfg.hidden_dim, cfg.moe_shared_hidden, cfg.moe_scale, cfg.qk_norm, cfg.rope_dims) == (16, 32, 2.0, False, 0)
    assert (cfg.has_qkv_bias, cfg.bias, cfg.rope_scaling) == (True, False, "yarn")
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        moe = model.blocks[1].mlp
        for attr, value in (("groups", 1), ("scale", 1.0)):
            kept = getattr(moe, attr)
            setattr(moe, attr, value)
            assert (model(TOKENS) - expected).abs().max() > 1e-4, attr
            setattr(moe, attr, kept)
        moe.expert_bias.zero_()
        assert (model(TOKENS) - expected).abs().max() > 1e-4


def test_solar_open_default_rope_base_is_1e6():
    from redline.interop.glm import solar_open_model_config

    hf = hf_model("solar_open").config.to_dict()
    assert solar_open_model_config({**hf, "rope_parameters": None}).rope_theta == 1e6
    cfg = solar_open_model_config({**hf, "rope_parameters": {"rope_type": "default"}})
    assert (cfg.rope_theta, cfg.rope_scaling) == (1e6, "none")


def test_solar_open_partial_rope_is_refused():
    from redline.interop.glm import solar_open_model_config

    hf = hf_model("solar_open").config.to_dict()
    params = {**hf["rope_parameters"], "partial_rotary_factor": 0.5}
    with pytest.raises(UserError, match="partial_rotary_factor=0.5 on a Solar Open model"):
        solar_open_model_config({**hf, "rope_parameters": params})


@pytest.mark.parametrize("overrides, fragment", [
    (dict(moe_norm_eps=1e-6), "model.moe_norm_eps=1e-06"),
    (dict(moe_shared_hidden=24), "model.moe_shared_hidden=24"),
    (dict(sliding_window=4), "has no model.sliding_window"),
    (dict(bias=True), "has no model.bias"),
])
def test_solar_open_export_refusals_name_the_option(overrides, fragment):
    from redline.interop.families import export_family

    base = dict(vocab_size=VOCAB, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, moe_experts=4, moe_top_k=2,
                mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20, moe_shared_hidden=16,
                moe_shared_gate=False)
    assert export_family(ModelConfig(**base)).name == "solar_open"
    with pytest.raises(UserError, match="Solar Open") as err:
        export_family(ModelConfig(**{**base, **overrides}))
    assert fragment in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------------------------------
# HY-V3


def test_hy_v3_routing_shows_in_the_logits_and_its_folder_is_written_back(tmp_path):
    hf, model = _imported("hy_v3")
    cfg = model.cfg
    assert (cfg.moe_experts, cfg.moe_top_k, cfg.moe_groups, cfg.moe_dense_layers, cfg.moe_dense_hidden) == (
        8, 3, 1, 1, 96)
    assert (cfg.hidden_dim, cfg.moe_shared_hidden, cfg.moe_scale, cfg.moe_norm_topk, cfg.qk_norm) == (
        16, 32, 2.0, True, True)
    assert [type(b.mlp).__name__ for b in model.blocks] == ["MLP", "MoE", "MoE"]
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        back = _written_as(tmp_path, model, "hy_v3")
        torch.testing.assert_close(back(TOKENS).logits, expected, rtol=1e-5, atol=1e-5)
        moe = model.blocks[2].mlp
        moe.expert_bias.zero_()  # the bias read from beside the router chooses
        assert (model(TOKENS) - expected).abs().max() > 1e-4


def test_hy_v3_sparse_layers_in_any_order_and_its_prediction_layers_unread():
    """mlp_layer_types with a dense layer between sparse ones reads as moe_layers (an export to dots.llm1, whose
    dense layers come first, is refused by name); a multi-token prediction layer past the last is left unread."""
    from redline.interop.families import TensorSource, export_family, family_for

    hf = hf_model("hy_v3")
    config = {**hf.config.to_dict(), "mlp_layer_types": ["sparse", "dense", "sparse"]}
    hf = transformers.HYV3ForCausalLM(transformers.HYV3Config(**config)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for layer in (0, 2):
            hf.model.layers[layer].mlp.e_score_correction_bias.normal_(0, 0.1)
    state = dict(hf.state_dict())
    state["model.layers.3.eh_proj.weight"] = torch.zeros(4, 4)  # a prediction layer's tensor (Hy3's layer 80)
    family = family_for(config, "test")
    cfg = family.model_config(config)
    assert cfg.moe_layers == (0, 2) and cfg.moe_dense_layers == 0 and cfg.moe_dense_hidden == 96
    src = TensorSource(state, state.__getitem__, "test")
    model = GPT(cfg).eval()
    model.load_state_dict(family.to_redline(src, cfg), strict=False)
    assert not src.unused(family.ignorable)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(UserError, match="moe_layers"):
        export_family(cfg)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(attention_bias=True), "attention_bias=true on a HY-V3 model"),
    (dict(mlp_bias=True), "mlp_bias=true on a HY-V3 model"),
    (dict(mlp_layer_types=["dense", "dense", "dense"]), "at least one sparse"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
])
def test_hy_v3_refusals_name_the_field(overrides, fragment):
    from redline.interop.dots1 import hy_v3_model_config

    hf = hf_model("hy_v3").config.to_dict()
    with pytest.raises(UserError) as err:
        hy_v3_model_config({**hf, **overrides})
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_hy_v3_defaults_are_hyv3configs():
    """Without rope_parameters, head_dim or num_shared_experts: HYV3Config's base, 128-wide heads, and a shared MLP
    intermediate_size wide where num_shared_experts is 0 (HYV3MLP takes a width of 0 as the config's)."""
    from redline.interop.dots1 import hy_v3_model_config

    hf = hf_model("hy_v3").config.to_dict()
    bare = {k: v for k, v in hf.items() if k not in ("rope_parameters", "head_dim")}
    cfg = hy_v3_model_config({**bare, "num_shared_experts": 0})
    assert (cfg.rope_theta, cfg.head_dim, cfg.moe_shared_hidden) == (11_158_840.0, 128, 96)


# ----------------------------------------------------------------------------------------------------
# Jais 2


def test_jais2_layernorm_biases_show_in_the_logits():
    hf, model = _imported("jais2")
    cfg = model.cfg
    assert (cfg.norm, cfg.norm_bias, cfg.mlp, cfg.bias, cfg.has_qkv_bias, cfg.norm_eps) == (
        "layernorm", True, "relu2", True, True, 1e-5)
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        model.blocks[0].norm1.bias.zero_()
        assert (model(TOKENS) - expected).abs().max() > 1e-4


@pytest.mark.parametrize("overrides, fragment", [
    (dict(hidden_act="silu"), "hidden_act='silu': Jais 2's MLP is ReLU²"),
    (dict(mlp_bias=False), "attention_bias=True with mlp_bias=False"),
])
def test_jais2_refusals_name_the_field(overrides, fragment):
    from redline.interop.llama import jais2_model_config

    hf = hf_model("jais2").config.to_dict()
    with pytest.raises(UserError) as err:
        jais2_model_config({**hf, **overrides})
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(qk_norm=True), "no QK-norm"),
    (dict(qkv_bias=True), "model.qkv_bias"),
    (dict(sliding_window=4), "whole context"),
])
def test_jais2_export_refusals_name_the_option(overrides, fragment):
    from redline.interop.families import export_family

    base = dict(vocab_size=VOCAB, n_layer=2, n_embd=64, n_head=4, norm="layernorm", mlp="relu2")
    assert export_family(ModelConfig(**base)).name == "jais2"
    with pytest.raises(UserError, match="Jais 2") as err:
        export_family(ModelConfig(**{**base, **overrides}))
    assert fragment in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------------------------------
# HyperCLOVA X


def test_hyperclovax_post_norms_and_scalars_show_in_the_logits(tmp_path):
    hf, model = _imported("hyperclovax")
    cfg = model.cfg
    assert (cfg.norm_position, cfg.embed_multiplier, cfg.residual_multiplier, cfg.attn_scale, cfg.logit_divisor) == (
        "sandwich", 2.0, 0.5, 0.2, 4.0)
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        back = _written_as(tmp_path, model, "hyperclovax")
        torch.testing.assert_close(back(TOKENS).logits, expected, rtol=1e-5, atol=1e-5)
        model.blocks[0].attn_out_norm.weight.fill_(1.0)  # post_norm1, read into the attention output's norm
        assert (model(TOKENS) - expected).abs().max() > 1e-4


def test_hyperclovax_without_post_norms_is_granites_block():
    hf, model = _imported("hyperclovax-pre")
    assert (model.cfg.norm_position, model.cfg.logit_divisor, model.cfg.attn_scale) == ("pre", 0.25, 0.25)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(sliding_window=4), "has no model.sliding_window"),
    (dict(mlp="gelu"), "model.mlp=gelu"),
    (dict(qkv_bias=True), "model.qkv_bias"),
])
def test_hyperclovax_export_refusals_name_the_option(overrides, fragment):
    from redline.interop.families import export_family

    base = dict(vocab_size=VOCAB, n_layer=2, n_embd=64, n_head=4, norm_position="sandwich")
    assert export_family(ModelConfig(**base)).name == "hyperclovax"
    with pytest.raises(UserError, match="HyperCLOVA X") as err:
        export_family(ModelConfig(**{**base, **overrides}))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_hyperclovax_logit_multiplier_at_or_below_zero_is_refused():
    from redline.interop.granite import hyperclovax_model_config

    hf = hf_model("hyperclovax").config.to_dict()
    with pytest.raises(UserError, match="logits_scaling=0.0"):
        hyperclovax_model_config({**hf, "logits_scaling": 0.0})


# ----------------------------------------------------------------------------------------------------
# Persimmon


def test_persimmon_layernorm_qk_norm_shows_in_the_logits_and_trains():
    hf, model = _imported("persimmon")
    cfg = model.cfg
    assert (cfg.qk_norm, cfg.qk_layernorm, cfg.rope_dims, cfg.mlp, cfg.norm, cfg.bias, cfg.kv_heads) == (
        True, True, 8, "relu2", "layernorm", True, 4)
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
    model.train()
    loss = torch.nn.functional.cross_entropy(model(TOKENS[:, :-1]).flatten(0, 1), TOKENS[:, 1:].flatten())
    loss.backward()
    attn = model.blocks[0].attn
    assert attn.q_norm.bias.grad.abs().sum() > 0 and attn.k_norm.weight.grad.abs().sum() > 0
    with torch.no_grad():
        attn.q_norm.bias.zero_()
        assert (model.eval()(TOKENS) - expected).abs().max() > 1e-4


def test_persimmon_without_qk_norm_and_its_folder_written_back(tmp_path):
    hf = hf_model("persimmon")
    config = {**hf.config.to_dict(), "qk_layernorm": False}
    cfg = _family("persimmon").model_config(config)
    assert not cfg.qk_norm and not cfg.qk_layernorm
    _, model = _imported("persimmon")
    back = _written_as(tmp_path, model, "persimmon")
    with torch.no_grad():
        torch.testing.assert_close(back(TOKENS).logits, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_qk_layernorm_needs_per_head_qk_norm():
    for bad in (dict(qk_layernorm=True), dict(qk_norm=True, qk_norm_after_rope=True, qk_layernorm=True),
                dict(qk_norm=True, qk_norm_scope="all", qk_layernorm=True)):
        with pytest.raises(UserError, match="model.qk_layernorm needs per-head QK-norm before RoPE"):
            ModelConfig(vocab_size=VOCAB, n_layer=1, n_embd=64, n_head=4, **bad).validate()


@pytest.mark.parametrize("overrides, fragment", [
    (dict(n_kv_head=2), "Persimmon is multi-head"),
    (dict(mlp="swiglu"), "model.mlp=swiglu"),
    (dict(norm="rmsnorm"), "model.norm=rmsnorm"),
    (dict(sliding_window=4), "Persimmon attends to the whole context"),
])
def test_persimmon_export_refusals_name_the_option(overrides, fragment):
    from redline.interop.families import export_family

    base = dict(vocab_size=VOCAB, n_layer=2, n_embd=64, n_head=4, norm="layernorm", mlp="relu2", qk_norm=True,
                qk_layernorm=True)
    assert export_family(ModelConfig(**base)).name == "persimmon"
    with pytest.raises(UserError, match="Persimmon") as err:
        export_family(ModelConfig(**{**base, **overrides}))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_persimmon_refusals_name_the_field():
    from redline.interop.persimmon import model_config

    hf = hf_model("persimmon").config.to_dict()
    with pytest.raises(UserError, match="hidden_act='gelu'"):
        model_config({**hf, "hidden_act": "gelu"})
    params = {**hf["rope_parameters"], "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}
    with pytest.raises(UserError, match="RoPE scaling 'yarn' on a Persimmon model"):
        model_config({**hf, "rope_parameters": params})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_persimmon_compiled_engine_stays_greedy():
    """On a GPU: the compiled, graph-captured engine decodes greedily as the eager one does (tests/engine_checks.py);
    the decode kernel's prologue has no LayerNorm QK-norm, so the layer computes q and k in torch."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy

    _, model = _imported("persimmon")
    assert_compiled_engine_stays_greedy(model.cuda(), [TOKENS[0, :9].tolist(), TOKENS[1, :4].tolist()])


# ----------------------------------------------------------------------------------------------------
# XGLM


def test_xglm_sinusoidal_table_is_transformers_and_shows_in_the_logits():
    hf, model = _imported("xglm")
    table = hf.model.embed_positions.weights  # transformers' table, offset rows first
    torch.testing.assert_close(model.wpe.weight, table[2:2 + model.cfg.context_len], rtol=0, atol=1e-6)
    assert (model.cfg.embed_scale, model.cfg.gelu_approximate, model.cfg.tie_embeddings) == (True, "none", True)
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        model.wpe.weight.copy_(table[:model.cfg.context_len])  # the table without its offset
        assert (model(TOKENS) - expected).abs().max() > 1e-4


@pytest.mark.parametrize("overrides, fragment", [
    (dict(scale_embedding=False), "scale_embedding=false"),
    (dict(activation_function="relu"), "activation_function='relu'"),
])
def test_xglm_refusals_name_the_field(overrides, fragment):
    from redline.interop.xglm import model_config

    hf = hf_model("xglm").config.to_dict()
    with pytest.raises(UserError) as err:
        model_config({**hf, **overrides})
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_xglm_gguf_export_is_refused_by_name(tmp_path, capsys):
    """XGLM exports to Hugging Face as BioGPT (test_interop.py's EXPORTED_AS), which llama.cpp has not."""
    from tests.test_interop import imported, run_cli

    _, _, _, ckpt = imported("xglm", tmp_path, capsys)
    out = tmp_path / "x.gguf"
    code, _, err = run_cli(["export", str(ckpt), "--format", "gguf", "--out", str(out)], capsys)
    assert code == 2 and "BioGPT models are not written as GGUF" in err and not out.exists(), err
