"""Step 3.5's text model beyond the shared tables (tests/test_multimodal.py: a Step 3.7 folder's logits on text and
greedy tokens through the engine against Step3p7ForConditionalGeneration, in the Hub's and transformers' module
names, the export refused in one line): the training gradients of the windowed layers' own heads, the head gates
and the clamped experts against transformers', each clamp doing its part, a step3p5 text folder in the Hub's config
form (multi-token-prediction layers past the last, legacy fields) read as transformers reads it, the server's
DecodeBatch and the engine's scores, `redline train --init-from` an import, the options redline cannot express
refused by name at import, export (Hugging Face, GGUF, PEFT) and config validation; the GPU's compiled engine and
training step (skipped without CUDA)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from redline.errors import UserError
from redline.interop.families import export_family
from redline.model import GPT, ModelConfig
from redline.training.checkpoint import load_for_inference
from tests.engine_checks import assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward
from tests.interop_models import VOCAB
from tests.test_interop import run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
transformers = pytest.importorskip("transformers")


def _imported(tmp_path, capsys):
    """(Step3p7ForConditionalGeneration, the redline import of its folder, the checkpoint dir): test_multimodal.py's
    tiny Step 3.7 (windowed layers of 6 heads beside full ones of 4, clamps on some layers)."""
    from tests.test_multimodal import _folder

    hf = _folder("step3p7", tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    return hf, load_for_inference(tmp_path / "ckpt")[0], tmp_path / "ckpt"


def test_training_gradients_equal_transformers(tmp_path, capsys):
    """The loss and the gradients of a windowed and a full layer's q/k/v, head gates and query norms, the clamped
    experts, shared expert and dense MLP, and the router equal transformers'."""
    hf, model, _ = _imported(tmp_path, capsys)
    hf.train(), model.train()
    tokens = torch.randint(0, VOCAB - 3, (2, 13), generator=torch.Generator().manual_seed(3))
    theirs = hf(input_ids=tokens, labels=tokens).loss
    ours = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    theirs.backward()
    ours.backward()
    close = dict(rtol=1e-4, atol=1e-6)
    layers = hf.model.language_model.layers
    for block, layer in zip(model.blocks, layers):
        attn = layer.self_attn
        qkv = torch.cat([attn.q_proj.weight.grad, attn.k_proj.weight.grad, attn.v_proj.weight.grad])
        torch.testing.assert_close(block.attn.qkv.weight.grad, qkv, **close)
        torch.testing.assert_close(block.attn.gate.weight.grad, attn.g_proj.weight.grad, **close)
        torch.testing.assert_close(block.attn.q_norm.weight.grad, attn.q_norm.weight.grad, **close)
    dense = layers[0].mlp
    torch.testing.assert_close(model.blocks[0].mlp.fc.weight.grad,
                               torch.cat([dense.gate_proj.weight.grad, dense.up_proj.weight.grad]), **close)
    moe = layers[3].mlp
    torch.testing.assert_close(model.blocks[3].mlp.fc.grad, moe.experts.gate_up_proj.grad, **close)
    torch.testing.assert_close(model.blocks[3].mlp.router.weight.grad, moe.gate.weight.grad, **close)
    shared = layers[2].mlp.shared_experts
    torch.testing.assert_close(model.blocks[2].mlp.shared.fc.weight.grad,
                               torch.cat([shared.gate_proj.weight.grad, shared.up_proj.weight.grad]), **close)


