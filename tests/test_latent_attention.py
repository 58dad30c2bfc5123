"""Multi-head latent attention (model.kv_lora_rank: DeepSeek-V2/V3's MLA) beyond the import/export parity of
tests/test_interop.py (the deepseek_* families there): the inference engine against full recompute, prefilled
whole, in chunks and through a decode batch; training through it; the Hub's DeepSeek-V3 and Moonlight configs; and
each refusal one line naming its option."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.interop.families import _families, export_family
from redline.model import GPT, ModelConfig
from tests.engine_checks import (assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches,
                                 assert_decode_batch_parks_rows,
                                 assert_freed_row_refills, full_recompute)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# q through its bottleneck, values narrower than q/k heads (padded in the cache), RoPE on a third of each head
MLA = ModelConfig(vocab_size=96, context_len=64, n_layer=2, n_embd=48, n_head=4, head_size=24, rope_dims=8,
                  kv_lora_rank=12, q_lora_rank=16, v_head_dim=16, fused_qkv=False, mlp_hidden=64)
# DeepSeek-V3's whole layout: a dense first layer, sigmoid group-limited routing with a shared expert, YaRN with
# its mscale² in the score scale
MLA_MOE = replace(MLA, moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_gating="sigmoid", moe_expert_bias=True,
                  moe_groups=2, moe_topk_groups=1, moe_norm_eps=1e-20, moe_shared_hidden=32, moe_shared_gate=False,
                  moe_dense_layers=1, moe_dense_hidden=64, moe_scale=2.5, rope_scaling="yarn", rope_factor=2.0,
                  rope_original_context=32, attn_scale=24 ** -0.5 * (0.1 * math.log(2.0) + 1) ** 2)
# DeepSeek-V2-Lite's: one q projection, softmax routing never rescaled
MLA_V2 = replace(MLA, q_lora_rank=0, moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_norm_topk=False,
                 moe_shared_hidden=64, moe_shared_gate=False, moe_dense_layers=1, moe_scale=2.0)
# A.X-K1's: DeepSeek-V3's layout with each mixture's output normed; Mistral 4's: softmax routing within groups
MLA_AXK1 = replace(MLA_MOE, moe_post_norm=True)
MLA_MISTRAL4 = replace(MLA_MOE, moe_gating="softmax", moe_expert_bias=False, moe_norm_eps=1e-6)
# dots.3 Note's: the shared RoPE key part RMS-normed, the latents normed at the blocks' epsilon, gated heads, a
# windowed layer with a RoPE base of its own
MLA_DOTS3 = replace(MLA_MOE, rope_scaling="none", attn_scale=0.0, attn_gate="head", latent_key_norm=True,
                    latent_norm_eps=1e-5, sliding_window=5, window_layers=(1,), rope_local_theta=300.0)
CONFIGS = pytest.mark.parametrize("cfg", [MLA, MLA_MOE, MLA_V2, MLA_AXK1, MLA_MISTRAL4, MLA_DOTS3],
                                  ids=["dense", "v3-moe", "v2-moe", "axk1", "mistral4", "dots3"])


def sharp(cfg: ModelConfig) -> GPT:
    """A random model whose logits are spread wide enough that greedy decoding has no near-ties."""
    torch.manual_seed(0)
    model = GPT(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
        for block in model.blocks:
            if getattr(block.mlp, "expert_bias", None) is not None:
                block.mlp.expert_bias.normal_(0, 0.1)
    return model.eval()


@CONFIGS
@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute(chunk, cfg):
    """Prompts of different lengths in one batch, prefilled whole or in chunks of `chunk` tokens, then decoded one
    token at a time: the full recompute's tokens. The cache holds one head of the latent and the rotated key part
    (as keys, and as values behind zeros): 2 · (kv_lora_rank + rope_dims) a layer and token."""
    model = sharp(cfg)
    prompts = [list(range(1, 12)), [5, 6], [40]]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
    got = [r.tokens for r in engine.generate(prompts, 10, SamplingParams(temperature=0))]
    assert got == [full_recompute(model, p, 10) for p in prompts]
    assert engine.kv_bytes_per_token() == cfg.n_layer * 2 * (cfg.kv_lora_rank + cfg.rope_dims) * 4


@pytest.mark.parametrize("adapted", [False, True], ids=["plain", "lora-on-kv_b"])
def test_absorbed_heads_give_the_expanded_heads_logits(adapted):
    """The engine's absorbed form (the queries taking the keys' up-projection in, the values' applied after
    attention) gives the full forward's logits in fp32, prefilled and decoded; with a LoRA adapter on kv_b (its
    update in W_uk and W_uv) too."""
    from redline.converters.lora import LoRAConverter
    from redline.inference.batch import DecodeBatch

    model = sharp(MLA_MOE)
    if adapted:
        LoRAConverter(4, 8.0, 0.0, ("attn.kv_b",), say=lambda m: None).convert(model)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2)
    batch = DecodeBatch(InferenceEngine(model, compile=False), rows=1, capacity=32)
    prompt = [3, 9, 4, 17, 5, 60, 2, 11]
    logits = batch.prefill(0, prompt)
    with torch.no_grad():
        full = model(torch.tensor([prompt + [int(logits.argmax())]]))[0]
    torch.testing.assert_close(logits.float().flatten(), full[-2], rtol=1e-5, atol=1e-5)
    batch.start(0, int(logits.argmax()), len(prompt))
    step = batch.step()
    assert int(step[0]) == int(full[-1].argmax())


@CONFIGS
def test_decode_batch_rows_and_spans(cfg):
    """A server's batch: one row decodes while another's prompt goes in over two spans; then both decode, and a
    freed row is refilled. Each row's tokens are the full recompute's."""
    model = sharp(cfg)
    batch = assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model)
    assert_freed_row_refills(batch, model)


@pytest.mark.parametrize("cfg, extra", [(MLA_MOE, set()), (MLA_DOTS3, {"gate.weight", "k_pe_norm.weight"})],
                         ids=["v3-moe", "dots3"])
def test_training_reaches_every_latent_projection(cfg, extra):
    """The forward is differentiable end to end: every parameter of the latent attention gets a finite, non-zero
    gradient (dots.3 Note's head gate and key norm too), and a few AdamW steps on one batch lower its loss."""
    torch.manual_seed(0)
    model = GPT(cfg).train()
    idx = torch.randint(0, cfg.vocab_size, (2, 24))
    loss = model(idx, idx)
    loss.backward()
    attn = model.blocks[1].attn
    for name, p in attn.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert {name for name, _ in attn.named_parameters()} == {
        "q_a.weight", "q_a_norm.weight", "q_b.weight", "kv_a.weight", "kv_a_norm.weight", "kv_b.weight",
        "proj.weight", *extra}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = loss.item()
    for _ in range(5):
        opt.zero_grad()
        loss = model(idx, idx)
        loss.backward()
        opt.step()
    assert loss.item() < first


@pytest.mark.parametrize("overrides, fragment", [
    (dict(rope_dims=0), "model.kv_lora_rank=12 (latent attention) needs a shared key part of each head"),
    (dict(n_kv_head=2), "model.n_kv_head = n_head"),
    (dict(v_head_dim=32), "model.v_head_dim <= the head width 24"),
    (dict(qk_norm=True), "model.kv_lora_rank (latent attention) takes no QK-norm"),
    (dict(value_embeddings=1), "model.kv_lora_rank (latent attention) takes no QK-norm, routed or softplus "
                               "attn_gate (a sigmoid one a head, Ling 3's, or a value, HY-V4's), value_embeddings"),
    (dict(kv_lora_rank=0), "model.q_lora_rank and v_head_dim are latent attention's"),
    (dict(kv_lora_rank=0, q_lora_rank=0, v_head_dim=0, latent_key_norm=True),
     "model.latent_key_norm and latent_norm_eps are latent attention's"),
    (dict(latent_norm_eps=-1.0), "latent_norm_eps >= 0"),
])
def test_config_refusals(overrides, fragment):
    with pytest.raises(UserError) as e:
        replace(MLA, **overrides).validate()
    assert fragment in str(e.value) and "\n" not in str(e.value)


# DeepSeek-V3's config.json as the Hub holds it (the sizes shrunk): rope_scaling with YaRN's mscale, its fp8 weights
HUB_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 320, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_nextn_predict_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 8,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "qk_nope_head_dim": 16, "topk_method": "noaux_tc", "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2,
    "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": True, "scoring_func": "sigmoid",
    "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "tie_word_embeddings": False, "attention_bias": False,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}


def test_hub_deepseek_v3_and_moonlight_configs():
    """The Hub's DeepSeek-V3 config: read with the score scale's mscale², YaRN's table factor 1 (mscale /
    mscale_all_dim), DeepSeek-V3's router; a quantization other than its fp8 blocks refused by name. Moonlight's
    (q_proj alone, one group, no RoPE scaling) too."""
    family = _families()["deepseek_v3"]
    for quant in ({"quant_method": "fp8", "weight_block_size": [64, 64]}, {"quant_method": "gptq"}):
        with pytest.raises(UserError, match="redline dequantizes DeepSeek's fp8 e4m3 weights in 128 x 128 blocks"):
            family.model_config(dict(HUB_V3, quantization_config=quant))
    cfg = family.model_config(HUB_V3)
    cfg.validate()
    assert cfg.attn_scale == pytest.approx(24 ** -0.5 * (0.1 * math.log(40) + 1) ** 2, rel=1e-12)
    assert (cfg.rope_scaling, cfg.rope_factor, cfg.rope_original_context, cfg.rope_attention_factor) == \
        ("yarn", 40.0, 4096, 1.0)
    assert (cfg.head_dim, cfg.rope_dims, cfg.v_head_dim, cfg.kv_lora_rank, cfg.q_lora_rank) == (24, 8, 16, 16, 24)
    assert (cfg.moe_experts, cfg.moe_top_k, cfg.moe_groups, cfg.moe_topk_groups, cfg.moe_gating, cfg.moe_expert_bias,
            cfg.moe_norm_topk, cfg.moe_norm_eps, cfg.moe_scale) == (8, 2, 4, 2, "sigmoid", True, True, 1e-20, 2.5)
    assert (cfg.moe_dense_layers, cfg.moe_dense_hidden, cfg.mlp_hidden, cfg.moe_shared_hidden,
            cfg.moe_shared_gate) == (1, 96, 32, 32, False)
    moonlight = dict(HUB_V3, q_lora_rank=None, n_group=1, topk_group=1, rope_scaling=None, n_shared_experts=2)
    del moonlight["quantization_config"]
    cfg = family.model_config(moonlight)
    cfg.validate()
    assert (cfg.q_lora_rank, cfg.moe_groups, cfg.attn_scale, cfg.rope_scaling, cfg.moe_shared_hidden) == \
        (0, 1, 24 ** -0.5, "none", 64)


def test_fp8_checkpoint_dequantizes_as_transformers_does(tmp_path, capsys):
    """DeepSeek-V3's fp8 checkpoints: every Linear weight of the layers e4m3 with a weight_scale_inv a 128 x 128
    block (here shapes under 128: one block a matrix, the scale its absolute maximum over 448), the router, norms,
    embedding and head as they are. The import gives transformers' logits for the same folder (which dequantizes it
    on the CPU), and the dequantization follows the blocks of a matrix wider than 128 with cut-short last blocks."""
    from safetensors.torch import load_file, save_file

    from redline.interop.deepseek import dequantize_fp8
    from redline.training.checkpoint import load_for_inference
    from tests.interop_models import hf_folder
    from tests.test_interop import TOKENS, run_cli

    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' fp8 loader needs it
    original = hf_folder("deepseek_v3", tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    for name in list(weights):
        if ".layers." in name and name.endswith("proj.weight") or ".experts." in name and name.endswith("weight"):
            w = weights[name]
            scale = (w.abs().amax() / 448.0).reshape(1, 1)
            weights[name] = (w / scale).to(torch.float8_e4m3fn)
            weights[name + "_scale_inv"] = scale
    assert sum(n.endswith("_scale_inv") for n in weights) > 10
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
        assert (hf(TOKENS).logits - original(TOKENS).logits).abs().max() > 1e-3  # the fp8 rounding is there
    # a 200 x 300 matrix: scales (2, 3), the last row and column blocks 72 and 44 wide
    w = torch.randn(200, 300).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 3) + 0.5
    expected = w.float().clone()
    for i, rows in enumerate((slice(0, 128), slice(128, 200))):
        for j, cols in enumerate((slice(0, 128), slice(128, 256), slice(256, 300))):
            expected[rows, cols] *= scale[i, j]
    assert torch.equal(dequantize_fp8(w, scale), expected)


def test_multi_token_prediction_layers_are_left_out(tmp_path, capsys):
    """A Hub checkpoint's layer past the last (DeepSeek-V3's num_nextn_predict_layers) is no part of the causal LM,
    as transformers leaves it out: the import takes the rest with the same logits."""
    from safetensors.torch import load_file, save_file

    from redline.training.checkpoint import load_for_inference
    from tests.interop_models import hf_folder
    from tests.test_interop import TOKENS, run_cli

    hf = hf_folder("deepseek_v3-dense", tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    weights["model.layers.2.eh_proj.weight"] = torch.zeros(64, 128)
    weights["model.layers.2.self_attn.kv_b_proj.weight"] = torch.zeros(112, 16)
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, changes, fragment", [
    ("deepseek_v3", dict(attention_bias=True), "attention_bias=true"),
    ("deepseek_v3", dict(num_key_value_heads=2), "num_key_value_heads=2 with num_attention_heads=4"),
    ("deepseek_v3", dict(moe_layer_freq=2), "moe_layer_freq=2"),
    ("deepseek_v3", dict(v_head_dim=32), "v_head_dim=32 wider than"),
    ("deepseek_v3", dict(n_shared_experts=0), "n_shared_experts=0"),
    ("deepseek_v2", dict(topk_method="group_limited_greedy", n_group=4, topk_group=2),
     "topk_method='group_limited_greedy'"),
])
def test_import_refusals_name_the_option(name, changes, fragment):
    hf = {k: v for k, v in HUB_V3.items() if k not in ("quantization_config", "rope_scaling")}
    with pytest.raises(UserError) as e:
        _families()[name].model_config({**hf, "model_type": name, **changes})
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_export_dispatch_and_refusals():
    """Latent attention exports as DeepSeek-V3 (sigmoid scores or dense), DeepSeek-V2 (softmax experts taken as they
    are), Mistral 4 (softmax experts rescaled or grouped) or A.X-K1 (normed mixture outputs); group
    routing without it (or GLM-4-MoE's, dots.llm1's or Nemotron-H's layout) is refused naming them; what neither holds is refused by name."""
    assert export_family(MLA).name == "deepseek_v3" and export_family(MLA_MOE).name == "deepseek_v3"
    assert export_family(MLA_V2).name == "deepseek_v2"
    # softmax scores rescaled or chosen within groups: Mistral 4's router (deepseek_kin.py)
    assert export_family(replace(MLA_V2, moe_norm_topk=True)).name == "mistral4"
    assert export_family(MLA_MISTRAL4).name == "mistral4" and export_family(MLA_AXK1).name == "axk1"
    plain = ModelConfig(n_layer=2, n_embd=64, n_head=4, moe_experts=4, moe_groups=2, moe_gating="sigmoid")
    for cfg, fragment in [
        (plain, "dots.llm1, the architecture with them, has Qwen3's QK-norm"),  # whole heads, sigmoid scores
        (replace(plain, moe_gating="softmax"), "only DeepSeek-V3 (latent attention, model.kv_lora_rank), GLM-4-MoE"),
        (replace(MLA_MOE, moe_norm_eps=0.0), "DeepSeek-V3 adds 1e-20 to their sum"),
        (replace(MLA, sliding_window=8), "windows, soft caps, sinks"),
        (replace(MLA, attn_scale=0.5), "model.attn_scale=0.5 with latent attention"),
        (replace(MLA_MOE, moe_shared_gate=True), "an ungated shared expert"),
        (replace(MLA_V2, moe_expert_bias=True), "DeepSeek-V2's router takes the top k of the softmax as they are"),
    ]:
        with pytest.raises(UserError) as e:
            export_family(cfg)
        assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_mlp_adapters_are_refused_for_peft(tmp_path, capsys):
    """PEFT moves gate_proj / up_proj / down_proj adapters onto transformers' DeepSeek experts: refused by name
    (the attention's adapters export: tests/test_lora_export.py)."""
    pytest.importorskip("peft")
    from tests.test_lora_export import export, lora_run

    _, ckpt = lora_run(tmp_path, "DeepseekV3ForCausalLM", targets=("attn.*", "mlp.*"))
    assert export(str(ckpt), "--adapter", str(tmp_path / "a")) == 2
    err = capsys.readouterr().err
    assert "would be a gate_proj, up_proj or down_proj adapter" in err and "DeepseekV3ForCausalLM" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "a").exists()


