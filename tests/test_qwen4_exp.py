"""Qwen4-Exp's hyper-connected streams and QSA indexer (model.hc_streams, model.qsa_heads): the engine's prefill,
chunked prefill, decode, scoring and DecodeBatch give the full recompute's tokens, training reaches the mixers, and
what redline cannot express is refused by name. Import, export and engine parity with transformers run in the shared
tables (tests/interop_models.py "qwen4_exp_text", test_lora_export.py)."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine
from redline.interop import qwen4_exp
from redline.model import GPT, ModelConfig, NGramEmbedding
from redline.training.optim import param_groups
from tests.engine_checks import (assert_decode_batch_parks_rows, assert_decode_batch_serves_like_generate,
                                 assert_freed_row_refills, assert_scores_equal_full_forward)
from tests.interop_models import FAMILIES
from tests.test_diffllama import assert_engine_decodes_as_full_recompute
from tests.test_latent_attention import sharp

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# delta nets on layers 0 and 2, gated attention with its indexer on 1, experts with a gated shared expert, 3 streams
QWEN4 = ModelConfig(vocab_size=96, context_len=64, n_layer=3, n_embd=48, n_head=4, n_kv_head=2, head_size=16,
                    qk_norm=True, attn_gate="element", rope_dims=8, mlp="swiglu", norm="rmsnorm",
                    norm_unit_offset=True, delta_layers=(0, 2), delta_heads=4, delta_key_heads=2, delta_key_dim=8,
                    delta_value_dim=12, moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_shared_hidden=40,
                    moe_shared_gate=True, hc_streams=3, hc_rank=8, qsa_heads=2, qsa_head_dim=16, qsa_budget=64,
                    qsa_block=1)


# Per-Layer Embeddings on both delta-net layers: 2 tables of each n-gram length 2 and 3 (primes after 29), a 3-tap
# convolution 3 tokens apart; 5, the end-of-text id, is in the engine checks' prompts
PLE = replace(QWEN4, ngram_layers=(0, 2), ngram_dim=16, ngram_heads=2, ngram_vocab_base=30, ngram_vocab_multiple=8,
              ngram_conv_kernel=3, ngram_eos=5)


def qwen4_model(cfg: ModelConfig = QWEN4) -> GPT:
    """sharp's model with the streams' norms moved off 1, so that every stream is mixed with weights of its own; the
    n-gram embeddings' norms and convolution (zeros at init) moved too."""
    model = sharp(cfg)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(getattr(module, "norm", None), torch.nn.Parameter) and module.norm.dim() == 2:
                module.norm.normal_(0, 0.3)
            if isinstance(module, NGramEmbedding):
                for p in (module.key_norm, module.query_norm, module.conv_norm, module.conv):
                    p.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("cfg", [QWEN4, PLE], ids=["streams", "ngrams"])
@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute(chunk, cfg):
    assert_engine_decodes_as_full_recompute(qwen4_model(cfg), chunk)


@pytest.mark.parametrize("cfg", [QWEN4, PLE], ids=["streams", "ngrams"])
def test_decode_batch_rows_spans_and_scores(cfg):
    model = qwen4_model(cfg)
    assert_freed_row_refills(assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model), model)
    assert_scores_equal_full_forward(qwen4_model(cfg), cfg.vocab_size)
    assert_decode_batch_serves_like_generate(qwen4_model(cfg), [[3, 4, 5], list(range(10, 22)), [7], [9, 1, 2, 3, 4]])


def test_ngram_hash_and_rows_are_transformers():
    """The multipliers, table sizes and each token's rows and vectors of the second PLE layer are those of
    transformers' Qwen4ExpTextNGramEmbedding, on random ids with end-of-text ids among them (at the start too)."""
    from transformers import Qwen4ExpTextConfig
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextNGramEmbedding

    hf = Qwen4ExpTextConfig(vocab_size=96, hidden_size=48, num_hidden_layers=3, hc_count=3, head_dim=16,
                            layer_types=["linear_attention", "indexed_attention", "linear_attention"],
                            indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=32,
                            indexer_compress_ratio=4, ple_layer_ids=[1, 3], ple_embed_dim=16, heads_per_ngram=2,
                            ngram_vocab_size_base=30, make_ngram_vocab_size_divisible_by=8, eos_token_id=5)
    theirs = Qwen4ExpTextNGramEmbedding(hf, 16, layer_idx=2, ple_layer_index=1)
    ours = NGramEmbedding(replace(PLE, ngram_seed=hf.seed), 1)
    assert ours.multipliers.tolist() == theirs.layer_multipliers.tolist()
    assert ours.sizes.tolist() == theirs.head_vocab_sizes and ours.offsets.tolist() == theirs.head_offsets
    assert ours.table.weight.shape == theirs.ngram_embedding.weight.shape
    with torch.no_grad():
        ours.table.weight.copy_(torch.randn_like(ours.table.weight))
        theirs.ngram_embedding.weight.copy_(ours.table.weight)
    ids = torch.randint(0, 96, (3, 40), generator=torch.Generator().manual_seed(0))
    ids[0, 0], ids[1, 7], ids[1, 8], ids[2, 20] = 5, 5, 5, 5
    rows = ours.ids(GPT(PLE).ngram_windows(ids))
    assert rows.shape == (3, 40, 4) and len(set(rows[..., 2].flatten().tolist())) > 20  # the tables are well used
    torch.testing.assert_close(ours.table(rows).flatten(-2), theirs(ids, None), rtol=0, atol=0)