def test_each_clamp_and_the_windowed_head_count_take_part(tmp_path, capsys):
    """The import reads the windowed layers' 6 heads, the scale and each type's RoPE; each clamp list changes the
    logits (so the parity tests hold them)."""
    _, model, _ = _imported(tmp_path, capsys)
    cfg = model.cfg
    assert (cfg.window_n_head, cfg.n_head, cfg.window_layers, cfg.attn_scale) == (6, 4, (1, 3), 12 ** -0.5)
    assert (cfg.rope_dims, cfg.rope_local_dims, cfg.rope_theta, cfg.rope_local_theta) == (8, 16, 500.0, 300.0)
    assert cfg.swiglu_act_limits == (0.04, 0.0, 0.05, 0.0) and cfg.moe_swiglu_act_limits == (0.0, 0.05, 0.0, 0.03)
    assert model.blocks[1].attn.gate.weight.shape == (6, 64) and model.blocks[0].attn.gate.weight.shape == (4, 64)
    tokens = torch.randint(0, VOCAB - 3, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = model(tokens)
        for change in (dict(swiglu_act_limits=()), dict(moe_swiglu_act_limits=())):
            unclamped = GPT(replace(cfg, **change)).eval()
            unclamped.load_state_dict(model.state_dict())
            assert (unclamped(tokens) - base).abs().max() > 1e-2, change


def _hub_text_config(text: dict) -> dict:
    """A step3p5 text folder's config.json in the Hub's form from transformers' saved text_config: one trailing
    multi-token-prediction layer padding the per-layer lists, moe_layers_enum, attention_other_setting, per-layer
    rope_theta and partial_rotary_factors, the attribute_map's names, "swigluoai"."""
    kinds = text["layer_types"]
    rope = text["rope_parameters"]
    hub = {k: v for k, v in text.items() if k not in ("mlp_layer_types", "num_sliding_attention_heads",
                                                      "per_layer_config", "rope_parameters", "n_routed_experts",
                                                      "num_key_value_heads", "num_experts_per_tok")}
    return {**hub, "model_type": "step3p5", "architectures": ["Step3p5ForCausalLM"], "hidden_act": "swigluoai",
            "num_nextn_predict_layers": 1, "layer_types": kinds + ["full_attention"],
            "moe_layers_enum": ",".join(str(i) for i, k in enumerate(text["mlp_layer_types"] + ["sparse"])
                                        if k == "sparse"),
            "attention_other_setting": {"num_attention_heads": text["num_sliding_attention_heads"],
                                        "num_attention_groups": text["num_key_value_heads"]},
            "rope_theta": [rope[k]["rope_theta"] for k in kinds] + [rope["full_attention"]["rope_theta"]],
            "partial_rotary_factors": [rope[k]["partial_rotary_factor"] for k in kinds] + [0.5],
            "swiglu_limits": text["swiglu_limits"] + [0.0], "swiglu_limits_shared": text["swiglu_limits_shared"] + [0],
            "moe_num_experts": text["n_routed_experts"], "num_attention_groups": text["num_key_value_heads"],
            "moe_top_k": text["num_experts_per_tok"]}


def test_hub_text_folder_reads_as_transformers_reads_its_config(tmp_path, capsys):
    """A step3p5 folder (Step-3.5-Flash's: the text model alone, its config in the Hub's form, a multi-token-
    prediction layer past the last) and a step3p7 folder whose text_config has that form and whose weights that
    layer: transformers' Step3p7TextConfig reads that config as the saved one, and so does redline; each import's
    logits are Step 3.7's on text, the extra layer left unread."""
    from redline.interop.step3p5 import model_config
    from tests.test_multimodal import _folder

    hf = _folder("step3p7", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    text = config["text_config"]
    hub = _hub_text_config(text)
    through_transformers = transformers.Step3p7TextConfig(**{k: v for k, v in hub.items() if k != "model_type"})
    assert model_config(through_transformers.to_dict()) == model_config(text) == model_config(hub)
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    weights.update({k.replace("layers.3.", "layers.4."): v.clone() for k, v in weights.items() if ".layers.3." in k})
    weights["model.layers.4.eh_proj.weight"] = torch.zeros(64, 128)
    tokens = torch.randint(0, VOCAB - 3, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
    for kind, folder_config, tensors in (
            ("step3p7", {**config, "text_config": {k: v for k, v in hub.items() if k != "architectures"}}, weights),
            ("step3p5", hub, {k: v for k, v in weights.items() if k.startswith(("model.", "lm_head."))})):
        save_file(tensors, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
        (tmp_path / "hf" / "config.json").write_text(json.dumps(folder_config))
        code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / kind), "--dtype", "fp32"],
                               capsys)
        assert code == 0, err
        with torch.no_grad():
            torch.testing.assert_close(load_for_inference(tmp_path / kind)[0](tokens), expected, rtol=1e-5,
                                       atol=1e-5)


def test_every_layer_windowed_all_sparse_and_tied(tmp_path, capsys):
    """Another layout: every layer windowed at one RoPE base (the windowed table alone) with the same head count
    beside them, experts on every layer, no clamps, the head tied by the top-level config: logits on text equal."""
    from tests.test_multimodal import CASES, _folder, _step3p7_config

    CASES["step3p7-windowed"] = (lambda: _step3p7_config(
        top=dict(tie_word_embeddings=True), layer_types=["sliding_attention"] * 4, num_sliding_attention_heads=4,
        mlp_layer_types=["sparse"] * 4, swiglu_limits=None, swiglu_limits_shared=None, rope_theta=300.0,
        partial_rotary_factors=None), *CASES["step3p7"][1:])
    try:
        hf = _folder("step3p7-windowed", tmp_path / "hf")
    finally:
        del CASES["step3p7-windowed"]
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    model = load_for_inference(tmp_path / "ckpt")[0]
    cfg = model.cfg
    assert (cfg.tie_embeddings, cfg.window_n_head, cfg.moe_dense_layers, cfg.swiglu_act_limits) == (True, 0, 0, ())
    tokens = torch.randint(0, VOCAB - 3, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(input_ids=tokens).logits, rtol=1e-5, atol=1e-5)


def test_decode_batch_and_scores_through_the_engine(tmp_path, capsys):
    """The server's DecodeBatch (prefill in spans, prefill_many, rows freed) decodes as the model's own generate;
    the engine's teacher-forced scores equal the full forward's (the windowed layers' own head count in the cache's
    chunked prefill and decode)."""
    _, model, _ = _imported(tmp_path, capsys)
    model.eval()
    prompts = [list(range(3, 14)), [7, 1, 8], list(range(40, 52)), [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
    assert_decode_batch_serves_like_generate(model, prompts)
    assert_scores_equal_full_forward(model, VOCAB - 3)


@pytest.mark.slow  # `redline train` end to end: the engine and gradient tests above run always
def test_train_init_from_starts_at_the_imported_models_loss(tmp_path, capsys):
    """`redline train --init-from` an imported Step 3.7 (its clamps and windowed heads trained as they compute)."""
    from tests.test_mistral_large4 import check_train_starts_at_import

    _, model, ckpt = _imported(tmp_path, capsys)
    check_train_starts_at_import(ckpt, model, tmp_path, capsys)


@pytest.mark.parametrize("change, fragment", [
    (dict(use_bidirectional_attention=True), "use_bidirectional_attention=true"),
    (dict(attention_bias=True), "attention_bias=true"),
    (dict(mlp_bias=True), "mlp_bias=true"),
    (dict(sliding_window=None), "num_sliding_attention_heads=6 without windowed layers"),
    (dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500.0},
                           "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 300.0}}),
     "the sliding-window layers' RoPE scaling 'linear'"),
    (dict(layer_types=["full_attention", "minimax_m3_sparse"] * 2), "layer_types"),
])
def test_import_refuses_what_redline_cannot_express(change, fragment, tmp_path, capsys):
    from tests.test_multimodal import _folder

    _folder("step3p7", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config,
                                                             "text_config": {**config["text_config"], **change}}))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a LoRA training run; the folder export's refusal runs always in test_multimodal's table
