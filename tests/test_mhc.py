"""Manifold-constrained hyper-connections (model.mhc_streams, DeepSeek-V4's mHC): the hyper-connections and the head
equal transformers' DeepseekV4HyperConnection and DeepseekV4HyperHead, a block mixes the streams around its
sublayers as DeepseekV4DecoderLayer does, the engine's prefill, chunked prefill, decode and DecodeBatch give the full
recompute's tokens, training reaches every mHC weight, and what redline cannot compute is refused by name.
DeepSeek-V4 itself imports (tests/test_deepseek_v4.py)."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine
from redline.model import GPT, ManifoldHyperConnection, ManifoldHyperHead, ModelConfig
from tests.engine_checks import (assert_decode_batch_parks_rows, assert_decode_batch_serves_like_generate,
                                 assert_freed_row_refills, assert_scores_equal_full_forward)
from tests.test_diffllama import assert_engine_decodes_as_full_recompute
from tests.test_latent_attention import sharp
from tests.test_train import dataset  # noqa: F401  (a pytest fixture)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

MHC = ModelConfig(vocab_size=96, context_len=64, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, mlp_hidden=48,
                  norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", bias=False, mhc_streams=3, mhc_sinkhorn_iters=6)
MHC_MOE = replace(MHC, moe_experts=4, moe_top_k=2, mlp_hidden=16)


def hyper_model(cfg: ModelConfig = MHC) -> GPT:
    """sharp's model with the mHC weights moved off their init (base 0, scale 1), so that the streams differ."""
    model = sharp(cfg)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (ManifoldHyperConnection, ManifoldHyperHead)):
                module.fn.normal_(0, 0.5)
                module.base.normal_(0, 0.5)
                module.scale.normal_(1, 0.3)
    return model


def v4_config(cfg: ModelConfig):
    from transformers import DeepseekV4Config

    return DeepseekV4Config(hidden_size=cfg.n_embd, hc_mult=cfg.mhc_streams, hc_sinkhorn_iters=cfg.mhc_sinkhorn_iters,
                            hc_eps=cfg.mhc_eps, rms_norm_eps=cfg.norm_eps, num_hidden_layers=1, vocab_size=96,
                            num_attention_heads=2, head_dim=16, q_lora_rank=8, o_groups=1, o_lora_rank=8,
                            n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=8, index_n_heads=1,
                            index_head_dim=8, layer_types=["sliding_attention"], mlp_layer_types=["moe"])


def test_hyper_connection_and_head_are_deepseek_v4s():
    """pre, post, the Sinkhorn-normalised mixing matrix and the collapsed input, and the head's sum, bit for bit as
    transformers computes them from the same weights (random, far from their init)."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection, DeepseekV4HyperHead

    torch.manual_seed(0)
    hf = v4_config(MHC)
    theirs, theirs_head = DeepseekV4HyperConnection(hf), DeepseekV4HyperHead(hf)
    for p in (*theirs.parameters(), *theirs_head.parameters()):
        torch.nn.init.normal_(p, std=0.5)
    ours, ours_head = ManifoldHyperConnection(MHC), ManifoldHyperHead(MHC)
    ours.load_state_dict({"fn": theirs.fn, "base": theirs.base, "scale": theirs.scale})
    ours_head.load_state_dict({"fn": theirs_head.hc_fn, "base": theirs_head.hc_base, "scale": theirs_head.hc_scale})
    xs = torch.randn(2, 5, 3, 32)
    with torch.no_grad():
        post, comb, collapsed = theirs(xs)
        u, our_post, our_comb = ours(xs)
        for a, b in ((u, collapsed), (our_post, post), (our_comb, comb), (ours_head(xs), theirs_head(xs))):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(comb.sum(dim=-2), torch.ones(2, 5, 3), rtol=0, atol=1e-5)  # doubly stochastic


class _Sublayer(torch.nn.Module):
    """One of redline's sublayers in DeepseekV4DecoderLayer's place: attention returns (output, None) as V4's
    does; the MLP drops the token ids a V4 MLP routes by."""

    def __init__(self, fn, pair: bool):
        super().__init__()
        self.fn, self.pair = fn, pair

    def forward(self, x, **kwargs):
        return (self.fn(x), None) if self.pair else self.fn(x)


@pytest.mark.parametrize("cfg", [MHC, MHC_MOE], ids=["dense", "experts"])
def test_block_mixes_the_streams_as_deepseek_v4_decoder_layer(cfg):
    """A redline block on the streams equals DeepseekV4DecoderLayer holding the block's norms, sublayers and
    hyper-connections: the sublayers' input sums, their outputs spread by post, the streams mixed by comb read
    transposed."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4DecoderLayer

    model = hyper_model(cfg)
    block = model.blocks[1]
    layer = DeepseekV4DecoderLayer(v4_config(cfg), 0).eval()
    idx = torch.randint(0, 96, (2, 9))
    x, rope = model.embed(idx)
    layer.input_layernorm, layer.post_attention_layernorm = block.norm1, block.norm2
    layer.self_attn = _Sublayer(lambda u: block.attn(u, rope, None), pair=True)
    layer.mlp = _Sublayer(block.mlp, pair=False)
    for ours, theirs in ((block.attn_mhc, layer.attn_hc), (block.mlp_mhc, layer.ffn_hc)):
        theirs.load_state_dict(ours.state_dict())
    xs = torch.randn(2, 9, 3, 32)
    with torch.no_grad():
        torch.testing.assert_close(block(xs, rope), layer(xs, input_ids=idx), rtol=1e-6, atol=1e-6)
        # the model: the embeddings copied into each stream, the head's sum before the final norm
        streams = model.stream_in(0, x, x)
        for block in model.blocks:
            streams = block(streams, rope)
        torch.testing.assert_close(model.logits(model.norm_f(model.mhc_head(streams)))[..., :96], model(idx))


