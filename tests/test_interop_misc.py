"""Apertus (the xIELU MLP), ERNIE 4.5 MoE, Hunyuan MoE, Ministral and Cohere2 MoE beyond the shared parity tables
(tests/interop_models.py's FAMILIES: import and export against transformers; tests/test_lora_export.py: PEFT): the
xIELU activation against transformers' own module, its learned scalars trained, the engine's chunked prefill and
decode on each new layout, redline's own configs exported as each architecture, and what each refuses, in one line."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.interop.families import export_family
from redline.model import GPT, MLP, ModelConfig, xielu
from tests.interop_models import VOCAB, hf_folder
from tests.test_interop import TOKENS, imported, run_cli, written_and_loaded

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

BASE = dict(vocab_size=VOCAB - 8, context_len=64, n_layer=2, n_embd=64, n_head=4, n_kv_head=2)
# redline's own configs that only these architectures hold (each exported and loaded by transformers below)
EXPORTS = {
    "ApertusForCausalLM": dict(mlp="xielu", qk_norm=True, rope_scaling="llama3", rope_factor=4.0,
                               rope_original_context=8),
    # Apertus with a head narrower than its embedding (model.head_vocab, padded rows past it): Apertus 1.5's
    "Apertus1p5TextForCausalLM": dict(mlp="xielu", qk_norm=True, head_vocab=300),
    # dense first layer then experts with a bias that chooses and 2 shared ones; and experts every second layer
    "Ernie4_5_MoeForCausalLM": dict(n_layer=3, moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_expert_bias=True,
                                    moe_dense_layers=1, moe_dense_hidden=48, moe_shared_hidden=64,
                                    moe_shared_gate=False, moe_norm_min=1e-12, tie_embeddings=True),
    "Ernie4_5_MoeForCausalLM-interval": dict(n_layer=4, moe_experts=4, moe_top_k=1, mlp_hidden=32,
                                             moe_expert_bias=True, moe_layers=(1, 3)),
    "HunYuanMoEV1ForCausalLM": dict(qk_norm=True, qk_norm_after_rope=True, moe_experts=4, moe_top_k=2, mlp_hidden=32,
                                    moe_shared_hidden=32, moe_shared_gate=False),
    "MinistralForCausalLM": dict(n_layer=3, sliding_window=5, window_layers=(0, 2)),
    "MinistralForCausalLM-pattern": dict(n_layer=4, sliding_window=5, sliding_window_pattern=2),
    # full dense first layer that rotates, windowed expert layers, a full one without RoPE at no fixed step (a RoPE
    # base per layer), the shared expert averaged in
    "Cohere2MoeForCausalLM": dict(n_layer=4, norm="layernorm", norm_bias=False, parallel_residual=True,
                                  parallel_shared_norm=True, sliding_window=5, window_layers=(1, 2),
                                  rope_layer_theta=(10000.0, 10000.0, 10000.0, 0.0), moe_experts=4, moe_top_k=2,
                                  mlp_hidden=32, moe_dense_layers=1, moe_dense_hidden=48, moe_shared_hidden=32,
                                  moe_shared_gate=False, moe_scale=0.5, logit_divisor=2.0),
    "Cohere2MoeForCausalLM-sigmoid": dict(norm="rmsnorm", parallel_residual=True, parallel_shared_norm=True,
                                          sliding_window=5, sliding_window_pattern=2, nope_interval=2,
                                          moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_gating="sigmoid",
                                          moe_norm_topk=False, tie_embeddings=False),
}


def _random_model(cfg: ModelConfig) -> GPT:
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):  # moved so that it chooses
                b.add_(torch.randn_like(b) * 0.1)
    return model


# ----------------------------------------------------------------------------------------------------
# xIELU


def test_xielu_is_transformers_activation_with_its_parameters_and_init():
    from transformers.activations import XIELUActivation

    theirs = XIELUActivation(dtype=torch.float32)
    with torch.no_grad():
        theirs.alpha_p.add_(0.3)
        theirs.alpha_n.sub_(0.2)
    x = torch.cat([torch.linspace(-6, 6, 101), torch.tensor([-1e-7, -1e-6, -2e-6, 0.0, 1e-7])])
    ours = xielu(x, theirs.alpha_p, theirs.alpha_n, float(theirs.beta), float(theirs.eps))
    torch.testing.assert_close(ours, theirs(x), rtol=0, atol=0)
    # redline's initial scalars are transformers' (alpha_p = alpha_n = 0.8 through softplus)
    mlp = MLP(ModelConfig(**BASE, mlp="xielu"))
    mlp.reset_xielu()
    fresh = XIELUActivation(dtype=torch.float32)
    torch.testing.assert_close(mlp.alpha_p.data, fresh.alpha_p.data)
    torch.testing.assert_close(mlp.alpha_n.data, fresh.alpha_n.data)


def test_xielu_scalars_train_and_are_checked():
    cfg = ModelConfig(**BASE, mlp="xielu")
    model = GPT(cfg)
    assert float(torch.nn.functional.softplus(model.blocks[0].mlp.alpha_p)) == pytest.approx(0.8)
    loss = model(TOKENS.clamp(max=cfg.vocab_size - 1), TOKENS.clamp(max=cfg.vocab_size - 1))
    loss.backward()
    for block in model.blocks:  # the activation's scalars are parameters that learn
        assert block.mlp.alpha_p.grad.abs().item() > 0 and block.mlp.alpha_n.grad.abs().item() > 0
    for fields, fragment in ((dict(moe_experts=4), "dense MLP"), (dict(xielu_eps=1e-3), "xielu_eps <= 0"),
                             (dict(xielu_beta=0.9), "xielu_beta < 0.8")):
        with pytest.raises(UserError, match=fragment):
            ModelConfig(**BASE, mlp="xielu", **fields).validate()


def test_apertus_import_checks_the_stored_beta_and_eps(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    hf_folder("apertus", tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    weights["model.layers.1.mlp.act_fn.beta"] = torch.tensor(0.25)
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 2 and "model.layers.1.mlp.act_fn.beta is 0.25, not xIELU's beta=0.5" in err, err
    assert len(err.strip().splitlines()) == 1


def test_apertus1p5_text_writes_its_own_folder_and_reads_a_pruned_head(tmp_path, capsys):
    """An Apertus 1.5 text import exports as Apertus (tests/test_interop.py); written as its own family it loads as
    Apertus1p5TextForCausalLM with the same logits. A head pruned to the text ids is model.head_vocab (its parity:
    tests/interop_models.py's apertus1p5_text-pruned); one tied to the embedding, or wider than it, is refused by
    name. Its tensors are read under a multimodal save's model.language_model.* too."""
    from safetensors.torch import load_file, save_file

    from redline.interop.apertus import TEXT_1P5_FAMILY
    from redline.training.checkpoint import load_for_inference

    hf, model, tokenizer, _ = imported("apertus1p5_text", tmp_path, capsys)
    back = written_and_loaded(tmp_path, model, tokenizer, TEXT_1P5_FAMILY)
    with torch.no_grad():
        torch.testing.assert_close(back(TOKENS).logits, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert TEXT_1P5_FAMILY.model_config({**config, "output_vocab_size": 300}).head_vocab == 300
    with pytest.raises(UserError, match="output_vocab_size=300 with tie_word_embeddings=true: a head pruned below"):
        TEXT_1P5_FAMILY.model_config({**config, "output_vocab_size": 300, "tie_word_embeddings": True})
    with pytest.raises(UserError, match=r"output_vocab_size=321 is outside \[1, vocab_size=320\]"):
        TEXT_1P5_FAMILY.model_config({**config, "output_vocab_size": 321})
    assert TEXT_1P5_FAMILY.model_config({**config, "output_vocab_size": VOCAB}) == TEXT_1P5_FAMILY.model_config(config)
    # the text model's tensors under a multimodal save's names, which Apertus1p5TextForCausalLM loads too
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    save_file({k.replace("model.", "model.language_model.", 1): v for k, v in weights.items()},
              tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    renamed = transformers.Apertus1p5TextForCausalLM.from_pretrained(tmp_path / "hf").eval()
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "again")], capsys)
    assert code == 0, err
    again, _, _ = load_for_inference(tmp_path / "again")
    with torch.no_grad():
        torch.testing.assert_close(again(TOKENS), renamed(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_aria_text_writes_its_own_folder_and_reads_both_expert_names(tmp_path, capsys):
    """An Aria text import exports as GraniteMoeShared (tests/test_interop.py); written as its own family it loads as
    AriaTextForCausalLM with the same logits; the experts under transformers' in-memory names (gate_up_proj,
    down_proj) read as under the names its save_pretrained writes (fc1, fc2); q/k/v/o biases are refused by name."""
    from safetensors.torch import load_file, save_file

    from redline.interop.aria import FAMILY
    from redline.training.checkpoint import load_for_inference

    hf, model, tokenizer, _ = imported("aria_text", tmp_path, capsys)
    back = written_and_loaded(tmp_path, model, tokenizer, FAMILY)
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(back(TOKENS).logits, expected, rtol=1e-5, atol=1e-5)
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    renamed = {k.replace(".mlp.experts.fc1.weight", ".mlp.experts.gate_up_proj")
                .replace(".mlp.experts.fc2.weight", ".mlp.experts.down_proj"): v for k, v in weights.items()}
    assert renamed.keys() != weights.keys()
    save_file(renamed, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "again")], capsys)
    assert code == 0, err
    again, _, _ = load_for_inference(tmp_path / "again")
    with torch.no_grad():
        torch.testing.assert_close(again(TOKENS), expected, rtol=1e-5, atol=1e-5)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    with pytest.raises(UserError, match="attention_bias=true: Aria then has q/k/v/o biases"):
        FAMILY.model_config({**config, "attention_bias": True})


