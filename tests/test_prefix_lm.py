"""The prefix-LM (model.prefix_lm) and PaliGemma's text model read as one: against transformers'
PaliGemmaForConditionalGeneration with token_type_ids marking the prompt, fp32 logits and the suffix's loss equal and
greedy tokens equal through the engine; the engine's prefill, batched prefill and DecodeBatch give the full
recompute's tokens with the prompt as the prefix; what a prefix-LM cannot do is refused by name."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from redline import cli
from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.model import GPT, ModelConfig
from tests.engine_checks import (assert_compiled_engine_stays_greedy, assert_scheduler_copies_no_beginning,
                                 full_recompute)
from tests.interop_models import VOCAB, byte_level_tokenizer
from tests.test_latent_attention import sharp

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PREFIX = ModelConfig(vocab_size=96, context_len=64, n_layer=2, n_embd=48, n_head=4, n_kv_head=2, mlp_hidden=64,
                     prefix_lm=True)

# PaliGemma 1 on Gemma (MQA, head_dim 24 != 64 / 4) and PaliGemma 2 on Gemma 2 (windowed and full layers, the window
# shorter than the prompts, scores and logits soft-capped with low caps so that they bite)
TEXT = {"gemma": dict(model_type="gemma", num_attention_heads=4, num_key_value_heads=1, head_dim=24),
        "gemma2": dict(model_type="gemma2", num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                       num_hidden_layers=3, query_pre_attn_scalar=20, sliding_window=5, attn_logit_softcapping=2.0,
                       final_logit_softcapping=3.0)}


def paligemma(text: str, seed: int = 0):
    """A tiny PaliGemmaForConditionalGeneration (a one-layer SigLIP tower) with every parameter perturbed."""
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    vision = dict(model_type="siglip_vision_model", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64, image_size=28, patch_size=14)
    config = transformers.PaliGemmaConfig(text_config={**common, **TEXT[text]}, vision_config=vision,
                                          image_token_index=VOCAB - 1, projection_dim=64)
    torch.manual_seed(seed)
    model = transformers.PaliGemmaForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def imported(text: str, tmp_path, capsys):
    """(PaliGemma, redline's import of its folder)."""
    from redline.training.checkpoint import load_for_inference

    hf = paligemma(text)
    hf.save_pretrained(tmp_path / "hf")
    byte_level_tokenizer(tmp_path / "hf")
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2], "bos_token_id": 0}))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")])
    assert exc.value.code == 0, capsys.readouterr().err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    return hf, model


TOKENS = torch.randint(2, VOCAB - 1, (2, 17), generator=torch.Generator().manual_seed(1))
PREFIX_LEN = torch.tensor([9, 4])


def token_types(prefix_len: torch.Tensor, T: int) -> torch.Tensor:
    """PaliGemma's processor's token_type_ids: 0 on each row's prefix (image and prompt), 1 on its suffix."""
    return (torch.arange(T)[None, :] >= prefix_len[:, None]).long()


