"""Zamba (v1) beyond the shared tables (tests/test_interop.py: import, engine, export, its redline exports): the
training loss and gradients against transformers' ZambaForCausalLM (Mamba-1 heads, the shared block), the server's
DecodeBatch and the engine's scores, `redline train --init-from` an import, the options redline cannot express refused
by name at import, export and config validation, PEFT adapters refused by name."""

from __future__ import annotations


import pytest
import torch

from redline.errors import UserError
from redline.model import GPT, ModelConfig
from tests.engine_checks import assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward
from tests.test_interop import imported
from tests.test_interop_commands import check_import_refuses

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
transformers = pytest.importorskip("transformers")


def test_training_gradients_equal_transformers(tmp_path, capsys):
    """The loss on the same tokens, and the gradients of a hybrid layer's heads' x_proj and dt_proj, its in_proj (rows
    interleaved back), A_log, the shared block's q/k/v and the layer's own linear, equal transformers'."""
    hf, model, _, _ = imported("zamba", tmp_path, capsys)
    hf.train(), model.train()
    tokens = torch.randint(0, 320, (2, 13), generator=torch.Generator().manual_seed(3))
    theirs = hf(tokens, labels=tokens).loss
    ours = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    theirs.backward()
    ours.backward()
    layer, block = hf.model.layers[1], model.blocks[1]
    mixer, mamba = layer.mamba_decoder.mamba, block.mamba
    I, C = 64, 32
    close = dict(rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(mamba.x_proj.weight.grad, mixer.x_proj_weight.grad, **close)
    torch.testing.assert_close(mamba.dt_proj.weight.grad, mixer.dt_proj_weight.grad, **close)
    torch.testing.assert_close(mamba.dt_proj.bias.grad, mixer.dt_proj_bias.grad.reshape(I), **close)
    torch.testing.assert_close(mamba.A_log.grad, mixer.A_log.grad.reshape(I, -1), **close)
    torch.testing.assert_close(mamba.in_proj.weight.grad, mixer.in_proj.weight.grad.view(I, 2, C).transpose(0, 1)
                               .reshape(2 * I, C), **close)
    attn = layer.shared_transf.self_attn  # the block is shared: its gradient sums both hybrid layers' calls
    torch.testing.assert_close(model.shared_blocks[0].qkv.weight.grad,
                               torch.cat([attn.q_proj.weight.grad, attn.k_proj.weight.grad, attn.v_proj.weight.grad]),
                               **close)
    torch.testing.assert_close(block.attn.shared_in.weight.grad, layer.linear.weight.grad, **close)


def test_decode_batch_and_scores_through_the_engine(tmp_path, capsys):
    """The server's DecodeBatch (prefill in spans, prefill_many, rows freed) decodes as the model's own generate;
    the engine's teacher-forced scores equal the full forward's."""
    _, model, _, _ = imported("zamba", tmp_path, capsys)
    prompts = [list(range(3, 14)), [7, 1, 8], list(range(40, 52)), [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
    assert_decode_batch_serves_like_generate(model, prompts)
    assert_scores_equal_full_forward(model.float(), 320)


@pytest.mark.parametrize("change, fragment", [
    (dict(hidden_mamba_act="gelu"), "hidden_mamba_act='gelu'"),
    (dict(hidden_act="relu"), "hidden_act='relu'"),
    (dict(attention_hidden_size=48), "attention_hidden_size=48"),
    (dict(layers_block_type=["mamba", "attention", "mamba", "hybrid"]), "layers_block_type ['attention']"),
])
def test_import_refuses_what_redline_cannot_express(change, fragment, tmp_path, capsys):
    check_import_refuses("zamba", change, fragment, tmp_path, capsys)


_ZAMBA = dict(vocab_size=64, context_len=16, n_layer=2, n_embd=32, n_head=4, head_size=16,
              attn_scale=(16 / 2) ** -0.5, pos_emb="none", mlp="geglu", mlp_hidden=48, delta_layers=(0, 1),
              mlp_free_layers=(0, 1), delta_rule="mamba1", delta_heads=64, delta_key_heads=2, delta_key_dim=8,
              delta_value_dim=1, shared_attn_layers=(1,), tie_embeddings=True)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(attn_scale=0.0), r"scales its scores by \(head_size / 2\)"),
    (dict(pos_emb="rope"), "has no positions"),
    (dict(shared_attn_adapter_rank=4), "has no adapters"),
    (dict(delta_heads=48), "whole multiple of n_embd"),
])
def test_export_refuses_what_zamba_has_not(overrides, fragment):
    from redline.interop.families import export_family

    with pytest.raises(UserError, match=fragment):
        export_family(ModelConfig(**{**_ZAMBA, **overrides}))


