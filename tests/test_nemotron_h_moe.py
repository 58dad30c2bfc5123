"""Nemotron-H's expert (E) layers beyond the FAMILIES tables: the routing each option computes matters to the logits,
transformers' stacked experts read as the Hub's per-expert tensors, the one-line refusals on import and export, the
engine's chunked prefill, and the routing bias's update in training (moe_bias_update) on such a model."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.model import GPT, ModelConfig
from tests.interop_models import hf_model

transformers = pytest.importorskip("transformers")
TOKENS = torch.tensor([[5, 17, 42, 99, 3, 64, 7, 120, 31, 8, 250, 11], [9, 8, 7, 6, 5, 4, 3, 2, 200, 150, 100, 50]])


def _imported():
    """(transformers' model, redline's GPT with its weights) of tests/interop_models.py's nemotron_h-experts, read
    from transformers' own state dict (its experts stacked, under model.)."""
    from redline.interop.families import TensorSource, family_for

    hf = hf_model("nemotron_h-experts")
    state = hf.state_dict()
    assert "model.layers.1.mixer.experts.up_proj" in state  # (E, F, C), not the Hub's one tensor per expert
    family = family_for(hf.config.to_dict(), "test")
    cfg = family.model_config(hf.config.to_dict())
    model = GPT(cfg).eval()
    missing, unexpected = model.load_state_dict(family.to_redline(TensorSource(state, state.__getitem__, "test"), cfg),
                                                strict=False)
    assert not unexpected and all(k.endswith(("rope_cos", "rope_sin")) or "mask" in k for k in missing), missing
    return hf, model


def test_stacked_experts_import_and_every_routing_option_shows_in_the_logits():
    """The E layers' config maps onto redline's fields; with transformers' stacked experts the logits are its own;
    dropping the groups, the routing bias, the scale or the renormalisation (each a field the import sets) moves
    them, so the parity tests would catch any of them read wrong."""
    hf, model = _imported()
    cfg = model.cfg
    assert (cfg.moe_layers, cfg.moe_experts, cfg.moe_top_k, cfg.moe_groups, cfg.moe_topk_groups) == ((1, 4), 8, 2, 2, 1)
    assert (cfg.hidden_dim, cfg.moe_dense_hidden, cfg.moe_shared_hidden, cfg.moe_scale) == (32, 96, 48, 2.5)
    assert [type(b.mlp).__name__ for b in model.blocks] == ["NoneType", "MoE", "NoneType", "MLP", "MoE"]
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        moe = model.blocks[1].mlp
        for attr, value in (("groups", 1), ("scale", 1.0), ("norm_topk", False)):
            kept = getattr(moe, attr)
            setattr(moe, attr, value)
            assert (model(TOKENS) - expected).abs().max() > 1e-4, attr
            setattr(moe, attr, kept)
        moe.expert_bias.zero_()
        assert (model(TOKENS) - expected).abs().max() > 1e-4


def test_engine_chunked_prefill_and_decode_match_the_whole_forward():
    """The engine runs the E layers as any MLP: prompts prefilled in chunks then decoded greedily give the tokens the
    model's own full forward chooses step by step."""
    from redline.inference import InferenceEngine, SamplingParams

    _, model = _imported()
    prompts = [TOKENS[0].tolist(), TOKENS[1, :5].tolist()]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=4)
    results = engine.generate(prompts, 6, SamplingParams(temperature=0))
    for prompt, result in zip(prompts, results):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(6):
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        assert result.tokens == seq[len(prompt):]


@pytest.mark.parametrize("edit, fragment", [
    ({"moe_latent_size": 16}, "moe_latent_size=16: Nemotron-H's experts then work in a latent space"),
    ({"moe_shared_expert_intermediate_size": 0}, "moe_shared_expert_intermediate_size=0"),
])
def test_import_refusals_name_the_option(edit, fragment):
    from redline.interop.nemotron_h import model_config

    hf = hf_model("nemotron_h-experts").config.to_dict()
    with pytest.raises(UserError, match=fragment):
        model_config({**hf, **edit})


CFG = ModelConfig(vocab_size=64, context_len=32, n_layer=3, n_embd=32, n_head=4, pos_emb="none", mlp="relu2",
                  mlp_free_layers=(0,), mixer_free_layers=(1, 2), moe_experts=4, moe_top_k=2, moe_groups=2,
                  moe_layers=(2,), mlp_hidden=16, moe_dense_hidden=48, moe_gating="sigmoid", moe_expert_bias=True,
                  moe_norm_eps=1e-20, moe_shared_hidden=24, moe_shared_gate=False)


