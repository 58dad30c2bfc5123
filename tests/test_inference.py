"""The KV-cache engine on CPU: greedy output token-for-token equal to the full-recompute forward (MHA, GQA, MQA,
learned positions, sliding window, post-norm, batches of different lengths), sampling, stop tokens and strings,
streaming text, and the generate / chat / bench-infer commands with their bad-input errors."""

import io
import json
from dataclasses import replace
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from redline import cli
from redline.config import TrainConfig, to_dict
from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams, naive_generate, sample_next
from redline.inference.engine import length_bucket
from redline.inference.sampling import apply_repetition_penalty, filter_top_p
from redline.inference.text import IncrementalText, TextGenerator
from redline.model import GPT, ModelConfig

BASE = ModelConfig(vocab_size=100, context_len=64, n_layer=2, n_embd=64, n_head=4, n_kv_head=4)
ARCHITECTURES = {
    "mha": {},
    "gqa": {"n_kv_head": 2},
    "mqa": {"n_kv_head": 1},
    "gpt2-style": {"pos_emb": "learned", "norm": "layernorm", "mlp": "gelu", "bias": True, "tie_embeddings": True},
    "sliding-window": {"n_kv_head": 2, "sliding_window": 6},
    "post-norm-qknorm-unfused": {"n_kv_head": 2, "norm_position": "post", "qk_norm": True, "fused_qkv": False},
    "no-positions-relu2": {"pos_emb": "none", "mlp": "relu2", "n_kv_head": 1},
    # nanochat's: weightless norms (the kernels' norms with no weight, the QK-norm's by ones), one on the embeddings
    "nanochat-style": {"norm_affine": False, "embed_norm": True, "qk_norm": True, "mlp": "relu2", "n_kv_head": 2,
                       "logit_softcap": 15.0},
    # YaRN's cos/sin tables are scaled by its attention factor (not unit length): every RoPE path must use them as given
    # OLMo 2's block: norms on the sublayers' outputs, QK-norm over the whole q and k projections
    "olmo2-style": {"n_kv_head": 2, "norm_position": "output", "qk_norm": True, "qk_norm_scope": "all"},
    # Gemma 3's block: sandwich norms scaling by 1 + weight, GeGLU, scaled embeddings and scores, a windowed layer
    # with its own RoPE base before a full one with YaRN's tables
    "gemma3-style": {"n_kv_head": 2, "head_size": 32, "norm_position": "sandwich", "norm_unit_offset": True,
                     "qk_norm": True, "mlp": "geglu", "embed_scale": True, "attn_scale": 0.1, "sliding_window": 6,
                     "sliding_window_pattern": 2, "rope_local_theta": 1000.0, "rope_scaling": "yarn",
                     "rope_factor": 4.0, "rope_original_context": 32, "tie_embeddings": True},
    # GPT-NeoX's (Pythia's) block: attention and MLP side by side, RoPE on 6 of each head's 16 dimensions, exact GELU
    "neox-style": {"norm": "layernorm", "mlp": "gelu", "bias": True, "parallel_residual": True, "rope_dims": 6,
                   "gelu_approximate": "none"},
    # Phi's: one LayerNorm feeding both sublayers, RoPE on half of each head, a bias on the head
    "phi-style": {"norm": "layernorm", "mlp": "gelu", "bias": True, "parallel_residual": True,
                  "parallel_shared_norm": True, "head_bias": True, "rope_dims": 8, "n_kv_head": 2},
    # Gemma 2's: Gemma 3's block without QK-norm, the attention scores soft-capped (low, so the cap bites)
    "gemma2-style": {"n_kv_head": 2, "norm_position": "sandwich", "norm_unit_offset": True, "mlp": "geglu",
                     "embed_scale": True, "attn_scale": 0.2, "attn_softcap": 1.5, "sliding_window": 6,
                     "sliding_window_pattern": 2, "logit_softcap": 20.0, "tie_embeddings": True},
    # Granite's: its embedding, residual, score and logit scalars
    "granite-style": {"n_kv_head": 2, "embed_multiplier": 3.0, "residual_multiplier": 0.5, "attn_scale": 0.2,
                      "logit_divisor": 2.0},
    # SmolLM3's: layer 1 of 2 without RoPE (its attention position-free)
    "smollm3-style": {"n_kv_head": 2, "nope_interval": 2},
    # OPT's: learned positions, LayerNorm, a ReLU MLP, biases, tied
    "opt-style": {"pos_emb": "learned", "norm": "layernorm", "mlp": "relu", "bias": True, "tie_embeddings": True},
    # Phi-4-mini's: RoPE on 12 of 16 dimensions, LongRoPE's per-pair factors and scaled tables
    "phi4-style": {"n_kv_head": 2, "rope_dims": 12, "rope_scaling": "longrope", "rope_factor": 4.0,
                   "rope_pair_factors": (1.0, 1.5, 2.0, 2.5, 3.0, 3.5), "rope_original_context": 256},
    # EXAONE 4.0's hybrid: output norms, QK-norm per head, windowed rotating layers and a full one without RoPE
    "exaone4-style": {"n_kv_head": 2, "norm_position": "output", "qk_norm": True, "sliding_window": 6,
                      "sliding_window_pattern": 2, "nope_interval": 2},
    # Phi-3.5-mini's: LongRoPE on whole heads, which the fused decode block runs from the model's tables
    "phi35-style": {"n_kv_head": 2, "rope_scaling": "longrope", "rope_factor": 32.0, "rope_original_context": 256,
                    "rope_pair_factors": (1.0, 1.2, 1.5, 2.0, 2.6, 3.3, 4.1, 5.0)},
    # Hunyuan's: QK-norm after RoPE
    "hunyuan-style": {"n_kv_head": 2, "qk_norm": True, "qk_norm_after_rope": True},
    "yarn-qknorm": {"n_kv_head": 2, "qk_norm": True, "rope_theta": 500.0, "rope_scaling": "yarn", "rope_factor": 4.0,
                    "rope_original_context": 32},
    # GPT-OSS's attention: sink logits in the softmax (the matmul decode path and the prefill's plain products),
    # biases on q/k/v/o, windowed and full layers in turn
    "gpt-oss-style": {"n_kv_head": 2, "attn_sinks": True, "bias": True, "sliding_window": 6,
                      "sliding_window_pattern": 2},
    # Granite SWA's: sinks, the full layer first (window_layers) and a RoPE base per layer, none on the full one
    "granite-swa-style": {"n_layer": 3, "n_kv_head": 2, "attn_sinks": True, "sliding_window": 6,
                          "window_layers": (1, 2), "rope_layer_theta": (0.0, 500.0, 10000.0), "attn_scale": 0.2,
                          "residual_multiplier": 0.5},
    # LFM3's: a short convolution, a full layer with proportional RoPE, a windowed one with its own base, sigmoid
    # gates on the heads, norms on the sublayers' outputs
    "lfm3-style": {"n_layer": 3, "conv_layers": (0,), "qk_norm": True, "n_kv_head": 2, "attn_gate": "head",
                   "norm_position": "sandwich", "sliding_window": 6, "window_layers": (2,), "rope_local_theta": 500.0,
                   "rope_scaling": "proportional", "rope_proportion": 0.5, "rope_factor": 2.0},
    # Qwen3.5's: gated delta nets (a recurrent state a row, the convolution's inputs in slots) around a full layer
    # whose heads are gated element-wise, RoPE on half of each head, norms by 1 + weight
    "qwen3.5-style": {"n_layer": 3, "delta_layers": (0, 2), "delta_heads": 4, "delta_key_heads": 2,
                      "delta_key_dim": 8, "delta_value_dim": 8, "attn_gate": "element", "qk_norm": True,
                      "norm_unit_offset": True, "rope_dims": 8, "n_kv_head": 2},
    # OLMo Hybrid's: gated delta nets in pre-norm blocks (β up to 2) around OLMo 3's output-norm attention
    "olmo-hybrid-style": {"n_layer": 3, "delta_layers": (0, 2), "delta_heads": 4, "delta_key_heads": 2,
                          "delta_key_dim": 8, "delta_value_dim": 16, "delta_norm_position": "pre",
                          "delta_beta_scale": 2.0, "norm_position": "output", "qk_norm": True, "qk_norm_scope": "all",
                          "n_kv_head": 2},
    # Granite 4.0's hybrid: Mamba-2 layers (the convolution's x, B and C in slots, an (N, P) state a row) around
    # attention without positions, Granite's scalars
    "granite-hybrid-style": {"n_layer": 3, "delta_layers": (0, 2), "delta_rule": "mamba2", "delta_heads": 4,
                             "delta_key_heads": 2, "delta_key_dim": 8, "delta_value_dim": 16,
                             "delta_conv_bias": True, "pos_emb": "none", "n_kv_head": 2, "residual_multiplier": 0.5},
    # Qwen3-Next's (Qwen3.5-MoE's with a dense first layer): Qwen3.5's layers, top 2 of 4 experts and a gated shared
    # expert after the first
    "qwen3-next-style": {"n_layer": 3, "delta_layers": (0, 2), "delta_heads": 4, "delta_key_heads": 2,
                         "delta_key_dim": 8, "delta_value_dim": 8, "attn_gate": "element", "qk_norm": True,
                         "norm_unit_offset": True, "rope_dims": 8, "n_kv_head": 2, "moe_experts": 4, "moe_top_k": 2,
                         "mlp_hidden": 32, "moe_shared_hidden": 48, "moe_dense_layers": 1, "moe_dense_hidden": 64},
    # Nemotron-H's: blocks of one sublayer each, Mamba-2 (M), an MLP alone (-), attention without positions (*):
    # the pattern M-*M-, dt floored at time_step_min
    "nemotron-h-style": {"n_layer": 5, "delta_layers": (0, 3), "delta_rule": "mamba2", "delta_heads": 4,
                         "delta_key_heads": 2, "delta_key_dim": 8, "delta_value_dim": 16, "delta_conv_bias": True,
                         "delta_dt_min": 0.001, "mlp_free_layers": (0, 2, 3), "mixer_free_layers": (1, 4),
                         "pos_emb": "none", "mlp": "relu2", "n_kv_head": 2},
    # Falcon-H1's: every layer Mamba-2 beside RoPE attention on the same normed input (a KV cache and the mixer's
    # convolution inputs and state a layer), the mixer's output normed before its gate
    "falcon-h1-style": {"n_layer": 2, "delta_layers": (0, 1), "delta_rule": "mamba2", "delta_parallel": True,
                        "delta_heads": 4, "delta_key_heads": 2, "delta_key_dim": 8, "delta_value_dim": 16,
                        "delta_conv_bias": True, "delta_gate_norm": "before_gate", "n_kv_head": 2},
    # ALiBi: a bias by distance on every head's scores, no position table; 6 heads (not a power of two: the
    # interleaved extra slopes), GQA, windowed and full layers in turn
    "alibi": {"pos_emb": "alibi", "n_head": 6, "head_size": 16, "n_kv_head": 2, "sliding_window": 6,
              "sliding_window_pattern": 2},
    # BLOOM's: ALiBi, a LayerNorm on the embeddings, pre-LayerNorm blocks with biases, tanh-GELU, tied
    "bloom-style": {"pos_emb": "alibi", "embed_norm": True, "norm": "layernorm", "mlp": "gelu", "bias": True,
                    "tie_embeddings": True},
    # Mamba-2's: Mamba-2 mixers alone, no attention and no MLP
    "mamba2-style": {"n_layer": 2, "delta_layers": (0, 1), "delta_rule": "mamba2", "delta_heads": 4,
                     "delta_key_heads": 2, "delta_key_dim": 8, "delta_value_dim": 16, "delta_conv_bias": True,
                     "mlp_free_layers": (0, 1), "pos_emb": "none"},
    # Mamba's: Mamba-1 mixers alone (an inner width of 128 channels a slot, an (I, N) state a row), biases on the
    # convolution and projections, tied
    "mamba1-style": {"n_layer": 2, "delta_layers": (0, 1), "delta_rule": "mamba1", "delta_heads": 128,
                     "delta_key_heads": 1, "delta_key_dim": 8, "delta_value_dim": 1, "delta_conv_bias": True,
                     "delta_proj_bias": True, "mlp_free_layers": (0, 1), "pos_emb": "none", "tie_embeddings": True},
    # Falcon-Mamba's: Mamba-1 mixers alone with RMS norms without weights on dt, B and C, an untied head
    "falcon-mamba-style": {"n_layer": 2, "delta_layers": (0, 1), "delta_rule": "mamba1", "delta_heads": 128,
                           "delta_key_heads": 1, "delta_key_dim": 8, "delta_value_dim": 1, "delta_conv_bias": True,
                           "delta_bcdt_norm_eps": 1e-6, "mlp_free_layers": (0, 1), "pos_emb": "none"},
    # Jamba's: Mamba-1 mixers (weighted dt, B and C norms) with attention without positions on layer 2 (GQA), each
    # followed by an MLP: top 2 of 4 experts, unrenormalized, on layers 1 and 3, a dense SwiGLU on the others
    "jamba-style": {"n_layer": 4, "delta_layers": (0, 1, 3), "delta_rule": "mamba1", "delta_heads": 128,
                    "delta_key_heads": 1, "delta_key_dim": 8, "delta_value_dim": 1, "delta_bcdt_norm_eps": 1e-6,
                    "delta_bcdt_norm_weight": True, "pos_emb": "none", "n_kv_head": 2, "moe_experts": 4,
                    "moe_top_k": 2, "moe_norm_topk": False, "mlp_hidden": 32, "moe_layers": (1, 3)},
}
PROMPTS = [[5, 6, 7, 8, 9], [42], list(range(10, 33)), [3, 1, 4, 1, 5, 9, 2, 6]]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(replace(BASE, **overrides))