def test_gemma4_unified_text_with_shared_kv_layers_reads_as_transformers_runs_it(tmp_path, capsys):
    """Gemma 4 Unified's text model with its last two layers reading earlier layers' keys and values (double-wide
    MLPs there): the import's logits and greedy tokens through the engine are transformers' (its export, as
    Gemma4ForCausalLM, is tested without shared layers: tests/interop_models.py)."""
    from redline.inference import InferenceEngine, SamplingParams
    from tests.interop_models import FAMILIES, byte_level_tokenizer

    extra = {**FAMILIES["gemma4_unified_text"][2], "num_hidden_layers": 5, "num_kv_shared_layers": 2,
             "use_double_wide_mlp": True,
             "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                             "full_attention"]}
    config = transformers.Gemma4UnifiedTextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                                                  max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0,
                                                  eos_token_id=1, **extra)
    torch.manual_seed(0)
    hf = transformers.Gemma4UnifiedForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(tmp_path / "hf")
    byte_level_tokenizer(tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    from redline.training.checkpoint import load_for_inference

    model, _, _ = load_for_inference(tmp_path / "ckpt")
    assert model.cfg.kv_shared_layers == 2
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    prompt = TOKENS[0, :9].tolist()
    result = InferenceEngine(model, compile=False).generate([prompt], 8, SamplingParams(temperature=0))[0]
    hf.generation_config.eos_token_id = None
    reference = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert result.tokens == reference[0, len(prompt):].tolist()


# ----------------------------------------------------------------------------------------------------
# the engine on each layout: chunked prefill and decode against the model's own greedy choice


@pytest.mark.parametrize("arch", ["ApertusForCausalLM", "Ernie4_5_MoeForCausalLM", "HunYuanMoEV1ForCausalLM",
                                  "MinistralForCausalLM", "Cohere2MoeForCausalLM", "Apertus1p5TextForCausalLM"])
def test_engine_chunked_prefill_and_decode_follow_the_model(arch):
    from redline.inference import InferenceEngine, SamplingParams

    cfg = ModelConfig(**{**BASE, **EXPORTS[arch]})
    model = _random_model(cfg)
    prompts = [list(range(3, 14)), [7, 8, 9]]
    results = InferenceEngine(model, compile=False, prefill_chunk_tokens=4).generate(
        prompts, 8, SamplingParams(temperature=0))
    for prompt, result in zip(prompts, results):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(8):
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        assert result.tokens == seq[len(prompt):]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["ApertusForCausalLM", "Ernie4_5_MoeForCausalLM", "Cohere2MoeForCausalLM",
                                  "Apertus1p5TextForCausalLM"])
