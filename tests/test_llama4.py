"""Llama 4's layers in redline: chunked attention (model.attn_chunk) through training masks and the engine's prefill,
chunked prefill, decode and DecodeBatch; the NoPE layers' query temperature; weightless QK-norm after RoPE; experts
weighted on their input (model.moe_weight_input); the multimodal folder's text model; the refusals. Parity of
llama4_text folders with transformers is in tests/test_interop.py (the FAMILIES table)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.model import GPT, MLP, ModelConfig
from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_decode_batch_parks_rows, full_recompute

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# Llama 4's text model as redline holds it: chunks of 5 on the layers that rotate, layer 1 and 3 without RoPE (their
# queries' temperature stepping every 3 positions), weightless QK-norm, top-1 of 4 experts weighted on their input
# with an ungated shared expert on layers 1 and 3, dense SwiGLUs 48 wide on 0 and 2
LLAMA4 = ModelConfig(vocab_size=96, context_len=64, n_layer=4, n_embd=32, n_head=4, n_kv_head=2, mlp="swiglu",
                     mlp_hidden=16, rope_theta=500.0, nope_interval=2, attn_chunk=5, rope_qk_norm=True,
                     nope_temperature=0.5, nope_temperature_floor=3, moe_experts=4, moe_top_k=1,
                     moe_gating="sigmoid", moe_norm_topk=False, moe_shared_hidden=16, moe_shared_gate=False,
                     moe_weight_input=True, moe_layers=(1, 3), moe_dense_hidden=48)


def model_of(cfg: ModelConfig = LLAMA4) -> GPT:
    torch.manual_seed(0)
    model = GPT(cfg)
    with torch.no_grad():  # sharper logits than the init's, so greedy tokens do not tie
        model.lm_head.weight.mul_(20)
        for block in model.blocks:
            block.attn.proj.weight.mul_(20)
    return model.eval()


def test_chunk_mask_attends_within_chunks():
    """Query i sees key j <= i of its own chunk of 5 (transformers' create_chunked_causal_mask); a chunk as long as
    the sequence is plain causal attention."""
    model = GPT(replace(LLAMA4, n_layer=2, moe_layers=(1,)))
    mask = model.sliding_mask(12, "cpu", -5)
    i = torch.arange(12)
    assert torch.equal(mask, (i[:, None] >= i[None, :]) & (i[:, None] // 5 == i[None, :] // 5))
    assert model.sliding_mask(5, "cpu", -5) is None
    assert sorted(LLAMA4.windows) == [-5, 0] and [LLAMA4.layer_mask(i) for i in range(4)] == [-5, 0, -5, 0]


def test_experts_weight_their_input():
    """moe_weight_input: the shared expert plus each chosen expert of the token weighted by its sigmoid score on its
    input, as transformers' Llama4TextMoe computes it; not the same as weighting the output."""
    model = model_of()
    moe = model.blocks[1].mlp
    x = torch.randn(7, 32)
    with torch.no_grad():
        got = moe(x)
        scores = torch.sigmoid(moe.router(x))
        expected = moe.shared(x)
        for t in range(7):
            e = int(scores[t].argmax())
            h = moe.fc[e] @ (x[t] * scores[t, e])
            gate, up = h.chunk(2)
            expected[t] += moe.proj[e] @ (torch.nn.functional.silu(gate) * up)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        moe.weight_input = False
        assert (moe(x) - got).abs().max() > 0.05 * got.abs().max()


def test_temperature_scales_the_nope_layers_queries():
    """A NoPE layer's queries times 1 + 0.5 · ln(1 + floor((p + 1) / 3)); the layers that rotate are left as they
    are; without the temperature the logits move from position 2 on, and not before."""
    model = model_of()
    idx = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    plain = GPT(replace(LLAMA4, nope_temperature=0.0))
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        a, b = model(idx), plain.eval()(idx)
    torch.testing.assert_close(a[:, :2], b[:, :2])
    assert (a[:, 2:] - b[:, 2:]).abs().max() > 1e-3
    assert torch.allclose(model.nope_temperature[:6, 0], 1 + 0.5 * torch.log1p(torch.tensor([0., 0, 1, 1, 1, 2])))


@pytest.mark.parametrize("chunk", [32768, 4, 3])
def test_engine_decodes_as_full_recompute(chunk):
    """Prompts of different lengths in one batch, prefilled whole or in spans of `chunk` tokens (each attending to the
    cached slots of its chunk of 5 before it), then decoded one token at a time past several chunk boundaries."""
    model = model_of()
    prompts = [list(range(1, 12)), [5, 6], [40, 41, 42, 43, 44, 45, 46]]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
    got = [r.tokens for r in engine.generate(prompts, 12, SamplingParams(temperature=0))]
    assert got == [full_recompute(model, p, 12) for p in prompts]


def test_decode_batch_parks_rows():
    """A server's batch: a row decodes while another's prompt goes in over two spans, across a chunk boundary;
    every row's tokens are the full recompute's."""
    model = model_of()
    assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model, steps=6)


def test_training_reaches_every_weight():
    """The forward is differentiable through the chunked masks, the temperature, the QK-norm and the input-weighted
    experts: a loss's gradients reach every weight a token routes through."""
    model = model_of()
    model.train()
    idx = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    model(idx, idx).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters()
               if not n.endswith((".fc", ".proj")) or "mlp" not in n)
    assert any(b.mlp.fc.grad.abs().sum() > 0 for b in model.blocks if not isinstance(b.mlp, MLP))


