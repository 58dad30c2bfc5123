"""LongCat-Flash beyond the shared tables (tests/test_interop.py: import, engine, export, its redline exports, GGUF
refused; tests/test_lora_export.py: PEFT): the training gradients against transformers' LongcatFlashForCausalLM,
identity experts chosen and returning their input, the server's DecodeBatch and the engine's scores, an exported
folder (stacked experts) read back, `redline train --init-from` an import, the options redline cannot express refused
by name at import, export and config validation."""

from __future__ import annotations


import pytest
import torch

from redline.errors import UserError
from redline.interop.families import export_family
from redline.model import GPT, ModelConfig
from tests.engine_checks import assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward
from tests.test_interop import TOKENS, imported, run_cli
from tests.test_interop_commands import check_import_refuses

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
transformers = pytest.importorskip("transformers")


def test_training_gradients_equal_transformers(tmp_path, capsys):
    """The loss and the gradients of the router, the experts, both dense MLPs of a layer and the attention's
    projections equal transformers' (the shortcut output joins after the second pair, the identity experts pass
    their input's gradient back)."""
    hf, model, _, _ = imported("longcat_flash", tmp_path, capsys)
    hf.train(), model.train()
    tokens = torch.randint(0, 320, (2, 13), generator=torch.Generator().manual_seed(3))
    theirs = hf(tokens, labels=tokens).loss
    ours = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    theirs.backward()
    ours.backward()
    layer, E = hf.model.layers[1], 4
    even, odd = model.blocks[2], model.blocks[3]
    close = dict(rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(even.moe.router.weight.grad, layer.mlp.router.classifier.weight.grad, **close)
    torch.testing.assert_close(even.moe.fc.grad, layer.mlp.experts.gate_up_proj.grad[:E], **close)
    torch.testing.assert_close(even.moe.proj.grad, layer.mlp.experts.down_proj.grad, **close)
    for block, mlp in ((even, layer.mlps[0]), (odd, layer.mlps[1])):
        torch.testing.assert_close(block.mlp.fc.weight.grad, torch.cat([mlp.gate_proj.weight.grad,
                                                                        mlp.up_proj.weight.grad]), **close)
        torch.testing.assert_close(block.mlp.proj.weight.grad, mlp.down_proj.weight.grad, **close)
    torch.testing.assert_close(odd.attn.proj.weight.grad, layer.self_attn[1].o_proj.weight.grad, **close)
    torch.testing.assert_close(odd.attn.kv_b.weight.grad, layer.self_attn[1].kv_b_proj.weight.grad, **close)


def test_identity_experts_are_chosen_and_return_their_input(tmp_path, capsys):
    """The test model's tokens choose identity experts (so the parity tests cover them); a mixture whose router
    always picks identity experts returns sum(weights) · x."""
    _, model, _, _ = imported("longcat_flash", tmp_path, capsys)
    moe = model.blocks[0].moe
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        choice = torch.softmax(moe.router(x), dim=-1) + moe.expert_bias
        assert (choice.topk(3, dim=-1).indices >= 4).any()
        moe.router.weight.zero_()
        moe.expert_bias.copy_(torch.tensor([0.0] * 4 + [1.0] * 3))  # the 3 identity experts win every choice
        weights = torch.full((40, 1), 3 / 7 * 2.0)  # uniform scores over 7 experts, times routed_scaling_factor
        torch.testing.assert_close(moe(x), x * weights)


def test_decode_batch_and_scores_through_the_engine(tmp_path, capsys):
    """The server's DecodeBatch (prefill in spans, prefill_many, rows freed) decodes as the model's own generate;
    the engine's teacher-forced scores equal the full forward's."""
    _, model, _, _ = imported("longcat_flash", tmp_path, capsys)
    prompts = [list(range(3, 14)), [7, 1, 8], list(range(40, 52)), [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
    assert_decode_batch_serves_like_generate(model, prompts)
    assert_scores_equal_full_forward(model.float(), 320)


def test_exported_folder_reads_back(tmp_path, capsys):
    """The export writes the experts stacked (gate_up_proj with zero rows for the identity experts) and the norms
    unscaled; importing that folder gives the same model."""
    from redline.training.checkpoint import load_for_inference

    hf, model, _, ckpt = imported("longcat_flash", tmp_path, capsys)
    code, _, err = run_cli(["export", str(ckpt), "--out", str(tmp_path / "exported")], capsys)
    assert code == 0, err
    from safetensors import safe_open

    with safe_open(str(tmp_path / "exported" / "model.safetensors"), framework="pt") as f:
        stacked = f.get_tensor("model.layers.0.mlp.experts.gate_up_proj")
        norm = f.get_tensor("model.layers.0.self_attn.0.q_a_layernorm.weight")
    assert stacked.shape[0] == 7 and not stacked[4:].any()
    torch.testing.assert_close(norm, hf.model.layers[0].self_attn[0].q_a_layernorm.weight.detach())
    code, _, err = run_cli(["import", str(tmp_path / "exported"), "--out", str(tmp_path / "again")], capsys)
    assert code == 0, err
    again, _, _ = load_for_inference(tmp_path / "again")
    with torch.no_grad():
        torch.testing.assert_close(again(TOKENS), model(TOKENS), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("change, fragment", [
    (dict(router_bias=True), "router_bias=true on longcat_flash"),
    (dict(head_dim=16), "head_dim=16 with qk_rope_head_dim=8 on longcat_flash"),
    (dict(qk_head_dim=20), "qk_head_dim=20 on longcat_flash"),
    (dict(q_lora_rank=None), "q_lora_rank=null on longcat_flash"),
    (dict(attention_bias=True), "attention_bias=true"),
])
def test_import_refuses_what_redline_cannot_express(change, fragment, tmp_path, capsys):
    check_import_refuses("longcat_flash", change, fragment, tmp_path, capsys)


_SHORTCUT = dict(vocab_size=64, context_len=16, n_layer=2, n_embd=32, n_head=4, kv_lora_rank=16, q_lora_rank=16,
                 head_size=24, rope_dims=8, v_head_dim=16, fused_qkv=False, moe_experts=4, moe_identity_experts=2,
                 moe_top_k=3, mlp_hidden=16, moe_expert_bias=True, moe_norm_topk=False, moe_shortcut=True,
                 moe_dense_hidden=24)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(moe_shortcut=False), "LongCat-Flash alone has them"),  # identity experts alone
    (dict(kv_lora_rank=0, q_lora_rank=0, head_size=0, rope_dims=0, v_head_dim=0), "LongCat-Flash alone has them"),
    (dict(moe_norm_topk=True), "LongCat-Flash's router"),
    (dict(moe_gating="sigmoid"), "LongCat-Flash's router"),
    (dict(moe_shared_hidden=16), "LongCat-Flash's router"),
    (dict(moe_dense_hidden=None), "model.moe_dense_hidden"),
    (dict(moe_groups=2, moe_topk_groups=2, moe_identity_experts=0), "LongCat-Flash's router"),
    (dict(norm_gate_rank=4), "are LongCat-Flash's: A.X-K2 has neither"),  # export_family asks A.X-K2's first
])
def test_export_refuses_what_longcat_has_not(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        export_family(ModelConfig(**{**_SHORTCUT, **overrides}))


def test_shortcut_without_identity_experts_exports_as_longcat():
    assert export_family(ModelConfig(**{**_SHORTCUT, "moe_identity_experts": 0})).name == "longcat_flash"


@pytest.mark.parametrize("overrides, fragment", [
    (dict(n_layer=3), "an even n_layer"),
    (dict(moe_experts=0, moe_identity_experts=0, moe_expert_bias=False, moe_dense_hidden=None), "takes experts"),
    (dict(moe_dense_layers=1), "without model.moe_dense_layers"),
    (dict(norm_position="sandwich"), "norm_position 'sandwich'"),
    (dict(moe_identity_experts=-1), "moe_identity_experts must be >= 0"),
    (dict(moe_groups=2, moe_topk_groups=2), "moe_identity_experts .LongCat-Flash's zero-computation experts."),
    (dict(moe_aux_loss=0.01), "moe_identity_experts .LongCat-Flash's zero-computation experts."),
])
def test_config_validation_names_the_field(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        ModelConfig(**{**_SHORTCUT, **overrides}).validate()


def test_train_init_from_resumes_and_exports(tmp_path, capsys):
    """`redline train --init-from` an imported LongCat-Flash: the first step's loss is transformers', --resume goes
    on, and the trained run exports back with its logits (the check tests/test_interop_commands.py runs on a
    Llama)."""
    from tests.test_interop_commands import check_train_init_from

    check_train_init_from("longcat_flash", tmp_path, capsys)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones, the shortcut experts' router included."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = ModelConfig(**{**_SHORTCUT, "vocab_size": 512, "context_len": 128, "n_embd": 128, "n_layer": 4,
                         "n_head": 8, "moe_experts": 8, "moe_identity_experts": 4, "mlp_hidden": 64,
                         "moe_dense_hidden": 96})
    model = GPT(cfg).cuda()
    with torch.no_grad():
        for block in model.blocks[::2]:
            block.moe.expert_bias.normal_(0, 0.05)
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[0].moe.router.weight)
