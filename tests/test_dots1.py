"""dots.llm1 beyond the FAMILIES tables: its config's fields, the routing options and windows each showing in the
logits (so the parity tests would catch any read wrong), transformers' stacked experts read as the Hub's per-expert
tensors, and the one-line refusals on import, export and PEFT export."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.model import GPT, ModelConfig
from tests.interop_models import hf_model

transformers = pytest.importorskip("transformers")
TOKENS = torch.tensor([[5, 17, 42, 99, 3, 64, 7, 120, 31, 8, 250, 11], [9, 8, 7, 6, 5, 4, 3, 2, 200, 150, 100, 50]])


def _imported(kind: str):
    """(transformers' model, redline's GPT with its weights) of tests/interop_models.py's `kind`, read from
    transformers' own state dict (its experts stacked: gate_up_proj, down_proj)."""
    from redline.interop.families import TensorSource, family_for

    hf = hf_model(kind)
    state = hf.state_dict()
    assert "model.layers.2.mlp.experts.gate_up_proj" in state
    family = family_for(hf.config.to_dict(), "test")
    cfg = family.model_config(hf.config.to_dict())
    model = GPT(cfg).eval()
    src = TensorSource(state, state.__getitem__, "test")
    _, unexpected = model.load_state_dict(family.to_redline(src, cfg), strict=False)
    assert not unexpected
    return hf, model


def test_config_fields_and_every_routing_option_shows_in_the_logits():
    hf, model = _imported("dots1")
    cfg = model.cfg
    assert (cfg.moe_experts, cfg.moe_top_k, cfg.moe_groups, cfg.moe_topk_groups, cfg.moe_dense_layers) == (8, 3, 4, 2, 1)
    assert (cfg.hidden_dim, cfg.moe_dense_hidden, cfg.moe_shared_hidden, cfg.moe_scale) == (16, 96, 32, 2.0)
    assert (cfg.qk_norm, cfg.moe_norm_topk, cfg.moe_norm_eps, cfg.sliding_window) == (True, True, 1e-20, 0)
    assert [type(b.mlp).__name__ for b in model.blocks] == ["MLP", "MoE", "MoE"]
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        moe = model.blocks[1].mlp
        for attr, value in (("groups", 1), ("scale", 1.0), ("norm_topk", False)):
            kept = getattr(moe, attr)
            setattr(moe, attr, value)
            assert (model(TOKENS) - expected).abs().max() > 1e-4, attr
            setattr(moe, attr, kept)
        moe.expert_bias.zero_()
        assert (model(TOKENS) - expected).abs().max() > 1e-4


def test_windowed_layers_from_max_window_layers():
    hf, model = _imported("dots1-window")
    cfg = model.cfg
    assert (cfg.sliding_window, cfg.window_layers, cfg.moe_norm_topk, cfg.tie_embeddings) == (5, (1, 2), False, True)
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        unwindowed = GPT(replace(cfg, sliding_window=0, window_layers=())).eval()
        unwindowed.load_state_dict(model.state_dict())
        assert (unwindowed(TOKENS) - expected).abs().max() > 1e-4


@pytest.mark.parametrize("edit, fragment", [
    ({"attention_bias": True}, "attention_bias=true"),
    ({"n_shared_experts": 0}, "n_shared_experts=0: dots.llm1's mixtures have routed and shared experts"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
])
def test_import_refusals_name_the_option(edit, fragment):
    from redline.interop.dots1 import model_config

    hf = hf_model("dots1").config.to_dict()
    with pytest.raises(UserError, match=fragment):
        model_config({**hf, **edit})


CFG = ModelConfig(vocab_size=64, context_len=32, n_layer=2, n_embd=32, n_head=4, qk_norm=True, moe_experts=4,
                  moe_top_k=2, mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20,
                  moe_shared_hidden=32, moe_shared_gate=False)


@pytest.mark.parametrize("extra, fragment", [
    # (without QK-norm, with dense layers: Sarvam MoE's, test_interop_glm.py)
    (dict(moe_shared_gate=True), "an ungated shared expert"),
    (dict(moe_shared_hidden=24), r"model.moe_shared_hidden=24, a multiple of 16"),
    (dict(moe_norm_eps=1e-6), r"adds 1e-20 to the chosen scores' sum \(model.moe_norm_eps=1e-06"),
    (dict(moe_layers=(1,)), "has its dense layers first"),
    (dict(mlp="geglu"), "has SwiGLU experts and MLPs"),
    (dict(rope_local_theta=50.0, sliding_window=4, sliding_window_pattern=2),
     "rotates every layer's whole heads"),  # (partial RoPE: GLM-4-MoE's)
    # layers without RoPE: EXAONE-MoE's, its full layers among windowed ones alone
    (dict(nope_interval=2), "EXAONE-MoE, the one architecture with both redline exports to, leaves RoPE out of "
                            "exactly its full-attention layers"),
])
def test_export_refusals_name_the_option(extra, fragment):
    from redline.interop.families import export_family

    assert export_family(CFG).name == "dots1"
    with pytest.raises(UserError, match=fragment):
        export_family(replace(CFG, **extra))


def test_peft_export_refuses_mlp_adapters(tmp_path, capsys):
    """PEFT moves gate_proj, up_proj and down_proj adapters onto dots.llm1's experts as it loads them: an adapter on an
    MLP is refused by name (the attention's are tests/test_lora_export.py's)."""
    from tests.test_lora_export import export, lora_run

    _, ckpt = lora_run(tmp_path, "Dots1ForCausalLM", targets=("attn.*", "mlp.fc"))
    assert export(str(ckpt), "--adapter", str(tmp_path / "adapter")) == 2
    err = capsys.readouterr().err
    assert "which PEFT moves onto dots.llm1's experts" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "adapter").exists()