def reference_greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    """The plain full-recompute loop of the model itself, one prompt at a time, no padding."""
    out = model.generate(torch.tensor([prompt], device=next(model.parameters()).device), n, temperature=0.0)
    return out[0, len(prompt):].tolist()


# ----------------------------------------------------------------------------------------------------
# greedy equality with the full forward


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_greedy_matches_full_forward_batched(arch):
    # fp64 so that equality does not hinge on near-ties between random logits on a particular BLAS
    model = tiny_model(**ARCHITECTURES[arch])
    engine = InferenceEngine(model, dtype=torch.float64)
    n = 24  # longer than the sliding window, prompts end at different offsets
    results = engine.generate(PROMPTS, n)
    for prompt, res in zip(PROMPTS, results):
        ref = reference_greedy(model, prompt, n)
        assert res.tokens == ref, (arch, prompt)
        assert res.finish_reason == "length" and res.prompt_tokens == len(prompt)
    assert len({tuple(r.tokens) for r in results}) > 1  # rows really differ: padding did not leak across rows
    single = engine.generate([PROMPTS[2]], n)[0].tokens  # batch of one, same answer
    assert single == results[2].tokens


def test_greedy_with_attention_sinks_matches_full_forward():
    """Sinks large enough to take much of a head (init leaves them at zero): the engine's prefill (plain products,
    prompts padded to a batch) and decode (the matmul path's extra denominator term) against the full forward."""
    model = tiny_model(**ARCHITECTURES["gpt-oss-style"])
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sinks.copy_(torch.tensor([-2.0, 1.0, 3.0, 5.0]))
        model.lm_head.weight.mul_(30)  # logits spread apart, so a changed attention changes the tokens
    results = InferenceEngine(model, dtype=torch.float64, compile=False).generate(PROMPTS, 24)
    for prompt, res in zip(PROMPTS, results):
        assert res.tokens == reference_greedy(model, prompt, 24), prompt
    # teacher-forced: every decode step's log-probabilities, not only the argmax, are the full forward's
    tokens = torch.randint(0, 100, (2, 30), generator=torch.Generator().manual_seed(1))
    scored, _ = InferenceEngine(model, dtype=torch.float64, compile=False).score(tokens, 10)
    full = torch.log_softmax(model(tokens[:, :-1])[:, 9:].float(), -1).gather(2, tokens[:, 10:, None])[..., 0]
    torch.testing.assert_close(scored, full, atol=1e-4, rtol=1e-4)


def test_options_are_checked_where_they_cannot_run():
    with pytest.raises(UserError, match="triton runs on CUDA GPUs only"):
        InferenceEngine(tiny_model(), decode_attention="triton")
    with pytest.raises(UserError, match="decode_attention must be one of auto, matmul, triton"):
        InferenceEngine(tiny_model(), decode_attention="flex")
    # auto picks the Triton kernel only for a step compiled for a GPU
    assert InferenceEngine(tiny_model(), compile=True).describe()["decode_attention"] == "matmul"
    with pytest.raises(UserError, match="decode_linear triton runs on CUDA GPUs only"):
        InferenceEngine(tiny_model(), decode_linear="triton")
    with pytest.raises(UserError, match="decode_linear must be one of auto, torch, triton"):
        InferenceEngine(tiny_model(), decode_linear="cublas")
    assert InferenceEngine(tiny_model(), compile=True).describe()["decode_linear"] == "torch"  # auto on a CPU
    # the attention kernel has no soft-cap of the scores (Gemma 2's): refused by name, before any machine check
    with pytest.raises(UserError, match="no soft-cap of the scores"):
        InferenceEngine(tiny_model(**ARCHITECTURES["gemma2-style"]), decode_attention="triton")
    with pytest.raises(UserError, match="no sink logits"):
        InferenceEngine(tiny_model(**ARCHITECTURES["gpt-oss-style"]), decode_attention="triton")
    with pytest.raises(UserError, match=r"no ALiBi bias to its scores \(model.pos_emb=alibi\)"):
        InferenceEngine(tiny_model(**ARCHITECTURES["alibi"]), decode_attention="triton")


@pytest.mark.parametrize("arch, fragment", [("post-norm-qknorm-unfused", "needs pre-norm blocks"),
                                            ("olmo2-style", "needs pre-norm blocks"),
                                            ("gemma3-style", "needs pre-norm blocks"),
                                            ("neox-style", "model.parallel_residual"),
                                            ("opt-style", "no fused relu activation"),
                                            ("mha", None), ("gpt2-style", None), ("no-positions-relu2", None)])
def test_fused_block_architectures(arch, fragment):
    """Which architectures the fused decode block computes (it fuses each norm into the next product)."""
    from redline.inference.kernels.fused_block import unsupported

    cfg = tiny_model(**ARCHITECTURES[arch]).cfg
    assert (unsupported(cfg) is None) if fragment is None else fragment in unsupported(cfg)
    assert "fused qkv" in unsupported(replace(cfg, fused_qkv=False, norm_position="pre"))
    assert "model.fused_mlp" in unsupported(replace(cfg, mlp="swiglu", fused_mlp=False, fused_qkv=True,
                                                    norm_position="pre"))
    assert "no fused geglu activation" in unsupported(replace(BASE, mlp="geglu"))
    assert "model.norm_unit_offset" in unsupported(replace(BASE, norm_unit_offset=True))
    assert "gelu_approximate=none" in unsupported(replace(BASE, mlp="gelu", gelu_approximate="none"))
    # what the attention kernel's prologue cannot compute from the raw projection the block hands it
    for options, name in (({"qk_norm": True, "qk_norm_scope": "all"}, "qk_norm_scope=all"),
                          ({"rope_dims": 8}, "model.rope_dims"),
                          ({"sliding_window": 4, "rope_local_theta": 1e3}, "model.rope_local_theta"),
                          ({"value_embeddings": 1}, "model.value_embeddings"),
                          ({"nope_interval": 2}, "model.nope_interval")):
        assert name in unsupported(replace(BASE, **options)), options
    assert unsupported(replace(BASE, sliding_window=4, sliding_window_pattern=2, attn_scale=0.1)) is None
    assert "model.residual_multiplier" in unsupported(replace(BASE, residual_multiplier=0.5))
    assert unsupported(replace(BASE, embed_multiplier=2.0, logit_divisor=3.0)) is None  # the step's inputs and head


def test_fused_block_accounts_for_every_model_field():
    """A new ModelConfig field must be decided on in kernels/fused_block.py (handled, or refused by unsupported()),
    or the fused decode path could silently compute another model than redline/model.py."""
    import dataclasses

    from redline.inference.kernels.fused_block import FIELDS_ACCOUNTED

    assert {f.name for f in dataclasses.fields(ModelConfig)} == set(FIELDS_ACCOUNTED)


def test_engine_leaves_the_callers_model_alone():
    model = tiny_model(n_kv_head=2)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    engine = InferenceEngine(model, dtype=torch.float64)
    engine.generate(PROMPTS, 8)
    assert engine.model is not model and model.training
    # the engine's own copy stays in eval mode, so no call walks its modules to switch modes (a serving batch calls
    # the engine once per group of decode steps)
    assert not engine.model.training
    calls = []
    engine.model.train = lambda mode=True: calls.append(mode)
    engine.generate(PROMPTS, 4)
    assert calls == []
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    same = InferenceEngine(model, dtype=torch.float32)  # already in the dtype: no copy, mode restored after a call
    same.generate(PROMPTS[:1], 4)
    assert same.model is model and model.training


def test_greedy_matches_in_fp32_default_dtype():
    model = tiny_model(n_kv_head=2)
    with torch.no_grad():  # sharpen the logits so that fp32 rounding cannot flip a near-tie
        model.lm_head.weight.mul_(30)
    engine = InferenceEngine(model)
    assert engine.dtype == torch.float32
    results = engine.generate(PROMPTS, 20)
    assert [r.tokens for r in results] == [reference_greedy(model, p, 20) for p in PROMPTS]


