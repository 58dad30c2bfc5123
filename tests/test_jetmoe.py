"""JetMoE beyond the shared tables (tests/test_interop.py: import, engine, export, its redline exports; tests/
test_lora_export.py: PEFT): the routed attention heads' training gradients against transformers' JetMoeForCausalLM,
the server's DecodeBatch and the engine's scores, `redline train --init-from` an import, the options redline cannot
express refused by name at import, export and config validation."""

from __future__ import annotations


import pytest
import torch

from redline.errors import UserError
from redline.interop.jetmoe import _outputs_to_redline, _queries_to_redline
from redline.model import GPT, ModelConfig
from tests.engine_checks import assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward
from tests.test_interop import imported
from tests.test_interop_commands import check_import_refuses

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
transformers = pytest.importorskip("transformers")


def test_training_gradients_equal_transformers(tmp_path, capsys):
    """The loss on the same tokens and the gradients of both routers, the experts' queries and output projections
    and kv_proj equal transformers' (the unchosen experts' heads, zeroed, take no gradient as in the sparse form)."""
    hf, model, _, _ = imported("jetmoe", tmp_path, capsys)
    hf.train(), model.train()
    tokens = torch.randint(0, 320, (2, 13), generator=torch.Generator().manual_seed(3))
    theirs = hf(tokens, labels=tokens).loss
    ours = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    theirs.backward()
    ours.backward()
    layer, block, kv = hf.model.layers[1], model.blocks[1], 2
    moa = layer.self_attention.experts
    q_rows = 4 * kv * 16
    torch.testing.assert_close(block.attn.gate.weight.grad, moa.router.layer.weight.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(block.attn.qkv.weight.grad[:q_rows], _queries_to_redline(moa.input_linear.weight.grad,
                                                                                        kv), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(block.attn.qkv.weight.grad[q_rows:], layer.self_attention.kv_proj.weight.grad,
                               rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(block.attn.proj.weight.grad, _outputs_to_redline(moa.output_linear.weight.grad, kv),
                               rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(block.mlp.router.weight.grad, layer.mlp.router.layer.weight.grad, rtol=1e-4,
                               atol=1e-6)
    torch.testing.assert_close(block.mlp.out_bias.grad, layer.mlp.bias.grad, rtol=1e-4, atol=1e-6)


def test_decode_batch_and_scores_through_the_engine(tmp_path, capsys):
    """The server's DecodeBatch (prefill in spans, prefill_many, rows freed) decodes as the model's own generate;
    the engine's teacher-forced scores equal the full forward's."""
    _, model, _, _ = imported("jetmoe", tmp_path, capsys)
    prompts = [list(range(3, 14)), [7, 1, 8], list(range(40, 52)), [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
    assert_decode_batch_serves_like_generate(model, prompts)
    assert_scores_equal_full_forward(model.float(), 320)


def test_routed_heads_zero_the_unchosen_experts():
    """Each token's output is what its chosen experts' heads give: changing an unchosen expert's query rows changes
    nothing, a chosen one's changes it."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, context_len=16, n_layer=1, n_embd=32, n_head=4, n_kv_head=1, head_size=8,
                      attn_gate="routed", attn_experts=4, moe_top_k=1)
    model = GPT(cfg).eval()
    attn = model.blocks[0].attn
    x = torch.randn(1, 3, 32)  # three tokens, top 1 of 4: some expert is nobody's
    choices = attn.gate(x).argmax(-1)[0].tolist()
    chosen, other = choices[-1], min(set(range(4)) - set(choices))
    with torch.no_grad():
        before = attn(x, None)
        attn.qkv.weight[other * 8:(other + 1) * 8] += 1.0  # KV head 0, expert `other`'s query rows
        torch.testing.assert_close(attn(x, None), before)
        attn.qkv.weight[chosen * 8:(chosen + 1) * 8] += 1.0
        assert not torch.allclose(attn(x, None), before)


@pytest.mark.parametrize("change, fragment", [
    (dict(activation_function="gelu"), "activation_function='gelu'"),
    (dict(output_router_logits=True), "output_router_logits=true"),
    (dict(rms_norm_eps=1e-5), "rms_norm_eps=1e-05"),
])
def test_import_refuses_what_redline_cannot_express(change, fragment, tmp_path, capsys):
    check_import_refuses("jetmoe", change, fragment, tmp_path, capsys)


_ROUTED = dict(vocab_size=64, context_len=16, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, attn_gate="routed",
               attn_experts=2, norm_eps=1e-6, moe_experts=2, moe_top_k=1, mlp_hidden=16)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(norm_eps=1e-5), "keeps its block norms' eps at 1e-6"),
    (dict(moe_experts=0), "as many experts in its MLP as in its attention"),
    (dict(qk_norm=True), "model.qk_norm with routed attention heads"),
    (dict(qkv_bias=True), "no biases on q, k or v"),
    (dict(sliding_window=4), "model.sliding_window with routed attention heads"),
])
def test_export_refuses_what_jetmoe_has_not(overrides, fragment):
    from redline.interop.families import export_family

    with pytest.raises(UserError, match=fragment):
        export_family(ModelConfig(**{**_ROUTED, **overrides}))


def test_moe_out_bias_without_routed_heads_is_refused_at_export():
    """No other architecture has the bias on the experts' sum: a Mixtral-shaped model with it is refused by name, not
    written without it."""
    from redline.interop.families import export_family

    cfg = ModelConfig(**{**_ROUTED, "attn_gate": "none", "attn_experts": 0, "moe_out_bias": True})
    with pytest.raises(UserError, match="model.moe_out_bias: of the architectures redline exports to, JetMoE alone"):
        export_family(cfg)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(attn_experts=0), "go together"),
    (dict(attn_gate="none"), "go together"),
    (dict(n_head=6, head_size=8), "n_head = attn_experts"),
    (dict(moe_experts=0, moe_top_k=3), "moe_top_k <= attn_experts"),
    (dict(moe_experts=0, moe_out_bias=True), "moe_out_bias"),
    (dict(attn_gate_fn="softplus"), "attn_gate_fn=softplus"),
])
def test_config_validation_names_the_field(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        ModelConfig(**{**_ROUTED, **overrides}).validate()


def test_train_init_from_resumes_and_exports(tmp_path, capsys):
    """`redline train --init-from` an imported JetMoE: the first step's loss is transformers', --resume goes on, and
    the trained run exports back with its logits (the check tests/test_interop_commands.py runs on a Llama)."""
    from tests.test_interop_commands import check_train_init_from

    check_train_init_from("jetmoe", tmp_path, capsys)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=512, context_len=128, n_embd=128, n_layer=2, n_head=8, n_kv_head=2, head_size=32,
                      attn_gate="routed", attn_experts=4, bias=True, qkv_bias=False, norm_bias=False, norm_eps=1e-6,
                      moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_out_bias=True)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[0].attn.gate.weight)
