"""DeepSeek-V4 (redline/interop/deepseek_v4.py; SharedKVAttention with its compressed layers, hash-routed experts and
sqrtsoftplus scores in redline/model.py): the import's logits and greedy tokens equal transformers' and its export
loads back (tests/test_interop.py's tables: "deepseek_v4", "deepseek_v4-compressed", "deepseek_v4-yarn",
"deepseek_v4-sigmoid"); here the engine's chunked prefill, decode and DecodeBatch give the full recompute's tokens
with and without compressed layers, the context stops where the indexer keeps every compressed key, DeepSeek's own
checkpoint names import alike, a training step reaches every new weight with finite gradients, and what redline
cannot read is refused by name."""

import json
from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine
from redline.model import ModelConfig
from tests.engine_checks import (assert_decode_batch_parks_rows, assert_decode_batch_serves_like_generate,
                                 assert_freed_row_refills, assert_scores_equal_full_forward)
from tests.interop_models import VOCAB, hf_folder
from tests.test_diffllama import assert_engine_decodes_as_full_recompute
from tests.test_interop import TOKENS, _expect_import_error, imported, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _import(kind: str, path):
    from redline import cli
    from redline.training.checkpoint import load_for_inference

    hf = hf_folder(kind, path / "hf")
    with pytest.raises(SystemExit) as exc:
        cli.main(["import", str(path / "hf"), "--out", str(path / "ckpt")])
    assert exc.value.code == 0
    return hf, load_for_inference(path / "ckpt")[0]


@pytest.fixture(scope="module", params=["deepseek_v4", "deepseek_v4-compressed"])
def model(request, tmp_path_factory):
    """An imported tiny DeepSeek-V4, fp32: sliding layers alone (a window of 5, a hash-routed layer and a routed
    one), or a sliding, a compressed sparse (windows of 2, overlapping) and a heavily compressed layer (windows of 3)
    with a window of 4."""
    return _import(request.param, tmp_path_factory.mktemp("v4"))[1]


@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute(model, chunk):
    """Prefilled whole or in spans of 3 tokens (shorter than the window), then decoded past the window."""
    assert_engine_decodes_as_full_recompute(model, chunk)


def test_decode_batch_rows_spans_and_scores(model):
    assert_freed_row_refills(assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model), model)
    assert_decode_batch_serves_like_generate(model, [list(range(3, 14)), [5, 6], [40, 41, 42], list(range(50, 62))])
    assert_scores_equal_full_forward(model, VOCAB)


def test_deepseeks_own_names_import_alike(tmp_path, capsys):
    """The Hub's checkpoint names (embed, head, hc_head_fn, layers.N.* without transformers' "model." prefix) and
    its multi-token-prediction layers (mtp.*, skipped as transformers skips them) give the same logits."""
    from safetensors.torch import load_file, save_file

    from redline.training.checkpoint import load_for_inference

    hf = hf_folder("deepseek_v4", tmp_path / "hf")
    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    renamed = {"embed.weight" if k == "model.embed_tokens.weight" else k.replace("model.hc_head.hc_", "hc_head_")
               .removeprefix("model."): v for k, v in tensors.items()}
    renamed["mtp.0.attn.wq_a.weight"] = torch.zeros(2, 2)
    save_file(renamed, tmp_path / "hf" / "model.safetensors")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    ours = load_for_inference(tmp_path / "ckpt")[0]
    with torch.no_grad():
        torch.testing.assert_close(ours(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_training_step_reaches_every_new_weight(model):
    """One step's gradients: finite everywhere, and nonzero on the attention's latent, key, sinks and grouped output
    projection, the hyper-connections, and both layers' routers (a hash layer's router weights its experts)."""
    model = model.train()
    try:
        tokens = TOKENS[:, :12]
        model(tokens[:, :-1], targets=tokens[:, 1:]).backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
        for name in ("attn.q_a.weight", "attn.q_b.weight", "attn.kv.weight", "attn.kv_norm.weight", "attn.sinks",
                     "attn.o_a.weight", "attn.proj.weight", "attn_mhc.fn", "mlp_mhc.fn", "mlp.router.weight",
                     "mlp.fc", "mlp.shared.fc.weight"):
            for i in range(2):
                assert model.get_parameter(f"blocks.{i}.{name}").grad.abs().sum() > 0, (i, name)
        for i, rate in enumerate(model.cfg.kv_compress_rates):  # the compressors of the compressed layers
            for name in ("comp_kv.weight", "comp_gate.weight", "comp_bias", "comp_norm.weight"):
                if rate:
                    assert model.get_parameter(f"blocks.{i}.attn.{name}").grad.abs().sum() > 0, (i, name)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


def test_hash_layer_takes_the_tables_experts(model):
    """Layer 0 routes each token to tid2eid's experts whatever its router scores: with the other experts' scores
    raised far above (sqrtsoftplus scores each expert alone, the chosen ones rescaled among themselves) and their
    weights NaN, the output is exactly what it was: no other expert is chosen or runs."""
    moe = model.blocks[0].mlp
    dtype = moe.fc.dtype  # (the fixture's model may be fp64 by now: assert_scores_equal_full_forward)
    x = torch.randn(1, 1, model.cfg.n_embd, dtype=dtype)  # one token: 2 of the 4 experts chosen
    ids = TOKENS[:1, :1, None]
    others = torch.ones(moe.fc.shape[0], dtype=torch.bool)
    others[moe.tid2eid[ids.reshape(-1)].flatten()] = False
    assert others.any()
    router, fc = moe.router.weight.clone(), moe.fc.clone()
    with torch.no_grad():
        try:
            before = moe(x, ids)
            moe.router.weight[others] += 5.0  # the other experts' scores up: a routed layer would choose them
            moe.fc[others] = float("nan")  # an unchosen expert that ran would poison the output
            after = moe(x, ids)
            assert torch.isfinite(before).all() and torch.equal(before, after)
        finally:
            moe.router.weight.copy_(router)
            moe.fc.copy_(fc)


def _folder(tmp_path, **overrides):
    hf_folder("deepseek_v4", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **overrides}))
    return tmp_path / "hf"