@pytest.mark.parametrize("pos_emb", ["rope", "alibi"])
def test_bucketed_prefill_and_chunked_rows_match(pos_emb):
    """The GPU path pads prompts up to a length bucket and prefills rows in chunks; check both on CPU, eagerly.
    alibi: each span's bias reaches back into the cached spans by slot distance."""
    model = tiny_model(n_kv_head=2, sliding_window=9, context_len=128, pos_emb=pos_emb)
    refs = [reference_greedy(model, p, 48) for p in PROMPTS]
    engine = InferenceEngine(model, dtype=torch.float64, prefill_chunk_tokens=40)
    # bucketed lengths, capacity and widths as compiling has them; the block functions stay eager
    engine.plan = replace(engine.plan, compile=True)
    results = engine.generate(PROMPTS, 48)  # crosses a width boundary (64) during decoding
    assert engine._state.cache.capacity == length_bucket(23 + 48) == 96
    assert [r.tokens for r in results] == refs
    # a prompt longer than the chunk goes through in spans, each attending to the cached spans before it
    spans = InferenceEngine(model, dtype=torch.float64, prefill_chunk_tokens=5)
    assert [r.tokens for r in spans.generate(PROMPTS, 48)] == refs


def test_naive_loop_matches_engine():
    model = tiny_model(n_kv_head=1)
    engine = InferenceEngine(model, dtype=torch.float64)
    prompts = torch.tensor([[1, 2, 3, 4], [9, 8, 7, 6]])
    naive, timings = naive_generate(model, prompts, 12)
    assert naive.tolist() == [r.tokens for r in engine.generate(prompts.tolist(), 12)]
    assert timings.steps == 12 and timings.total_s > 0


def test_cache_stores_only_kv_heads():
    for kv in (4, 2, 1):
        engine = InferenceEngine(tiny_model(n_kv_head=kv))
        engine.generate([[1, 2, 3]], 4)
        k = engine._state.cache.k[0]
        assert k.shape == (1, kv, 3 + 4 + 1, BASE.head_dim)  # prompt, new tokens, one spare slot
        assert engine.kv_bytes_per_token() == 2 * BASE.n_layer * kv * BASE.head_dim * 4
        assert engine.kv_cache_bytes == engine.kv_bytes_per_token() * 8


def test_length_bucket():
    sizes = (1, 16, 17, 25, 33, 100, 512, 513, 769)
    assert [length_bucket(n) for n in sizes] == [16, 16, 24, 32, 48, 128, 512, 768, 1024]


# ----------------------------------------------------------------------------------------------------
# sampling, stops


def test_sampling_seeded_and_filters():
    model = tiny_model()
    engine = InferenceEngine(model)
    hot = SamplingParams(temperature=1.5, seed=7)
    a = engine.generate(PROMPTS, 12, hot)
    b = engine.generate(PROMPTS, 12, hot)
    c = engine.generate(PROMPTS, 12, replace(hot, seed=8))
    assert [r.tokens for r in a] == [r.tokens for r in b]
    assert [r.tokens for r in a] != [r.tokens for r in c]
    greedy = [r.tokens for r in engine.generate(PROMPTS, 12)]
    for narrow in (SamplingParams(temperature=1.0, top_k=1, seed=1),
                   SamplingParams(temperature=1.0, top_p=1e-6, seed=1)):
        assert [r.tokens for r in engine.generate(PROMPTS, 12, narrow)] == greedy


ROW_PARAMS = [SamplingParams(temperature=0.7, seed=5), SamplingParams(temperature=1.3, top_p=0.5),
              SamplingParams(temperature=1.0, top_k=3, seed=9), SamplingParams(temperature=0.9, top_k=40, top_p=0.9),
              SamplingParams(temperature=2.0, top_k=1000)]  # top_k above the vocabulary: off


def test_row_sampler_filters_each_row_as_sample_next_does():
    """RowSampler's distributions, rows picked from a batch in any order, each with its own temperature, top-k and
    top-p: those of sample_next's transforms applied to the row alone."""
    from redline.inference.sampling import RowSampler, filter_top_k

    torch.manual_seed(0)
    logits = torch.randn(7, 300) * 3
    rows = [4, 0, 6, 2, 5]
    sampler = RowSampler(rows, ROW_PARAMS, [None] * len(rows), torch.Generator(), torch.device("cpu"))
    got = sampler.probabilities(logits)
    for i, (row, params) in enumerate(zip(rows, ROW_PARAMS)):
        x = filter_top_p(filter_top_k(logits[row:row + 1] / params.temperature, params.top_k or 0), params.top_p)
        torch.testing.assert_close(got[i:i + 1], F.softmax(x, dim=-1), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="greedy"):
        RowSampler([0], [SamplingParams()], [None], None, torch.device("cpu"))


def test_row_sampler_seeded_rows_do_not_depend_on_the_others_and_draw_as_multinomial():
    """A seeded row draws from its own generator: the same tokens among other rows as alone, and (on a CPU, where
    both divide by the temperature) the tokens sample_next draws for it alone. The rows without a seed share one
    generator; what they draw follows their distributions, never a token that top-k or top-p removed."""
    from redline.inference.sampling import RowSampler, make_generator

    torch.manual_seed(1)
    steps = [torch.randn(7, 50) * 2 for _ in range(6)]
    rows = [4, 0, 6, 2, 5]
    together = RowSampler(rows, ROW_PARAMS, [make_generator(p, torch.device("cpu")) if p.seed is not None else None
                                             for p in ROW_PARAMS], torch.Generator().manual_seed(3),
                          torch.device("cpu"))
    drawn = torch.stack([together.sample(logits) for logits in steps])  # (steps, R)
    for i in (0, 2):  # the seeded rows, each alone, and through sample_next
        alone = RowSampler([rows[i]], [ROW_PARAMS[i]], [make_generator(ROW_PARAMS[i], torch.device("cpu"))], None,
                           torch.device("cpu"))
        assert [int(alone.sample(logits)[0]) for logits in steps] == drawn[:, i].tolist()
        generator = make_generator(ROW_PARAMS[i], torch.device("cpu"))
        assert [int(sample_next(logits[rows[i]:rows[i] + 1], ROW_PARAMS[i], generator)) for logits in steps] \
            == drawn[:, i].tolist()

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_k=2),
              SamplingParams(temperature=1.0, top_p=0.7)]
    shared = RowSampler([0, 0, 0], params, [None] * 3, torch.Generator().manual_seed(0), torch.device("cpu"))
    draws = torch.stack([shared.sample(logits) for _ in range(4000)])  # (4000, 3)
    counts = torch.stack([torch.bincount(draws[:, j], minlength=4) for j in range(3)]).float() / 4000
    torch.testing.assert_close(counts[0], torch.tensor([0.5, 0.3, 0.15, 0.05]), rtol=0, atol=0.03)
    torch.testing.assert_close(counts[1], torch.tensor([0.625, 0.375, 0.0, 0.0]), rtol=0, atol=0.03)
    assert counts[1, 2:].sum() == 0 and counts[2, 2:].sum() == 0  # top-p 0.7 keeps 0.5 and 0.3 only
    torch.testing.assert_close(counts[2], torch.tensor([0.625, 0.375, 0.0, 0.0]), rtol=0, atol=0.03)


def test_draw_rows_is_the_row_samplers_draw_for_every_row_at_once():
    """draw_rows (the draw captured with a decode step): each row's token is RowSampler's for the same noise, a row
    at temperature 0 takes the argmax, and top-p never lets through a token it removed."""
    from redline.inference.sampling import RowSampler, draw_rows

    torch.manual_seed(2)
    logits = torch.randn(4, 60) * 2
    params = [SamplingParams(temperature=0.7, seed=1), SamplingParams(), SamplingParams(temperature=1.4, top_p=0.5,
              seed=2), SamplingParams(temperature=1.0, seed=3)]
    temperature = torch.tensor([[p.temperature] for p in params])
    top_p = torch.tensor([[p.top_p if p.top_p < 1 else float("inf")] for p in params])
    noise = torch.empty(4, 60)
    for row, p in enumerate(params):
        noise[row].exponential_(1, generator=torch.Generator().manual_seed(p.seed or 0))
    drawn = draw_rows(logits, temperature, top_p, noise)
    assert int(drawn[1]) == int(logits[1].argmax())
    sampled = [0, 2, 3]
    sampler = RowSampler(sampled, [params[r] for r in sampled],
                         [torch.Generator().manual_seed(params[r].seed) for r in sampled], None, torch.device("cpu"))
    assert sampler.sample(logits).tolist() == drawn[sampled].tolist()
    kept = torch.isfinite(filter_top_p(logits[2:3] / 1.4, 0.5))[0]
    for seed in range(200):
        noise[2].exponential_(1, generator=torch.Generator().manual_seed(seed))
        assert kept[draw_rows(logits, temperature, top_p, noise)[2]]


def test_top_p_and_repetition_penalty_math():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(filter_top_p(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_top_p(logits, 0.4)).tolist() == [[True, False, False, False]]
    raw = torch.tensor([[2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False]])
    assert apply_repetition_penalty(raw, seen, 2.0).tolist() == [[1.0, -4.0, 1.0]]
    # the penalty turns greedy away from the seen token
    assert sample_next(torch.tensor([[2.0, 1.5]]), SamplingParams(repetition_penalty=2.0), None,
                       torch.tensor([[True, False]])).item() == 1


def test_repetition_penalty_in_engine_avoids_repeats():
    model = tiny_model(n_kv_head=2)
    engine = InferenceEngine(model)
    plain = engine.generate([[1, 2, 3]], 30)[0].tokens
    assert len(set(plain)) < len(plain)  # a random model loops
    penalised = engine.generate([[1, 2, 3]], 30, SamplingParams(repetition_penalty=1e6))[0].tokens
    assert len(set(penalised)) > len(set(plain))


def test_stop_tokens_end_rows_separately():
    model = tiny_model(n_kv_head=2)
    engine = InferenceEngine(model, dtype=torch.float64)
    refs = [reference_greedy(model, p, 16) for p in PROMPTS]
    stop = refs[0][3]
    results = engine.generate(PROMPTS, 16, stop_tokens=[stop])
    for ref, res in zip(refs, results):
        if stop in ref:
            assert res.tokens == ref[: ref.index(stop)] and res.finish_reason == "stop_token"
        else:
            assert res.tokens == ref and res.finish_reason == "length"
    seen = []
    engine.generate([PROMPTS[1]], 16, on_tokens=lambda row, ids: seen.extend(ids) or len(seen) >= 5)
    assert seen == refs[1][:5]  # the callback saw every token as it came, and ended the row


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_stop_tokens_with_captured_greedy_steps():
    """On a GPU the greedy step records its tokens and advances the slot inside its CUDA graph, and the host
    reads each chunk a chunk late: rows still end at their stop token exactly (what ran past it is dropped),
    chunk sizes that do not divide the length included, and the next call starts clean."""
    model = tiny_model(context_len=160, n_kv_head=2).cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    refs = [reference_greedy(model, p, 40) for p in PROMPTS]
    engine = InferenceEngine(model, dtype=torch.float32)
    for stop, sync_every in [(refs[0][3], 4), (refs[2][17], 3), (refs[1][30], None)]:
        results = engine.generate(PROMPTS, 40, stop_tokens=[stop], sync_every=sync_every)
        for ref, res in zip(refs, results):
            if stop in ref:
                assert res.tokens == ref[: ref.index(stop)] and res.finish_reason == "stop_token"
            else:
                assert res.tokens == ref and res.finish_reason == "length"
    assert [r.tokens for r in engine.generate(PROMPTS, 40, sync_every=7)] == refs


@pytest.mark.parametrize("params, fragment", [
    (SamplingParams(temperature=-0.1), "temperature must be >= 0"),
    (SamplingParams(temperature=1.0, top_p=0.0), "top_p must be in (0, 1]"),
    (SamplingParams(temperature=1.0, top_p=1.5), "top_p must be in (0, 1]"),
    (SamplingParams(repetition_penalty=0.0), "repetition_penalty must be > 0"),
])
def test_bad_sampling_params(params, fragment):
    engine = InferenceEngine(tiny_model())
    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace("]", r"\]")):
        engine.generate([[1]], 2, params)


