"""A head narrower than the embedding (model.head_vocab: Apertus 1.5's output_vocab_size, its head pruned to the
text ids) beyond the shared parity tables (tests/interop_models.py's apertus1p5_text-pruned and
tests/test_multimodal.py's apertus1p5-pruned: import, engine, export; tests/test_lora_export.py: PEFT with the head
adapted): the loss, full and chunked, and targets past the head refused; the engine's greedy, sampled and scored
tokens with prompts holding ids past the head; the server's sampling, logit bias and logprobs; training from an
import; and the refusals (GGUF, an architecture without such a head, a tied head)."""

from __future__ import annotations

import copy
import json
import queue
import re
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.interop.families import export_family
from redline.model import GPT, ModelConfig
from tests.engine_checks import (assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward,
                                 full_recompute)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

HEAD = 200  # the ids the model predicts; the byte tokenizer's 200..255 and its EOT (256) are inputs alone
CFG = ModelConfig(vocab_size=261, head_vocab=HEAD, pad_vocab_to=16, context_len=96, n_layer=2, n_embd=32, n_head=4,
                  n_kv_head=2)
# prompts with ids past the head, which the embedding reads as any other
PROMPTS = [[5, 230, 17, 250, 3, 199, 260, 8, 9], [240, 2, 7], [1, 2, 3, 4, 255, 6, 7], [9] * 12]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = GPT(CFG).eval()
    with torch.no_grad():  # away from GPT-2's near-uniform initial logits
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m


def test_the_head_has_its_own_rows_and_the_config_checks_them(model):
    assert model.wte.weight.shape == (272, 32) and model.lm_head.weight.shape == (208, 32)  # each padded to 16
    assert model(torch.tensor([PROMPTS[0]])).shape == (1, 9, HEAD)
    for fields, fragment in ((dict(head_vocab=262), "model.head_vocab=262 must lie in [0, vocab_size=261]"),
                             (dict(head_vocab=-1), "model.head_vocab=-1 must lie in"),
                             (dict(tie_embeddings=True), "needs an untied head (model.tie_embeddings=false")):
        with pytest.raises(UserError, match=re.escape(fragment)):
            replace(CFG, **fields).validate()
    assert GPT(replace(CFG, head_vocab=0)).lm_head.weight.shape == (272, 32)  # 0: the whole vocabulary
    from redline.chat.render import resize_vocab

    with pytest.raises(UserError, match=re.escape("model.head_vocab=200: the tokens this adds (ids from 261) would "
                                                  "lie past the model's head")):
        resize_vocab(model, 264)  # redline's chat tokens, as `redline sft` adds them


def test_the_loss_full_and_chunked_is_the_cross_entropy_over_the_head(model):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, CFG.vocab_size, (2, 12), generator=g)
    y = torch.randint(0, HEAD, (2, 12), generator=g)
    y[0, :3] = -1  # ignored
    with torch.no_grad():
        expected = F.cross_entropy(model(x).reshape(-1, HEAD), y.reshape(-1), ignore_index=-1)
    chunked = GPT(replace(CFG, ce_chunk_tokens=5)).eval()
    chunked.load_state_dict(model.state_dict())
    grads = []
    for m in (copy.deepcopy(model), chunked):
        loss = m(x, y)
        loss.backward()
        torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)
        grads.append(m.lm_head.weight.grad)
        assert grads[-1][HEAD:].abs().max() == 0  # the head's padding rows: out of the softmax
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    y[1, 4] = 230  # an image code as a target: a token the head cannot give
    for m in (model, chunked):
        with pytest.raises(UserError, match=re.escape("a target token id 230 is past the model's head, which "
                                                      "predicts ids [0, 200) (model.head_vocab)")):
            m(x, y)


def test_the_engine_generates_and_scores_within_the_head(model):
    engine = InferenceEngine(model, compile=False)
    greedy = engine.generate(PROMPTS, 10, SamplingParams(temperature=0))
    assert [r.tokens for r in greedy] == [full_recompute(model, p, 10) for p in PROMPTS]
    assert_decode_batch_serves_like_generate(copy.deepcopy(model), PROMPTS)  # the server's batch: chunked prefill
    for sampling in (SamplingParams(temperature=2.0, seed=0), SamplingParams(temperature=2.0, top_k=50, top_p=0.9,
                                                                             seed=1)):
        sampled = engine.generate(PROMPTS, 20, sampling)
        tokens = [t for r in sampled for t in r.tokens]
        assert all(0 <= t < HEAD for t in tokens) and len(set(tokens)) > 20
    assert_scores_equal_full_forward(copy.deepcopy(model), HEAD)
    # a token past the head, teacher-forced: a log-probability of -inf (the model never gives it), the rest finite
    logps, _ = engine.score(torch.tensor([[5, 6, 7, 250, 8, 9]]), prefill=2)
    assert logps[0, 1] == float("-inf") and torch.isfinite(logps[0, [0, 2, 3]]).all()