@pytest.mark.parametrize("extra, fragment", [
    (dict(moe_gating="softmax", moe_expert_bias=False, moe_groups=1), "scores its experts by their sigmoid"),
    (dict(moe_norm_eps=1e-6), r"adds 1e-20 to the chosen scores' sum \(model.moe_norm_eps=1e-06"),
    (dict(moe_shared_gate=True), "an ungated shared expert on each expert layer"),
    (dict(moe_shared_hidden=0), "an ungated shared expert on each expert layer"),
    (dict(mlp="swiglu"), "has ReLU² MLPs"),
    (dict(mixer_free_layers=(1,)), r"never both \(layers \[2\] have both"),
])
def test_export_refusals_name_the_option(extra, fragment):
    from redline.interop.families import export_family

    assert export_family(CFG).name == "nemotron_h"
    with pytest.raises(UserError, match=fragment):
        export_family(replace(CFG, **extra))


def test_gguf_refuses_expert_layers_by_name():
    """llama.cpp holds Nemotron-H's E layers in its own nemotron_h_moe layout, which redline does not write."""
    from redline.interop.families import export_family
    from redline.interop.gguf_recurrent import recurrent_arch

    with pytest.raises(UserError, match=r"Nemotron-H's expert \(E\) layers are not written as GGUF"):
        recurrent_arch(export_family(CFG), CFG)


def test_grouped_ungated_experts_off_one_sublayer_blocks_stay_refused():
    """Outside blocks of one sublayer (and dots.llm1's sigmoid scores), grouped or ungated experts and moe_layers
    still have no architecture."""
    from redline.interop.families import export_family

    plain = dict(mlp_free_layers=(), mixer_free_layers=(), moe_layers=(), moe_dense_hidden=None, moe_gating="softmax",
                 moe_expert_bias=False)
    for extra, fragment in [(dict(), "model.moe_groups=2: of the architectures redline exports to, only DeepSeek-V3"),
                            (dict(moe_groups=1), "but for Nemotron-H's ReLU² experts"),
                            (dict(moe_groups=1, mlp="swiglu", moe_layers=(1,)), "Nemotron-H too, on blocks of one sublayer")]:
        with pytest.raises(UserError, match=fragment):
            export_family(replace(CFG, **{**plain, **extra}))


def test_moe_layers_with_dense_hidden_builds_both_widths():
    """moe_layers with moe_dense_hidden: the experts mlp_hidden wide, the dense MLPs off moe_layers moe_dense_hidden
    wide."""
    model = GPT(CFG)
    assert model.blocks[1].mlp.fc.weight.shape == (48, 32) and model.blocks[2].mlp.fc.shape == (4, 16, 32)
    assert model.blocks[2].mlp.shared.fc.weight.shape == (24, 32)


def test_bias_update_trains_on_nemotron_h_expert_layers():
    """moe_bias_update on a hybrid with E layers (blocks of one sublayer, some MLPs dense): training steps with the
    expert_balance converter move the E layers' routing biases and the experts' weights."""
    from redline.converters.expert_balance import ExpertBalanceConverter

    torch.manual_seed(0)
    cfg = replace(CFG, moe_bias_update=0.01, delta_layers=(0,), delta_rule="mamba2", delta_heads=4,
                  delta_key_heads=2, delta_key_dim=8, delta_value_dim=16)
    model = GPT(cfg).train()
    converter = ExpertBalanceConverter(cfg.moe_bias_update)
    converter.convert(model)
    assert len(converter.layers) == 1
    moe = model.blocks[2].mlp
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fc = moe.fc.detach().clone()
    idx = torch.randint(0, cfg.vocab_size, (4, 16), generator=torch.Generator().manual_seed(1))
    for step in range(3):
        model(idx, idx).backward()
        opt.step()
        opt.zero_grad()
        converter.after_optimizer_step(step)
    assert moe.expert_bias.abs().min() > 0 and not torch.equal(fc, moe.fc)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["nemotron_h-experts", "dots1"])
def test_train_init_from_an_imported_expert_model(kind, tmp_path):
    """`redline train --init-from` an imported Nemotron-H with E layers (and a dots.llm1): the first step's loss is
    transformers' on the same batch, and training runs through the experts' routing and weights."""
    import json

    from redline.data.loader import TokenLoader
    from tests.test_interop_commands import Imported, call

    imported = Imported(kind, tmp_path)
    assert call(["train", "--init-from", imported.ckpt, "--data.path", imported.data, "max_steps=2", "seq_len=32",
                 "batch_size=2", "eval_every=0", "optim.warmup_steps=0", "optim.lr=1e-3", f"out_dir={tmp_path}",
                 "run_name=run", "eval_batches=1", "sample_tokens=0", "device=cpu"]) == 0
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in steps if r.get("kind") == "train" and r["step"] == 1)
    x, y = TokenLoader(imported.data, "train", 2, 32, seed=1337, prefetch=False).next_batch()
    assert first["loss"] == pytest.approx(imported.loss(x, y), abs=1e-4)
