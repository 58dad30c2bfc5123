"""The Qwen-MoE-derived families' refusals: each option redline cannot express named at import, each option the
architecture lacks named at export (their parity runs in tests/test_interop.py's FAMILIES and REDLINE_EXPORTS)."""

from __future__ import annotations

import pytest

from redline.errors import UserError
from redline.interop.families import export_family
from redline.model import ModelConfig

_AFMOE = {"model_type": "afmoe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
          "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "num_experts": 4,
          "num_experts_per_tok": 2, "num_shared_experts": 1, "num_dense_layers": 0, "sliding_window": 4}


@pytest.mark.parametrize("hf, fragment", [
    ({"attention_bias": True}, "attention_bias=true"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"num_shared_experts": 0}, "num_shared_experts=0"),
    ({"layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types"),
])
def test_afmoe_import_refusals_name_the_option(hf, fragment):
    from redline.interop.afmoe import model_config

    with pytest.raises(UserError, match=fragment):
        model_config({**_AFMOE, **hf})


def test_afmoe_layers_rotate_as_transformers_does():
    """The windowed layers rotate, the full ones do not: every N-th full is nope_interval, any other order
    rope_layer_theta; all full is no positions at all."""
    from redline.interop.afmoe import model_config

    cfg = model_config({**_AFMOE, "num_hidden_layers": 4, "global_attn_every_n_layers": 2})
    assert (cfg.nope_interval, cfg.sliding_window_pattern) == (2, 2)
    cfg = model_config({**_AFMOE, "layer_types": ["full_attention", "sliding_attention"]})
    assert cfg.rope_layer_theta == (0.0, 10000.0) and cfg.window_layers == (1,)
    assert model_config({**_AFMOE, "layer_types": ["full_attention"] * 2}).pos_emb == "none"


_SIGMOID = dict(vocab_size=64, n_layer=2, n_embd=32, n_head=4, qk_norm=True, moe_experts=4, moe_top_k=2,
                mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20, moe_shared_hidden=32,
                moe_shared_gate=False, norm_position="sandwich", attn_gate="element", sliding_window=4,
                sliding_window_pattern=2, nope_interval=2)


@pytest.mark.parametrize("extra, fragment", [
    (dict(attn_gate="none"), "gates every element of its heads' output .model.attn_gate=element."),
    (dict(norm_position="pre"), "model.norm_position=sandwich"),
    (dict(nope_interval=0), "rotates exactly its windowed layers"),
    (dict(sliding_window=0, sliding_window_pattern=0), "layers without RoPE among rotating ones need a window"),
    (dict(moe_shared_gate=True), "ungated shared expert"),
    (dict(embed_multiplier=3.0), "sqrt.n_embd."),
    (dict(v_norm=True), "has no such layers .model.v_norm."),
])
def test_afmoe_export_refusals_name_the_option(extra, fragment):
    with pytest.raises(UserError, match=fragment):
        export_family(ModelConfig(**{**_SIGMOID, **extra}))


_MELLUM = {"model_type": "mellum", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
           "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "num_experts": 4,
           "num_experts_per_tok": 2, "sliding_window": 4}


@pytest.mark.parametrize("hf, fragment", [
    ({"attention_bias": True}, "attention_bias=true"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "partial_rotary_factor=0.5"),
    ({"layer_types": ["sliding_attention", "full_attention"],
      "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                          "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}},
     "sliding-window layers' RoPE scaling 'linear'"),
    ({"mlp_layer_types": ["dense", "dense"]}, "no layer has experts"),
    ({"mlp_layer_types": ["sparse", "moe"]}, "mlp_layer_types"),
])
def test_mellum_import_refusals_name_the_option(hf, fragment):
    from redline.interop.windowed_moe import mellum_model_config

    with pytest.raises(UserError, match=fragment):
        mellum_model_config({**_MELLUM, **hf})


