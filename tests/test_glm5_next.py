"""GLM-5.3-Next (redline/interop/glm5_next.py; its multimodal folders through multimodal.py): the softplus decay and a
text-only folder's flat config import with transformers' logits (the bounded decay in tests/test_multimodal.py's
CASES "glm5_next"); the engine's prefill, chunked prefill, decode and DecodeBatch give the full recompute's tokens;
the context stops where the pooled indexer keeps every key; training reaches the new layers' weights; what redline
cannot read, and every export, is refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine
from redline.interop import glm5_next
from redline.model import GPT
from redline.training.checkpoint import load_for_inference
from tests.engine_checks import (assert_decode_batch_parks_rows, assert_decode_batch_serves_like_generate,
                                 assert_freed_row_refills)
from tests.interop_models import VOCAB, byte_level_tokenizer
from tests.test_diffllama import assert_engine_decodes_as_full_recompute
from tests.test_interop import run_cli
from tests.test_multimodal import _glm5_next_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _folder(path, flat: bool = False, **text):
    """save_pretrained of a tiny Glm5NextForConditionalGeneration (every parameter and the routing bias perturbed);
    flat: its config.json's text fields at the top level, as GLM-5.3-Flash's text-only folders hold them."""
    import transformers

    torch.manual_seed(0)
    hf = transformers.Glm5NextForConditionalGeneration(_glm5_next_config(**text)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.add_(torch.randn_like(b) * 0.05)
    hf.save_pretrained(path)
    byte_level_tokenizer(path, template=None)
    if flat:
        config = json.loads((path / "config.json").read_text())
        flat_config = {**config.pop("text_config"), **config}
        flat_config.pop("vision_config")
        (path / "config.json").write_text(json.dumps({**flat_config, "model_type": "glm5_next"}))
    return hf


def _imported(tmp_path, capsys, **kwargs):
    hf = _folder(tmp_path / "hf", **kwargs)
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    return hf, load_for_inference(tmp_path / "ckpt")[0], err


@pytest.mark.parametrize("kwargs", [dict(linear_lower_bound=None), dict(flat=True)], ids=["softplus-decay", "flat"])
def test_imports_with_transformers_logits(kwargs, tmp_path, capsys):
    """linear_lower_bound null (the KDA decay −exp(A_log)·softplus(·): model.delta_decay=channel) and a flat
    config.json: the imported model's logits are transformers' over the whole context the indexer keeps dense (19
    tokens); one stderr line says the indexers were left out."""
    hf, model, err = _imported(tmp_path, capsys, **kwargs)
    assert model.cfg.delta_decay == ("channel" if "linear_lower_bound" in kwargs else "bounded")
    assert model.cfg.context_len == 19 and "indexer (7 tensors) is left out" in err
    tokens = torch.randint(0, VOCAB - 8, (2, 19), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(input_ids=tokens).logits, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def engine_checkpoint(tmp_path_factory):
    """The CASES model with index_topk 64 (a context of 67 tokens, room for the engine checks' sequences), imported:
    the checkpoint's path."""
    from redline import cli

    path = tmp_path_factory.mktemp("glm5_next")
    _folder(path / "hf", index_topk=64, max_position_embeddings=128)
    with pytest.raises(SystemExit) as exc:
        cli.main(["import", str(path / "hf"), "--out", str(path / "ckpt"), "--dtype", "fp32"])
    assert exc.value.code == 0
    return path / "ckpt"


@pytest.fixture
def engine_model(engine_checkpoint):
    return load_for_inference(engine_checkpoint)[0]


@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute(engine_model, chunk):
    """KDA states and convolutions, the NoPE latent caches and the hyper-connection streams through prefill (whole or
    in chunks of 3), then decode: the full recompute's tokens."""
    assert engine_model.cfg.context_len == 67
    assert_engine_decodes_as_full_recompute(engine_model, chunk)


def test_decode_batch(engine_model):
    model = engine_model
    assert_freed_row_refills(assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model), model)
    assert_decode_batch_serves_like_generate(model, [[3, 4, 5], list(range(10, 30)), [7], [9, 8] * 6])