def test_streams_are_mixed_and_trained():
    """The streams differ after a block (each takes the sublayers' outputs by its own weight), the last mixer
    averages them, and a training step's gradients reach every mixer while the indexer's weights stay buffers."""
    model = qwen4_model().train()
    idx = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    x, rope = model.embed(idx)
    xs = model.blocks[0](model.stream_in(0, x, x), rope, model.attention_mask(12, idx.device, None, 0, None))
    assert xs.shape == (2, 12, 3, 48) and not torch.allclose(xs[:, :, 0], xs[:, :, 1])
    model(idx, idx).backward()
    for name, p in model.named_parameters():
        if "_hc." in name or name.startswith("hc_out."):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    names = {n for n, _ in model.named_parameters()}
    assert "blocks.1.attn.qsa_qk" in model.state_dict() and "blocks.1.attn.qsa_qk" not in names


def test_packed_documents_equal_each_document_alone():
    """Documents packed into one row (doc_ids, restarting positions) see only themselves through the n-gram
    embeddings too: the tokens before each one's first read as eos, its convolution starting from zeros."""
    model = qwen4_model(PLE)
    a, b = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(2)), torch.tensor([[8, 9, 10, 11, 12]])
    doc_ids = torch.tensor([[0] * 9 + [1] * 5])
    positions = torch.tensor([list(range(9)) + list(range(5))])
    with torch.no_grad():
        together = model(torch.cat([a, b], dim=1), positions=positions, doc_ids=doc_ids)
        torch.testing.assert_close(together[:, :9], model(a), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(together[:, 9:], model(b), atol=1e-5, rtol=1e-5)


def test_ngram_embeddings_are_trained():
    """A training step's gradients reach every part of both layers' n-gram embeddings (the table's looked-up rows
    alone), while the hash's constants are buffers derived from the config, not stored."""
    model = qwen4_model(PLE).train()
    idx = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    idx[0, 4] = 5
    model(idx, idx).backward()
    for name, p in model.named_parameters():
        if ".ngram." in name:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    table = model.blocks[2].ngram.table.weight.grad
    assert 0 < int((table.abs().sum(-1) > 0).sum()) <= 2 * 12 * 4  # a row for each token and table at most
    assert not any("multipliers" in k or "sizes" in k or "offsets" in k for k in model.state_dict())
    hidden, tables, _ = param_groups(model)  # the tables trained as embeddings (AdamW), not as Muon's matrices
    table = model.blocks[0].ngram.table.weight
    assert any(p is table for p in tables) and not any(p is table for p in hidden)
    assert model.num_params() - model.num_params(embeddings=False) == sum(
        t.numel() for t in (model.wte.weight, model.lm_head.weight, table, model.blocks[2].ngram.table.weight))


def test_refused_by_name():
    with pytest.raises(UserError, match="hc_streams=1"):
        replace(QWEN4, hc_streams=1).validate()
    with pytest.raises(UserError, match="model.hc_streams .*parallel_residual"):
        replace(QWEN4, parallel_residual=True).validate()
    with pytest.raises(UserError, match="context_len=80 at most qsa_budget"):
        replace(QWEN4, context_len=80).validate()
    with pytest.raises(UserError, match="describe one QSA indexer"):
        replace(QWEN4, qsa_block=0).validate()
    with pytest.raises(UserError, match="QSA indexer on every attention layer"):
        qwen4_exp.check_exportable(replace(QWEN4, qsa_heads=0, qsa_head_dim=0, qsa_budget=0, qsa_block=0))
    with pytest.raises(UserError, match="has no such option \\(model.smear_gate\\)"):
        qwen4_exp.check_exportable(replace(QWEN4, smear_gate=8))
    with pytest.raises(UserError, match="experts on every layer"):
        qwen4_exp.check_exportable(replace(QWEN4, moe_experts=0, moe_top_k=0, moe_shared_hidden=0,
                                           moe_shared_gate=False))
    hf = {"model_type": "qwen4_exp_text", "vocab_size": 96, "hidden_size": 48, "num_hidden_layers": 3,
          "max_position_embeddings": 64, **FAMILIES["qwen4_exp_text"][2]}
    cfg = qwen4_exp.model_config(hf)
    assert (cfg.hc_streams, cfg.hc_rank, cfg.qsa_heads, cfg.context_len) == (3, 8, 2, 35)  # 32 + 4 - 1
    hub = qwen4_exp.model_config({"model_type": "qwen4_exp_text", "num_hidden_layers": 4, "ple_layer_ids": None,
                                  "indexer_n_heads": 32, "indexer_kv_heads": 1, "indexer_head_dim": 128,
                                  "indexer_budget": 2048, "indexer_compress_ratio": 64})  # the class's defaults
    assert (hub.n_embd, hub.head_dim, hub.moe_experts, hub.hc_rank, hub.context_len) == (2048, 256, 512, 320, 2111)
    assert hub.delta_layers == (0, 1, 2) and hub.rope_dims == 0  # a full layer in four, RoPE on whole heads
    with pytest.raises(UserError, match="model.ngram_layers=\\(1,\\): distinct layers in order, each a gated"):
        qwen4_exp.model_config({**hf, "ple_layer_ids": [2], "eos_token_id": 1}).validate()
    with pytest.raises(UserError, match="ngram_dim=18: n-grams of 2 or more tokens"):
        replace(PLE, ngram_dim=18).validate()
    with pytest.raises(UserError, match="model.ngram_eos=-1"):
        replace(PLE, ngram_eos=-1).validate()
    ple = qwen4_exp.model_config({**hf, "ple_layer_ids": [3, 1], "eos_token_id": [7, 2], "ple_embed_dim": 16,
                                  "heads_per_ngram": 2, "ngram_vocab_size_base": 30, "seed": 9})
    assert (ple.ngram_layers, ple.ngram_dim, ple.ngram_eos, ple.ngram_seed, ple.ngram_conv_kernel) == ((0, 2), 16, 7,
                                                                                                      9, 4)
    for change, fragment in [({"ple_layer_ids": [1]}, "eos_token_id unset: Qwen4-Exp's Per-Layer Embeddings"),
                             ({"output_gate_type": "sigmoid"}, "output_gate_type='sigmoid'"),
                             ({"indexer_budget": None}, "indexer_budget unset"),
                             ({"indexer_kv_heads": 2}, "indexer_kv_heads=2"),
                             ({"num_experts": 0}, "num_experts=0")]:
        with pytest.raises(UserError, match=fragment):
            qwen4_exp.model_config({**hf, **change})


@pytest.mark.slow  # a training run: about 15 s on 2 CPU cores
@pytest.mark.parametrize("kind", ["qwen4_exp_text", "qwen4_exp_text-ple"])
def test_train_init_from_an_imported_qwen4_exp_trains_its_streams(kind, tmp_path, capsys):
    """`redline train --init-from` on an imported Qwen4-Exp: the first step's loss is transformers' on the same batch,
    and training moves the hyper-connection mixers, the delta nets, the experts and the Per-Layer Embeddings; the
    indexer's weights stay."""
    from tests.test_interop_commands import Imported, trained_two_steps

    before, after = trained_two_steps(Imported(kind, tmp_path / "src"), tmp_path, capsys)
    old, new = before.state_dict(), after.state_dict()
    names = ["blocks.0.attn_hc.down.weight", "blocks.1.mlp_hc.inject.weight", "blocks.2.attn_hc.norm",
             "hc_out.up.weight", "blocks.0.attn.in_proj.weight", "blocks.1.mlp.fc"]
    if kind.endswith("-ple"):
        names += [f"blocks.{i}.ngram.{part}" for i in (0, 2) for part in ("table.weight", "key.weight",
                                                                          "value.weight", "query_norm", "conv")]
    for name in names:
        assert not torch.equal(old[name], new[name]), name
    assert torch.equal(old["blocks.1.attn.qsa_qk"], new["blocks.1.attn.qsa_qk"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", [QWEN4, PLE], ids=["streams", "ngrams"])
def test_gpu_compiled_engine_and_training_step(cfg):
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and a mixer's (and an n-gram embedding's key projection's) gradients match
    eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = replace(cfg, n_embd=128, vocab_size=512, context_len=128, qsa_budget=128)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[1].attn_hc.inject.weight)
    if cfg.ngram_layers:
        assert_compiled_training_step_matches(model, model.blocks[0].ngram.key.weight)
