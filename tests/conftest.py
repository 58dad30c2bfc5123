"""Every test starts from the process's initial global torch state, whichever tests ran before it in the same
process (pytest-xdist runs many tests per worker, in an order that changes between runs).

`redline train` and `redline bench` turn TF32 on for CUDA matmuls process-wide (torch.backends.*.allow_tf32), and
nothing turns it off: a later test in the same worker then computes its float32 reference (eager cuBLAS) with a
10-bit mantissa while the kernels under test (Triton matrix-vector products in fp32) do not, so greedy tokens of a
model with sharpened logits diverge and teacher-forced log-probabilities miss an fp32 tolerance. Such a test failed
only in a full parallel run and passed alone. The global RNG is reset to the seed a fresh process starts with, so a
test that draws from it sees what it sees when run alone."""

from __future__ import annotations

import pytest
import torch

_INITIAL_SEED = torch.initial_seed()  # read at collection, before any test seeds the generator


def _backend_flags() -> tuple:
    matmul = torch.backends.cuda.matmul
    return (torch.get_float32_matmul_precision(), matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction)


_INITIAL_FLAGS = _backend_flags()


def _set_backend_flags(flags: tuple) -> None:
    precision, tf32, cudnn_tf32, fp16_reduced, bf16_reduced = flags
    torch.set_float32_matmul_precision(precision)  # sets matmul.allow_tf32 as well; set below in case they differ
    matmul = torch.backends.cuda.matmul
    matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    matmul.allow_fp16_reduced_precision_reduction = fp16_reduced
    matmul.allow_bf16_reduced_precision_reduction = bf16_reduced


@pytest.fixture(autouse=True)
def initial_torch_state():
    if _backend_flags() != _INITIAL_FLAGS:
        _set_backend_flags(_INITIAL_FLAGS)
    torch.manual_seed(_INITIAL_SEED)  # the CPU and every CUDA generator
    yield


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny models (`pytestmark = pytest.mark.usefixtures("one_thread")`): as fast
    as several there, and immune to other processes competing for the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
