"""tests/conftest.py: a test that turns TF32 on (as `redline train` and `bench` do on a GPU) or draws from the
global generator leaves nothing behind for the next test in the same process."""

from __future__ import annotations

import torch

from tests.conftest import _INITIAL_FLAGS, _INITIAL_SEED, _backend_flags

_drawn: list[torch.Tensor] = []


def test_a_test_that_changes_global_state():
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("medium")
    _drawn.append(torch.rand(4))


def test_the_next_test_starts_from_the_initial_state():
    assert _backend_flags() == _INITIAL_FLAGS
    assert _INITIAL_FLAGS[:2] == ("highest", False)  # torch's defaults: fp32 matmuls in fp32
    drawn = torch.rand(4)
    assert torch.equal(drawn, torch.rand(4, generator=torch.Generator().manual_seed(_INITIAL_SEED)))
    if _drawn:  # (the first test ran in this process, before this one)
        assert torch.equal(_drawn[0], drawn)