@pytest.mark.parametrize("overrides, fragment", [
    (dict(scoring_func="softmax"), "scoring_func='softmax': transformers' DeepSeek-V4 scores its experts by"),
    (dict(quantization_config={"quant_method": "fp8"}), "quantization_config: redline reads DeepSeek-V4's weights"),
    (dict(rope_parameters={"main": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 500.0},
                           "compress": {"rope_type": "default", "rope_theta": 500.0}}),
     "rope_parameters.main.rope_type='yarn'"),
    (dict(mlp_bias=True), "mlp_bias: DeepSeek-V4's shared expert with biases"),
    (dict(layer_types=["sliding_attention", "heavily_compressed_attention"],
          rope_parameters={"main": {"rope_type": "default", "rope_theta": 500.0},
                           "compress": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 500.0,
                                        "original_max_position_embeddings": 16}}),
     "compress_rope_theta=500.0 equal to rope_theta with YaRN on the compressed layers alone"),
    (dict(layer_types=["sliding_attention", "heavily_compressed_attention"],
          rope_parameters={"main": {"rope_type": "default", "rope_theta": 500.0},
                           "compress": {"rope_type": "linear", "factor": 2.0, "rope_theta": 900.0}}),
     "rope_parameters.compress.rope_type='linear': redline turns DeepSeek-V4's compressed layers by the plain RoPE "
     "or YaRN"),
    (dict(layer_types=None, compress_ratios=[0, 8]), "layer_types ['compress_ratios 8']"),
])
def test_import_refuses_what_redline_cannot_read_by_name(overrides, fragment, tmp_path, capsys):
    _expect_import_error(_folder(tmp_path, **overrides), tmp_path / "out", capsys, fragment)
    assert not (tmp_path / "out").exists()