@pytest.mark.parametrize("prompts, n, fragment", [
    ([[]], 4, "prompt 0 is empty"),
    ([[1] * 60], 8, "exceeds the model's context_len 64"),
    ([[1]], 64, "leaves no room for a prompt"),
    ([[1, 100]], 4, "outside the model's vocabulary"),
])
def test_bad_prompts(prompts, n, fragment):
    with pytest.raises(UserError, match=fragment):
        InferenceEngine(tiny_model()).generate(prompts, n)


def test_cuda_graphs_on_cpu_is_refused():
    with pytest.raises(UserError, match="CUDA graphs need a CUDA device"):
        InferenceEngine(tiny_model(), cuda_graphs=True)


# ----------------------------------------------------------------------------------------------------
# text: streaming, stop strings, truncation


class CharTokenizer:
    """Each token is one byte; multi-byte characters span several tokens (like the bytes tokenizer)."""
    vocab_size, eot_id = 257, 256

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def test_incremental_text_holds_back_partial_chars_and_stop_strings():
    dec = IncrementalText(CharTokenizer(), stop_strings=["END"])
    pieces = [dec.add(list(chunk)) for chunk in (b"caf", b"\xc3", b"\xa9 E", b"N", b"D more")]
    assert pieces == ["caf", "", "é ", "", ""]  # "é" waits for its second byte, "EN" might start "END"
    assert dec.stopped and dec.final_text() == "café " and dec.final_tokens == len("café END more".encode())
    dec = IncrementalText(CharTokenizer(), stop_strings=["END"])
    assert dec.add(list(b"an E")) == "an " and dec.finish() == "E"


def test_text_generator_stop_strings_streaming_and_truncation():
    torch.manual_seed(0)
    model = GPT(replace(BASE, vocab_size=257, context_len=48))
    gen = TextGenerator(InferenceEngine(model, dtype=torch.float64), CharTokenizer())
    full = gen.generate(["hello", "a"], 20, stop_at_eot=False)
    assert [c.finish_reason for c in full] == ["length", "length"]
    target = full[0].text
    stop = target[4:6]
    streamed = []
    cut = gen.generate(["hello", "a"], 20, stop_strings=[stop], stop_at_eot=False,
                       on_text=lambda row, t: streamed.append((row, t)))
    assert cut[0].text == target[: target.index(stop)] and cut[0].finish_reason == "stop"
    assert "".join(t for row, t in streamed if row == 0) == cut[0].text
    assert "".join(t for row, t in streamed if row == 1) == cut[1].text
    with pytest.raises(UserError, match="--truncate"):
        gen.encode_prompt("x" * 40, 10)
    ids, truncated = gen.encode_prompt("abc" + "x" * 40, 10, truncate=True)
    assert truncated and len(ids) == 38 and ids[-1] == ord("x")
    with pytest.raises(UserError, match="--prepend-eot"):
        gen.encode_prompt("", 10)
    assert gen.encode_prompt("", 10, prepend_eot=True)[0] == [256]


# ----------------------------------------------------------------------------------------------------
# the commands


def run_cli(argv, capsys, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from redline.tokenizer import load_tokenizer
    from redline.training.checkpoint import save_checkpoint

    torch.manual_seed(0)
    cfg = TrainConfig(model=replace(BASE, vocab_size=257, context_len=96, n_kv_head=2))
    model = GPT(cfg.model)
    run = tmp_path_factory.mktemp("run")
    return str(save_checkpoint(run, 1, model, {}, to_dict(cfg), load_tokenizer("bytes"), keep=1))


def test_generate_jsonl_greedy_matches_engine(checkpoint, capsys, tmp_path):
    code, out, err = run_cli(["generate", "--checkpoint", checkpoint, "--prompt", "Hello", "a b",
                              "--temperature", "0", "--max-new-tokens", "12", "--jsonl", "-", "--no-stop-at-eot"],
                             capsys)
    assert code == 0, err
    records = [json.loads(line) for line in out.strip().splitlines()]
    assert [r["prompt"] for r in records] == ["Hello", "a b"]
    from redline.training.checkpoint import load_for_inference

    model, tok, _ = load_for_inference(checkpoint)
    for r in records:
        ids = tok.encode(r["prompt"])
        assert tok.decode(reference_greedy(model, ids, 12)) == r["completion"]
        assert r["completion_tokens"] == 12 and r["finish_reason"] == "length"
    assert "tokens/s" in err


def test_generate_streams_prompts_from_stdin_and_file(checkpoint, capsys, monkeypatch, tmp_path):
    code, out, err = run_cli(["generate", "--checkpoint", checkpoint, "--max-new-tokens", "5", "--seed", "3"],
                             capsys, stdin="first prompt\n\nsecond\n", monkeypatch=monkeypatch)
    assert code == 0, err
    assert out.startswith("first prompt") and "\n---\nsecond" in out
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "multi\nline"}) + "\n")
    out_file = tmp_path / "o.jsonl"
    code, out, err = run_cli(["generate", "--checkpoint", checkpoint, "--prompt-file", str(prompts),
                              "--stream", "False", "--max-new-tokens", "4", "--jsonl", str(out_file)], capsys)
    assert code == 0, err
    assert out.startswith("multi\nline")
    assert json.loads(out_file.read_text())["prompt"] == "multi\nline"