@CONFIGS
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step(cfg):
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones."""
    torch.manual_seed(0)
    cfg = replace(cfg, n_embd=128, vocab_size=512, context_len=128)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[0].attn.kv_b.weight)


@pytest.fixture(scope="module")
def imported_v3(tmp_path_factory):
    from tests.test_interop_commands import Imported

    return Imported("deepseek_v3", tmp_path_factory.mktemp("deepseek_v3"))


@pytest.mark.slow
def test_train_init_from_resumes_and_exports(imported_v3, tmp_path, capsys):
    """`redline train --init-from` an imported DeepSeek-V3 (latent attention, group-routed experts): the first step's
    loss is transformers', --resume goes on, and the trained run exports back with its logits (the check
    tests/test_interop_commands.py runs on a Llama and a GPT-2)."""
    from tests import test_interop_commands as commands

    commands.test_train_init_from_starts_at_the_imported_models_loss_resumes_and_exports(imported_v3, tmp_path, capsys)


@pytest.mark.slow
def test_generate_greedy_equals_transformers(imported_v3, capsys):
    """`redline generate --temperature 0` on the imported checkpoint: transformers' greedy tokens, stopping at the
    model's EOS ids."""
    from tests import test_interop_commands as commands

    commands.test_generate_greedy_equals_transformers_and_stops_at_the_models_eos(imported_v3, capsys)