def test_gpu_compiled_engine_stays_greedy(arch):
    from tests.engine_checks import assert_compiled_engine_stays_greedy

    cfg = ModelConfig(**{**BASE, **EXPORTS[arch]})
    assert_compiled_engine_stays_greedy(_random_model(cfg).cuda(), [list(range(1, 20)), [5, 6, 7]])


# ----------------------------------------------------------------------------------------------------
# export of redline's own configs


@pytest.mark.parametrize("arch", list(EXPORTS))
def test_export_redline_configs_as_the_new_architectures(arch, tmp_path):
    from redline.tokenizer import load_tokenizer
    from tests.interop_models import byte_level_tokenizer

    cfg = ModelConfig(**{**BASE, **EXPORTS[arch]})
    cfg.validate()
    model = _random_model(cfg)
    family = export_family(cfg)
    assert family.architecture == arch.split("-")[0]
    back = written_and_loaded(tmp_path, model, load_tokenizer(byte_level_tokenizer(tmp_path / "tok")), family)
    tokens = TOKENS.clamp(max=cfg.vocab_size - 1)
    with torch.no_grad():
        torch.testing.assert_close(back(tokens).logits, model(tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(mlp="xielu"), "model.mlp=xielu: Apertus, the one architecture with it redline exports to, has a per-head "
                        "QK-norm"),
    (dict(mlp="xielu", qk_norm=True, sliding_window=4), "Apertus, the one architecture with it redline exports to, "
                                                        "attends to the whole context"),
    (dict(moe_experts=4, moe_expert_bias=True, qk_norm=True), "ERNIE 4.5 MoE, the one architecture with them redline "
                                                              "exports to, has no QK-norm"),
    (dict(moe_experts=4, moe_expert_bias=True, moe_shared_hidden=48, moe_shared_gate=False, mlp_hidden=32),
     "moe_shared_hidden a multiple of mlp_hidden"),
    (dict(n_layer=4, moe_experts=4, moe_expert_bias=True, moe_layers=(0, 2)),
     "ERNIE 4.5 MoE puts its experts on every moe_layer_interval-th layer"),
    (dict(moe_experts=4, qk_norm=True, qk_norm_after_rope=True), "Hunyuan MoE, the one architecture with them redline "
                                                                 "exports to, has an ungated shared MLP"),
    (dict(moe_experts=4, qk_norm=True, qk_norm_after_rope=True, moe_shared_hidden=32, mlp_hidden=32,
          moe_shared_gate=False, moe_dense_layers=1), "Hunyuan MoE, the one architecture with them redline exports "
                                                      "to, has experts on every layer"),
    (dict(sliding_window=4, sliding_window_pattern=2, qk_norm=True), "Ministral, the one architecture with them "
                                                                     "redline exports to, has no QK-norm"),
    (dict(sliding_window=4, window_layers=(0,), bias=True), "Ministral, the one architecture with them redline "
                                                            "exports to, has no Linear biases"),
    (dict(norm="layernorm", norm_bias=False, parallel_residual=True, parallel_shared_norm=True, moe_experts=4),
     "Cohere2 MoE, the one architecture with them redline exports to, rotates its windowed layers alone"),
    (dict(norm="layernorm", norm_bias=False, parallel_residual=True, parallel_shared_norm=True, moe_experts=4,
          sliding_window=4, sliding_window_pattern=2), "rotates its windowed layers, and its full dense layers all or "
                                                       "none"),
    (dict(norm="layernorm", norm_bias=False, parallel_residual=True, parallel_shared_norm=True, moe_experts=4,
          sliding_window=4, moe_gating="sigmoid"), "leaves sigmoid scores as they are"),
    (dict(norm="layernorm", norm_bias=False, parallel_residual=True, parallel_shared_norm=True, moe_experts=4,
          sliding_window=4, rope_layer_theta=(500.0, 500.0)), "rotates whole heads with one RoPE (model.rope_theta's)"),
])
def test_export_refuses_what_the_new_architectures_have_not(overrides, fragment):
    cfg = replace(ModelConfig(vocab_size=100, context_len=32, n_layer=2, n_embd=32, n_head=4), **overrides)
    with pytest.raises(UserError, match=re.escape(fragment)):
        export_family(cfg)