@pytest.mark.parametrize("text", list(TEXT))
def test_paligemma_logits_loss_and_greedy_tokens_equal_transformers(text, tmp_path, capsys):
    hf, model = imported(text, tmp_path, capsys)
    assert model.cfg.prefix_lm
    types = token_types(PREFIX_LEN, TOKENS.shape[1])
    labels = TOKENS.masked_fill(types == 0, -100)  # the processor's labels: the suffix alone
    with torch.no_grad():
        out = hf(input_ids=TOKENS, token_type_ids=types, labels=labels)
        got = model(TOKENS, prefix_len=PREFIX_LEN)
        # the same rows all suffix (token_type_ids 1): causal attention, redline's without a prefix
        causal = hf(input_ids=TOKENS, token_type_ids=torch.ones_like(TOKENS)).logits
    torch.testing.assert_close(got, out.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model(TOKENS), causal, rtol=1e-5, atol=1e-5)
    assert (got - causal).abs().max() > 1e-2  # the prefix changes the logits
    # training's loss: targets are the labels shifted, the prefix's -1 (transformers' ForCausalLMLoss)
    targets = torch.cat([labels[:, 1:], torch.full((2, 1), -100)], dim=1).clamp(min=-1)
    with torch.no_grad():
        loss = model(TOKENS, targets, prefix_len=PREFIX_LEN)
    torch.testing.assert_close(loss, out.loss, rtol=1e-5, atol=1e-5)
    # greedy decoding: the engine (prompts of different lengths in one batch, each its own prefix) vs transformers'
    # generate with the prompt's token_type_ids 0, one by one
    prompts = [TOKENS[0, :9].tolist(), TOKENS[1, :4].tolist()]
    results = InferenceEngine(model, compile=False).generate(prompts, 10, SamplingParams(temperature=0))
    hf.generation_config.eos_token_id = None
    for prompt, result in zip(prompts, results):
        ids = torch.tensor([prompt])
        reference = hf.generate(input_ids=ids, token_type_ids=torch.zeros_like(ids), max_new_tokens=10,
                                do_sample=False, pad_token_id=0)
        assert result.tokens == reference[0, len(prompt):].tolist()


def prefix_model(**overrides) -> GPT:
    return sharp(replace(PREFIX, **overrides))


@pytest.mark.parametrize("overrides", [{}, dict(sliding_window=4, attn_softcap=3.0), dict(attn_chunk=5)],
                         ids=["full", "window-softcap", "chunks"])
@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute_with_the_prompt_as_prefix(overrides, chunk):
    """Prompts of different lengths in one batch (rows in chunks of `chunk` tokens: each prompt still whole), then
    decoded one token at a time: the full recompute's tokens, the prompt its prefix."""
    model = prefix_model(**overrides)
    prompts = [list(range(1, 12)), [5, 6, 7], [40]]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=chunk)
    got = [r.tokens for r in engine.generate(prompts, 10, SamplingParams(temperature=0))]
    assert got == [full_recompute(model, p, 10) for p in prompts]
    idx = torch.tensor([prompts[0] + got[0]])
    with torch.no_grad():  # the prefix changes what the prompt's last token predicts
        assert (model(idx, prefix_len=torch.tensor([11]))[0, 10] - model(idx)[0, 10]).abs().max() > 1e-2


def test_full_recompute_attends_the_prompt_both_ways():
    """GPT.forward's mask: a prefix token sees the prefix after it, a suffix token the prefix and the suffix before it,
    nothing later; prefix_len 0 is causal attention."""
    model = prefix_model(sliding_window=3)
    idx = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    changed[0, 5] = (idx[0, 5] + 1) % 96  # the prefix's last token (prefix 6)
    with torch.no_grad():
        a, b = (model(x, prefix_len=torch.tensor([6])) for x in (idx, changed))
        moved = (a - b).abs().amax(-1)[0]
        assert (moved[:5] > 0).all() and (moved[5:] > 0).all()  # every token sees it, the window notwithstanding
        changed = idx.clone()
        changed[0, 7] = (idx[0, 7] + 1) % 96  # a suffix token: causal (and windowed) from there
        moved = (model(idx, prefix_len=torch.tensor([6])) - model(changed, prefix_len=torch.tensor([6])))
        assert (moved.abs().amax(-1)[0, :7] == 0).all()
        torch.testing.assert_close(model(idx, prefix_len=torch.tensor([0])), model(idx))
    mask = model.attention_mask(6, "cpu", window=0, prefix_len=torch.tensor([3]))[0, 0]
    assert mask.tolist() == [[j <= i or (i < 3 and j < 3) for j in range(6)] for i in range(6)]


