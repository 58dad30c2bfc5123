"""Chameleon (redline/interop/chameleon.py) beyond tests/test_multimodal.py's import parity: its per-head QK
LayerNorms (model.qk_layernorm_per_head) and the image tokens' logit mask (the head's bias) through the engine
(chunked prefill, decode, DecodeBatch, teacher-forced scores), in training (gradients, the optimizer's gains) and
the exports it refuses by name."""

from __future__ import annotations

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.model import GPT, ModelConfig
from redline.training.checkpoint import load_for_inference
from tests.engine_checks import (assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward,
                                 full_recompute)
from tests.test_interop import run_cli
from tests.test_multimodal import _folder

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(the import's checkpoint, its model) of tests/test_multimodal.py's tiny Chameleon."""
    path = tmp_path_factory.mktemp("chameleon")
    _folder("chameleon", path / "hf")
    from redline import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["import", str(path / "hf"), "--out", str(path / "ckpt"), "--dtype", "fp32"])
    assert done.value.code == 0
    return path / "ckpt", load_for_inference(path / "ckpt")[0]


def test_engine_decodes_as_full_recompute_never_emitting_image_tokens(imported):
    """Prompts of different lengths prefilled whole or in chunks of 3 tokens, then decoded: the full recompute's
    tokens, none of them an image token; DecodeBatch serves as generate; the engine's scores are the full
    forward's."""
    _, model = imported
    prompts = [list(range(1, 12)), [5, 6], [40]]
    for chunk in (32768, 3):
        engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
        got = [r.tokens for r in engine.generate(prompts, 10, SamplingParams(temperature=0))]
        assert got == [full_recompute(model, p, 10) for p in prompts]
    sampled = InferenceEngine(model, compile=False).generate(prompts, 16, SamplingParams(temperature=1.5, seed=0))
    assert not {t for r in sampled for t in r.tokens} & set(range(200, 216))  # the masked image tokens
    assert_decode_batch_serves_like_generate(model, prompts + [[9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]])
    assert_scores_equal_full_forward(model, model.cfg.vocab_size)


def test_per_head_norms_train_as_gains(imported):
    """A training step reaches every head's own QK-norm weight and bias; the optimizer takes the (H, D) weights as
    gains (no weight decay, not Muon's matrices)."""
    from redline.training.optim import param_groups

    _, model = imported
    model = GPT(model.cfg)
    model.load_state_dict(imported[1].state_dict())
    model.train()
    tokens = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    loss = model(tokens[:, :-1], tokens[:, 1:])
    loss = loss[1] if isinstance(loss, tuple) else loss
    loss.backward()
    attn = model.blocks[0].attn
    for norm in (attn.q_norm, attn.k_norm):
        assert norm.weight.grad is not None and norm.weight.grad.abs().sum() > 0
        assert norm.bias.grad is not None and norm.bias.grad.abs().sum() > 0
    assert attn.q_norm.weight.shape == (model.cfg.n_head, model.cfg.head_dim)
    hidden, _, gains = param_groups(model)
    assert any(p is attn.q_norm.weight for p in gains) and not any(p is attn.q_norm.weight for p in hidden)


def test_exports_are_refused_by_name(imported, tmp_path, capsys):
    """Neither a transformers folder (no architecture redline writes has per-head QK LayerNorms) nor a GGUF file."""
    ckpt, _ = imported
    for out, extra in (("out", []), ("out.gguf", ["--format", "gguf"])):
        code, _, err = run_cli(["export", str(ckpt), "--out", str(tmp_path / out), *extra], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "model.qk_layernorm_per_head" in err, err


def test_per_head_layernorm_needs_qk_layernorm():
    with pytest.raises(UserError, match="model.qk_layernorm_per_head needs model.qk_layernorm=true"):
        ModelConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, context_len=16, qk_norm=True,
                    qk_layernorm_per_head=True).validate()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_engine_and_training_step_on_gpu(imported):
    """The per-head QK LayerNorms and the masked head through the compiled, graph-captured engine (bf16, greedy
    within tolerance of the fp32 model) and a compiled bf16 training step (the q norm's per-head weight's gradient
    near fp32 eager's), on the import's weights."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    _, imported_model = imported
    model = GPT(imported_model.cfg).cuda()
    model.load_state_dict(imported_model.state_dict())
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 60))])
    assert_compiled_training_step_matches(model, model.blocks[0].attn.q_norm.weight, length=48)