def test_training_under_autocast_follows_fp32():
    """Under bf16 autocast (training's default), the input-weighted experts' bf16 products are summed into the fp32
    stream: the loss is fp32's within bf16 rounding."""
    model = model_of()
    model.train()
    idx = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    exact = model(idx, idx)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(idx, idx)
    loss.backward()
    torch.testing.assert_close(loss.float(), exact, rtol=2e-2, atol=2e-2)
    assert all(b.mlp.fc.grad is not None for b in model.blocks if not isinstance(b.mlp, MLP))


def test_multimodal_folder_reads_its_text_model(tmp_path, capsys):
    """A Llama4ForConditionalGeneration folder: its text model imported (the vision tower left unread), with the
    logits and greedy tokens of transformers' language model, and exported as Llama4ForCausalLM."""
    transformers = pytest.importorskip("transformers")
    from tests.interop_models import VOCAB, hf_folder
    from tests.test_interop import run_cli
    from redline.training.checkpoint import load_for_inference

    hf = hf_folder("llama4", tmp_path / "hf").language_model
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    tokens = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens).logits
        torch.testing.assert_close(model(tokens), expected, rtol=1e-5, atol=1e-5)
    prompt = tokens[0, :9].tolist()
    result = InferenceEngine(model, compile=False).generate([prompt], 10, SamplingParams(temperature=0))[0]
    hf.generation_config.eos_token_id = None
    reference = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert result.tokens == reference[0, len(prompt):].tolist()
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    back, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert type(back).__name__ == "Llama4ForCausalLM" and not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(tokens).logits, expected, rtol=1e-5, atol=1e-5)


def test_scout_shaped_config():
    """Llama 4 Scout's text_config values (its Llama 3 RoPE with both frequency factors 1, a 10M context, chunks of
    8192, RoPE left out of one layer in four, experts on every layer): the fields redline derives, valid as they are
    (the model itself, whose RoPE tables alone would take 5 GB at that context, is not built here)."""
    from redline.interop.llama4 import model_config

    scout = {"model_type": "llama4_text", "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
             "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
             "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 10485760, "rms_norm_eps": 1e-5,
             "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "use_qk_norm": True,
             "attention_chunk_size": 8192, "attn_temperature_tuning": 4, "floor_scale": 8192, "attn_scale": 0.1,
             "rope_theta": 500000.0, "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                                                      "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
    cfg = model_config({"model_type": "llama4", "text_config": scout})
    cfg.validate()
    assert (cfg.nope_interval, cfg.attn_chunk, cfg.rope_qk_norm, cfg.nope_temperature) == (4, 8192, True, 0.1)
    assert (cfg.rope_scaling, cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor) == (
        "llama3", 16.0, 1.0, 1.0)
    assert (cfg.moe_experts, cfg.moe_layers, cfg.hidden_dim, cfg.moe_shared_hidden) == (16, (), 8192, 8192)
    from redline.model import rope_frequencies

    assert torch.isfinite(rope_frequencies(cfg)).all()


def test_refusals():
    """What redline cannot run or Llama 4 cannot hold is one line naming it."""
    from redline.interop.families import export_family
    from redline.interop.llama4 import model_config

    for bad, fragment in [(dict(attn_chunk=-1), "model.attn_chunk=-1"),
                          (dict(sliding_window=4), "model.attn_chunk=5 .* no model.sliding_window"),
                          (dict(nope_temperature_floor=0), "nope_temperature_floor >= 1"),
                          (dict(moe_weight_input=True, moe_experts=0, moe_layers=(), moe_dense_hidden=None),
                           "moe_weight_input need experts")]:
        with pytest.raises(UserError, match=fragment):
            replace(LLAMA4, **bad).validate()
    hf = {"model_type": "llama4_text", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 16,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
    model_config(hf).validate()
    for edit, fragment in [({"attention_bias": True}, "attention_bias=true: Llama 4's biases"),
                           ({"layer_types": ["full_attention"] * 4}, "layer_types .* attends in chunks on exactly"),
                           ({"num_experts_per_tok": 17}, "num_experts_per_tok=17 with num_local_experts=16"),
                           ({"hidden_act": "gelu"}, "hidden_act='gelu'")]:
        with pytest.raises(UserError, match=fragment):
            model_config({**hf, **edit})
    from redline.inference.plan import plan_decode

    with pytest.raises(UserError, match=r"triton masks by a sliding window, not by chunks \(model.attn_chunk\)"):
        plan_decode(LLAMA4, torch.device("cpu"), decode_attention="triton")
    for bad, fragment in [(dict(moe_gating="softmax"), "unrescaled sigmoid scores"),
                          (dict(moe_shared_gate=True), "ungated shared expert"),
                          (dict(qk_norm=True), "no learned QK-norm"),
                          (dict(moe_weight_input=False), "weights its experts' input"),
                          (dict(rope_dims=4), "rotates whole heads")]:  # not GLM-4-MoE's partial RoPE
        with pytest.raises(UserError, match=fragment):
            export_family(replace(LLAMA4, **bad))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and gradients match eager ones."""
    torch.manual_seed(0)
    cfg = replace(LLAMA4, n_embd=128, vocab_size=512, context_len=128, attn_chunk=16)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    model.train()
    idx = torch.randint(0, cfg.vocab_size, (4, 96), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx, idx)
    weight = model.blocks[0].attn.qkv.weight
    grad = torch.autograd.grad(loss, weight)[0]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss_c = torch.compile(model)(idx, idx)
    grad_c = torch.autograd.grad(loss_c, weight)[0]
    torch.testing.assert_close(loss_c, loss, rtol=1e-2, atol=1e-2)
    assert (grad_c - grad).norm() / grad.norm() < 0.05