def test_flex_block_mask_is_the_dense_mask():
    """The flex attention BlockMask (training on CUDA) allows what the SDPA mask allows."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    model = prefix_model(sliding_window=3)
    prefix = torch.tensor([5, 0, 9])
    dense = model._allowed(12, "cpu", None, 3, prefix)  # (3, 1, 12, 12)
    block = model._block_mask(12, "cpu", None, 3, prefix)
    b, q, kv = torch.meshgrid(torch.arange(3), torch.arange(12), torch.arange(12), indexing="ij")
    assert torch.equal(block.mask_mod(b, 0, q, kv), dense[:, 0])


def test_decode_batch_prefills_whole_prompts_and_reuses_no_prefix():
    """The server's DecodeBatch: a prompt prefilled alone and two together (prefill_many) decode as the full
    recompute does; a span after slot 0 is refused by name, and no row's cache is matched for reuse."""
    from redline.inference.batch import DecodeBatch

    model = prefix_model()
    prompts = [list(range(3, 14)), [7, 1, 8, 2, 8], [9, 4]]
    batch = DecodeBatch(InferenceEngine(model, compile=False), rows=3, capacity=48)
    firsts = [int(batch.prefill(0, prompts[0]).argmax()),
              *batch.prefill_many([1, 2], prompts[1:]).argmax(-1).tolist()]
    for row, (prompt, first) in enumerate(zip(prompts, firsts)):
        batch.start(row, first, len(prompt))
    got = [[t] for t in firsts]
    for _ in range(5):
        for row, t in enumerate(batch.step().tolist()):
            got[row].append(t)
    assert got == [full_recompute(model, p, 6) for p in prompts]
    batch.free(0)
    assert batch.match(prompts[0] + [1, 2, 3, 4, 5, 6]) == (-1, 0)
    with pytest.raises(UserError, match="prefilled whole from slot 0"):
        batch.prefill(0, [5, 6], start=2)


def test_naive_generate_takes_the_prompt_as_prefix():
    from redline.inference import naive_generate

    model = prefix_model()
    prompts = torch.tensor([[3, 4, 5, 6, 7], [9, 8, 7, 6, 5]])
    tokens, _ = naive_generate(model, prompts, 6, SamplingParams(temperature=0))
    got = InferenceEngine(model, compile=False).generate(prompts.tolist(), 6, SamplingParams(temperature=0))
    assert tokens.tolist() == [r.tokens for r in got]