def test_config_and_export_refusals(model):
    from redline.interop.families import export_family
    from redline.inference.kernels.fused_block import unsupported
    from redline.inference.plan import _triton_attention_unsupported

    cfg = model.cfg
    with pytest.raises(UserError, match="needs one key head"):
        replace(cfg, n_kv_head=2).validate()
    with pytest.raises(UserError, match="o_groups >= 1 dividing n_head=4"):
        replace(cfg, o_groups=3).validate()
    with pytest.raises(UserError, match="takes no model.qk_norm"):
        replace(cfg, qk_norm=True).validate()
    with pytest.raises(UserError, match="model.moe_hash_layers=\\(5,\\) must name distinct layers"):
        replace(cfg, moe_hash_layers=(5,)).validate()
    with pytest.raises(UserError, match="model.o_groups=2 and o_lora_rank=12 are >= 0 and DeepSeek-V4's"):
        replace(cfg, shared_kv_attention=False, n_kv_head=None, q_lora_rank=0, kv_compress_rates=(),
                kv_compress_overlap=()).validate()
    with pytest.raises(UserError, match="are DeepSeek-V4's compressed layers"):
        replace(cfg, kv_compress_rates=(0,) * (cfg.n_layer + 1), kv_compress_overlap=(1,)).validate()
    assert export_family(cfg).name == "deepseek_v4"
    with pytest.raises(UserError, match="moe_norm_topk, moe_norm_eps"):
        export_family(replace(cfg, moe_norm_eps=1e-6))
    with pytest.raises(UserError, match="model.mhc_streams, shared_kv_attention and attn_sinks"):
        export_family(replace(cfg, attn_sinks=False))
    assert "model.shared_kv_attention" in unsupported(cfg)
    assert "model.shared_kv_attention" in _triton_attention_unsupported(replace(cfg, attn_sinks=False),
                                                                         torch.device("cuda"), torch.bfloat16)


def test_compressed_context_stops_where_the_indexer_keeps_every_key(tmp_path, capsys):
    """index_topk 3 over windows of 2: a query sees at most 3 compressed keys up to position 6, so the import's
    context is 7 tokens, over which transformers' indexer (scoring and picking its top 3) gives redline's dense
    logits; an 8th token is refused."""
    hf = hf_folder("deepseek_v4-compressed", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "index_topk": 3}))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0 and "lightning indexers of the compressed sparse attention layers are left out" in err, err
    from redline.training.checkpoint import load_for_inference

    ours = load_for_inference(tmp_path / "ckpt")[0]
    assert ours.cfg.context_len == 7
    for layer in hf.model.layers:  # transformers' indexer at the folder's top 3
        if getattr(layer.self_attn.compressor, "indexer", None) is not None:
            layer.self_attn.compressor.indexer.index_topk = 3
    with torch.no_grad():
        torch.testing.assert_close(ours(TOKENS[:, :7]), hf(TOKENS[:, :7]).logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(UserError, match="exceeds the model's context_len 7"):
        ours(TOKENS[:, :8])


@pytest.mark.slow  # `redline train` end to end: the engine and gradient tests above run always
@pytest.mark.parametrize("kind", ["deepseek_v4", "deepseek_v4-compressed"])
def test_train_init_from_an_import(kind, tmp_path, capsys):
    from tests.test_interop_commands import check_train_init_from

    check_train_init_from(kind, tmp_path, capsys)


GPU_V4 = ModelConfig(vocab_size=512, context_len=128, n_layer=3, n_embd=128, n_head=4, n_kv_head=1, head_size=32,
                     shared_kv_attention=True, q_lora_rank=32, o_groups=2, o_lora_rank=32, attn_sinks=True,
                     sliding_window=16, rope_dims=16, mhc_streams=2, mhc_sinkhorn_iters=4, moe_experts=4, moe_top_k=2,
                     mlp="swiglu_clipped", mlp_hidden=64, moe_shared_hidden=64, moe_shared_gate=False,
                     moe_gating="sqrtsoftplus", moe_norm_eps=1e-20, moe_expert_bias=True, moe_hash_layers=(0,),
                     kv_compress_rates=(0, 4, 8), kv_compress_overlap=(1,), rope_layer_theta=(1e4, 4e4, 4e4),
                     norm="rmsnorm", norm_eps=1e-6, bias=False)
"""A DeepSeek-V4 for the GPU checks (no transformers model needed): a sliding layer with hash routing, a compressed
sparse layer (windows of 4) and a heavily compressed one (windows of 8) turning by their own RoPE base."""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compressed", [False, True], ids=["sliding", "compressed"])
def test_gpu_compiled_engine_and_training_step(compressed):
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and the grouped output projection's gradient match eager ones."""
    from redline.model import GPT
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    cfg = GPU_V4 if compressed else replace(GPU_V4, kv_compress_rates=(), kv_compress_overlap=(), rope_layer_theta=())
    torch.manual_seed(0)
    model = GPT(cfg)
    with torch.no_grad():
        model.blocks[0].mlp.tid2eid.copy_(torch.rand(cfg.vocab_size, 4).argsort(dim=-1)[:, :2])
        for name, p in model.named_parameters():
            if name.endswith(("comp_bias", "attn_mhc.base", "mlp_mhc.base", "attn.sinks")):
                p.normal_(0, 0.5)
    model = model.cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[1].attn.o_a.weight)
