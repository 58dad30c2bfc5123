"""The reference window (model.reference_window) and Unlimited-OCR's text model read as one: against transformers'
UnlimitedOcrForConditionalGeneration, whose generate makes the prompt the reference of its
reference_sliding_attention layers, each step's fp32 logits and the greedy tokens equal through the engine; the
engine's chunked prefill, DecodeBatch, score and the server's scheduler give the full recompute's results with the
prompt as the reference; what a reference window cannot do is refused by name."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from redline import cli
from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.model import GPT, ModelConfig
from tests.engine_checks import (assert_compiled_engine_stays_greedy, assert_decode_batch_serves_like_generate,
                                 assert_scheduler_copies_no_beginning, full_recompute)
from tests.interop_models import VOCAB, byte_level_tokenizer
from tests.test_latent_attention import sharp

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

REFERENCE = ModelConfig(vocab_size=96, context_len=64, n_layer=3, n_embd=48, n_head=4, n_kv_head=2, mlp_hidden=64,
                        sliding_window=3, window_layers=(0, 2), reference_window=True)


def unlimited_ocr(seed: int = 0):
    """A tiny UnlimitedOcrForConditionalGeneration: a window of 3 beside the reference on layers 0 and 2, a full
    layer between them, DeepSeek-V2's experts after a dense first layer, every parameter perturbed."""
    config = transformers.UnlimitedOcrConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                         n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
                         routed_scaling_factor=1.5, mlp_layer_types=["dense", "sparse", "sparse"], pad_token_id=None,
                         sliding_window=3, layer_types=["reference_sliding_attention", "full_attention",
                                                        "reference_sliding_attention"]),
        vision_config=dict(sam_config=dict(hidden_size=16, output_channels=16, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=64, patch_size=16,
                                           global_attn_indexes=[0], mlp_dim=32, window_size=2,
                                           downsample_channels=[32, 64]),
                           encoder_config=dict(hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                                               num_attention_heads=2)),
        image_token_id=VOCAB - 1)
    torch.manual_seed(seed)
    model = transformers.UnlimitedOcrForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.generation_config.eos_token_id = None
    return model


def imported(tmp_path, capsys):
    """(Unlimited-OCR, redline's import of its folder)."""
    from redline.training.checkpoint import load_for_inference

    hf = unlimited_ocr()
    hf.save_pretrained(tmp_path / "hf")
    byte_level_tokenizer(tmp_path / "hf")
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2], "bos_token_id": 0}))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"])
    assert exc.value.code == 0, capsys.readouterr().err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    return hf, model


TOKENS = torch.randint(2, VOCAB - 3, (2, 17), generator=torch.Generator().manual_seed(1))


def test_unlimited_ocr_generate_logits_and_greedy_tokens_equal_transformers(tmp_path, capsys):
    """Each step of transformers' generate (the prompt its cache's reference, 12 tokens past a window of 3) against
    redline's forward with the prompt as the reference: fp32 logits equal; the whole input as the reference (a
    forward without a cache) is causal attention; the engine's greedy tokens, prompts of two lengths in one batch,
    are generate's."""
    hf, model = imported(tmp_path, capsys)
    assert model.cfg.reference_window and [model.cfg.layer_window(i) for i in range(3)] == [3, 0, 3]
    prompts = [TOKENS[0, :9].tolist(), TOKENS[1, :4].tolist()]
    for prompt in prompts:
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0,
                          output_logits=True, return_dict_in_generate=True)
        steps = torch.stack(out.logits, dim=1)[0]  # (12, vocab): step i predicts new token i
        seq = out.sequences
        with torch.no_grad():
            got = model(seq, prefix_len=torch.tensor([len(prompt)]))[0, len(prompt) - 1:-1]
            causal = model(seq)[0, len(prompt) - 1:-1]
            torch.testing.assert_close(causal, hf(input_ids=seq).logits[0, len(prompt) - 1:-1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, steps, rtol=1e-5, atol=1e-5)
        assert (got - causal).abs().max() > 1e-2  # the window bites past the reference
    results = InferenceEngine(model, compile=False).generate(prompts, 12, SamplingParams(temperature=0))
    for prompt, result in zip(prompts, results):
        reference = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert result.tokens == reference[0, len(prompt):].tolist()


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_unlimited_ocr_export_is_refused_by_name(fmt, tmp_path, capsys):
    """Import only: the export (a folder, GGUF, and with them a PEFT adapter, which export_family answers first)
    refuses model.reference_window in one line before writing anything."""
    imported(tmp_path, capsys)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"), "--format", fmt])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    assert "model.reference_window: no architecture redline exports to" in err
    assert not (tmp_path / "out").exists()


def reference_model(**overrides) -> GPT:
    return sharp(replace(REFERENCE, **overrides))


def test_mask_keeps_the_reference_beside_the_window():
    """GPT.attention_mask: causal, within the window or within the row's reference; the flex BlockMask (training on
    CUDA) allows the same."""
    model = reference_model()
    mask = model.attention_mask(8, "cpu", window=2, prefix_len=torch.tensor([3]))[0, 0]
    assert mask.tolist() == [[j <= i and (i - j < 2 or j < 3) for j in range(8)] for i in range(8)]
    pytest.importorskip("torch.nn.attention.flex_attention")
    prefix = torch.tensor([5, 0, 12])
    dense = model._allowed(12, "cpu", None, 3, prefix)  # (3, 1, 12, 12)
    block = model._block_mask(12, "cpu", None, 3, prefix)
    b, q, kv = torch.meshgrid(torch.arange(3), torch.arange(12), torch.arange(12), indexing="ij")
    assert torch.equal(block.mask_mod(b, 0, q, kv), dense[:, 0])


@pytest.mark.parametrize("chunk", [32768, 4])
def test_engine_decodes_as_full_recompute_with_the_prompt_as_reference(chunk):
    """Prompts of different lengths in one batch (prompts in spans of `chunk` tokens), decoded well past the window:
    the full recompute's tokens with the prompt as the reference, which differ from a plain window's."""
    model = reference_model()
    prompts = [list(range(1, 12)), [5, 6, 7], [40]]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
    got = [r.tokens for r in engine.generate(prompts, 10, SamplingParams(temperature=0))]
    assert got == [full_recompute(model, p, 10) for p in prompts]
    idx = torch.tensor([prompts[0] + got[0]])
    with torch.no_grad():
        windowed = GPT(replace(model.cfg, reference_window=False))
        windowed.load_state_dict(model.state_dict())
        ours = model(idx, prefix_len=torch.tensor([11]))[0, 11:]
        assert (ours - windowed(idx)[0, 11:]).abs().max() > 1e-2  # the reference is seen past the window
        assert (ours - model(idx)[0, 11:]).abs().max() > 1e-2  # and the window cuts the rest


def test_decode_batch_and_score_take_the_prompt_as_reference():
    """The server's DecodeBatch (a prompt whole, one in spans, two together) decodes as the full recompute does and
    matches no row's cache for reuse; engine.score's prefilled tokens are the reference."""
    from redline.inference.batch import DecodeBatch

    model = reference_model()
    assert_decode_batch_serves_like_generate(model, [list(range(3, 14)), [7, 1, 8, 2, 8], [9, 4],
                                                     list(range(20, 33))])
    batch = DecodeBatch(InferenceEngine(model, compile=False), rows=2, capacity=48)
    prompt = list(range(3, 14))
    batch.start(0, int(batch.prefill(0, prompt).argmax()), len(prompt))
    batch.step()
    assert batch.match(prompt + [1, 2, 3, 4, 5, 6]) == (-1, 0)
    model = model.double()
    tokens = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(2))
    logps, _ = InferenceEngine(model, dtype=torch.float64).score(tokens, prefill=7)
    with torch.no_grad():
        full = torch.log_softmax(model(tokens, prefix_len=torch.tensor([7, 7])), dim=-1)
    torch.testing.assert_close(logps, full[:, 6:-1].gather(2, tokens[:, 7:, None])[..., 0].float(), rtol=0,
                               atol=1e-6)