@pytest.mark.parametrize("extra, fragment", [
    (["--prompt", "x" * 90], "exceeds the model's context_len 96"),
    (["--prompt", ""], "prompt 0 is empty"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature must be >= 0"),
    (["--prompt", "hi", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["--prompt", "hi", "--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--prompt", "hi", "--cuda-graphs", "on", "--device", "cpu"], "--cuda-graphs on needs a CUDA GPU"),
    (["--prompt", "hi", "--max-new-tokens", "96"], "leaves no room"),
])
def test_generate_bad_input(checkpoint, capsys, extra, fragment):
    code, _, err = run_cli(["generate", "--checkpoint", checkpoint, "--max-new-tokens", "10", *extra], capsys)
    assert code == 2
    assert fragment in err and len(err.strip().splitlines()) == 1


def test_generate_truncates_when_asked(checkpoint, capsys):
    code, out, err = run_cli(["generate", "--checkpoint", checkpoint, "--prompt", "y" * 95, "--truncate",
                              "--max-new-tokens", "6", "--jsonl", "-"], capsys)
    assert code == 0, err
    record = json.loads(out)
    assert record["prompt_truncated"] and record["prompt_tokens"] == 90
    assert "cut from the left" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_device_cuda_without_gpu(checkpoint, capsys):
    code, _, err = run_cli(["generate", "--checkpoint", checkpoint, "--prompt", "hi", "--device", "cuda"], capsys)
    assert code == 2 and "no CUDA GPU is visible" in err


def test_tokenizer_of_another_identity_is_refused(checkpoint, capsys, tmp_path):
    from redline.tokenizer import train_bpe

    other = train_bpe(["some text to learn a few merges from, again and again"] * 20, vocab_size=270)
    other.save(tmp_path / "tok")
    code, _, err = run_cli(["generate", "--checkpoint", checkpoint, "--prompt", "hi",
                            "--tokenizer", str(tmp_path / "tok")], capsys)
    assert code == 2 and "is not the tokenizer checkpoint" in err
    code, _, err = run_cli(["generate", "--checkpoint", checkpoint, "--prompt", "hi", "--tokenizer", "bytes",
                              "--max-new-tokens", "3"], capsys)
    assert code == 0, err  # the same identity is fine


def test_chat_keeps_history_within_context(checkpoint, capsys, monkeypatch):
    long_message = "z" * 60
    code, out, err = run_cli(["chat", "--checkpoint", checkpoint, "--max-new-tokens", "20", "--seed", "1"],
                             capsys, stdin=f"hello there\n{long_message}\n/reset\nagain\n/exit\nnever read\n",
                             monkeypatch=monkeypatch)
    assert code == 0, err
    assert "dropped the 1 oldest turn" in err and "conversation forgotten" in err
    assert len(out.splitlines()) >= 3  # three replies, each ended by a newline


def test_chat_default_reply_length_fits_a_short_context(checkpoint, capsys, monkeypatch):
    """The default reply length (256) is cut to half of a shorter context (this model's 96, tiny's 256), so chat
    runs on a small model as the quick start trains it; an explicit length that leaves no room is still refused."""
    code, out, err = run_cli(["chat", "--checkpoint", checkpoint, "--seed", "1"], capsys, stdin="hello\n/exit\n",
                             monkeypatch=monkeypatch)
    assert code == 0, err
    code, _, err = run_cli(["chat", "--checkpoint", checkpoint, "--max-new-tokens", "96"], capsys, stdin="hi\n",
                           monkeypatch=monkeypatch)
    assert code == 2 and "max_new_tokens=96 leaves no room" in err


def test_bench_infer_tiny_preset(capsys):
    code, out, err = run_cli(["bench-infer", "--preset", "tiny", "--batch-sizes", "1", "2", "--prompt-lens", "16",
                              "--max-new-tokens", "8", "--repeats", "1"], capsys)
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    rows = {(r["method"], r["batch"]): r for r in summary["results"]}
    assert rows[("naive", 1)]["status"] == "ok" and rows[("eager", 2)]["status"] == "ok"
    assert rows[("naive", 2)]["status"].startswith("skipped")
    assert rows[("eager", 1)]["speedup_vs_naive"] > 0 and rows[("eager", 1)]["ttft_ms"] > 0
    assert rows[("eager", 2)]["kv_cache_mib"] > 0
    assert "naive (no cache)" in out


def test_bench_infer_profile_writes_traces(capsys, tmp_path):
    trace = tmp_path / "prof" / "decode.json.gz"
    code, out, err = run_cli(["bench-infer", "--preset", "tiny", "--batch-sizes", "1", "2", "--prompt-lens", "16",
                              "--max-new-tokens", "6", "--repeats", "1", "--methods", "eager",
                              "--profile", str(trace)], capsys)
    assert code == 0, err
    profiles = json.loads(out.strip().splitlines()[-1])["profiles"]
    assert [p["batch"] for p in profiles] == [1, 2] and all(p["steps"] == 5 for p in profiles)
    for p in profiles:
        assert p["total_ms_per_step"] > 0 and p["kernels_per_step"] > 10  # every block's operators, per token
        assert p["groups_ms_per_step"]["gemm"] > 0 and p["top"]
    assert sorted(f.name for f in trace.parent.iterdir()) == ["decode-b1.json.gz", "decode-b2.json.gz"]
    assert ("kernels per token" if torch.cuda.is_available() else "operators per token") in out


@pytest.mark.parametrize("argv, fragment", [
    (["bench-infer", "--preset", "tiny", "--profile", "trace.txt"], "ending in .json or .json.gz"),
    (["bench-infer"], "exactly one of --checkpoint"),
    (["bench-infer", "--preset", "nope"], "unknown preset"),
    (["bench-infer", "--preset", "tiny", "--cuda-graphs", "on", "--device", "cpu"], "needs a CUDA GPU"),
    (["bench-infer", "--preset", "tiny", "--decode-attention", "triton", "--device", "cpu"],
     "triton runs on CUDA GPUs only"),
    (["bench-infer", "--preset", "tiny", "--decode-linear", "triton", "--device", "cpu"],
     "decode_linear triton runs on CUDA GPUs only"),
    (["bench-infer", "--preset", "tiny", "--kv-cache-dtype", "fp4"], "--kv-cache-dtype"),
])
def test_bench_infer_bad_input(argv, fragment, capsys):
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and fragment in err


def test_quantize_kv_round_trip():
    """FP8 cache vectors: one scale per vector (its absolute maximum maps to 448), every element within e4m3's
    rounding of the original (3 mantissa bits: 2^-4 relative; below the normal range 2^-9 of the scale), a zero
    vector stays zero, and nothing overflows."""
    from redline.inference.cache import dequantize_kv, quantize_kv

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 50, 64, generator=gen) * torch.logspace(-6, 6, 50)[:, None]  # magnitudes far apart
    x[0, 0, 0] = 0.0
    x8, scale = quantize_kv(x)
    assert x8.dtype == torch.float8_e4m3fn and scale.shape == (3, 4, 50) and scale.dtype == torch.float32
    assert torch.equal(x8.float().abs().amax(-1), torch.full_like(scale, 448.0).index_put_((torch.tensor(0),) * 3,
                                                                                          torch.tensor(0.0)))
    back = dequantize_kv(x8, scale, torch.float32)
    bound = torch.maximum(x.abs() * 2**-4, scale[..., None] * 2**-9)
    assert ((back - x).abs() <= bound).all() and torch.isfinite(back).all()
    assert not back[0, 0, 0].any()


@pytest.mark.parametrize("arch", ["gqa", "gpt2-style", "sliding-window"])
def test_fp8_kv_cache_engine(arch):
    """kv_cache_dtype fp8 on the CPU: the cache holds exactly quantize_kv of what the model-dtype cache holds
    (prefill slots), its bytes are what kv_bytes_per_token says, and teacher-forced decoding through it stays
    close to the full forward (it is not equal: the cache is rounded)."""
    from redline.inference.cache import quantize_kv

    model = tiny_model(**ARCHITECTURES[arch])
    tokens = torch.randint(0, 100, (3, 40), generator=torch.Generator().manual_seed(1))
    plain, fp8 = InferenceEngine(model), InferenceEngine(model, kv_cache_dtype="fp8")
    assert fp8.describe()["kv_cache_dtype"] == "fp8"
    want, _ = plain.score(tokens, 20)
    got, picks = fp8.score(tokens, 20)
    for layer in range(model.cfg.n_layer):
        for buf, buf8, scales in ((plain._state.cache.k, fp8._state.cache.k, fp8._state.cache.scales[layer][0]),
                                  (plain._state.cache.v, fp8._state.cache.v, fp8._state.cache.scales[layer][1])):
            x8, scale = quantize_kv(buf[layer][:, :, :20])
            assert torch.equal(buf8[layer][:, :, :20].view(torch.uint8), x8.view(torch.uint8))
            assert torch.equal(scales[:, :, :20], scale)
    cache = fp8._state.cache
    assert cache.nbytes == fp8.kv_bytes_per_token() * 3 * (cache.capacity + 1)
    assert fp8.kv_bytes_per_token() == 2 * 2 * model.cfg.kv_heads * (16 + 4)  # 2 layers, head_dim 16, fp32 scales
    full = torch.log_softmax(model(tokens[:, :-1])[:, 19:].float(), -1).gather(2, tokens[:, 20:, None])[..., 0]
    torch.testing.assert_close(want, full, atol=1e-5, rtol=1e-5)  # the model-dtype cache is the full forward
    assert not torch.equal(got, want) and (got - want).abs().max() < 0.05
    assert picks.shape == (3, 20)
    with pytest.raises(UserError, match="kv_cache_dtype must be one of"):
        InferenceEngine(model, kv_cache_dtype="int4")


def test_chunked_argmax_is_argmax():
    """The greedy step's argmax in spans (up to batch 64): the same index as argmax, ties to the first maximum
    included, across spans and inside one, for lengths that are no multiple of the spans."""
    from redline.inference.steps import chunked_argmax

    gen = torch.Generator().manual_seed(0)
    for V in (50257, 32768, 100, 65):
        logits = torch.randn(3, V, generator=gen)
        logits[1, [7, V - 2]] = 50.0  # a tie in different spans
        logits[2, [V - 3, V - 2]] = 50.0  # a tie in one span (or adjacent ones)
        assert torch.equal(chunked_argmax(logits), logits.argmax(dim=-1))
        assert torch.equal(chunked_argmax(logits, chunks=7), logits.argmax(dim=-1))
    assert chunked_argmax(torch.full((1, 10), -1.0)).item() == 0  # all equal: the first


# ----------------------------------------------------------------------------------------------------
def test_past_the_prefill_graph_limit_shapes_go_without_a_graph_and_it_is_said_once(capsys):
    """DecodeBatch's rule for graphed prefills, on a state that claims CUDA graphs: a known shape replays, a new one
    is captured until PREFILL_GRAPHS are held; past it, new shapes run without a graph, reported once on stderr."""
    from redline.inference.batch import PREFILL_GRAPHS, PREFILL_WIDTH_STEP, DecodeBatch

    batch = DecodeBatch(InferenceEngine(tiny_model(context_len=160)), rows=2, capacity=160)
    st = batch.state
    st.graphs = object()  # the rule reads only whether graphs exist and which shapes are held
    try:
        assert batch._graph_width(2, 20) == PREFILL_WIDTH_STEP  # a new shape, room for it
        st.prefill_inputs.update({("prefill", 3, 8 * i, 3): None for i in range(PREFILL_GRAPHS)})  # others held
        assert batch._graph_width(1, 20, start=3) == 0 and batch._graph_width(2, 40, start=5) == 0  # new ones
        st.prefill_inputs[("prefill", 2, 32, 0)] = None
        assert batch._graph_width(2, 20) == PREFILL_WIDTH_STEP  # a held shape still replays
    finally:
        st.graphs = None
    assert capsys.readouterr().err.count(f"{PREFILL_GRAPHS} prompt shapes") == 1


# GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("window", [0, 9])
def test_prefill_graphs_write_and_return_what_the_plain_prefill_does(window):
    """DecodeBatch.prefill_many through a CUDA graph per (rows, padded width): the logits and the cache rows equal
    those of the plain prefill (fp32, the same compiled blocks), on capture and on a replay with other prompts and
    rows; other rows' caches untouched."""
    from redline.inference.batch import DecodeBatch

    model = tiny_model(n_kv_head=2, sliding_window=window, context_len=160).cuda()
    graphed = DecodeBatch(InferenceEngine(model, dtype=torch.float32), rows=6, capacity=160)
    plain = DecodeBatch(InferenceEngine(model, dtype=torch.float32, cuda_graphs=False), rows=6, capacity=160)
    for b in (graphed, plain):
        b.state.cache.k[0].fill_(7.0)  # a row no prefill touches keeps it
    def prompt(start: int, n: int) -> list[int]:
        return [(start + 7 * j) % 60 + 1 for j in range(n)]

    for rows, prompts in (([4, 1], [prompt(0, 20), prompt(3, 12)]), ([0, 5], [prompt(5, 25), prompt(9, 30)]),
                          ([3], [prompt(2, 40)])):
        want = plain.prefill_many(rows, prompts)
        got = graphed.prefill_many(rows, prompts)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for r, p in zip(rows, prompts):
            for layer in range(model.cfg.n_layer):
                for a, b in ((graphed.state.cache.k, plain.state.cache.k), (graphed.state.cache.v, plain.state.cache.v)):
                    torch.testing.assert_close(a[layer][r, :, :len(p)], b[layer][r, :, :len(p)], rtol=1e-5, atol=1e-5)
    assert graphed.engine.prefill_graphs(graphed.state) == 2  # (2 rows, 32 wide) captured once, replayed; (1, 64)
    assert (graphed.state.cache.k[0][2] == 7.0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("group_steps", [0, 4])
def test_admitting_and_decoding_rows_never_wait_for_the_device(group_steps):
    """What a server does between groups of decode steps (prefill free rows, greedy or in spans, start them, decode
    a group, free the rows that ended) makes no call that waits for the device (torch's sync debug mode raises on
    one): a wait there drains the queued decode steps and idles the GPU while the host launches the next ones."""
    from redline.inference.batch import DecodeBatch

    model = tiny_model(n_kv_head=2, context_len=160).cuda()
    batch = DecodeBatch(InferenceEngine(model), rows=4, capacity=160, group_steps=group_steps)

    def turn(rows: list[int]) -> None:
        logits = batch.prefill_many(rows[:2], [[1 + r] * 20 for r in rows[:2]])
        first = batch.prefill(rows[2], [5] * 12)
        first = batch.prefill(rows[2], [6] * 8, start=12)
        for i, r in enumerate(rows[:2]):
            batch.start(r, logits[i].argmax(), 20)
        batch.start(rows[2], first.argmax(), 20)
        batch.decode_greedy(4, {1: [rows[0]], 3: [rows[1]]})
        batch.decode_greedy(4, {3: [rows[2]]})

    turn([0, 1, 2])  # compiles and captures every shape the turn uses
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:  # other rows through the graphed prefill and the decode steps; the spans' compiled prefill specialises on
        turn([3, 1, 2])  # its row (a slice), so the same one (a recompilation would wait for the device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert not any(batch.busy)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("impl, tuning", [("matmul", False), ("matmul", True), ("triton", False), ("triton", True)])
def test_compiled_cuda_graph_engine_matches_full_forward(impl, tuning):
    model = tiny_model(n_kv_head=2, sliding_window=9, context_len=160).cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    refs = [reference_greedy(model, p, 72) for p in PROMPTS]
    engine = InferenceEngine(model, dtype=torch.float32, compile=True, cuda_graphs=True, decode_attention=impl,
                             kernel_tuning=tuning)
    for _ in range(2):  # the second call replays the captured graphs (widths 64 and 128)
        assert [r.tokens for r in engine.generate(PROMPTS, 72)] == refs
    assert [r.tokens for r in engine.generate(PROMPTS[:3], 30)] == [r[:30] for r in refs[:3]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch, impl", [(arch, impl) for arch in ("olmo2-style", "gemma3-style", "neox-style",
                                                                   "phi-style", "opt-style", "smollm3-style",
                                                                   "granite-style", "phi4-style", "exaone4-style",
                                                                   "hunyuan-style", "lfm3-style", "qwen3.5-style",
                                                                   "granite-hybrid-style", "falcon-h1-style")
                                        for impl in ("matmul", "triton")] + [("gemma2-style", "matmul"),
                                                                             ("gpt-oss-style", "matmul"),
                                                                             ("granite-swa-style", "matmul"),
                                                                             ("olmo-hybrid-style", "matmul"),
                                                                             ("qwen3-next-style", "matmul"),
                                                                             ("nemotron-h-style", "matmul"),
                                                                             ("mamba2-style", "matmul"),
                                                                             ("mamba1-style", "matmul"),
                                                                             ("falcon-mamba-style", "matmul"),
                                                                             ("jamba-style", "matmul"),
                                                                             ("alibi", "matmul"),
                                                                             ("bloom-style", "matmul")])