def test_mellum_and_flint_dense_layers():
    """Dense layers first are moe_dense_layers, any other set moe_layers (Mellum's mlp_layer_types; Flint's
    mlp_only_layers, [0, 1] by default, with Qwen3-MoE's decoder_sparse_step)."""
    from redline.interop.windowed_moe import flint_model_config, mellum_model_config

    cfg = mellum_model_config({**_MELLUM, "num_hidden_layers": 3, "mlp_layer_types": ["dense", "sparse", "dense"]})
    assert cfg.moe_layers == (1,) and cfg.moe_dense_hidden == 48
    flint = {**_MELLUM, "model_type": "flint", "num_hidden_layers": 4, "shared_expert_intermediate_size": 24}
    cfg = flint_model_config(flint)
    assert cfg.moe_dense_layers == 2 and not cfg.moe_layers
    assert flint_model_config({**flint, "mlp_only_layers": [], "decoder_sparse_step": 2}).moe_layers == (1, 3)


@pytest.mark.parametrize("hf, fragment", [
    ({"attention_bias": True}, "attention_bias=true"),
    ({"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size=0"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
])
def test_flint_import_refusals_name_the_option(hf, fragment):
    from redline.interop.windowed_moe import flint_model_config

    base = {**_MELLUM, "model_type": "flint", "shared_expert_intermediate_size": 24}
    with pytest.raises(UserError, match=fragment):
        flint_model_config({**base, **hf})


_SOFTMAX = dict(vocab_size=64, n_layer=2, n_embd=32, n_head=4, qk_norm=True, moe_experts=4, moe_top_k=2,
                mlp_hidden=16, sliding_window=4, window_layers=(0,))


@pytest.mark.parametrize("extra, fragment", [
    (dict(moe_shared_hidden=16), "Mellum, the architecture with them redline exports to, has no shared expert"),
    (dict(nope_interval=2), "Mellum.* rotates every layer's whole heads"),
    (dict(moe_scale=2.0), "Mellum.* weights the experts by their probabilities alone"),
    (dict(attn_sinks=True, moe_gating="sigmoid", moe_norm_eps=0.0, moe_shared_hidden=16, moe_shared_gate=False),
     "Flint.* rotates exactly its windowed layers"),
    (dict(attn_sinks=True, moe_gating="sigmoid", moe_shared_hidden=16, moe_shared_gate=False, window_layers=(),
          sliding_window_pattern=2, nope_interval=2), "Flint.* divides the chosen scores by their sum alone"),
    (dict(attn_sinks=True, moe_gating="sigmoid", moe_norm_eps=0.0, window_layers=(), sliding_window_pattern=2,
          nope_interval=2), "Flint.* has an ungated shared expert"),
])
def test_mellum_and_flint_export_refusals_name_the_option(extra, fragment):
    with pytest.raises(UserError, match=fragment):
        export_family(ModelConfig(**{**_SOFTMAX, **extra}))


def test_qwen3_moe_keeps_exporting_as_qwen3_moe():
    """A softmax mixture with QK-norm on every layer, whole context: Qwen3-MoE's still, not Mellum's."""
    cfg = ModelConfig(**{**_SOFTMAX, "sliding_window": 0, "window_layers": ()})
    assert export_family(cfg).name == "qwen3_moe"


_KOLIBRI = {"model_type": "kolibri1", "vocab_size": 64, "hidden_size": 32, "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_experts": 4, "num_experts_per_tok": 2, "sliding_window": 4}


@pytest.mark.parametrize("hf, fragment", [
    ({"sliding_window": None}, "sliding_window=None"),
    ({"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size=0"),
    ({"hidden_act": "relu"}, "hidden_act='relu'"),
])
def test_kolibri1_import_refusals_name_the_option(hf, fragment):
    from redline.interop.kolibri1 import model_config

    with pytest.raises(UserError, match=fragment):
        model_config({**_KOLIBRI, **hf})


def test_bias_on_logits_chooses_by_logits_plus_bias():
    """moe_bias_on_logits: the top k of logits + bias (Kolibri-1's), which a bias on the sigmoid scores does not give
    (sigmoid flattens large logits), each chosen expert weighted by its own score."""
    import torch

    from redline.model import MoE

    cfg = ModelConfig(vocab_size=64, n_layer=1, n_embd=8, n_head=2, moe_experts=4, moe_top_k=1, mlp_hidden=8,
                      moe_gating="sigmoid", moe_expert_bias=True, moe_norm_topk=False)
    moe = {flag: MoE(ModelConfig(**{**cfg.__dict__, "moe_bias_on_logits": flag})) for flag in (False, True)}
    logits = torch.tensor([[6.0, 3.0, 0.0, -5.0]])
    for m in moe.values():
        torch.nn.init.normal_(m.fc), torch.nn.init.normal_(m.proj)
        m.router.weight.data.zero_()
        m.router.weight.data[:, 0] = logits[0]  # x = e_0: the logits as given
        m.expert_bias.copy_(torch.tensor([0.0, 2.9, 0.0, 0.0]))
    moe[True].load_state_dict(moe[False].state_dict())
    x = torch.zeros(1, 1, 8)
    x[..., 0] = 1.0
    # logits + bias: 6 vs 5.9, expert 0; sigmoid + bias: 0.998 vs 0.953 + 2.9, expert 1
    expert = {flag: m.proj[e] @ torch.nn.functional.silu(m.fc[e][:8] @ x[0, 0]).mul(m.fc[e][8:] @ x[0, 0])
              * torch.sigmoid(logits[0, e]) for flag, m, e in ((True, moe[True], 0), (False, moe[False], 1))}
    for flag, m in moe.items():
        with torch.no_grad():
            torch.testing.assert_close(m(x)[0, 0], expert[flag])
    with pytest.raises(UserError, match="moe_bias_on_logits needs a routing bias on sigmoid scores"):
        ModelConfig(**{**cfg.__dict__, "moe_bias_on_logits": True, "moe_gating": "softmax"}).validate()


def test_bias_on_logits_exports_as_kolibri1_alone():
    base = dict(vocab_size=64, n_layer=2, n_embd=32, n_head=4, qk_norm=True, moe_experts=4, moe_top_k=2,
                mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True, moe_bias_on_logits=True, moe_norm_eps=1e-20,
                moe_shared_hidden=16, moe_shared_gate=False)
    with pytest.raises(UserError, match="Kolibri-1, the one architecture with it redline exports to, has plain "
                                        "RMSNorms"):  # dots.llm1 would choose by the scores
        export_family(ModelConfig(**base))
    with pytest.raises(UserError, match="Kolibri-1.* divides the chosen scores by their sum alone"):
        export_family(ModelConfig(**{**base, "norm_position": "sandwich"}))
    assert export_family(ModelConfig(**{**base, "norm_position": "sandwich", "moe_norm_eps": 0.0})).name == "kolibri1"


_LAGUNA = {"model_type": "laguna", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
           "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_experts": 4, "num_experts_per_tok": 2, "sliding_window": 4}


@pytest.mark.parametrize("hf, fragment", [
    ({"attention_bias": True}, "attention_bias=true"),
    ({"num_attention_heads_per_layer": [4, 2]}, "num_attention_heads_per_layer=.4, 2."),
    ({"moe_router_logit_softcapping": 30.0}, "moe_router_logit_softcapping=30.0"),
    ({"moe_apply_router_weight_on_input": True}, "moe_apply_router_weight_on_input=true"),
    ({"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size=0"),
])
def test_laguna_import_refusals_name_the_option(hf, fragment):
    from redline.interop.laguna import model_config

    with pytest.raises(UserError, match=fragment):
        model_config({**_LAGUNA, **hf})


def test_laguna_rope_and_gates_per_config():
    """LagunaConfig's defaults: half of each full layer's head rotated, a windowed layer's whole head with its own
    base; gating true is a gate a head, "per-element" one an element."""
    from redline.interop.laguna import model_config

    cfg = model_config({**_LAGUNA, "layer_types": ["sliding_attention", "full_attention"]})
    assert (cfg.rope_dims, cfg.rope_local_dims, cfg.rope_theta, cfg.rope_local_theta) == (4, 8, 500000.0, 10000.0)
    assert (cfg.attn_gate, cfg.attn_gate_fn) == ("head", "softplus") and cfg.moe_dense_layers == 1
    assert model_config({**_LAGUNA, "gating": "per-element"}).attn_gate == "element"


def test_softplus_gate_and_windowed_partial_rope_are_checked():
    base = dict(vocab_size=64, n_layer=2, n_embd=32, n_head=4)
    with pytest.raises(UserError, match="model.attn_gate_fn=softplus needs a gate on the heads"):
        ModelConfig(**base, attn_gate_fn="softplus").validate()
    with pytest.raises(UserError, match="model.rope_local_dims=4 needs the windowed layers' own RoPE table"):
        ModelConfig(**base, rope_local_dims=4).validate()


def test_softplus_gate_exports_as_laguna_alone():
    base = dict(vocab_size=64, n_layer=2, n_embd=32, n_head=4, qk_norm=True, attn_gate="element",
                attn_gate_fn="softplus")
    with pytest.raises(UserError, match="Laguna, the one architecture with them redline exports to, has "
                                        "sigmoid-scored SwiGLU experts"):  # Qwen3.5 would gate by a sigmoid
        export_family(ModelConfig(**base))


@pytest.mark.parametrize("model_type, fragment", [("gpt_neox_japanese", "GPTNeoXJapaneseTokenizer")])
def test_families_redline_cannot_express_are_refused_by_name(model_type, fragment):
    from redline.interop.families import family_for

    with pytest.raises(UserError, match=f"model_type '{model_type}' is not supported: .*{fragment}"):
        family_for({"model_type": model_type}, "config.json")


@pytest.mark.parametrize("extra", [
    # Laguna's softplus head gate and the windowed layer's own partial RoPE
    dict(attn_gate="head", attn_gate_fn="softplus", sliding_window=4, window_layers=(0,), rope_dims=4,
         rope_local_theta=50.0, rope_local_dims=8, moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=0.0),
    # Kolibri-1's bias on the logits, AFMoE's sandwich norms and element gate
    dict(norm_position="sandwich", attn_gate="element", moe_gating="sigmoid", moe_expert_bias=True,
         moe_bias_on_logits=True, moe_shared_hidden=16, moe_shared_gate=False),
])
def test_new_layers_train(extra):
    """A step's gradient reaches every parameter of the new layers (the gates, the router with its bias on logits),
    so `redline train --init-from` fine-tunes an imported model of these families."""
    import torch

    from redline.model import GPT

    cfg = ModelConfig(vocab_size=64, context_len=32, n_layer=2, n_embd=32, n_head=4, qk_norm=True, moe_experts=4,
                      moe_top_k=2, mlp_hidden=16, **extra)
    cfg.validate()
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(0, 64, (2, 12))
    model(idx, idx).backward()
    for name in ("blocks.0.attn.gate.weight", "blocks.1.mlp.router.weight", "blocks.1.mlp.fc"):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0 and torch.isfinite(grad).all(), name


@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_new_layers_as_full_recompute(chunk):
    """The engine on Laguna's and Kolibri-1's new layers (a softplus gate, the windowed layers' own partial RoPE, a
    bias on the router's logits): prompts of different lengths prefilled whole or in chunks, then decoded, give the
    tokens GPT.generate's full recompute gives."""
    import torch

    from redline.inference import InferenceEngine, SamplingParams
    from redline.model import GPT

    cfg = ModelConfig(vocab_size=64, context_len=48, n_layer=3, n_embd=32, n_head=4, n_kv_head=2, qk_norm=True,
                      attn_gate="head", attn_gate_fn="softplus", sliding_window=4, window_layers=(0, 2), rope_dims=4,
                      rope_local_theta=50.0, rope_local_dims=8, moe_experts=4, moe_top_k=2, mlp_hidden=16,
                      moe_gating="sigmoid", moe_expert_bias=True, moe_bias_on_logits=True, moe_norm_eps=0.0)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for block in model.blocks:
            block.mlp.expert_bias.copy_(torch.randn(4))
    prompts = [[3, 9, 27, 17, 51, 5, 8, 11, 40], [7, 1, 60]]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
    got = [r.tokens for r in engine.generate(prompts, 10, SamplingParams(temperature=0))]
    expected = [model.generate(torch.tensor([p]), 10, temperature=0)[0, len(p):].tolist() for p in prompts]
    assert got == expected