def test_naive_generate_and_training_take_the_reference():
    from redline.inference import naive_generate

    model = reference_model()
    prompts = torch.tensor([[3, 4, 5, 6, 7], [9, 8, 7, 6, 5]])
    tokens, _ = naive_generate(model, prompts, 8, SamplingParams(temperature=0))
    got = InferenceEngine(model, compile=False).generate(prompts.tolist(), 8, SamplingParams(temperature=0))
    assert tokens.tolist() == [r.tokens for r in got]
    model.train()
    idx = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(3))
    loss = model(idx, idx.roll(-1, 1), prefix_len=torch.tensor([4, 9]))
    loss.backward()
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_server_reuses_no_beginning_and_prefills_prompts_in_spans():
    """The server's scheduler: asked to reuse 16-token beginnings, it does not (a parked row's slots past its prompt
    were windowed); prompts prefilled 4 tokens a turn still give each request the engine's greedy tokens alone."""
    assert assert_scheduler_copies_no_beginning(reference_model(vocab_size=261), 8) == 4


def test_refusals():
    from redline.inference.plan import _triton_attention_unsupported

    with pytest.raises(UserError, match="model.reference_window .* needs model.sliding_window"):
        replace(REFERENCE, sliding_window=0, window_layers=()).validate()
    with pytest.raises(UserError, match="model.reference_window"):
        replace(REFERENCE, prefix_lm=True).validate()
    reason = _triton_attention_unsupported(REFERENCE, torch.device("cuda"), torch.bfloat16)
    assert "model.reference_window" in reason


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_server_batch_and_training_step():
    """On a GPU: the compiled, graph-captured engine (bf16) decodes greedily with each prompt as its reference:
    every token, teacher-forced through the fp32 model with that reference, within 0.05 of the best logit; the
    server's graph-captured batched prefill gives those of the full forward; the compiled training forward gives
    eager's loss."""
    from redline.inference.batch import DecodeBatch
    from tests.engine_checks import assert_compiled_training_step_matches

    model = reference_model(n_embd=128, vocab_size=512, context_len=128, sliding_window=8).cuda()
    prompts = [list(range(1, 20)), [5, 6, 7], list(range(30, 90))]
    assert_compiled_engine_stays_greedy(model, prompts, prompt_prefix=True)
    batch = DecodeBatch(InferenceEngine(model, dtype=torch.bfloat16), rows=4, capacity=128)
    firsts = batch.prefill_many([0, 1, 2], prompts)
    with torch.no_grad():
        for prompt, row in zip(prompts, firsts.float()):
            full = model(torch.tensor([prompt], device="cuda"))
            assert (full[0, -1].max() - full[0, -1, int(row.argmax())]) < 0.05
    assert_compiled_training_step_matches(model, model.blocks[0].attn.qkv.weight)