def test_compiled_cuda_graph_engine_runs_the_blocks_the_fused_block_refuses(arch, impl):
    """OLMo 2's, Gemma 3's, GPT-NeoX's, Phi's, OPT's, SmolLM3's, Granite's, Phi-4-mini's (partial RoPE with
    LongRoPE), EXAONE 4.0's, Hunyuan's (QK-norm after RoPE) and LFM3's (gated heads, two RoPE tables) blocks, which the fused decode block refuses, with
    either decode attention, and Gemma 2's capped scores, ALiBi's bias (alone and in BLOOM's block) and GPT-OSS's and Granite SWA's sinks (the latter with its
    windowed layers after a full one and a RoPE base per layer) with the matmul one (the kernel refuses both): compiled
    and captured, greedy equal to the full forward at batch 4 and 1 and on a replay. triton: q, k and v made in torch where the kernel's prologue cannot make them (OLMo 2's QK-norm
    over whole projections, Gemma 3's QK-norm and per-layer RoPE tables, partial RoPE, layers without RoPE), the
    score scale (Gemma 3's, Granite's) and each layer's window handed to the kernel; Gemma 3's windowed and full
    layers each attend as their own (prompts and generations longer than the window)."""
    model = tiny_model(context_len=160, **ARCHITECTURES[arch]).cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    refs = [reference_greedy(model, p, 72) for p in PROMPTS]
    engine = InferenceEngine(model, dtype=torch.float32, compile=True, cuda_graphs=True, decode_attention=impl)
    assert (engine.describe()["decode_attention"], engine.describe()["decode_linear"]) == (impl, "torch")
    for _ in range(2):  # the second call replays the captured graphs
        assert [r.tokens for r in engine.generate(PROMPTS, 72)] == refs
    assert engine.generate(PROMPTS[2:3], 72)[0].tokens == refs[2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch, hidden", [("gqa", None), ("gpt2-style", None), ("sliding-window", None),
                                          ("no-positions-relu2", None), ("gpt2-style", 2048), ("yarn-qknorm", None),
                                          ("phi35-style", None), ("nanochat-style", None)])
def test_matvec_decode_matches_full_forward(arch, hidden):
    """decode_linear triton: batch 1's blocks and head in redline's matrix-vector kernel (norms, biases,
    activations and residual adds fused), and batch 2's in its tiled kernel (the norms before it), compiled and
    captured, greedy equal to the full forward. hidden 2048: the MLP's second product is long enough in K for the
    batched kernel to split it (split-K, gemv_split)."""
    import redline.inference.kernels.linear as tg
    from redline.inference.kernels.launch import sm_count

    model = tiny_model(context_len=160, vocab_size=8200, mlp_hidden=hidden,  # argmax in spans too
                       **ARCHITECTURES[arch]).cuda()
    if hidden:
        assert tg.pick_row_blocks(2, model.cfg.n_embd, hidden, sm_count(torch.device("cuda")), 4)[-1] > 1
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    engine = InferenceEngine(model, dtype=torch.float32, compile=True, cuda_graphs=True, decode_attention="triton",
                             decode_linear="triton")
    assert engine.describe()["decode_linear"] == "triton"
    for p in PROMPTS:
        assert engine.generate([p], 72)[0].tokens == reference_greedy(model, p, 72)
    assert [r.tokens for r in engine.generate(PROMPTS[:2], 30)] == [reference_greedy(model, p, 30) for p in PROMPTS[:2]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernel_tuning_with_biases_matches_full_forward():
    """Kernel tuning on a model with biases, the batch-1 Linear layers left to PyTorch: greedy equal to the full
    forward at batch 1 and 4."""
    model = tiny_model(context_len=160, **ARCHITECTURES["gpt2-style"]).cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    refs = [reference_greedy(model, p, 40) for p in PROMPTS]
    engine = InferenceEngine(model, dtype=torch.float32, compile=True, cuda_graphs=True, kernel_tuning=True,
                             decode_linear="torch")
    assert [engine.generate([p], 40)[0].tokens for p in PROMPTS[:2]] == refs[:2]
    assert [r.tokens for r in engine.generate(PROMPTS, 40)] == refs


def decode_attention_reference(q, k, v, k_cache, v_cache, slot, width: int, window: int, eps: float,
                               q_norm=None, k_norm=None, cos=None, sin=None, scales=None, key_stored=None):
    """What torch.ops.redline.decode_attention computes, from the model's own pieces: QK-norm, RoPE, the cache
    write at each row's slot (slot: (B,)), then the masked-softmax attention in fp64. scales: an FP8 cache's
    (k_scale, v_scale), the new key and value stored with quantize_kv and the cache dequantised; key_stored: the
    (key, scale) at the slot to attend with instead of its own (the kernel's, whose QK-norm and RoPE may round
    apart, then to another e4m3 step). -> (out (B, H*D) fp64, k_cache, v_cache new copies (and the scales' new
    copies for FP8))."""
    from redline.inference.cache import cached_attention, dequantize_kv, quantize_kv
    from redline.model import apply_rope

    B, KV, _, D = k_cache.shape
    H = q.shape[1] // D
    rows = torch.arange(B, device=q.device)
    q, k, v = q.view(B, H, 1, D), k.view(B, KV, 1, D), v.view(B, KV, 1, D)
    if q_norm is not None:
        q, k = F.rms_norm(q, (D,), q_norm, eps), F.rms_norm(k, (D,), k_norm, eps)
    if cos is not None:
        rope = cos[:, None, None, :], sin[:, None, None, :]
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    if scales is None:
        k_cache[rows, :, slot], v_cache[rows, :, slot] = k[:, :, 0], v[:, :, 0]
        keys, values = k_cache[:, :, :width].double(), v_cache[:, :, :width].double()
    else:
        scales = [t.clone() for t in scales]
        (k_cache[rows, :, slot], scales[0][rows, :, slot]), (v_cache[rows, :, slot], scales[1][rows, :, slot]) = (
            quantize_kv(k[:, :, 0]), quantize_kv(v[:, :, 0]))
        attended, attended_scales = k_cache.clone(), scales[0].clone()
        if key_stored is not None:
            attended[rows, :, slot], attended_scales[rows, :, slot] = key_stored
        keys = dequantize_kv(attended[:, :, :width], attended_scales[:, :, :width], torch.float64)
        values = dequantize_kv(v_cache[:, :, :width], scales[1][:, :, :width], torch.float64)
    slots = torch.arange(width, device=q.device)
    mask = slots[None, :] <= slot[:, None]
    if window:
        mask &= slot[:, None] - slots[None, :] < window
    out = cached_attention(q.double(), keys, values, mask[:, None, None]).reshape(B, H * D)
    return (out, k_cache, v_cache) if scales is None else (out, k_cache, v_cache, *scales)


def row_slots(B: int, slot: int, gen) -> torch.Tensor:
    """Each row's slot on the GPU: the first row at `slot`, the others anywhere before it (rows of other lengths)."""
    slots = torch.randint(0, slot + 1, (B,), generator=gen)
    slots[0] = slot
    return slots.cuda()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B, H, KV, D", [(1, 12, 3, 64), (3, 12, 12, 64), (2, 25, 5, 64), (5, 4, 1, 32),
                                         (1, 16, 8, 128)])
@pytest.mark.parametrize("norm, rope", [(True, True), (False, False)])
def test_triton_decode_attention_matches_reference(B, H, KV, D, dtype, norm, rope):
    """Both kernels (split: spans of 16, 128 and the default, split_slots; -1: whole width) against the model's own QK-norm,
    RoPE and masked softmax: rows at slots of their own (spans past a row's slot left empty), a slot in the middle
    of a span, widths that are no multiple of the span, a sliding window. The cache slot is written, the rest left alone, and the
    split kernel's counters are zero again after each call."""
    import redline.inference.kernels.decode_attention as td

    gen = torch.Generator().manual_seed(B * 100 + H)
    S = 300
    for width, slot, window, split in [(300, 299, 0, 0), (256, 130, 0, 16), (64, 5, 0, -1), (300, 250, 37, 128),
                                       (200, 199, 1, -1), (300, 299, 0, -1), (300, 256, 0, -1), (300, 200, 70, -1)]:
        qkv = torch.randn(B, (H + 2 * KV) * D + 8, generator=gen).cuda().to(dtype)[:, 8:]  # a row stride of its own
        q, k, v = qkv.split([H * D, KV * D, KV * D], dim=1)
        k_cache, v_cache = (torch.randn(B, KV, S, D, generator=gen).cuda().to(dtype) for _ in range(2))
        slots = row_slots(B, slot, gen)
        weights = [(torch.rand(D, generator=gen) + 0.5).cuda().to(dtype) for _ in range(2)] if norm else [None] * 2
        angles = torch.rand(B, D // 2, generator=gen).cuda() * 6
        tables = [angles.cos(), angles.sin()] if rope else [None] * 2
        want, k_want, v_want = decode_attention_reference(q, k, v, k_cache, v_cache, slots, width, window, 1e-5,
                                                          *weights, *tables)
        counts = torch.zeros(max(td.counters_needed(KV), B * KV), dtype=torch.int32, device="cuda")
        got = torch.ops.redline.decode_attention(qkv, k_cache, v_cache, slots, counts, width, window, 1e-5,
                                                 *weights, *tables, split)
        tol = 2e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
        torch.testing.assert_close(k_cache, k_want, atol=tol, rtol=tol)  # one rounding apart in bf16 at most
        assert torch.equal(v_cache, v_want) and not counts.any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B, H, KV, D, norm", [(1, 12, 3, 64, True), (3, 12, 12, 64, False), (5, 4, 1, 32, True),
                                               (1, 16, 8, 128, True)])
