"""Activation checkpointing: same losses and gradients, fewer saved activations, unchanged parameter names."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from redline.config import TrainConfig
from redline.distributed import DistInfo
from redline.errors import UserError
from redline.model import GPT
from redline.presets import get_preset
from redline.training.activation_checkpointing import (
    apply_activation_checkpointing,
    blocks_to_checkpoint,
    is_checkpointed,
)


def small_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = replace(get_preset("tiny"), n_layer=4, n_embd=64, n_head=4, n_kv_head=2, vocab_size=256, context_len=32)
    return GPT(cfg)


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (2, 17), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def saved_bytes(model: GPT, x, y) -> int:
    """Bytes of tensors autograd keeps for the backward pass of one forward."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, y)
    return total


def test_blocks_to_checkpoint_modes():
    assert blocks_to_checkpoint(6, "none") == []
    assert blocks_to_checkpoint(6, "selective") == [0, 2, 4]
    assert blocks_to_checkpoint(5, "full") == [0, 1, 2, 3, 4]
    with pytest.raises(UserError, match="activation_checkpointing must be one of"):
        blocks_to_checkpoint(4, "some")


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_same_loss_and_gradients_as_without(mode):
    plain = small_model()
    ckpt = copy.deepcopy(plain)
    chosen = apply_activation_checkpointing(ckpt, mode)
    assert [i for i, b in enumerate(ckpt.blocks) if is_checkpointed(b)] == chosen
    x, y = batch()
    loss_plain, loss_ckpt = plain(x, y), ckpt(x, y)
    loss_plain.backward()
    loss_ckpt.backward()
    assert torch.equal(loss_plain, loss_ckpt)
    for (name, p), (name2, q) in zip(plain.named_parameters(), ckpt.named_parameters(), strict=True):
        assert name == name2
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_parameter_names_and_objects_unchanged():
    model = small_model()
    before = {name: p for name, p in model.named_parameters()}
    keys = list(model.state_dict())
    apply_activation_checkpointing(model, "full")
    assert list(model.state_dict()) == keys
    assert all(before[name] is p for name, p in model.named_parameters())
    # and a checkpointed model's weights load into a plain one
    plain = small_model(seed=5)
    plain.load_state_dict(model.state_dict())


def test_checkpointing_saves_fewer_activations():
    x, y = batch()
    none = saved_bytes(small_model(), x, y)
    selective_model = small_model()
    apply_activation_checkpointing(selective_model, "selective")
    selective = saved_bytes(selective_model, x, y)
    full_model = small_model()
    apply_activation_checkpointing(full_model, "full")
    full = saved_bytes(full_model, x, y)
    assert full < selective < none
    # a fully checkpointed block keeps its input only: most of the per-block activations are gone
    assert full < 0.6 * none


def test_eval_and_no_grad_run_plainly():
    plain = small_model()
    ckpt = copy.deepcopy(plain)
    apply_activation_checkpointing(ckpt, "full")
    x, _ = batch()
    plain.eval()
    ckpt.eval()
    with torch.no_grad():
        assert torch.equal(plain(x), ckpt(x))


def test_applying_twice_is_harmless():
    model = small_model()
    apply_activation_checkpointing(model, "full")
    cls = type(model.blocks[0])
    apply_activation_checkpointing(model, "full")
    assert type(model.blocks[0]) is cls


def test_wrap_model_applies_it():
    from redline.converters import Converters
    from redline.training.wrap import wrap_model

    cfg = TrainConfig(model=small_model().cfg, batch_size=2, seq_len=16, activation_checkpointing="selective",
                      compile=False)
    model = GPT(cfg.model)
    wrapped = wrap_model(model, cfg, torch.device("cpu"), DistInfo(), Converters())
    assert wrapped.module is model
    assert wrapped.decisions["activation_checkpointing"] == {"mode": "selective", "blocks": [0, 2]}
    x, y = batch()
    model(x, y).backward()
    assert all(p.grad is not None for p in model.parameters())
