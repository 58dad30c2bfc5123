"""A.X-K2 beyond the shared tables (tests/test_interop.py: import, engine, export, its redline exports, GGUF refused;
tests/test_lora_export.py: PEFT): the training gradients of the gated norms and the query gate against transformers'
AXK2ForCausalLM, the context stopping at index_topk, the server's DecodeBatch and the engine's scores (the query
gate on the absorbed heads), `redline train --init-from` an import, the options redline cannot express refused by
name at import, export and config validation."""

from __future__ import annotations

import json

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
    """The loss and the gradients of both gated norms' gates, the query gate's projection (its gate rows: not
    rotated) and the experts' router equal transformers'."""
    hf, model, _, _ = imported("axk2", tmp_path, capsys)
    hf.train(), model.train()
    tokens = torch.randint(0, 320, (2, 13), generator=torch.Generator().manual_seed(3))
    theirs = hf(tokens, labels=tokens).loss
    ours = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    theirs.backward()
    ours.backward()
    layer, block = hf.model.layers[1], model.blocks[1]
    close = dict(rtol=1e-4, atol=1e-6)
    for norm, gated in ((block.norm1, layer.input_layernorm), (block.norm2, layer.post_attention_layernorm)):
        torch.testing.assert_close(norm.gate_down.weight.grad, gated.mlp.fc1.weight.grad, **close)
        torch.testing.assert_close(norm.gate_up.weight.grad, gated.mlp.fc2.weight.grad, **close)
        torch.testing.assert_close(norm.weight.grad, gated.norm.weight.grad, **close)
    D, H = 24, 4
    ours_gate = block.attn.q_b.weight.grad.view(H, D + 12, -1)[:, D:]
    theirs_gate = layer.self_attn.q_gate_proj.weight.grad.view(H, D + 12, -1)[:, D:]
    torch.testing.assert_close(ours_gate, theirs_gate, **close)
    torch.testing.assert_close(block.mlp.router.weight.grad, layer.mlp.gate.weight.grad, **close)
    assert isinstance(model.blocks[0].norm2, torch.nn.RMSNorm) and not hasattr(model.blocks[0].norm2, "gate_up")


def test_context_stops_at_index_topk_and_the_indexer_is_left_out(tmp_path, capsys):
    hf_folder("axk2", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "index_topk": 32}))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    assert "indexer (10 tensors) is left out" in err and "index_topk = 32" in err
    from redline.training.checkpoint import load_for_inference

    model, _, _ = load_for_inference(tmp_path / "ckpt")
    assert model.cfg.context_len == 32 and model.cfg.q_latent_gate and model.cfg.norm_gate_rank == 8


def test_decode_batch_and_scores_through_the_engine(tmp_path, capsys):
    """The server's DecodeBatch (prefill in spans, prefill_many, rows freed) decodes as the model's own generate;
    the engine's teacher-forced scores equal the full forward's (the query gate on the absorbed heads)."""
    _, model, _, _ = imported("axk2", tmp_path, capsys)
    prompts = [list(range(3, 14)), [7, 1, 8], list(range(40, 52)), [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
    assert_decode_batch_serves_like_generate(model, prompts)
    assert_scores_equal_full_forward(model.float(), 320)


@pytest.mark.parametrize("change, fragment", [
    (dict(n_group=2, topk_group=1), "n_group=2 on axk2"),
    (dict(q_lora_rank=None), "q_lora_rank=null on axk2"),
    (dict(mlp_layer_types=["sparse", "dense"]), "mlp_layer_types=['sparse', 'dense']"),
    (dict(attention_bias=True), "attention_bias=true"),
])
def test_import_refuses_what_redline_cannot_express(change, fragment, tmp_path, capsys):
    check_import_refuses("axk2", change, fragment, tmp_path, capsys)


_GATED = dict(vocab_size=64, context_len=16, n_layer=2, n_embd=32, n_head=4, kv_lora_rank=16, q_lora_rank=16,
              head_size=24, rope_dims=8, v_head_dim=16, fused_qkv=False, moe_experts=4, moe_top_k=2, mlp_hidden=16,
              moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20, moe_shared_hidden=16,
              moe_shared_gate=False, moe_dense_layers=1, moe_dense_hidden=32, q_latent_gate=True, norm_gate_rank=4)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(norm_gate_rank=0), "A.X-K2 alone has them"),
    (dict(q_latent_gate=False), "A.X-K2 alone has them"),
    (dict(moe_post_norm=True), "model.moe_post_norm with A.X-K2's gates"),
    (dict(moe_groups=2, moe_topk_groups=1), "model.moe_groups=2 with A.X-K2's gates"),
    (dict(moe_layers=(0, 1), moe_dense_layers=0, moe_dense_hidden=None, moe_shortcut=True, moe_gating="softmax",
          moe_shared_hidden=0), "are LongCat-Flash's: A.X-K2 has neither"),
])
def test_export_refuses_what_axk2_has_not(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        export_family(ModelConfig(**{**_GATED, **overrides}))


@pytest.mark.parametrize("overrides, fragment", [
    (dict(norm_gate_rank=-1), "norm_gate_rank=-1"),
    (dict(norm="layernorm"), "plain RMSNorms"),
    (dict(norm_position="sandwich"), "pre-norm blocks"),
    (dict(q_lora_rank=0), "model.q_latent_gate gates latent attention"),
    (dict(attn_gate="head"), "model.q_latent_gate gates latent attention"),
])
def test_config_validation_names_the_field(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        ModelConfig(**{**_GATED, **overrides}).validate()


def test_train_init_from_resumes_and_exports(tmp_path, capsys):
    """`redline train --init-from` an imported A.X-K2: the first step's loss is transformers', --resume goes on, and
    the trained run exports back with its logits (the check tests/test_interop_commands.py runs on a Llama)."""
    from tests.test_interop_commands import check_train_init_from

    check_train_init_from("axk2", tmp_path, capsys)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones, the gated norms' gate included."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = ModelConfig(**{**_GATED, "vocab_size": 512, "context_len": 128, "n_embd": 128, "n_head": 8,
                         "moe_experts": 8, "mlp_hidden": 64, "moe_shared_hidden": 64, "moe_dense_hidden": 96})
    model = GPT(cfg).cuda()
    with torch.no_grad():  # the gates away from their init so that they gate
        for block in model.blocks:
            block.norm1.gate_up.weight.normal_(0, 0.5)
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[1].norm1.gate_down.weight)