@pytest.mark.parametrize("overrides, fragment", [
    (dict(shared_attn_layers=()), "model.delta_key_heads=2: Mamba-1 layers"),  # as Mamba
    (dict(shared_attn_layers=(), mlp_free_layers=(), attn_scale=0.0), "model.delta_key_heads=2: Jamba"),  # MLPs
])
def test_mamba1_heads_export_as_zamba_alone(overrides, fragment):
    from redline.interop.families import export_family

    with pytest.raises(UserError, match=fragment):
        export_family(ModelConfig(**{**_ZAMBA, "mlp": "swiglu", **overrides}))


@pytest.mark.parametrize("overrides, fragment", [
    (dict(delta_key_heads=3), "a multiple of model.delta_key_heads"),
    (dict(delta_bcdt_norm_eps=1e-6), "no dt, B and C norms with more than one"),
])
def test_config_validation_names_the_field(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        ModelConfig(**{**_ZAMBA, **overrides}).validate()


def test_mamba1_heads_scan_their_own_b_and_c():
    """Two heads whose x_proj and dt_proj are the same matrices compute one head's Mamba-1 layer (the channels alike
    in both): the heads' split changes nothing but which B and C a channel reads."""
    torch.manual_seed(0)
    one = GPT(ModelConfig(**{**_ZAMBA, "delta_key_heads": 1, "shared_attn_layers": (), "n_layer": 1,
                             "delta_layers": (0,), "mlp_free_layers": (0,)})).eval()
    two = GPT(ModelConfig(**{**_ZAMBA, "shared_attn_layers": (), "n_layer": 1, "delta_layers": (0,),
                             "mlp_free_layers": (0,)})).eval()
    state = dict(one.state_dict())
    x_proj, dt_proj = state.pop("blocks.0.attn.x_proj.weight"), state.pop("blocks.0.attn.dt_proj.weight")
    # x_proj (R + 2N, 64): both heads read 32 channels; the same (R + 2N, 32) block each, the channels duplicated
    block = x_proj[:, :32]
    state["blocks.0.attn.x_proj.weight"] = torch.stack([block, block])
    state["blocks.0.attn.dt_proj.weight"] = torch.stack([dt_proj[:32], dt_proj[:32]])
    state["blocks.0.attn.dt_proj.bias"] = torch.cat([state["blocks.0.attn.dt_proj.bias"][:32]] * 2)
    for name in ("in_proj.weight",):  # both heads' x channels the same: rows [x0; x0; z0; z0]
        w = state[f"blocks.0.attn.{name}"]
        state[f"blocks.0.attn.{name}"] = torch.cat([w[:32], w[:32], w[64:96], w[64:96]])
    for name in ("conv", "A_log", "D", "conv_bias"):
        if f"blocks.0.attn.{name}" in state:
            t = state[f"blocks.0.attn.{name}"]
            state[f"blocks.0.attn.{name}"] = torch.cat([t[:32], t[:32]])
    two.load_state_dict(state)
    single = dict(state)  # one head over the first 32 channels alone, twice: x_proj zero on the copies
    single["blocks.0.attn.x_proj.weight"] = torch.cat([block, torch.zeros_like(block)], dim=1)
    single["blocks.0.attn.dt_proj.weight"] = torch.cat([dt_proj[:32], dt_proj[:32]])
    one.load_state_dict(single)
    tokens = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(two(tokens), one(tokens), rtol=1e-5, atol=1e-5)


def test_peft_adapter_is_refused_by_name(tmp_path, capsys):
    from redline.interop.peft_adapter import _parts
    from redline.interop.families import _families

    cfg = ModelConfig(**_ZAMBA)
    with pytest.raises(UserError, match="no counterpart in Zamba"):
        _parts("blocks.0.attn.in_proj", 128, cfg, _families()["zamba"])


def test_train_init_from_resumes_and_exports(tmp_path, capsys):
    """`redline train --init-from` an imported Zamba: the first step's loss is transformers', --resume goes on, and
    the trained run exports back with its logits (the check tests/test_interop_commands.py runs on a Llama)."""
    from tests.test_interop_commands import check_train_init_from

    check_train_init_from("zamba", tmp_path, capsys)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = ModelConfig(**{**_ZAMBA, "vocab_size": 512, "context_len": 128, "n_layer": 3, "delta_layers": (0, 1, 2),
                         "mlp_free_layers": (0, 1, 2), "shared_attn_layers": (1, 2)})
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[1].mamba.x_proj.weight)