def test_triton_decode_attention_fp8_cache(B, H, KV, D, norm, dtype):
    """An FP8 cache: both kernels against the dequantised reference; the new value is stored byte for byte as
    quantize_kv stores it, with its scale (the key too within one e4m3 step: the kernel's QK-norm and RoPE may
    round one ulp apart from the model's, which RoPE's differences can make an absolute error of one ulp of the
    vector's largest elements), and nothing else in the cache changes."""
    import redline.inference.kernels.decode_attention as td
    from redline.inference.cache import dequantize_kv, quantize_kv

    gen = torch.Generator().manual_seed(B * 100 + H)
    S = 300
    for width, slot, window, split in [(300, 299, 0, 0), (256, 130, 0, 16), (64, 5, 0, -1), (300, 250, 37, 128),
                                       (300, 299, 0, -1), (300, 256, 0, -1), (300, 200, 70, -1)]:
        qkv = torch.randn(B, (H + 2 * KV) * D + 8, generator=gen).cuda().to(dtype)[:, 8:]
        q, k, v = qkv.split([H * D, KV * D, KV * D], dim=1)
        (k_cache, k_scale), (v_cache, v_scale) = (quantize_kv(torch.randn(B, KV, S, D, generator=gen).cuda())
                                                  for _ in range(2))
        slots = row_slots(B, slot, gen)
        rows = torch.arange(B, device="cuda")
        weights = [(torch.rand(D, generator=gen) + 0.5).cuda().to(dtype) for _ in range(2)] if norm else [None] * 2
        angles = torch.rand(B, D // 2, generator=gen).cuda() * 6
        tables = [angles.cos(), angles.sin()] if norm else [None] * 2
        reference = partial(decode_attention_reference, q, k, v, k_cache, v_cache, slots, width, window, 1e-5,
                            *weights, *tables, scales=(k_scale, v_scale))
        _, k_want, v_want, ks_want, vs_want = reference()
        counts = torch.zeros(max(td.counters_needed(KV), B * KV), dtype=torch.int32, device="cuda")
        got = torch.ops.redline.decode_attention_fp8(qkv, k_cache, v_cache, k_scale, v_scale, slots, counts, width,
                                                     window, 1e-5, *weights, *tables, split)
        # attending with the kernel's key
        want = reference(key_stored=(k_cache[rows, :, slots], k_scale[rows, :, slots]))[0]
        tol = 2e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
        assert torch.equal(v_cache.view(torch.uint8), v_want.view(torch.uint8)) and torch.equal(v_scale, vs_want)
        torch.testing.assert_close(dequantize_kv(k_cache, k_scale, torch.float32),
                                   dequantize_kv(k_want, ks_want, torch.float32), atol=tol, rtol=2**-3)
        assert not counts.any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cache", ["model", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B, H, KV", [(3, 12, 3), (3, 12, 12)])
@pytest.mark.parametrize("factor", [3.0, 100.0])
def test_triton_decode_attention_scores_far_above_the_new_token(B, H, KV, factor, dtype, cache):
    """The whole-width kernel sums its softmax against the new token's score: a cached key that scores far above
    it (a copy of the query times `factor`: about 35 log2 units above, within the kernel's slack, and about 1,150,
    where it must run again against the largest score) gives the reference's output, with no overflow; the same
    key before the row's sliding window changes nothing."""
    import redline.inference.kernels.decode_attention as td
    from redline.inference.cache import quantize_kv

    D, S, width, slot = 64, 300, 300, 280
    gen = torch.Generator().manual_seed(H + int(factor))
    qkv = torch.randn(B, (H + 2 * KV) * D, generator=gen).cuda().to(dtype)
    q, k, v = qkv.split([H * D, KV * D, KV * D], dim=1)
    k_cache, v_cache = (torch.randn(B, KV, S, D, generator=gen).cuda() for _ in range(2))
    slots = torch.tensor([slot, slot - 30, slot - 7], device="cuda")
    window = 170  # row b attends to slots slot_b - 169..slot_b
    heads = q.float().view(B, H, D)[:, :: H // KV]  # each kv head's first query head
    k_cache[:, :, 150] = factor * heads  # attended by every row
    k_cache[1, :, 20] = 2 * factor * heads[1]  # before row 1's window: masked
    counts = torch.zeros(max(td.counters_needed(KV), B * KV), dtype=torch.int32, device="cuda")
    args = (slots, counts, width, window, 1e-5)
    rows = torch.arange(B, device="cuda")
    if cache == "fp8":
        (k8, k_scale), (v8, v_scale) = quantize_kv(k_cache), quantize_kv(v_cache)
        got = torch.ops.redline.decode_attention_fp8(qkv, k8, v8, k_scale, v_scale, *args, split=-1)
        want = decode_attention_reference(q, k, v, k8, v8, slots, width, window, 1e-5, scales=(k_scale, v_scale),
                                          key_stored=(k8[rows, :, slots], k_scale[rows, :, slots]))[0]
    else:
        k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
        want = decode_attention_reference(q, k, v, k_cache, v_cache, slots, width, window, 1e-5)[0]
        got = torch.ops.redline.decode_attention(qkv, k_cache, v_cache, *args, split=-1)
    assert got.isfinite().all()
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["gqa", "gpt2-style", "sliding-window"])
def test_fp8_cache_compiled_engine_matches_eager(arch):
    """An FP8 cache in the compiled, captured engine with redline's kernels (batch 1's matrix-vector path and the
    batched one) against the same cache in the plain eager engine: the same greedy tokens, and teacher-forced
    log-probabilities within float rounding."""
    model = tiny_model(context_len=160, **ARCHITECTURES[arch]).cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    fast = InferenceEngine(model, dtype=torch.float32, kv_cache_dtype="fp8")
    plain = InferenceEngine(model, dtype=torch.float32, compile=False, cuda_graphs=False, decode_attention="matmul",
                            decode_linear="torch", kv_cache_dtype="fp8")
    assert fast.describe()["decode_attention"] == "triton"
    assert [r.tokens for r in fast.generate(PROMPTS, 72)] == [r.tokens for r in plain.generate(PROMPTS, 72)]
    assert fast.generate(PROMPTS[:1], 40)[0].tokens == plain.generate(PROMPTS[:1], 40)[0].tokens
    tokens = torch.randint(0, 100, (2, 100), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(fast.score(tokens, 30)[0], plain.score(tokens, 30)[0], atol=1e-4, rtol=1e-4)


def gemv_reference(x, w, bias, residual, act, norm, norm_weight, norm_bias, eps):
    """What the gemv op computes, from the modules' own functions: the norm rounded to x's dtype as the module
    rounds it, the rest in fp64."""
    h = x
    if norm == "layernorm":
        h = F.layer_norm(x, (x.shape[1],), norm_weight, norm_bias, eps)
    elif norm == "rmsnorm":
        h = torch.nn.RMSNorm(x.shape[1], eps=eps, elementwise_affine=norm_weight is not None).to(x)
        if norm_weight is not None:
            h.weight.data.copy_(norm_weight)
        h = h(x)
    y = F.linear(h.double(), w.double(), None if bias is None else bias.double())
    if act == "gelu_tanh":
        y = F.gelu(y, approximate="tanh")
    elif act == "relu2":
        y = F.relu(y).square()
    elif act == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y if residual is None else y + residual.double()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M, N, K", [(1, 2304, 768), (1, 768, 3072), (2, 130, 300), (1, 50304, 64), (3, 17, 5),
                                     (1, 64, 9000), (64, 2304, 768), (70, 768, 3072), (17, 50304, 64)])
def test_triton_gemv_matches_reference(M, N, K, dtype):
    """act(norm(x)·Wᵀ + b) + r against the modules (fp64 product) for every epilogue and norm, a row stride of
    x's own, shapes that are no multiple of the tiles, a normed row too long for one tile (K 9000); one row (the
    matrix-vector kernel) and batches (the tiled one: 64 rows, rows over two row tiles, 17 rows)."""
    import redline.inference.kernels.linear  # noqa: F401  (registers torch.ops.redline.gemv)

    gen = torch.Generator().manual_seed(N + K)
    x = (torch.randn(M, K + 8, generator=gen) * 3 + 0.5).cuda().to(dtype)[:, 8:]
    w2 = (torch.randn(2 * N, K, generator=gen) / K**0.5).cuda().to(dtype)
    b2, r = torch.randn(2 * N, generator=gen).cuda().to(dtype), torch.randn(M, N, generator=gen).cuda().to(dtype)
    nw, nb = (torch.rand(K, generator=gen) + 0.5).cuda().to(dtype), torch.randn(K, generator=gen).cuda().to(dtype)
    w, b = w2[:N], b2[:N]
    for args in [(w, None, None, "none", "none", None, None), (w, b, None, "gelu_tanh", "none", None, None),
                 (w, b, r, "gelu_tanh", "layernorm", nw, nb), (w, None, r, "none", "layernorm", None, None),
                 (w, None, r, "relu2", "rmsnorm", nw, None), (w2, b2, None, "swiglu", "rmsnorm", None, None),
                 (w2, None, r, "swiglu", "rmsnorm", nw, None)]:
        want = gemv_reference(x, *args, 1e-5)
        got = torch.ops.redline.gemv(x, *args, 1e-5)
        assert got.dtype == dtype and got.shape == (M, N)
        # bf16: the kernel's norm statistics are summed in another order than the module's, so a normalised
        # element can round to the neighbouring bf16 value (measured: 0.033 at most over 855k outputs)
        tol = 1e-4 if dtype == torch.float32 else 5e-2
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M, N, K", [(64, 768, 3072), (64, 130, 1000), (17, 2304, 768), (2, 100, 3072),
                                     (17, 4200, 640)])
