"""Dory beyond the shared tables (tests/test_interop.py: import, engine, export, GGUF refusal, its redline exports;
tests/test_lora_export.py: PEFT): nGPT layers and the looped section's training gradients against transformers'
DoryForCausalLM, a released checkpoint's layout (layer pairs, backbone. names), the server's DecodeBatch and the
engine's scores, `redline train --init-from` an import, the options redline cannot express refused by name at import,
export and config validation."""

from __future__ import annotations

import json

import pytest
import torch

from redline.errors import UserError
from redline.interop.dory import canonical
from redline.model import GPT, LoopPass, ModelConfig
from tests.engine_checks import assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward
from tests.interop_models import hf_folder
from tests.test_interop import TOKENS, imported, run_cli
from tests.test_train import dataset  # noqa: F401  (the session-scoped prepared corpus)
from tests.test_interop_commands import check_import_refuses

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
transformers = pytest.importorskip("transformers")

_NGPT = dict(vocab_size=64, context_len=32, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, ngpt=True, norm="l2",
             norm_eps=1e-6, norm_position="sandwich", qk_norm=True, attn_gate="element", mlp="swiglu")


def test_training_gradients_equal_transformers(tmp_path, capsys):
    """The loss and the gradients of a looped layer's weights (summed over its three passes), its query scales and
    rates (by the constant factors between Dory's stored scales and redline's) equal transformers'."""
    hf, model, _, _ = imported("dory", tmp_path, capsys)
    hf.train(), model.train()
    tokens = torch.randint(0, 320, (2, 13), generator=torch.Generator().manual_seed(3))
    theirs = hf(tokens, labels=tokens).loss
    ours = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    theirs.backward()
    ours.backward()
    init, alpha = hf.config.initializer_range, hf.config.ngpt_alpha_init
    for j, i in ((0, 0), (1, 1), (3, 7)):  # the input layer, a looped one, the output layer (block 7 of 8)
        layer, block = hf.model.layers[j], model.blocks[i]
        assert not isinstance(block, LoopPass)
        torch.testing.assert_close(block.attn.proj.weight.grad, layer.self_attn.o_proj.weight.grad, rtol=1e-4,
                                   atol=1e-6)
        torch.testing.assert_close(block.mlp.proj.weight.grad, layer.mlp.down_proj.weight.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(block.attn.q_scale.grad * (16 ** 0.5 / init), layer.self_attn.sqk.grad,
                                   rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(block.attn_rate.grad * (alpha / init), layer.lambda_1.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(block.mlp_rate.grad * (alpha / init), layer.lambda_2.grad, rtol=1e-4, atol=1e-6)
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


def test_looped_passes_share_their_blocks_weights(tmp_path, capsys):
    """The looped section's later passes run the first pass's blocks (LoopPass): no weights of their own, none in
    the state dict, one parameter count; the engine still caches each pass apart (its tokens above)."""
    _, model, _, _ = imported("dory", tmp_path, capsys)
    cfg = model.cfg
    assert cfg.n_layer == 8 and cfg.loop_section == (1, 2) and cfg.loop_passes == 3
    passes = [i for i, b in enumerate(model.blocks) if isinstance(b, LoopPass)]
    assert passes == [3, 4, 5, 6] and model.blocks[3].block is model.blocks[1]
    assert {k.split(".")[1] for k in model.state_dict() if k.startswith("blocks.")} == {"0", "1", "2", "7"}
    assert model.blocks[5].window == model.blocks[1].window == 5 and model.blocks[6].window == 0


def test_released_checkpoint_layout_reads_alike(tmp_path, capsys):
    """A released checkpoint's names (backbone.layers.2i.mixer.* the attention, 2i + 1 the MLP, g_proj, attn_alpha
    and mlp_alpha, backbone.embeddings) and its doubled config (each layer listed as attention then "mlp") give the
    logits of transformers' own layout."""
    from safetensors.torch import load_file, save_file

    hf = hf_folder("dory", tmp_path / "hf")
    state = load_file(tmp_path / "hf" / "model.safetensors")
    renamed = {}
    for name, t in state.items():
        parts = name.split(".")
        if parts[:2] == ["backbone", "layers"]:
            j, rest = int(parts[2]), parts[3:]
            if rest[0] in ("lambda_1", "lambda_2"):
                index, rest = 2 * j + (rest[0] == "lambda_2"), ["attn_alpha" if rest[0] == "lambda_1" else "mlp_alpha"]
            else:
                index, rest = 2 * j + (rest[0] == "mlp"), ["mixer", *rest[1:]]
            name = ".".join(["backbone", "layers", str(index), *rest])
        renamed[name] = t
    assert canonical("backbone.layers.3.mixer.up_proj.weight") == "model.layers.1.mlp.up_proj.weight"
    assert canonical("backbone.layers.2.mixer.g_proj.weight") == "model.layers.1.self_attn.gate_proj.weight"
    save_file(renamed, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "mlp" in config["layer_types"]  # transformers writes the doubled layout itself
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    from redline.training.checkpoint import load_for_inference

    model, _, _ = load_for_inference(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_decode_batch_and_scores_through_the_engine(tmp_path, capsys):
    """The server's DecodeBatch (prefill in spans of 5, prefill_many, rows freed) decodes as the model's own
    generate, each looped pass with its own cache; the engine's teacher-forced scores equal the full forward's."""
    _, model, _, _ = imported("dory", tmp_path, capsys)
    prompts = [list(range(3, 14)), [7, 1, 8], list(range(40, 52)), [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
    assert_decode_batch_serves_like_generate(model, prompts)
    assert_scores_equal_full_forward(model.float(), 320)


@pytest.mark.parametrize("change, fragment", [
    (dict(recurrent_kv_cache_mode="last_loop"), "recurrent_kv_cache_mode=last_loop"),
    (dict(hidden_act="gelu"), "hidden_act=gelu"),
    (dict(attention_bias=True), "attention_bias=True"),
    (dict(n_recurrent_loops=0), "n_recurrent_loops=0"),
])
def test_import_refuses_what_redline_cannot_express(change, fragment, tmp_path, capsys):
    check_import_refuses("dory", change, fragment, tmp_path, capsys)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(norm_eps=1e-5), "normalizes with eps 1e-06"),
    (dict(attn_gate="none"), "model.attn_gate=element"),
    (dict(rope_dims=4), "whole heads"),
])
def test_export_refuses_what_dory_has_not(overrides, fragment):
    from redline.interop.families import export_family

    with pytest.raises(UserError, match=fragment):
        export_family(ModelConfig(**{**_NGPT, **overrides}))


@pytest.mark.parametrize("overrides, fragment", [
    (dict(ngpt=False), "model.norm=l2 .* is nGPT's"),
    (dict(norm_position="pre"), "model.ngpt keeps the stream on the unit sphere"),
    (dict(mlp="gelu"), "model.ngpt keeps the stream on the unit sphere"),
    (dict(loop_section=(1,)), "model.loop_section is \\(first, count\\)"),
    (dict(loop_section=(1, 1), loop_passes=2), "does not fit in model.n_layer=2"),
    (dict(n_layer=4, loop_section=(0, 2), loop_passes=2, sliding_window=4, window_layers=(0,)),
     "repeats layer 0 .* with another window"),
])
def test_config_validation_names_the_field(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        ModelConfig(**{**_NGPT, **overrides}).validate()


def test_ngpt_stream_stays_on_the_sphere():
    """Every block's output is a point between two unit vectors (rates in [0, 1]) and the final norm puts it back
    at norm 1; a loop pass's stream restarts from l2(x) + anchor."""
    torch.manual_seed(0)
    cfg = ModelConfig(**{**_NGPT, "n_layer": 5, "loop_section": (1, 2), "loop_passes": 2})
    model = GPT(cfg)
    x, _ = model.embed(torch.randint(0, 64, (1, 6)))
    h = model.stream_in(1, x, x)
    assert h.shape == (1, 6, 2, 32)
    torch.testing.assert_close(h[:, :, 0], 2 * model.norm_f(x))
    assert (model.blocks[0](x, model.embed(torch.zeros(1, 6, dtype=torch.long))[1]).norm(dim=-1) <= 1 + 1e-5).all()


def test_activation_checkpointing_and_flops_count_every_pass():
    """Checkpointing every block (a later pass's LoopPass too) leaves the loss and every gradient as they were; a
    looped model's FLOPs per token, by the formula and exactly, are those of the same depth with a block per layer."""
    import copy

    from redline.training.activation_checkpointing import apply_activation_checkpointing

    torch.manual_seed(0)
    cfg = ModelConfig(**{**_NGPT, "n_layer": 6, "loop_section": (1, 2), "loop_passes": 2})
    model = GPT(cfg)
    checkpointed = copy.deepcopy(model)
    assert apply_activation_checkpointing(checkpointed, "full") == list(range(6))
    tokens = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(checkpointed(tokens, tokens), model(tokens, tokens).detach())
    model(tokens, tokens).backward()
    checkpointed(tokens, tokens).backward()
    for (name, p), q in zip(model.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)
    unrolled = GPT(ModelConfig(**{**_NGPT, "n_layer": 6}))
    assert model.num_params() < unrolled.num_params()
    for exact in (False, True):
        assert model.flops_per_token(16, exact=exact) == unrolled.flops_per_token(16, exact=exact)


@pytest.mark.slow  # `redline train` end to end: the engine and gradient tests above run always
def test_train_init_from_resumes_and_exports(tmp_path, capsys):
    """`redline train --init-from` an imported Dory: the first step's loss is transformers', --resume goes on, and
    the trained run exports back with its logits (the check tests/test_interop_commands.py runs on a Llama)."""
    from tests.test_interop_commands import check_train_init_from

    check_train_init_from("dory", tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_looped_model_on_two_ranks_matches_one_process(dataset, tmp_path, parallel):  # noqa: F811
    """A looped nGPT model trained on two CPU ranks follows the one-process run: FSDP2 shards a looped block once
    and gathers it for each pass that calls it (its LoopPass entries hold no weights)."""
    from tests.test_distributed import close, run_train

    looped = ("model.ngpt=true", "model.norm=l2", "model.norm_eps=1e-6", "model.norm_position=sandwich",
              "model.qk_norm=true", "model.attn_gate=element", "model.mlp=swiglu", "model.n_layer=4",
              "--model.loop_section", "1", "1", "model.loop_passes=2", "max_steps=4")
    single = run_train(dataset, tmp_path, "single", 1, *looped)
    double = run_train(dataset, tmp_path, "double", 2, *looped, f"parallel={parallel}")
    assert close(single, double), (single, double)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py),
    each looped pass through its own cache; the compiled training step's loss and gradients match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = ModelConfig(**{**_NGPT, "vocab_size": 512, "context_len": 128, "n_embd": 128, "n_head": 8, "head_size": 16,
                         "n_layer": 6, "loop_section": (1, 2), "loop_passes": 2, "sliding_window": 16,
                         "window_layers": (0, 1, 3), "rope_local_theta": 100.0})
    model = GPT(cfg).cuda()
    prompts = [list(range(3, 40)), [5, 9, 2], list(range(100, 160))]
    assert_compiled_engine_stays_greedy(model, prompts)
    assert_compiled_training_step_matches(model, model.blocks[1].attn.qkv.weight)
