"""Mistral Large 4 beyond the shared multimodal table (tests/test_multimodal.py: import of its folder in Mistral's own
tensor names, logits and greedy tokens through the engine, export refused in one line): the training gradients of
the queries' position scales, a cache-sharing layer and its source against transformers'
MistralLarge4ForConditionalGeneration, the server's DecodeBatch and the engine's scores (NoPE latent layers, shared
latent caches), its folder under transformers' own names, `redline train --init-from` an import, the options
redline cannot express refused by name at import, export and config validation; the GPU's compiled engine and
training step (skipped without CUDA)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from redline.errors import UserError
from redline.interop.families import export_family
from redline.model import GPT, ModelConfig
from redline.training.checkpoint import load_for_inference
from tests.engine_checks import assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward
from tests.test_interop import run_cli
from tests.test_multimodal import _folder

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
transformers = pytest.importorskip("transformers")


def _imported(tmp_path, capsys, layout="saved"):
    """(transformers' model, redline's import of its folder) in fp32."""
    hf = _folder("mistral_large4", tmp_path / "hf", layout)
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    return hf, load_for_inference(tmp_path / "ckpt")[0]


def test_training_gradients_equal_transformers(tmp_path, capsys):
    """The loss and the gradients of the queries' position scale and bias, of layer 2's kv_b (it reads layer 0's
    cache) and of layer 0's kv_a (whose latent layers 0 and 2 both read) equal transformers'."""
    hf, model = _imported(tmp_path, capsys)
    assert model.cfg.kv_source_layers == (0, 1, 0, 1) and model.cfg.nope_interval == 2
    assert model.cfg.rope_pair_log_scales and model.cfg.q_position_scale
    hf.train(), model.train()
    tokens = torch.randint(0, 317, (2, 13), generator=torch.Generator().manual_seed(3))
    theirs = hf(input_ids=tokens, labels=tokens).loss
    ours = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    theirs.backward()
    ours.backward()
    layers, close = hf.model.language_model.layers, dict(rtol=1e-4, atol=1e-6)
    for i in range(4):
        attn = model.blocks[i].attn
        torch.testing.assert_close(attn.q_pos_scale.grad, layers[i].self_attn.softmax_scaling.scale.grad, **close)
        torch.testing.assert_close(attn.q_pos_bias.grad, layers[i].self_attn.softmax_scaling.bias.grad, **close)
    torch.testing.assert_close(model.blocks[2].attn.kv_b.weight.grad, layers[2].self_attn.kv_b_proj.weight.grad,
                               **close)
    # the latent rows (not rotated) of the source's kv_a, which the sharing layer's gradient reaches too
    torch.testing.assert_close(model.blocks[0].attn.kv_a.weight.grad[:16],
                               layers[0].self_attn.kv_a_proj_with_mqa.weight.grad[:16], **close)
    assert model.blocks[2].attn.kv_a is None and model.blocks[3].attn.kv_a is None
    assert model.blocks[1].attn.kv_a.weight.shape == (16, 64)  # a NoPE layer: the latent alone


def test_decode_batch_and_scores_through_the_engine(tmp_path, capsys):
    """The server's DecodeBatch (prefill in spans, prefill_many, rows freed) decodes as the model's own generate;
    the engine's teacher-forced scores equal the full forward's (shared latent caches, NoPE latent layers, the
    queries' position scale on the absorbed heads). The import's weights at a context of 64 (the checks' cache
    capacity: redline against itself, past the index_topk of 32 that transformers' dense equivalence stops at)."""
    from dataclasses import replace

    _, imported = _imported(tmp_path, capsys)
    model = GPT(replace(imported.cfg, context_len=64)).eval()
    model.load_state_dict(imported.state_dict())
    prompts = [list(range(3, 14)), [7, 1, 8], list(range(40, 52)), [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
    assert_decode_batch_serves_like_generate(model, prompts)
    assert_scores_equal_full_forward(model, 320)


def test_transformers_names_read_as_mistral_names(tmp_path, capsys):
    """A folder under transformers' own names (model.language_model.*, stacked experts, rotary_emb.alpha) imports
    to the same model as the Mistral-named one save_pretrained writes."""
    hf, model = _imported(tmp_path, capsys)
    renamed = tmp_path / "renamed"
    hf.save_pretrained(renamed)
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(renamed / "model.safetensors"),
              metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (renamed / name).write_text((tmp_path / "hf" / name).read_text())
    assert "model.language_model.norm.weight" in load_file(str(renamed / "model.safetensors"))
    code, _, err = run_cli(["import", str(renamed), "--out", str(tmp_path / "ckpt2"), "--dtype", "fp32"], capsys)
    assert code == 0, err
    again = load_for_inference(tmp_path / "ckpt2")[0]
    assert again.cfg == model.cfg
    for name, t in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], t, rtol=0, atol=0)


def test_export_and_gguf_refused_in_one_line(tmp_path, capsys):
    """Import only: the export (Hugging Face or GGUF) names the options no architecture redline writes has."""
    _imported(tmp_path, capsys)
    for extra in ([], ["--format", "gguf"]):
        code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"), *extra], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "model.q_position_scale, kv_source_layers" in err and "Mistral Large 4's" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, fragment", [
    (dict(kv_source_layers=[0, 1, 1, 1]), "kv_source_layers[2]=1"),
    (dict(kv_source_layers=[0, 0, 2, 3]), "kv_source_layers[1]=0"),
    (dict(kv_source_layers=[0, 2, 2, 3]), "kv_source_layers=[0, 2, 2, 3]"),
    (dict(q_lora_rank=16), "q_lora_rank=16 on mistral_large4_text"),
    (dict(mlp_layer_types=["sparse", "dense", "sparse", "sparse"]), "mlp_layer_types="),
    (dict(attention_bias=True), "attention_bias=true"),
])
def test_import_refuses_what_redline_cannot_express(change, fragment, tmp_path, capsys):
    _folder("mistral_large4", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["text_config"].update(change)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


_LARGE4 = dict(vocab_size=64, context_len=32, n_layer=4, n_embd=32, n_head=4, kv_lora_rank=16, head_size=24,
               rope_dims=8, v_head_dim=16, fused_qkv=False, nope_interval=2, q_position_scale=True,
               kv_source_layers=(0, 1, 0, 1), rope_pair_log_scales=(0.1, -0.2, 0.0, 0.3), latent_norm_eps=1e-5)


@pytest.mark.parametrize("overrides", [{}, dict(kv_source_layers=(), rope_pair_log_scales=(), nope_interval=0),
                                       dict(q_position_scale=False, kv_source_layers=(), nope_interval=0)])
def test_export_refuses_mistral_large4s_options_by_name(overrides):
    with pytest.raises(UserError, match="are Mistral Large 4's, which redline imports alone"):
        export_family(ModelConfig(**{**_LARGE4, **overrides}))


@pytest.mark.parametrize("overrides, fragment", [
    (dict(kv_source_layers=(0, 1, 1, 3)), r"kv_source_layers\[2\]=1"),
    (dict(kv_source_layers=(0, 1)), "one entry a layer"),
    (dict(kv_lora_rank=0, q_position_scale=False, rope_dims=0, v_head_dim=0, nope_interval=0, latent_norm_eps=0.0,
          kv_source_layers=(0, 1, 0, 3)), "model.kv_source_layers shares latent attention's caches"),
    (dict(kv_lora_rank=0, rope_dims=0, v_head_dim=0, kv_source_layers=(), nope_interval=0, latent_norm_eps=0.0),
     "model.q_position_scale scales latent attention's queries"),
    (dict(rope_pair_log_scales=(0.1,)), "model.rope_pair_log_scales scales each rotated pair's frequency"),
    (dict(latent_key_norm=True), "latent_key_norm with layers without RoPE"),
])
def test_config_validation_names_the_field(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        ModelConfig(**{**_LARGE4, **overrides}).validate()


def check_train_starts_at_import(ckpt, model, tmp_path, capsys) -> None:
    """`redline train --init-from ckpt` (an import-only family's, model its weights): its first step's loss is the
    import's on that batch, and --resume goes on (tests/test_interop_commands.py's check, without the export)."""
    import random

    from redline.data.loader import TokenLoader
    from redline.training.checkpoint import list_checkpoints

    rng, words = random.Random(0), "hello world the model reads tokens and says hi".split()
    (tmp_path / "text.txt").write_text("\n\n".join(" ".join(rng.choice(words) for _ in range(60)) for _ in range(40)))
    code, _, err = run_cli(["data", "prepare", "--inputs", str(tmp_path / "text.txt"), "--out", str(tmp_path / "data"),
                            "--tokenizer", str(ckpt / "tokenizer")], capsys)
    assert code == 0, err
    common = [f"out_dir={tmp_path}", "run_name=run", "eval_batches=1", "sample_tokens=0", "device=cpu"]
    code, _, err = run_cli(["train", "--init-from", str(ckpt), "--data.path", str(tmp_path / "data"), "max_steps=2",
                            "seq_len=32", "batch_size=2", "eval_every=0", "optim.warmup_steps=0", "optim.lr=1e-3",
                            *common], capsys)
    assert code == 0, err
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in steps if r.get("kind") == "train" and r["step"] == 1)
    x, y = TokenLoader(tmp_path / "data", "train", 2, 32, seed=1337, prefetch=False).next_batch()
    with torch.no_grad():
        assert first["loss"] == pytest.approx(model(x, y).item(), abs=1e-4)  # the imported weights
    code, _, err = run_cli(["train", "--resume", str(tmp_path / "run"), "max_steps=3"], capsys)
    assert code == 0, err
    assert list_checkpoints(tmp_path / "run")[-1].name == "step_00000003"


@pytest.mark.slow  # `redline train` end to end: the engine and gradient tests above run always
def test_train_init_from_starts_at_the_imported_models_loss(tmp_path, capsys):
    """`redline train --init-from` an imported Mistral Large 4 (the shared caches, NoPE layers and position scales
    trained as they compute)."""
    _, model = _imported(tmp_path, capsys)
    check_train_starts_at_import(tmp_path / "ckpt", model, tmp_path, capsys)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones, the queries' position scale included."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = ModelConfig(**{**_LARGE4, "vocab_size": 512, "context_len": 128, "n_embd": 128, "n_head": 8})
    model = GPT(cfg).cuda()
    with torch.no_grad():  # the position scales away from their no-op init
        for block in model.blocks:
            block.attn.q_pos_scale.normal_(0, 0.1)
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[2].attn.q_pos_scale)