# ----------------------------------------------------------------------------------------------------
# import: configs read as transformers reads them, and what cannot be expressed refused by name


def _config(kind: str, tmp_path) -> dict:
    hf_folder(kind, tmp_path / kind)
    return json.loads((tmp_path / kind / "config.json").read_text())


def test_import_refuses_what_the_new_families_cannot_express(tmp_path):
    from redline.interop.families import family_for

    def refused(config: dict, fragment: str):
        with pytest.raises(UserError, match=re.escape(fragment)):
            family_for(config, "src").model_config(config).validate()

    apertus = _config("apertus", tmp_path)
    refused({**apertus, "hidden_act": "gelu"}, "hidden_act='gelu': redline's Apertus has the xIELU MLP")
    refused({**apertus, "attention_bias": True}, "attention_bias=true: Apertus then has biases on q/k/v/o")
    ernie = _config("ernie4_5_moe", tmp_path)
    refused({**ernie, "use_bias": True}, "use_bias=true: ERNIE 4.5 MoE's experts then have no biases")
    refused({**ernie, "moe_layer_end_index": 1, "num_hidden_layers": 3},
            "put experts on layers [1] with intermediate_size=96 != moe_intermediate_size=32")
    refused({**ernie, "moe_layer_start_index": 5}, "put experts on no layer")
    hunyuan = _config("hunyuan_v1_moe", tmp_path)
    refused({**hunyuan, "moe_topk": [2, 1]}, "moe_topk=[2, 1]: a different value per layer")
    refused({**hunyuan, "attention_bias": True}, "attention_bias=true: Hunyuan then has a bias on o_proj")
    cohere = _config("cohere2_moe", tmp_path)
    refused({**cohere, "expert_selection_fn": "sigmoid", "norm_topk_prob": True},
            "expert_selection_fn='sigmoid' with norm_topk_prob=True")
    refused({**cohere, "sliding_window": None}, "a cohere2_moe config without sliding_window")
    refused({**cohere, "mlp_layer_types": ["sparse", "dense", "sparse", "sparse"]},
            "redline's dense layers among the expert layers are as wide as the experts")
    refused({**cohere, "shared_expert_combination_strategy": "max"}, "shared_expert_combination_strategy='max'")
    ministral = _config("ministral", tmp_path)
    refused({**ministral, "layer_types": ["chunked_attention"] * 3}, "expected 3 entries of sliding_attention")


