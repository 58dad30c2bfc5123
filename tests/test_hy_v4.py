"""HY-V4 beyond the shared tables (tests/test_interop.py: import logits and greedy tokens through the engine against
HYV4ForCausalLM, its Hub tensor names as save_pretrained writes them, the export refused in one line): its folders
under transformers' module names, the training gradients of the independent hyper-connections, the value gates, the
sinks and the router against transformers', the routed experts' clamp doing its part, the context stopping at
index_topk, the server's DecodeBatch and the engine's scores (sinks and value gates on the absorbed latent heads),
`redline train --init-from` an import, the options redline cannot express refused by name at import and config
validation; the GPU's compiled engine and training step (skipped without CUDA)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.interop.families import export_family
from redline.model import GPT, ModelConfig
from tests.engine_checks import assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward
from tests.interop_models import hf_folder
from tests.test_interop import imported, run_cli
from tests.test_interop_commands import check_import_refuses

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
transformers = pytest.importorskip("transformers")


def test_training_gradients_equal_transformers(tmp_path, capsys):
    """The loss and the gradients of both layers' hyper-connections, the head's, the value gates, the sinks and the
    experts' router equal transformers'."""
    hf, model, _, _ = imported("hy_v4", tmp_path, capsys)
    hf.train(), model.train()
    tokens = torch.randint(0, 320, (2, 13), generator=torch.Generator().manual_seed(3))
    theirs = hf(tokens, labels=tokens).loss
    ours = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    theirs.backward()
    ours.backward()
    close = dict(rtol=1e-4, atol=1e-6)
    for i, (layer, block) in enumerate(zip(hf.model.layers, model.blocks)):
        for ours_hc, theirs_hc in ((block.attn_mhc, layer.attn_hc), (block.mlp_mhc, layer.ffn_hc)):
            for name in ("fn", "base", "scale"):
                torch.testing.assert_close(getattr(ours_hc, name).grad, getattr(theirs_hc, name).grad, **close)
        torch.testing.assert_close(block.attn.gate.weight.grad, layer.self_attn.gate_proj.weight.grad, **close)
        torch.testing.assert_close(block.attn.sinks.grad, layer.self_attn.sinks.grad, **close)
    torch.testing.assert_close(model.blocks[1].mlp.router.weight.grad, hf.model.layers[1].mlp.gate.weight.grad,
                               **close)
    torch.testing.assert_close(model.mhc_head.fn.grad, hf.model.hc_head.hc_fn.grad, **close)


def test_the_routed_experts_clamp_and_the_context_stops_at_index_topk(tmp_path, capsys):
    """The test model's clamp (0.3) changes its logits (so the parity test holds it); the import's context stops at
    index_topk, the indexer left out in one line."""
    hf_folder("hy_v4", tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    assert "indexer (10 tensors) is left out" in err and "index_topk = 32" in err
    from redline.training.checkpoint import load_for_inference

    model = load_for_inference(tmp_path / "ckpt")[0]
    cfg = model.cfg
    assert (cfg.context_len, cfg.mhc_streams, cfg.mhc_sinkhorn_iters, cfg.mhc_post_scale, cfg.moe_swiglu_limit,
            cfg.attn_gate, cfg.attn_sinks) == (32, 3, 0, 1.5, 0.3, "element", True)
    unclamped = GPT(replace(cfg, moe_swiglu_limit=0.0)).eval()
    unclamped.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 320, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert not torch.allclose(unclamped(tokens), model(tokens), atol=1e-4)


def test_decode_batch_and_scores_through_the_engine(tmp_path, capsys):
    """The server's DecodeBatch (prefill in spans, prefill_many, rows freed) decodes as the model's own generate;
    the engine's teacher-forced scores equal the full forward's (the sinks and value gates on the absorbed heads).
    The import's weights at a context of 64 (the checks' cache capacity: redline against itself)."""
    _, imported_model, _, _ = imported("hy_v4", tmp_path, capsys)
    model = GPT(replace(imported_model.cfg, context_len=64)).eval()
    model.load_state_dict(imported_model.state_dict())
    prompts = [list(range(3, 14)), [7, 1, 8], list(range(40, 52)), [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
    assert_decode_batch_serves_like_generate(model, prompts)
    assert_scores_equal_full_forward(model, 320)


def test_transformers_module_names_read_as_the_hub_names(tmp_path, capsys):
    """A folder under transformers' module names (attn_hc.fn, sinks, gate_proj, hc_head.hc_fn) imports to the same
    model as the Hub-named one save_pretrained writes (hc_pre.hc_attn_layer.hc_fn, learnable_sink_param,
    linear_gate)."""
    from safetensors.torch import load_file, save_file

    from redline.training.checkpoint import load_for_inference

    hf, model, _, _ = imported("hy_v4", tmp_path, capsys)
    assert "model.layers.0.self_attn.learnable_sink_param" in load_file(str(tmp_path / "hf" / "model.safetensors"))
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(tmp_path / "hf" / "model.safetensors"),
              metadata={"format": "pt"})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt2"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    again = load_for_inference(tmp_path / "ckpt2")[0]
    assert again.cfg == model.cfg
    for name, t in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], t, rtol=0, atol=0)


@pytest.mark.parametrize("change, fragment", [
    (dict(hc_mult=0), "hc_mult=0 on hy_v4"),
    (dict(hc_magnitude=0.0), "hc_magnitude=0.0 on hy_v4"),
    (dict(index_topk=0), "index_topk=0 on hy_v4"),
    (dict(mlp_layer_types=["sparse", "dense"]), "mlp_layer_types=['sparse', 'dense']"),
    (dict(attention_bias=True), "attention_bias=true"),
])
def test_import_refuses_what_redline_cannot_express(change, fragment, tmp_path, capsys):
    check_import_refuses("hy_v4", change, fragment, tmp_path, capsys)


_HY = dict(vocab_size=64, context_len=16, n_layer=2, n_embd=32, n_head=4, kv_lora_rank=16, q_lora_rank=16,
           head_size=24, rope_dims=8, v_head_dim=16, fused_qkv=False, moe_experts=4, moe_top_k=2, mlp_hidden=16,
           moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20, moe_shared_hidden=16,
           moe_shared_gate=False, moe_dense_layers=1, moe_dense_hidden=32, mhc_streams=3, mhc_sinkhorn_iters=0,
           mhc_post_scale=1.5, attn_gate="element", attn_sinks=True, moe_swiglu_limit=0.5)


@pytest.mark.parametrize("overrides, fragment", [
    ({}, "model.attn_gate=element and attn_sinks on latent attention are HY-V4's"),
    (dict(attn_gate="none"), "model.attn_gate=element and attn_sinks on latent attention are HY-V4's"),
    (dict(attn_gate="none", attn_sinks=False), "HY-V4's iHC, read import only"),
])
def test_export_refuses_hy_v4s_options_by_name(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        export_family(ModelConfig(**{**_HY, **overrides}))


@pytest.mark.parametrize("overrides, fragment", [
    (dict(mhc_sinkhorn_iters=-1), "mhc_sinkhorn_iters >= 0"),
    (dict(mhc_post_scale=0.0), "mhc_post_scale > 0"),
    (dict(moe_swiglu_limit=-1.0), "model.moe_swiglu_limit=-1.0 clamps the routed experts' SwiGLU"),
    (dict(mlp="geglu"), "model.moe_swiglu_limit=0.5 clamps the routed experts' SwiGLU"),
    (dict(attn_gate="routed", attn_experts=2), "routed or softplus attn_gate"),
])
def test_config_validation_names_the_field(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        ModelConfig(**{**_HY, **overrides}).validate()


@pytest.mark.slow  # `redline train` end to end: the engine and gradient tests above run always
def test_train_init_from_starts_at_the_imported_models_loss(tmp_path, capsys):
    """`redline train --init-from` an imported HY-V4 (its hyper-connections, gates and sinks trained as they
    compute)."""
    from tests.test_mistral_large4 import check_train_starts_at_import

    _, model, _, ckpt = imported("hy_v4", tmp_path, capsys)
    check_train_starts_at_import(ckpt, model, tmp_path, capsys)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones, the hyper-connections' projection included."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = ModelConfig(**{**_HY, "vocab_size": 512, "context_len": 128, "n_embd": 128, "n_head": 8,
                         "moe_experts": 8, "mlp_hidden": 64, "moe_shared_hidden": 64, "moe_dense_hidden": 96})
    model = GPT(cfg).cuda()
    with torch.no_grad():  # the sinks away from their init so that they take part
        for block in model.blocks:
            block.attn.sinks.normal_(0, 0.5)
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[1].attn_mhc.fn)