def test_the_server_samples_biases_and_scores_within_the_head(model):
    from redline.inference.batch import DecodeBatch
    from redline.serve.scheduler import Scheduler, Sequence
    from redline.tokenizer import load_tokenizer

    sched = Scheduler(DecodeBatch(InferenceEngine(model), rows=3, capacity=CFG.context_len), load_tokenizer("bytes"),
                      [256])  # the byte tokenizer's EOT, past the head: never generated, so rows run to max_tokens
    try:
        with pytest.raises(UserError, match=re.escape("logit_bias names a token id outside the ids the model "
                                                      "generates [0, 200)")):
            sched.submit([Sequence([1, 2], 4, SamplingParams(), (), lambda e: None, logit_bias=((220, 1.0),))])
        sinks = [queue.Queue() for _ in range(3)]
        seqs = [Sequence(PROMPTS[0], 12, SamplingParams(temperature=1.5, seed=0), (), sinks[0].put,
                         prompt_logprobs=2, logprobs=2),
                Sequence(PROMPTS[1], 12, SamplingParams(temperature=1.5, seed=1), (), sinks[1].put,
                         logit_bias=((199, 4.0),), penalties=(0.5, 0.5)),
                Sequence(PROMPTS[2], 12, SamplingParams(temperature=1.5, seed=2), (), sinks[2].put)]
        sched.submit(seqs)
        events = [[] for _ in seqs]
        for sink, got in zip(sinks, events):
            while not got or got[-1][0] == "text" or got[-1][0] == "prompt":
                got.append(sink.get(timeout=30))
    finally:
        sched.close()
    for seq, got in zip(seqs, events):
        assert got[-1] == ("done", "length")
        assert len(seq.tokens) == 12 and all(0 <= t < HEAD for t in seq.tokens)
    assert any(t >= 128 for seq in seqs for t in seq.tokens)  # bytes past ASCII, near the head's end, drawn too
    prompt = next(e[1] for e in events[0] if e[0] == "prompt")  # (id, logprob, top) for each prompt token
    assert [entry[0] for entry in prompt] == PROMPTS[0]
    past = {i for i, t in enumerate(PROMPTS[0]) if t >= HEAD}
    for i, (_, logprob, top) in enumerate(prompt[1:], 1):
        assert (logprob == float("-inf")) == (i in past) and all(t < HEAD for t, _ in top)


def test_exports_refuse_what_has_no_narrower_head(tmp_path, capsys):
    from tests.test_interop import imported, run_cli

    with pytest.raises(UserError, match=re.escape("model.head_vocab=200: of the architectures redline exports to, "
                                                  "Apertus 1.5 alone has a head narrower than its embedding")):
        export_family(CFG)
    _, _, _, ckpt = imported("apertus1p5_text-pruned", tmp_path, capsys)
    out = tmp_path / "x.gguf"
    code, _, err = run_cli(["export", str(ckpt), "--format", "gguf", "--out", str(out)], capsys)
    assert code == 2 and "model.head_vocab=312: llama.cpp's output tensor has a row for every token" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_an_eos_id_past_the_head_is_said_at_import(tmp_path, capsys):
    """A multimodal Apertus 1.5 folder whose head stops below the image codes (200), an EOS id among those codes
    (within the tokenizer): kept, and said in one stderr line, since generation never stops at it."""
    from tests.test_interop import run_cli
    from tests.test_multimodal import _folder

    _folder("apertus1p5-pruned", tmp_path / "hf")
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 250]}))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    said = [line for line in err.splitlines() if "past the model's head" in line]
    assert code == 0 and len(said) == 1 and "eos_token_id [250] lies past the model's head (model.head_vocab=200)" \
        in said[0], err


def test_train_init_from_an_imported_pruned_head(tmp_path, capsys):
    """`redline train --init-from` on an Apertus 1.5 import with a pruned head: the first step's loss is
    transformers' on the same batch, and the head keeps its rows."""
    from tests.test_interop_commands import Imported, trained_two_steps

    before, after = trained_two_steps(Imported("apertus1p5_text-pruned", tmp_path / "src"), tmp_path, capsys)
    assert after.lm_head.weight.shape == before.lm_head.weight.shape and after.cfg.head_vocab == 312
    assert not torch.equal(before.lm_head.weight, after.lm_head.weight)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_loss():
    """On a GPU: the compiled, graph-captured engine (redline's fused decode block and head where it takes the model)
    decodes greedily within the head, as the eager one does; the compiled loss is eager's."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy

    torch.manual_seed(0)
    model = GPT(replace(CFG, n_embd=128, context_len=128)).cuda()
    assert_compiled_engine_stays_greedy(model, PROMPTS)
    x = torch.randint(0, CFG.vocab_size, (4, 96), device="cuda")
    y = torch.randint(0, HEAD, (4, 96), device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model)(x, y), model(x, y), rtol=1e-4, atol=1e-4)