def test_import_reads_the_layouts_as_transformers_builds_them(tmp_path):
    from redline.interop.families import family_for

    def cfg_of(config):
        return family_for(config, "src").model_config(config)

    ernie = _config("ernie4_5_moe", tmp_path)  # ERNIE-4.5-21B-A3B's layout: dense first, experts to the end (-1)
    cfg = cfg_of({**ernie, "moe_layer_end_index": -1})
    assert (cfg.moe_dense_layers, cfg.moe_dense_hidden, cfg.hidden_dim, cfg.moe_shared_hidden) == (1, 96, 32, 64)
    assert cfg.moe_norm_min == 1e-12 and cfg.moe_expert_bias and not cfg.moe_shared_gate
    hunyuan = _config("hunyuan_v1_moe", tmp_path)  # Hunyuan-A13B's lists of one value a layer
    assert cfg_of({**hunyuan, "moe_topk": [2, 2], "num_experts": [4, 4]}).moe_top_k == 2
    ministral = _config("ministral", tmp_path)
    assert cfg_of({**ministral, "layer_types": None}).sliding_window == 5  # every layer windowed without layer_types
    assert (cfg_of(ministral).sliding_window_pattern, cfg_of(ministral).window_layers) == (3, ())
    cohere = _config("cohere2_moe", tmp_path)
    cfg = cfg_of(cohere)  # the dense full layer rotates (force_rope), the sparse full one does not
    assert [cfg.layer_rope(i) for i in range(4)] == [True, True, True, False] and cfg.moe_scale == 0.5
    # without force_rope (prefix_dense_sliding_window_pattern != 1) the first full layer takes no RoPE either: no
    # fixed step, a RoPE base per layer
    cfg = cfg_of({**cohere, "prefix_dense_sliding_window_pattern": 2})
    assert [cfg.layer_rope(i) for i in range(4)] == [False, True, True, False] and cfg.rope_layer_theta
    # layer_types built from first_k_dense_replace and the two patterns, as Cohere2MoeConfig builds them
    cfg = cfg_of({**cohere, "layer_types": None, "mlp_layer_types": None, "first_k_dense_replace": 1,
                  "sliding_window_pattern": 3})
    assert [cfg.layer_window(i) > 0 for i in range(4)] == [False, True, True, False]
    assert [cfg.layer_has_experts(i) for i in range(4)] == [False, True, True, True]


@pytest.mark.parametrize("kind, name", [("ministral", "Ministral"), ("cohere2_moe", "Cohere2 MoE")])
def test_new_families_are_not_written_as_gguf(kind, name, tmp_path, capsys):
    _, _, _, ckpt = imported(kind, tmp_path, capsys)
    out = tmp_path / "x.gguf"
    code, _, err = run_cli(["export", str(ckpt), "--format", "gguf", "--out", str(out)], capsys)
    assert code == 2 and f"{name} models are not written as GGUF" in err and not out.exists(), err


@pytest.mark.slow  # a training run: about 15 s on 2 CPU cores
def test_train_init_from_an_imported_apertus_trains_its_xielu_scalars(tmp_path, capsys):
    """`redline train --init-from` on an imported Apertus: the first step's loss is transformers' on the same batch,
    and training moves every layer's xIELU scalars (parameters with the rest)."""
    from tests.test_interop_commands import Imported, trained_two_steps

    before, after = trained_two_steps(Imported("apertus", tmp_path / "src"), tmp_path, capsys)
    for old, new in zip(before.blocks, after.blocks):
        assert not torch.equal(old.mlp.alpha_p, new.mlp.alpha_p) and not torch.equal(old.mlp.alpha_n, new.mlp.alpha_n)