def test_training_reaches_the_new_layers():
    """A model of the imported config trains: the loss's gradient reaches the KDA layers' low-rank decay and gate,
    the NoPE latent attention's kv_b, the hyper-connections and the routed experts."""
    torch.manual_seed(0)
    cfg = glm5_next.model_config(_glm5_next_config().to_dict()["text_config"])
    assert cfg.mhc_head_mean and cfg.nope_interval == 1 and cfg.mlp == "swiglu_clipped"
    model = GPT(cfg).train()
    idx = torch.randint(0, VOCAB, (2, 12))
    model(idx, idx).backward()
    block0, block1 = model.blocks[0], model.blocks[1]
    for name, p in (("a_down", block0.attn.a_down.weight), ("z_down", block0.attn.z_down.weight),
                    ("kv_b", block1.attn.kv_b.weight), ("mhc", block1.attn_mhc.fn), ("experts", block1.mlp.fc)):
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_context_stops_where_the_indexer_keeps_every_key():
    """A query seeing n keys sees n // index_kpool whole groups and the tail after them: every key while the groups
    fit in index_topk / index_kpool, so up to index_topk + index_kpool - 1 tokens; with groups of one, index_topk."""
    text = _glm5_next_config().to_dict()["text_config"]
    assert glm5_next.model_config({**text, "index_topk": 32, "index_kpool": 8}).context_len == 39
    assert glm5_next.model_config({**text, "index_kpool": 1, "index_kpool_always_select_tail": False}).context_len \
        == 16


@pytest.mark.parametrize("change, fragment", [
    (dict(index_kpool_always_select_tail=False), "index_kpool_always_select_tail=false"),
    (dict(qk_rope_head_dim=8), "qk_rope_head_dim=8"),
    (dict(layer_types=["linear_attention", "sliding_attention", "indexed_attention", "linear_attention"]),
     "sliding_attention"),
    (dict(mlp_layer_types=["sparse", "dense", "sparse", "sparse"]), "mlp_layer_types"),
    (dict(index_topk=18), "index_topk=18"),
    (dict(architectures=["Glm5NextTextModel"]), "has no head"),
    (dict(linear_lower_bound=0.0), "linear_lower_bound=0.0"),
    (dict(hc_sinkhorn_iters=0), "hc_sinkhorn_iters=0"),
])
def test_refusals_name_the_option(change, fragment):
    text = _glm5_next_config().to_dict()["text_config"]
    with pytest.raises(UserError, match=fragment):
        glm5_next.model_config({**text, **change})


@pytest.mark.parametrize("fmt, out", [("hf", "out"), ("gguf", "out.gguf")])
def test_export_is_refused_by_name(engine_checkpoint, fmt, out, tmp_path, capsys):
    """Import only: the HF and GGUF exports (and so a PEFT adapter's) refuse in one line naming GLM-5.3-Next."""
    code, _, err = run_cli(["export", str(engine_checkpoint), "--out", str(tmp_path / out), "--format", fmt], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "GLM-5.3-Next is import only" in err, err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py),
    on KDA layers beside NoPE latent layers on averaged hyper-connection streams; the compiled training step's loss
    and a KDA decay projection's gradient match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    text = _glm5_next_config(index_topk=128, max_position_embeddings=256).to_dict()["text_config"]
    model = GPT(glm5_next.model_config(text)).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[0].attn.a_down.weight)


def test_context_cap_is_where_the_sparse_attention_departs(tmp_path, capsys):
    """Past index_topk + index_kpool - 1 tokens transformers' indexer drops whole groups, and its logits leave the
    dense attention's: the imported weights with a longer context equal transformers on the first 19 positions of 24
    tokens and not on the last ones, so the import's cap is the longest exact context."""
    from dataclasses import replace

    hf, model, _ = _imported(tmp_path, capsys, linear_lower_bound=None)
    longer = GPT(replace(model.cfg, context_len=64)).eval()
    longer.load_state_dict(model.state_dict())
    tokens = torch.randint(0, VOCAB - 8, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours, theirs = longer(tokens), hf(input_ids=tokens).logits
    torch.testing.assert_close(ours[:, :19], theirs[:, :19], rtol=1e-5, atol=1e-5)
    assert (ours[:, 20:] - theirs[:, 20:]).abs().amax() > 1e-3
