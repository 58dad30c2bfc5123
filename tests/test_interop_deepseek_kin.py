"""Youtu, Mistral 4, DeepSeek-V3.2, GLM-5, A.X-K1 (redline/interop/deepseek_kin.py) and MiMo-V2-Flash
(redline/interop/mimo.py) beyond the import / export tables of test_interop.py: the contexts the imports stop at,
what each reads as, the engine on MiMo's layers, the one-line refusals."""

import dataclasses

import pytest
import torch

from redline.errors import UserError
from redline.model import ModelConfig
from redline.interop.families import _families, export_family
from tests.interop_models import hf_folder
from tests.test_interop import TOKENS, imported, run_cli

transformers = pytest.importorskip("transformers")

HUB_V32 = {  # DeepSeek-V3.2-Exp's config.json, its sizes cut down
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "vocab_size": 320,
    "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 8,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "qk_nope_head_dim": 16, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 3,
    "norm_topk_prob": True, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "index_topk": 2048,
    "index_head_dim": 128, "index_n_heads": 64, "tie_word_embeddings": False,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}


def test_dsa_import_stops_at_index_topk_and_says_the_indexer_is_left_out(tmp_path, capsys):
    from redline.training.checkpoint import load_for_inference

    hf_folder("glm_moe_dsa", tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    assert model.cfg.context_len == 32  # index_topk, below max_position_embeddings 64
    assert "indexer (5 tensors) is left out" in err and "index_topk = 32" in err  # layer 0's alone: 1 is "shared"
    cfg = _families()["deepseek_v32"].model_config(HUB_V32)
    assert cfg.context_len == 2048 and cfg.moe_dense_layers == 3 and cfg.moe_groups == 4
    # the rest is DeepSeek-V3's reading of the same fields, RoPE on interleaved pairs
    v3 = _families()["deepseek_v3"].model_config({**HUB_V32, "model_type": "deepseek_v3"})
    assert dataclasses.replace(v3, context_len=2048) == cfg
    assert export_family(cfg).name == "deepseek_v3"


def test_dsa_import_matches_transformers_up_to_index_topk(tmp_path, capsys):
    """At index_topk tokens, the longest context the import takes, the indexer still keeps every key."""
    hf, model, _, _ = imported("deepseek_v32", tmp_path, capsys)
    tokens = torch.randint(0, 320, (1, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(UserError, match="exceeds the model.s context_len 32"):  # past it DSA would drop keys
        model(torch.cat([tokens, tokens[:, :1]], dim=1))


def test_mistral4_context_stops_where_its_query_scale_starts(tmp_path, capsys):
    hf, model, _, _ = imported("mistral4", tmp_path, capsys)
    assert model.cfg.context_len == 32  # rope_parameters' original_max_position_embeddings
    assert model.cfg.moe_gating == "softmax" and not model.cfg.moe_expert_bias and model.cfg.moe_groups == 4
    tokens = torch.randint(0, 320, (1, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=1e-5, atol=1e-5)
    # Mistral4Config's defaults: YaRN by 128 from 8192 with the query scale from there
    cfg = _families()["mistral4"].model_config({"model_type": "mistral4", "num_hidden_layers": 2, "hidden_size": 64,
                                                "intermediate_size": 96, "num_attention_heads": 4})
    assert cfg.context_len == 8192 and cfg.rope_scaling == "yarn" and cfg.rope_factor == 128.0


def test_youtu_reads_as_dense_deepseek_v3(tmp_path, capsys):
    _, model, _, _ = imported("youtu", tmp_path, capsys)
    assert model.cfg.kv_lora_rank == 16 and not model.cfg.moe_experts and model.cfg.tie_embeddings
    assert export_family(model.cfg).name == "deepseek_v3"


@pytest.mark.parametrize("kind, change, fragment", [
    ("mistral4", {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
     "rope_parameters.rope_type='default' on mistral4"),
    ("mistral4", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0,
                                      "llama_4_scaling_beta": 0.1}},
     "llama_4_scaling_beta without original_max_position_embeddings"),
    ("youtu", {"n_routed_experts": 4}, "n_routed_experts=4 on youtu"),
    ("deepseek_v32", {"mlp_layer_types": ["sparse", "dense"]}, "mlp_layer_types=['sparse', 'dense']"),
    ("glm_moe_dsa", {"index_topk": 0}, "index_topk=0 on glm_moe_dsa"),
])
def test_import_refusals_are_one_line(kind, change, fragment, tmp_path, capsys):
    import json

    hf_folder(kind, tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_mistral4_export_refusals(tmp_path, capsys):
    _, model, _, _ = imported("mistral4", tmp_path, capsys)
    biased = dataclasses.replace(model.cfg, moe_expert_bias=True)
    with pytest.raises(UserError, match="Mistral 4's router has no routing bias"):
        export_family(biased)
    with pytest.raises(UserError, match="model.rope_scaling=linear with Mistral 4's router"):
        export_family(dataclasses.replace(model.cfg, rope_scaling="linear", rope_factor=2.0))
    # rescaled scores without groups are Mistral 4's too; taken as they are, DeepSeek-V2's
    ungrouped = dataclasses.replace(model.cfg, moe_groups=1, moe_topk_groups=1)
    assert export_family(ungrouped).name == "mistral4"
    assert export_family(dataclasses.replace(ungrouped, moe_norm_topk=False)).name == "deepseek_v2"
    assert TOKENS.shape[1] <= model.cfg.context_len


def test_axk1_hub_files_without_routing_bias_and_with_dense_layer_norms(tmp_path, capsys):
    """A.X-K1's Hub files route without e_score_correction_bias (transformers holds zeros) and store a
    post_mlp_layernorm on the dense layers too, which nothing uses."""
    from safetensors.torch import load_file, save_file

    from redline.training.checkpoint import load_for_inference

    hf = hf_folder("axk1", tmp_path / "hf")
    with torch.no_grad():
        hf.model.layers[1].mlp.gate.e_score_correction_bias.zero_()
    path = tmp_path / "hf" / "model.safetensors"
    state = {k: v for k, v in load_file(path).items() if not k.endswith("e_score_correction_bias")}
    state["model.layers.0.post_mlp_layernorm.weight"] = torch.ones(64)
    save_file(state, path, metadata={"format": "pt"})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    assert model.cfg.moe_post_norm and model.cfg.moe_dense_layers == 1
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_moe_post_norm_exports_as_axk1_alone():
    cfg = ModelConfig(vocab_size=100, context_len=32, n_layer=2, n_embd=32, n_head=4, moe_experts=4, moe_top_k=2,
                      mlp_hidden=16, moe_post_norm=True)
    with pytest.raises(UserError, match="model.moe_post_norm: of the architectures redline exports to, A.X-K1 alone"):
        export_family(cfg)
    with pytest.raises(UserError, match="model.moe_post_norm needs experts"):
        dataclasses.replace(cfg, moe_experts=0).validate()


def test_moe_post_norm_trains():
    """The mixture's output norm is on the differentiable path: its weight gets a finite, non-zero gradient."""
    from redline.model import GPT

    cfg = ModelConfig(vocab_size=64, context_len=16, n_layer=2, n_embd=32, n_head=4, moe_experts=4, moe_top_k=2,
                      mlp_hidden=16, moe_dense_layers=1, moe_post_norm=True)
    torch.manual_seed(0)
    model = GPT(cfg).train()
    idx = torch.randint(0, 64, (2, 12))
    model(idx, idx).backward()
    grad = model.blocks[1].mlp.post_norm.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    assert model.blocks[0].mlp.__class__.__name__ == "MLP"  # the dense layer has no such norm


@pytest.mark.parametrize("change, fragment", [
    ({"attention_bias": True}, "attention_bias=true on mimo_v2_flash"),
    ({"v_head_dim": 32}, "v_head_dim=32 wider than head_dim=24"),
    ({"mlp_layer_types": ["sparse", "dense", "sparse"]}, "mlp_layer_types=['sparse', 'dense', 'sparse']"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 5e6, "factor": 2.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "rope_parameters.full_attention.rope_type='yarn' on mimo_v2_flash"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.3},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                                                "partial_rotary_factor": 0.3}}},
     "gives [7] rotated dimensions of 24"),
])
def test_mimo_import_refusals(change, fragment):
    from tests.interop_models import FAMILIES

    hf = {"model_type": "mimo_v2_flash", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 96,
          "max_position_embeddings": 64, **FAMILIES["mimo_v2_flash"][2], **change}
    with pytest.raises(UserError) as e:
        _families()["mimo_v2_flash"].model_config(hf)
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_mimo_reads_the_hub_window_and_pads_values(tmp_path, capsys):
    """sliding_window_size (the Hub's) is one key fewer than the window; values 16 wide are padded to the keys' 24
    with zero rows (v) and columns (o_proj), attention_value_scale folded into v."""
    from tests.interop_models import FAMILIES

    hf = {"model_type": "mimo_v2_flash", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 96,
          "max_position_embeddings": 64, **FAMILIES["mimo_v2_flash"][2]}
    assert _families()["mimo_v2_flash"].model_config({**hf, "sliding_window_size": 128}).sliding_window == 129
    source, model, _, _ = imported("mimo_v2_flash", tmp_path, capsys)
    cfg = model.cfg
    assert (cfg.n_kv_head, cfg.global_kv_head, cfg.rope_dims, cfg.window_layers) == (4, 2, 8, (1, 2))
    assert model.blocks[0].attn.sinks is None and model.blocks[1].attn.sinks is not None
    v = model.blocks[1].attn.v.weight.reshape(4, 24, 64)
    assert v[:, 16:].abs().max() == 0
    theirs = source.model.layers[1].self_attn.v_proj.weight.reshape(4, 16, 64)
    torch.testing.assert_close(v[:, :16], theirs * 0.707)
    assert model.blocks[1].attn.proj.weight.reshape(64, 4, 24)[:, :, 16:].abs().max() == 0


