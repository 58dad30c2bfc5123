"""model.ce_chunk_tokens: the chunked head + cross-entropy equals the full one (loss and every gradient), in fp32
and bf16, with padded vocabularies, ignored targets, tied embeddings, uneven chunks, compile, activation
checkpointing, an FP8 head, DDP and FSDP2; it keeps no (tokens, vocab) tensor for backward; bad values are user
errors."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from redline.chunked_cross_entropy import chunk_loss_and_grad, chunked_cross_entropy, linear_cross_entropy_sum
from redline.config import TrainConfig, apply_overrides
from redline.errors import UserError
from redline.model import GPT, ModelConfig
from tests.test_train import dataset  # noqa: F401  (the session-scoped prepared corpus)

# vocab 101 is padded to 128: the padded rows take no part in the softmax in either path
SMALL = ModelConfig(vocab_size=101, context_len=32, n_layer=2, n_embd=32, n_head=4, n_kv_head=2)


def pair(chunk: int, **overrides) -> tuple[GPT, GPT]:
    """A full-logits model and a chunked one with the same weights."""
    torch.manual_seed(0)
    full = GPT(replace(SMALL, **overrides))
    chunked = GPT(replace(SMALL, ce_chunk_tokens=chunk, **overrides))
    chunked.load_state_dict(full.state_dict())
    return full, chunked


def batch(B: int = 3, T: int = 17, ignored: bool = True, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 101, (B, T), generator=g)
    targets = torch.randint(0, 101, (B, T), generator=g)
    if ignored:
        targets[0, :5] = -1  # e.g. padding of a short document
        targets[2, -1] = -1
    return idx, targets


def loss_and_grads(model: nn.Module, idx, targets, dtype: torch.dtype | None = None, owner: GPT | None = None):
    owner = owner or model
    owner.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = model(idx, targets)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in owner.named_parameters()}


def assert_same(a, b, atol: float, rtol: float):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    torch.testing.assert_close(loss_a, loss_b, atol=atol, rtol=rtol)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=atol, rtol=rtol, msg=name)


# ----------------------------------------------------------------------------------------------------
# the function against F.cross_entropy


@pytest.mark.parametrize("chunk", [1, 7, 50, 64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_function_equals_cross_entropy_fp32(chunk, reduction):
    torch.manual_seed(0)
    head = nn.Linear(16, 40, bias=False)
    x = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 40, (50,))
    targets[[3, 4, 30]] = -1
    ref = F.cross_entropy(head(x).float(), targets, ignore_index=-1, reduction=reduction)
    weights = torch.randn(ref.shape)  # a non-uniform upstream gradient for reduction="none"
    ref_x, ref_w = torch.autograd.grad((ref * weights).sum(), (x, head.weight))
    out = chunked_cross_entropy(head, x, targets, chunk, reduction)
    got_x, got_w = torch.autograd.grad((out * weights).sum(), (x, head.weight))
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got_x, ref_x, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_w, ref_w, atol=1e-6, rtol=1e-5)
    if reduction == "none":
        assert out.shape == (50,) and (out[[3, 4, 30]] == 0).all()


def test_operator_returns_the_gradients_of_the_sum():
    torch.manual_seed(0)
    x, w = torch.randn(9, 8, requires_grad=True), torch.randn(24, 8, requires_grad=True)
    targets = torch.tensor([0, 5, -1, 23, 7, 7, -1, 1, 2])
    ref = F.cross_entropy(x @ w.t(), targets, ignore_index=-1, reduction="sum")
    ref_x, ref_w = torch.autograd.grad(ref, (x, w))
    with torch.no_grad():
        total, grad_x, grad_w = linear_cross_entropy_sum(x, w, targets, 4, -1, torch.float32, 24)
    torch.testing.assert_close(total, ref)
    torch.testing.assert_close(grad_x, ref_x)
    torch.testing.assert_close(grad_w, ref_w)
    assert grad_w.dtype == torch.float32 and grad_x.dtype == x.dtype


def test_padding_rows_take_no_part_in_the_loss():
    """Rows of the head past `vocab` (the padded vocabulary) are out of the softmax: the loss and gradients are
    those of the head cut to its first `vocab` rows, and the padding rows get no gradient."""
    torch.manual_seed(0)
    x, w = torch.randn(9, 8, requires_grad=True), torch.randn(24, 8, requires_grad=True)
    targets = torch.tensor([0, 5, -1, 19, 7, 7, -1, 1, 2])
    ref = F.cross_entropy(x @ w[:20].t(), targets, ignore_index=-1, reduction="sum")
    ref_x, ref_w = torch.autograd.grad(ref, (x, w))
    with torch.no_grad():
        total, grad_x, grad_w = linear_cross_entropy_sum(x, w, targets, 4, -1, torch.float32, 20)
    torch.testing.assert_close(total, ref)
    torch.testing.assert_close(grad_x, ref_x)
    torch.testing.assert_close(grad_w, ref_w)
    assert not grad_w[20:].any()
    head = nn.Linear(8, 24, bias=False)
    for reduction in ("mean", "none"):
        expected = F.cross_entropy(head(x)[:, :20], targets, ignore_index=-1, reduction=reduction)
        torch.testing.assert_close(chunked_cross_entropy(head, x, targets, 4, reduction, vocab=20), expected)


def test_chunk_step_compiles_to_the_same_numbers():
    """On CUDA the per-chunk softmax/loss/gradient runs compiled: the compiled function gives the same numbers."""
    torch.manual_seed(0)
    logits = torch.randn(12, 40).bfloat16()
    targets = torch.tensor([0, 3, -1, 39, 5, 5, 6, -1, 8, 9, 10, 11])
    loss, grad = chunk_loss_and_grad(logits.clone(), targets, -1, 40)
    compiled_loss, compiled_grad = torch.compile(chunk_loss_and_grad, fullgraph=True)(logits.clone(), targets, -1, 40)
    torch.testing.assert_close(compiled_loss, loss)
    torch.testing.assert_close(compiled_grad, grad, atol=1e-3, rtol=1e-2)
    full = logits.float().requires_grad_()
    ref = F.cross_entropy(full, targets, ignore_index=-1, reduction="sum")
    ref.backward()
    torch.testing.assert_close(loss, ref.detach())
    assert grad.dtype == torch.bfloat16 and (grad[[2, 7]] == 0).all()
    torch.testing.assert_close(grad.float(), full.grad, atol=4e-3, rtol=1e-2)


# ----------------------------------------------------------------------------------------------------
# the model: ce_chunk_tokens against the full logits


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("chunk", [7, 16, 51, 4096])  # 51 = B·T exactly; 7 and 16 leave a short last chunk
def test_model_fp32_equals_full(tie, chunk):
    full, chunked = pair(chunk, tie_embeddings=tie)
    idx, targets = batch()
    assert_same(loss_and_grads(full, idx, targets), loss_and_grads(chunked, idx, targets), atol=1e-6, rtol=1e-5)
    if tie:
        assert chunked.lm_head.weight is chunked.wte.weight
    grads = loss_and_grads(chunked, idx, targets)[1]
    head = "wte.weight" if tie else "lm_head.weight"
    assert not grads[head][101:].any()  # the padded rows are out of the softmax, as in the full path


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_model_bf16_autocast_close_to_full(tie):
    full, chunked = pair(10, tie_embeddings=tie)
    idx, targets = batch()
    loss_full, grads_full = loss_and_grads(full, idx, targets, torch.bfloat16)
    loss_chunked, grads_chunked = loss_and_grads(chunked, idx, targets, torch.bfloat16)
    torch.testing.assert_close(loss_chunked, loss_full, atol=1e-5, rtol=1e-5)  # same bf16 logits, fp32 loss
    for name, g in grads_full.items():
        scale = g.abs().max().item()
        assert (grads_chunked[name] - g).abs().max().item() <= 0.02 * scale + 1e-6, name


def test_model_bf16_weights_close_to_full():
    full, chunked = pair(8)
    full, chunked = full.to(torch.bfloat16), chunked.to(torch.bfloat16)
    idx, targets = batch()
    loss_full, grads_full = loss_and_grads(full, idx, targets)
    loss_chunked, grads_chunked = loss_and_grads(chunked, idx, targets)
    assert loss_chunked.dtype == torch.float32
    torch.testing.assert_close(loss_chunked, loss_full, atol=1e-4, rtol=1e-4)
    for name, g in grads_full.items():
        assert grads_chunked[name].dtype == torch.bfloat16
        assert (grads_chunked[name].float() - g.float()).abs().max() <= 0.03 * g.float().abs().max() + 1e-6, name


def test_per_token_losses_with_and_without_grad():
    full, chunked = pair(5)
    idx, targets = batch()
    with torch.no_grad():  # evaluation: reduction="none" under no_grad, through the head module
        torch.testing.assert_close(chunked(idx, targets, reduction="none"), full(idx, targets, reduction="none"))
    weights = torch.rand(3, 17)
    (full(idx, targets, reduction="none") * weights).sum().backward()
    (chunked(idx, targets, reduction="none") * weights).sum().backward()
    for (name, a), b in zip(full.named_parameters(), chunked.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_generation_logits_are_unchanged():
    full, chunked = pair(4)
    idx, _ = batch()
    assert chunked(idx).shape == (3, 17, 101)
    torch.testing.assert_close(chunked(idx), full(idx))


def test_saved_tensors_hold_no_logits():
    """What backward keeps: the full path saves (tokens, padded vocab) logits; the chunked path nothing that big."""
    full, chunked = pair(8, vocab_size=1000)  # a head larger than any other weight, as in a real model
    g = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(0, 1000, (4, 32), generator=g), torch.randint(0, 1000, (4, 32), generator=g)
    rows_x_vocab = idx.numel() * full.cfg.padded_vocab

    def saved_numels(model):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (sizes.append(t.numel()), t)[1], lambda t: t):
            loss = model(idx, targets)
        loss.backward()
        return sizes

    full_sizes, chunked_sizes = saved_numels(full), saved_numels(chunked)
    assert rows_x_vocab in full_sizes
    assert max(chunked_sizes) < rows_x_vocab / 2
    assert sum(chunked_sizes) < sum(full_sizes) - rows_x_vocab


def test_compiled_model_equals_eager_full():
    full, chunked = pair(16, tie_embeddings=True)
    idx, targets = batch()
    compiled = torch.compile(chunked, fullgraph=True)
    assert_same(loss_and_grads(full, idx, targets),
                loss_and_grads(compiled, idx, targets, owner=chunked), atol=1e-5, rtol=1e-4)


class SubclassedHead(nn.Linear):
    """Not exactly nn.Linear (as an FP8 head is not): takes the per-chunk module path."""


def test_compiled_model_with_a_module_head_equals_eager_full():
    full, chunked = pair(16)
    chunked.lm_head.__class__ = SubclassedHead
    idx, targets = batch()
    compiled = torch.compile(chunked)  # the per-chunk loop itself stays out of the graph
    assert_same(loss_and_grads(full, idx, targets),
                loss_and_grads(compiled, idx, targets, owner=chunked), atol=1e-5, rtol=1e-4)


def test_activation_checkpointing_equals_full():
    from redline.training.activation_checkpointing import apply_activation_checkpointing

    full, chunked = pair(9)
    assert apply_activation_checkpointing(chunked, "full") == [0, 1]
    idx, targets = batch()
    assert_same(loss_and_grads(full, idx, targets), loss_and_grads(chunked, idx, targets), atol=1e-6, rtol=1e-5)


def test_fp8_head_is_called_per_chunk():
    """An FP8 lm_head is not bypassed: the chunked path calls it per chunk (and again in backward, recomputing)."""
    pytest.importorskip("torchao.float8")
    from redline.converters import float8 as f8

    full, chunked = pair(16, vocab_size=256, n_embd=64, n_head=4)
    for model in (full, chunked):
        f8.convert_linears(model, {"lm_head"}, emulate=True)
    assert type(chunked.lm_head).__name__ == "SwitchableFloat8Linear"
    g = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(0, 256, (2, 24), generator=g), torch.randint(0, 256, (2, 24), generator=g)
    calls = []
    chunked.lm_head.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    for model in (full, chunked):  # BF16 through the same module: as the full path
        f8.set_float8_enabled(model, False)
    assert_same(loss_and_grads(full, idx, targets, torch.bfloat16),
                loss_and_grads(chunked, idx, targets, torch.bfloat16), atol=2e-2, rtol=2e-2)
    assert calls == [16, 16, 16, 16, 16, 16]  # 3 chunks of 48 tokens, forward then recomputed in backward
    for model in (full, chunked):
        f8.set_float8_enabled(model, True)
    loss_full, grads_full = loss_and_grads(full, idx, targets, torch.bfloat16)
    loss_chunked, grads_chunked = loss_and_grads(chunked, idx, targets, torch.bfloat16)
    assert f8.float8_enabled(chunked)
    assert abs(loss_chunked.item() - loss_full.item()) < 0.01 * loss_full.item()  # FP8 scales per chunk
    cosine = F.cosine_similarity(grads_chunked["lm_head.weight"].flatten(), grads_full["lm_head.weight"].flatten(), 0)
    assert cosine > 0.99


# ----------------------------------------------------------------------------------------------------
# configuration


def test_bad_chunk_values_are_user_errors():
    with pytest.raises(UserError, match="model.ce_chunk_tokens must be >= 0"):
        GPT(replace(SMALL, ce_chunk_tokens=-8))
    cfg = TrainConfig()
    apply_overrides(cfg, {"model.ce_chunk_tokens": -1})
    with pytest.raises(UserError, match="ce_chunk_tokens"):
        cfg.validate()
    with pytest.raises(UserError, match="must be a int"):
        apply_overrides(TrainConfig(), {"model.ce_chunk_tokens": "lots"})
    with pytest.raises(ValueError, match="chunk must be positive"):
        chunked_cross_entropy(nn.Linear(4, 8, bias=False), torch.randn(3, 4), torch.zeros(3, dtype=torch.long), 0)


def test_off_by_default_and_set_from_the_command_line():
    from redline.config import parse

    assert ModelConfig().ce_chunk_tokens == 0
    cfg = parse(TrainConfig, ["--preset", "tiny", "model.ce_chunk_tokens=4096"], prog="t", description="t")
    assert cfg.model.ce_chunk_tokens == 4096
    copy.deepcopy(cfg).validate()


# ----------------------------------------------------------------------------------------------------
# training: data parallel (2 gloo ranks) and the compiled model, through `redline train`


@pytest.mark.slow
def test_data_parallel_training_matches_one_process_without_chunks(dataset, tmp_path):  # noqa: F811
    from tests.test_distributed import close, run_train

    single = run_train(dataset, tmp_path, "single", 1, "max_steps=4")
    for parallel in ("ddp", "fsdp2"):  # 64 tokens per rank and micro-batch: chunks of 24, 24 and 16
        chunked = run_train(dataset, tmp_path, parallel, 2, "max_steps=4", f"parallel={parallel}",
                            "model.ce_chunk_tokens=24")
        assert close(single, chunked), (parallel, single, chunked)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compiled", [False, True])
def test_chunked_matches_full_on_gpu(compiled):
    """On CUDA each chunk's softmax, loss and gradient run compiled: the same loss and gradients as the full path
    (fp32 weights under bf16 autocast, as training runs), eager and with the model compiled too."""
    full, chunked = pair(24, vocab_size=1000, n_embd=64)
    full, chunked = full.cuda(), chunked.cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    idx = torch.randint(0, 1000, (4, 32), device="cuda", generator=g)
    targets = torch.randint(0, 1000, (4, 32), device="cuda", generator=g)
    targets[0, :3] = -1
    results = []
    for model in (full, chunked):
        model.zero_grad(set_to_none=True)
        run = torch.compile(model) if compiled else model
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(idx, targets)
        loss.backward()
        results.append((loss.detach().float(), {n: p.grad.float().clone() for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b, atol=1e-3, rtol=1e-3)
    for name in grads_a:
        scale = grads_a[name].abs().max().clamp(min=1e-6)
        assert (grads_a[name] - grads_b[name]).abs().max() / scale < 0.03, name


@pytest.mark.parametrize("chunk", [0, 5])
def test_model_loss_leaves_the_padded_vocabulary_out(chunk):
    """A vocabulary of 100 padded to 128 rows: the loss (full or chunked) is the cross-entropy of the 100 real
    logits, as transformers computes it for an imported model, and the padding rows get no gradient."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=100, context_len=16, n_layer=1, n_embd=32, n_head=2, ce_chunk_tokens=chunk))
    with torch.no_grad():
        model.lm_head.weight[100:] = 0.0  # as an import pads them
    idx, targets = torch.randint(0, 100, (2, 8)), torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        expected = F.cross_entropy(model(idx).flatten(0, 1), targets.flatten())
    loss = model(idx, targets)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert not model.lm_head.weight.grad[100:].any()