@pytest.mark.parametrize("cfg", [MHC, replace(MHC_MOE, sliding_window=5)], ids=["dense", "experts-window"])
@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute(chunk, cfg):
    assert_engine_decodes_as_full_recompute(hyper_model(cfg), chunk)


def test_engine_scores_and_decode_batch():
    model = hyper_model()
    assert_scores_equal_full_forward(model, MHC.vocab_size)
    model = hyper_model()
    assert_freed_row_refills(assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model), model)
    assert_decode_batch_serves_like_generate(hyper_model(MHC_MOE), [[3, 4, 5], list(range(10, 30)), [7], [9, 8] * 6])


def test_training_reaches_every_mhc_weight():
    torch.manual_seed(0)
    model = GPT(MHC).train()
    idx = torch.randint(0, 96, (2, 16))
    model(idx, idx).backward()
    named = [("head", model.mhc_head)] + [(f"{i}.{which}", getattr(block, which)) for i, block in
                                          enumerate(model.blocks) for which in ("attn_mhc", "mlp_mhc")]
    for name, module in named:
        for p in (module.fn, module.base, module.scale):
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_training_run_with_hyper_connections(dataset, tmp_path):
    """redline's training loop (its default optimizer, activation checkpointing, the sample at the end) on a model
    with hyper-connections: the loss falls."""
    from redline.training.loop import train
    from tests.test_train import config, train_losses

    result = train(config(dataset, tmp_path, "model.mhc_streams=2", "model.mhc_sinkhorn_iters=4", "max_steps=30",
                          "optim.lr=3e-3", "sample_tokens=8", "activation_checkpointing=full"))
    assert result.status == "completed" and result.sample
    losses = list(train_losses(result.run_dir).values())
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5


def test_refusals():
    from redline.interop.families import export_family
    from redline.inference.kernels.fused_block import unsupported

    with pytest.raises(UserError, match="model.mhc_streams.*without model.parallel_residual"):
        replace(MHC, parallel_residual=True).validate()
    with pytest.raises(UserError, match="without model.norm_position 'sandwich'"):
        replace(MHC, norm_position="sandwich").validate()
    with pytest.raises(UserError, match="mhc_sinkhorn_iters >= 0"):
        replace(MHC, mhc_sinkhorn_iters=-1).validate()
    with pytest.raises(UserError, match="model.mhc_streams, shared_kv_attention and attn_sinks"):
        export_family(MHC)
    assert "model.mhc_streams" in unsupported(MHC)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and a hyper-connection's gradient match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = replace(MHC, n_embd=128, vocab_size=512, context_len=128, mlp_hidden=256)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[0].attn_mhc.fn)