def test_triton_gemv_split_matches_reference(M, N, K, dtype):
    """Split-K: torch.ops.redline.gemv_split at the tiles it picks, and the batched kernel with 1, 2, 4 and 8 K
    splits forced at those column tiles (16, 32 and 64 columns; spans that do not divide K, N no multiple of the
    column tile; 64, 17 and 2 rows), against the modules (fp64 product) for the epilogues (bias, residual, GELU,
    ReLU², SwiGLU; a norm in the kernel too); the counters are zeros again after every call, and a second call
    gives the same bits."""
    import redline.inference.kernels.linear as tg
    from redline.inference.kernels.launch import sm_count

    gen = torch.Generator().manual_seed(M + N + K)
    x = (torch.randn(M, K + 8, generator=gen) * 3 + 0.5).cuda().to(dtype)[:, 8:]
    w2 = (torch.randn(2 * N, K, generator=gen) / K**0.5).cuda().to(dtype)
    b2, r = torch.randn(2 * N, generator=gen).cuda().to(dtype), torch.randn(M, N, generator=gen).cuda().to(dtype)
    nw, nb = (torch.rand(K, generator=gen) + 0.5).cuda().to(dtype), torch.randn(K, generator=gen).cuda().to(dtype)
    w, b = w2[:N], b2[:N]
    counts = torch.zeros(-(-M // 16) * -(-N // 16), dtype=torch.int32, device="cuda")  # (enough for any tiles)

    def check_twice(call, want, tol):
        got = call()
        assert got.dtype == dtype and got.shape == (M, N) and not counts.any()
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
        assert torch.equal(call(), got) and not counts.any()

    tol = 1e-4 if dtype == torch.float32 else 1e-2  # bf16: the output's rounding
    for args in [(w, None, None, "none"), (w, b, r, "gelu_tanh"), (w2, b2, r, "swiglu"), (w, None, r, "relu2")]:
        check_twice(lambda: torch.ops.redline.gemv_split(x, args[0], counts, *args[1:]),
                    gemv_reference(x, *args, "none", None, None, 0.0), tol)
    tiles = tg.pick_row_blocks(M, N, K, sm_count(x.device), x.element_size())[:5]
    for split in (1, 2, 4, 8):
        for weight, bias, residual, act, norm in [(w, b, r, "gelu_tanh", "none"), (w2, b2, r, "swiglu", "none"),
                                                  (w, b, None, "none", "layernorm")]:
            norm_args = (nw, nb) if norm != "none" else (None, None)

            def call():
                out = torch.empty(M, N, dtype=dtype, device="cuda")
                tg.launch_rows(x, weight, bias, residual, act, out, *tiles, split, counts, norm, *norm_args)
                return out

            # bf16 with the norm: test_triton_gemv_matches_reference's tolerance, for the same reason
            check_twice(call, gemv_reference(x, weight, bias, residual, act, norm, *norm_args, 1e-5),
                        5e-2 if norm != "none" and dtype == torch.bfloat16 else tol)


@pytest.mark.slow
def test_compiled_engine_on_cpu_matches_full_forward():
    """torch.compile'd blocks (the GPU code path without graphs): dynamic batch/length/width, one compilation."""
    from torch._dynamo.utils import counters

    model = tiny_model(n_kv_head=2, context_len=160)
    engine = InferenceEngine(model, dtype=torch.float64, compile=True)
    before = counters["stats"]["unique_graphs"]
    first = engine.generate(PROMPTS, 72)  # widths 64 and 128
    compiled = counters["stats"]["unique_graphs"]
    again = engine.generate(PROMPTS[:3], 30)  # another batch size and capacity: no new compilation
    assert [r.tokens for r in first] == [reference_greedy(model, p, 72) for p in PROMPTS]
    assert [r.tokens for r in again] == [r.tokens[:30] for r in first[:3]]
    # the decode step's three parts (embedding and mask, a block, the head with argmax) and the prefill block
    # (which an earlier test may have compiled already)
    assert compiled - before in (3, 4) and counters["stats"]["unique_graphs"] == compiled
    sampled = engine.generate(PROMPTS, 20, SamplingParams(temperature=0.8, top_k=5, seed=1))  # argmax left out
    assert counters["stats"]["unique_graphs"] == compiled + 1 and all(len(r.tokens) == 20 for r in sampled)


def test_decode_batch_rows_join_and_leave_with_the_same_greedy_tokens():
    """Continuous batching's engine side: rows prefilled, started and freed at different steps of one static batch
    (a prompt prefilled in spans too) decode exactly what each prompt decodes alone."""
    from redline.inference.batch import DecodeBatch

    model = tiny_model(n_kv_head=2, sliding_window=7)
    engine = InferenceEngine(model, dtype=torch.float64)
    n = 12
    refs = [reference_greedy(model, p, n) for p in PROMPTS]
    batch = DecodeBatch(engine, rows=3, capacity=48)
    got = {i: [] for i in range(len(PROMPTS))}
    where = {}  # row -> prompt index

    def admit(i, row, span=None):
        prompt = PROMPTS[i]
        if span is None:
            logits = batch.prefill(row, prompt)
        else:  # in spans of `span` tokens, each attending to the spans before it
            for s in range(0, len(prompt), span):
                logits = batch.prefill(row, prompt[s:s + span], start=s)
        first = int(logits.argmax())
        batch.start(row, first, len(prompt))
        got[i].append(first)
        where[row] = i

    admit(0, 0)
    admit(2, 2, span=5)
    for step in range(40):
        if step == 3:
            admit(1, 1)
        greedy = step % 2 == 0  # the in-graph argmax and the sampled path with advance() interleaved
        out = batch.step() if greedy else batch.step(greedy=False).argmax(-1)
        if not greedy:
            batch.advance(out)
        for row, i in list(where.items()):
            got[i].append(int(out[row]))
            if len(got[i]) == n:
                batch.free(row)
                del where[row]
                if i == 0:
                    admit(3, row)  # the freed row serves the next prompt
        if not where:
            break
    assert [got[i] for i in range(len(PROMPTS))] == refs


def test_engine_refuses_fused_products_that_would_skip_lora_adapters():
    """The triton products read each Linear's weight; a LoRA layer's update lives only in its forward."""
    model = tiny_model(n_kv_head=2)
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    linear.lora_A = torch.nn.Linear(linear.in_features, 2, bias=False)  # what marks a LoRA-adapted layer
    with pytest.raises(UserError, match="decode_linear=triton would skip the model's LoRA adapters"):
        InferenceEngine(model, decode_linear="triton")


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_decode_batch_prefill_many_equals_prefills_one_at_a_time(kv_cache_dtype):
    """Several free rows' whole prompts in one padded forward, rows out of order and not contiguous: the same logits
    and the same greedy continuations as prefilling each row alone (the padding's cache slots are never read)."""
    from redline.inference.batch import DecodeBatch

    model = tiny_model(n_kv_head=2)
    dtype = torch.float64 if kv_cache_dtype == "auto" else torch.float32
    rows, prompts, n = [3, 0, 2], [PROMPTS[2], PROMPTS[1], PROMPTS[3]], 10

    def run(together: bool):
        batch = DecodeBatch(InferenceEngine(model, dtype=dtype, kv_cache_dtype=kv_cache_dtype), rows=4, capacity=48)
        if together:
            logits = batch.prefill_many(rows, prompts)
        else:
            logits = torch.stack([batch.prefill(r, p) for r, p in zip(rows, prompts)])
        for r, p, t in zip(rows, prompts, logits.argmax(-1).tolist()):
            batch.start(r, t, len(p))
        steps = torch.stack([batch.step().clone() for _ in range(n)])  # (n, rows)
        return logits, steps[:, rows].t()

    (one, one_tokens), (many, many_tokens) = run(False), run(True)
    torch.testing.assert_close(many, one, rtol=1e-5, atol=1e-5)
    assert torch.equal(many_tokens, one_tokens)
    if kv_cache_dtype == "auto":
        refs = [reference_greedy(model, p, n + 1) for p in prompts]
        assert [[int(a)] + t for a, t in zip(many.argmax(-1), many_tokens.tolist())] == refs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_group_graphs_decode_and_free_rows_as_single_steps_do():
    """DecodeBatch(group_steps=4): each group of 4 greedy steps is one CUDA graph that also frees the rows ending
    inside it. The same tokens as the per-step graphs, rows ending mid-group included, and a freed row's cache is
    refilled by the next prompt as usual."""
    from redline.inference.batch import DecodeBatch

    model = tiny_model(n_kv_head=2, context_len=160).cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # no near-ties between the compiled step and the full forward
    budgets = [10, 7, 13, 5]  # tokens after the first: rows end at different steps of different groups

    def run(group_steps: int) -> list[list[int]]:
        engine = InferenceEngine(model, dtype=torch.float32, compile=True, cuda_graphs=True)
        batch = DecodeBatch(engine, rows=4, capacity=96, group_steps=group_steps)
        logits = batch.prefill_many([0, 1, 2, 3], PROMPTS)
        firsts = logits.argmax(-1).tolist()
        for row, (p, t) in enumerate(zip(PROMPTS, firsts)):
            batch.start(row, t, len(p))
        out, left = [[t] for t in firsts], list(budgets)
        while any(left):
            ends = {}
            for row, n in enumerate(left):
                if 0 < n <= 4:
                    ends.setdefault(n - 1, []).append(row)
            tokens = batch.decode_greedy(4, ends).t().tolist()  # (rows, 4)
            for row in range(4):
                take = min(4, left[row])
                out[row] += tokens[row][:take]
                left[row] -= take
        assert not any(batch.busy)
        return out

    grouped, single = run(4), run(0)
    assert grouped == single
    assert grouped == [reference_greedy(model, p, n + 1) for p, n in zip(PROMPTS, budgets)]


def test_a_gpu_prefill_leaves_cudnn_attention_out_when_the_model_leaves_the_choice():
    """cuDNN's SDPA builds an execution plan for each new shape (milliseconds of host time per layer): a serving
    batch's prefills come in every row count, so the engine's prefill asks for flash, efficient or math instead."""
    from redline.inference.engine import _prefill_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    with _prefill_attention(torch.device("cuda"), "auto"):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with _prefill_attention(torch.device("cuda"), "cudnn"):  # a backend the model names is the model's to keep
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with _prefill_attention(torch.device("cpu"), "auto"):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_decode_attention_tiles_fit_shared_memory():
    """The whole-width kernel's pipelined cache tiles fit a program's shared memory with room left (fewer stages,
    then narrower tiles), and the split kernel's span holds at most the same bytes (128 slots at most), with 8
    warps where it holds them all."""
    pytest.importorskip("triton")
    from redline.inference.kernels.decode_attention import SMEM_HEADROOM, fit_tile, split_slots, split_warps

    h100, a100 = 227 * 1024, 163 * 1024
    assert fit_tile(128, 3, 2 * 64 * 2, h100) == (128, 3)  # bf16, head_dim 64: the measured tile as it is
    assert fit_tile(128, 3, 2 * 128 * 2, h100) == (128, 3)
    assert fit_tile(128, 3, 2 * 128 * 2, a100) == (128, 2)  # 192 KiB of tiles do not fit the A100's 163
    assert fit_tile(128, 3, 2 * 128 * 4, h100) == (64, 2)  # fp32, head_dim 128: 384 KiB at the bf16 tile
    for smem in (h100, a100):
        for slot_bytes in (2 * 64 * 2, 2 * 128 * 2, 2 * 128 * 4, 2 * 256 * 4):
            block, stages = fit_tile(128, 3, slot_bytes, smem)
            assert block * stages * slot_bytes <= smem - SMEM_HEADROOM
    assert [split_slots(d, e) for d, e in [(64, 2), (128, 2), (64, 4), (128, 4), (512, 4)]] == [128, 128, 128, 64, 16]
    assert [split_warps(split_slots(d, e), d, e) for d, e in [(64, 2), (128, 2), (128, 4)]] == [4, 8, 8]


def test_model_sampling_defaults_and_their_precedence():
    from types import SimpleNamespace

    from redline.inference.sampling import model_sampling_defaults, sampling_from

    recommended = model_sampling_defaults({"temperature": 0.7, "top_k": 20.0, "top_p": 1.5, "repetition_penalty": True,
                                           "do_sample": False, "max_new_tokens": 9})
    assert recommended == {"temperature": 0.7, "top_k": 20}  # top_p out of range, a boolean penalty: not taken
    fallback = {"temperature": 0.8, "top_k": 50, "top_p": 0.95, "repetition_penalty": 1.1}
    options = SimpleNamespace(temperature=0.0, top_k=None, top_p=None, repetition_penalty=None, seed=4)
    params, taken = sampling_from(options, fallback, recommended)
    assert (params.temperature, params.top_k, params.top_p, params.repetition_penalty, params.seed) == \
        (0.0, 20, 0.95, 1.1, 4)
    assert taken == ["top_k"]