def test_training_reaches_the_weights_through_the_prefix():
    """The suffix's loss (the prefix's targets -1, as PaliGemma's labels) is differentiable, and its gradient
    reaches the prefix's tokens through the bidirectional attention."""
    torch.manual_seed(0)
    model = GPT(PREFIX).train()
    idx = torch.randint(0, 96, (2, 16))
    targets = idx.roll(-1, 1)
    targets[:, :5] = -1
    model(idx, targets, prefix_len=torch.tensor([6, 6])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_refusals(tmp_path):
    from redline.interop.families import export_family

    with pytest.raises(UserError, match="model.prefix_lm attends the prefix both ways"):
        replace(PREFIX, conv_layers=(0,)).validate()
    with pytest.raises(UserError, match="model.prefix_lm attends the prefix both ways"):
        replace(PREFIX, pos_emb="alibi").validate()
    with pytest.raises(UserError, match="prefix_len takes a prefix-LM"):
        GPT(replace(PREFIX, prefix_lm=False))(torch.zeros(1, 4, dtype=torch.long), prefix_len=torch.tensor([2]))
    with pytest.raises(UserError, match="model.prefix_lm: no architecture redline exports to"):
        export_family(PREFIX)


def test_paligemma_reads_the_hubs_sparse_text_config():
    """PaliGemma 1's Hub config gives a few text_config fields: the rest are GemmaConfig's defaults, as transformers
    fills them in; the prompt is a prefix whatever use_bidirectional_attention says."""
    from redline.interop.paligemma import FAMILY

    hub = {"model_type": "paligemma", "text_config": {"hidden_size": 2048, "intermediate_size": 16384,
                                                      "model_type": "gemma", "num_attention_heads": 8,
                                                      "num_hidden_layers": 18, "num_image_tokens": 256,
                                                      "num_key_value_heads": 1, "vocab_size": 257216},
           "vision_config": {}, "projection_dim": 2048, "image_token_index": 257152}
    cfg = FAMILY.model_config(hub)
    assert (cfg.prefix_lm, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.tie_embeddings,
            cfg.norm_eps, cfg.context_len) == (True, 18, 2048, 8, 1, 256, True, 1e-6, 8192)
    with pytest.raises(UserError, match="text_config.model_type='llama'"):
        FAMILY.model_config({**hub, "text_config": {**hub["text_config"], "model_type": "llama"}})


def test_sft_takes_each_rows_prompt_as_its_prefix():
    """SFT's objective on a prefix-LM: each row's prefix is its prompt, up to the token whose target is the first
    trained one (PaliGemma's labels), and the loss is the suffix's."""
    from redline.training.conversations import prompt_lengths
    from redline.training.objectives import SupervisedFineTuning

    model = prefix_model()
    inputs = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    targets = inputs.roll(-1, 1)
    targets[0, :4], targets[1, :2], targets[:, -1] = -1, -1, -1  # prompts of 5 and 3 tokens
    assert prompt_lengths(targets).tolist() == [5, 3]
    assert prompt_lengths(torch.full((1, 6), -1)).tolist() == [6]  # nothing trained: the whole row
    objective = SupervisedFineTuning()
    objective.prefix_lm = True  # attach()'s, from the run's model config
    with torch.no_grad():
        loss, _ = objective.compute(model, {"inputs": inputs, "targets": targets})
        expected = model(inputs, targets, prefix_len=torch.tensor([5, 3]))
        torch.testing.assert_close(loss, expected)
        assert (loss - model(inputs, targets)).abs() > 1e-4


PROMPT = "café 日本, the model reads tokens\tand says"


def test_sft_and_generate_on_an_imported_paligemma(tmp_path, capsys):
    """redline sft (LoRA) on PaliGemma's import: one conversation a row (packing refused by name); its export as a
    folder, a GGUF file or an adapter refused by name; generate with the prompt as the prefix: transformers' tokens
    with the prompt's token_type_ids 0."""
    hf, _ = imported("gemma", tmp_path, capsys)
    data = tmp_path / "c.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"hi {i}", "completion": "hello world"}) + "\n" for i in range(40)))
    common = ["sft", "--from", str(tmp_path / "ckpt"), "--data", str(data), f"out_dir={tmp_path}", "max_steps=2",
              "batch_size=2", "seq_len=48", "eval_batches=1", "tensorboard=False"]
    with pytest.raises(SystemExit) as exc:
        cli.main([*common, "run_name=packed"])
    assert exc.value.code != 0 and "finetune.packing=false" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main([*common, "run_name=s", "finetune.packing=false", "lora.enabled=True"])
    assert exc.value.code == 0, capsys.readouterr().err
    # import only: a Hugging Face folder, a GGUF file and a PEFT adapter are refused by name, nothing written
    for source, args in ((tmp_path / "ckpt", ["--out", str(tmp_path / "x")]),
                         (tmp_path / "ckpt", ["--format", "gguf", "--out", str(tmp_path / "x.gguf")]),
                         (tmp_path / "s", ["--adapter", str(tmp_path / "adapter")])):
        with pytest.raises(SystemExit) as exc:
            cli.main(["export", str(source), *args])
        assert exc.value.code != 0 and "model.prefix_lm: no architecture" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in ("x", "x.gguf", "adapter"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(["generate", "--checkpoint", str(tmp_path / "ckpt"), "--prompt", PROMPT, "--max-new-tokens",
                  "6", "--temperature", "0", "--jsonl", "-"])
    assert exc.value.code == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    from redline.inference.text import prompt_ids
    from redline.training.checkpoint import load_for_inference

    _, tokenizer, _ = load_for_inference(tmp_path / "ckpt")
    ids = prompt_ids(tokenizer, PROMPT)
    hf.generation_config.eos_token_id = None
    prompt = torch.tensor([ids])
    reference = hf.generate(input_ids=prompt, token_type_ids=torch.zeros_like(prompt), max_new_tokens=6,
                            do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
    stops = {*tokenizer.stop_ids, tokenizer.eot_id}
    cut = next((i for i, t in enumerate(reference) if t in stops), len(reference))
    assert record["prompt_tokens"] == len(ids) and record["completion"] == tokenizer.decode(reference[:cut])


def test_score_prefills_the_prefix():
    """engine.score (redline eval's KV-cache check): the prefilled tokens are the prefix, the rest decoded: the full
    forward's log-probabilities with that prefix."""
    model = prefix_model().double()
    tokens = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(2))
    logps, _ = InferenceEngine(model, dtype=torch.float64).score(tokens, prefill=7)
    with torch.no_grad():
        full = torch.log_softmax(model(tokens, prefix_len=torch.tensor([7, 7])), dim=-1)
    torch.testing.assert_close(logps, full[:, 6:-1].gather(2, tokens[:, 7:, None])[..., 0].float(), rtol=0,
                               atol=1e-6)


def test_server_prefills_each_prompt_whole_and_copies_no_beginning():
    """The server's scheduler on a prefix-LM: asked to reuse 16-token beginnings and to prefill 4 tokens a turn, it
    does neither (each prompt whole, its own prefix), and every request's greedy tokens are the engine's alone."""
    assert assert_scheduler_copies_no_beginning(prefix_model(vocab_size=261), 6) >= 64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("overrides", [{}, dict(sliding_window=8, attn_softcap=5.0)], ids=["full", "window-softcap"])
def test_gpu_compiled_engine_server_batch_and_training_step(overrides):
    """On a GPU: the compiled, graph-captured engine (bf16) decodes greedily with each prompt as its prefix: every
    token, teacher-forced through the fp32 model with that prefix, within 0.05 of the best logit; the server's
    graph-captured batched prefill (DecodeBatch.prefill_many) gives the eager engine's first tokens; the compiled
    training forward (flex attention's block mask where the scores are capped) gives eager's loss and gradients."""
    from redline.inference.batch import DecodeBatch

    model = prefix_model(n_embd=128, vocab_size=512, context_len=128, **overrides).cuda()
    prompts = [list(range(1, 20)), [5, 6, 7], list(range(30, 90))]
    assert_compiled_engine_stays_greedy(model, prompts, prompt_prefix=True)
    batch = DecodeBatch(InferenceEngine(model, dtype=torch.bfloat16), rows=4, capacity=128)
    assert batch.state.graphs is not None
    firsts = batch.prefill_many([0, 1, 2], prompts)
    with torch.no_grad():
        for prompt, row in zip(prompts, firsts.float()):
            full = model(torch.tensor([prompt], device="cuda"), prefix_len=torch.tensor([len(prompt)], device="cuda"))
            assert (full[0, -1].max() - full[0, -1, int(row.argmax())]) < 0.05
    model.train()
    idx = torch.randint(0, 512, (4, 96), device="cuda")
    prefix = torch.tensor([10, 0, 50, 96], device="cuda")
    weight = model.blocks[0].attn.qkv.weight
    exact = torch.autograd.grad(model(idx, idx, prefix_len=prefix), weight)[0]  # fp32 eager
    with torch.autocast("cuda", dtype=torch.bfloat16):  # eager and compiled bf16, each measured against fp32
        loss = model(idx, idx, prefix_len=prefix)
    grad = torch.autograd.grad(loss, weight)[0]
    torch._dynamo.reset()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss_c = torch.compile(model, dynamic=False)(idx, idx, prefix_len=prefix)
    grad_c = torch.autograd.grad(loss_c, weight)[0]
    torch.testing.assert_close(loss_c, loss, rtol=1e-2, atol=1e-2)
    eager_error, compiled_error = ((g - exact).norm() / exact.norm() for g in (grad, grad_c))
    assert compiled_error < 2 * eager_error + 0.02