def test_exports_are_refused_in_one_line(tmp_path, capsys):
    """Hugging Face, GGUF and a LoRA run's PEFT adapter: each refused by name before anything is written."""
    from tests.test_lora_export import ARCHS, lora_run

    _, _, ckpt = _imported(tmp_path, capsys)
    ARCHS["Step3p5ForCausalLM"] = {**_STEP, "window_layers": (1,), "swiglu_act_limits": (0.5, 0.0),
                                   "moe_swiglu_act_limits": (0.0, 0.5), "n_layer": 2}
    try:
        _, run = lora_run(tmp_path / "lora", "Step3p5ForCausalLM")
    finally:
        del ARCHS["Step3p5ForCausalLM"]
    for source, args in ((ckpt, ["--out", str(tmp_path / "out")]),
                         (ckpt, ["--out", str(tmp_path / "out.gguf"), "--format", "gguf"]),
                         (run, ["--adapter", str(tmp_path / "adapter")])):
        code, _, err = run_cli(["export", str(source), *args], capsys)
        assert code == 2 and "Step 3.5's" in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not any((tmp_path / name).exists() for name in ("out", "out.gguf", "adapter"))


_STEP = dict(vocab_size=64, context_len=32, n_layer=3, n_embd=32, n_head=4, n_kv_head=2, head_size=8,
             sliding_window=4, window_layers=(1,), window_n_head=6, qk_norm=True, attn_gate="head",
             norm_unit_offset=True, moe_experts=4, moe_top_k=2, mlp_hidden=16, moe_gating="sigmoid",
             moe_expert_bias=True, moe_shared_hidden=16, moe_shared_gate=False, moe_dense_layers=1,
             moe_dense_hidden=32, swiglu_act_limits=(0.5, 0.0, 0.5), moe_swiglu_act_limits=(0.0, 0.5, 0.5))


def test_export_refuses_steps_options_by_name():
    for change in ({}, dict(swiglu_act_limits=(), moe_swiglu_act_limits=()), dict(window_n_head=0)):
        with pytest.raises(UserError, match="are Step 3.5's, which redline imports alone"):
            export_family(ModelConfig(**{**_STEP, **change}))


@pytest.mark.parametrize("overrides, fragment", [
    (dict(window_n_head=5), "model.window_n_head=5 needs windowed layers"),
    (dict(sliding_window=0, window_layers=()), "model.window_n_head=6 needs windowed layers"),
    (dict(swiglu_act_limits=(0.5,)), r"model.swiglu_act_limits=\(0.5,\): one clamp >= 0 a layer \(3\)"),
    (dict(moe_swiglu_act_limits=(0.0, -1.0, 0.0)), "model.moe_swiglu_act_limits=.*one clamp >= 0 a layer"),
    (dict(moe_experts=0, moe_top_k=0, moe_shared_hidden=0, moe_dense_layers=0, moe_dense_hidden=None,
          moe_gating="softmax", moe_expert_bias=False), "model.moe_swiglu_act_limits="),
    (dict(mlp="geglu"), "model.swiglu_act_limits="),
])
def test_config_validation_names_the_field(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        ModelConfig(**{**_STEP, **overrides}).validate()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones, through a windowed layer's own heads."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = ModelConfig(**{**_STEP, "vocab_size": 512, "context_len": 128, "n_embd": 128, "head_size": 16,
                         "moe_experts": 8, "mlp_hidden": 64, "moe_shared_hidden": 64, "moe_dense_hidden": 96,
                         "swiglu_act_limits": (2.0, 0.0, 2.0), "moe_swiglu_act_limits": (0.0, 2.0, 2.0)})
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[1].attn.qkv.weight)