def test_mimo_engine_decodes_as_full_recompute(tmp_path, capsys):
    """Prompts longer than the window, prefilled in chunks of 3 tokens (test_interop.py prefills whole), decoded by
    the engine: the full recompute's tokens (the windowed layers' own KV heads and sinks, the full layer's)."""
    from redline.inference import InferenceEngine, SamplingParams

    _, model, _, _ = imported("mimo_v2_flash", tmp_path, capsys)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # no near-ties
    prompts = [list(range(1, 12)), [5, 6], [40]]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=3)
    got = [r.tokens for r in engine.generate(prompts, 10, SamplingParams(temperature=0))]
    want = [model.generate(torch.tensor([p]), 10, temperature=0)[0, len(p):].tolist() for p in prompts]
    assert got == want


def test_mimo_export_refusals(tmp_path, capsys):
    _, model, _, _ = imported("mimo_v2_flash", tmp_path, capsys)
    with pytest.raises(UserError, match="MiMo-V2-Flash's windowed layers have twice the full layers' KV heads"):
        export_family(dataclasses.replace(model.cfg, global_kv_head=1))
    with pytest.raises(UserError, match="MiMo-V2-Flash routes as DeepSeek-V3"):
        export_family(dataclasses.replace(model.cfg, moe_shared_hidden=32, moe_shared_gate=False))
    with pytest.raises(UserError, match="model.attn_sinks_windowed puts the sinks on the windowed layers alone"):
        dataclasses.replace(model.cfg, attn_sinks=False).validate()
