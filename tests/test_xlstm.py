"""xLSTM's mLSTM layers (model.delta_rule=mlstm): the chunked cell equals transformers' token by token recurrence,
the engine's prefill, chunked prefill, decode and DecodeBatch give the full recompute's tokens, packed documents start
from the initial state, training reaches every parameter, the fused weight mode reads as the single one, and what
redline cannot compute is refused by name. Import and export parity with transformers run in the shared tables
(tests/interop_models.py "xlstm", "xlstm-tied"; test_lora_export.ARCHS)."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine
from redline.interop import xlstm
from redline.model import GPT
from redline.recurrent import mlstm
from tests.engine_checks import assert_decode_batch_parks_rows, assert_freed_row_refills
from tests.test_diffllama import assert_engine_decodes_as_full_recompute
from tests.test_latent_attention import sharp

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

HUB = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_heads=2, qk_dim_factor=0.5, ffn_proj_factor=2.0,
           ffn_round_up_to_multiple_of=16, max_position_embeddings=64)
XLSTM = xlstm.model_config(HUB)  # q and k 8 wide a head, v 16, gates capped at 15, logits at 30


def _reference(q, k, v, i, f, **kw):
    """transformers' recurrence, token by token ((B, H, T, D) inputs)."""
    from transformers.models.xlstm.modeling_xlstm import mlstm_recurrent_sequence_native

    h, state = mlstm_recurrent_sequence_native(*(t.transpose(1, 2) for t in (q, k, v, i, f)),
                                               return_last_states=True, **kw)
    return h.transpose(1, 2), state


def _inputs(T: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, T, 3, 4, generator=g), torch.randn(2, T, 3, 4, generator=g)
    v = torch.randn(2, T, 3, 5, generator=g)
    i, f = torch.randn(2, T, 3, generator=g) * 5, torch.randn(2, T, 3, generator=g) * 3 + 2
    return tuple(t.to(dtype) for t in (q, k, v, i, f))


def test_chunked_cell_is_the_recurrence():
    """In fp64 to rounding (the running maximum m, which sets the denominator's floor, as the recurrence defines it),
    in fp32 closely; carried on over a second call (a chunked prefill or decode), padding leaving the state as the
    real tokens left it."""
    q, k, v, i, f = _inputs(21, torch.float64)
    expected, (C, n, m) = _reference(q, k, v, i, f, dtype_state=torch.float64)
    got, state = mlstm(q, k, v, i, f, chunk=4)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    for ours, theirs in zip(state, (C, n, m[..., 0])):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    q, k, v, i, f = _inputs(21)
    expected, _ = _reference(q, k, v, i, f)
    first, state = mlstm(q[:, :9], k[:, :9], v[:, :9], i[:, :9], f[:, :9], chunk=4)
    rest, _ = mlstm(q[:, 9:], k[:, 9:], v[:, 9:], i[:, 9:], f[:, 9:], state, chunk=5)
    torch.testing.assert_close(torch.cat([first, rest], 1), expected, rtol=1e-5, atol=5e-5)
    valid = torch.tensor([[True] * 9, [True] * 4 + [False] * 5])
    _, padded = mlstm(q[:, :9], k[:, :9], v[:, :9], i[:, :9], f[:, :9], valid=valid, chunk=4)
    _, short = mlstm(q[1:, :4], k[1:, :4], v[1:, :4], i[1:, :4], f[1:, :4], chunk=4)
    for a, b, c in zip(padded, short, state):
        torch.testing.assert_close(a[1], b[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(a[0], c[0], rtol=1e-6, atol=1e-6)


def _hf_model(**extra):
    torch.manual_seed(0)
    hf = transformers.xLSTMForCausalLM(transformers.xLSTMConfig(**{**HUB, **extra})).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return hf


class _Source:
    """A TensorSource stand-in over a state dict (xlstm.to_redline reads take and `in`)."""

    def __init__(self, state):
        self.state = state

    def take(self, name):
        return self.state[name]

    def __contains__(self, name):
        return name in self.state


def _fused(state: dict) -> dict:
    """A single-mode state dict under the fused weight mode's names (qkv_opreact, ifgate_preact, proj_up_gate_z)."""
    out = {}
    for name, w in state.items():
        base, _, leaf = name.rpartition(".mlstm_layer.")
        if leaf in ("q.weight", "k.weight", "v.weight", "igate_preact.weight", "igate_preact.bias"):
            continue
        if leaf == "ogate_preact.weight":
            out[base + ".mlstm_layer.qkv_opreact.weight"] = torch.cat(
                [state[f"{base}.mlstm_layer.{x}.weight"] for x in ("q", "k", "v", "ogate_preact")])
        elif leaf.startswith("fgate_preact."):
            kind = leaf.split(".")[1]
            out[f"{base}.mlstm_layer.ifgate_preact.{kind}"] = torch.cat(
                [state[f"{base}.mlstm_layer.igate_preact.{kind}"], w])
        elif name.endswith("ffn.proj_up.weight"):
            continue
        elif name.endswith("ffn.proj_up_gate.weight"):
            out[name.replace("proj_up_gate", "proj_up_gate_z")] = torch.cat(
                [w, state[name.replace("proj_up_gate", "proj_up")]])
        else:
            out[name] = w
    return out


@pytest.mark.parametrize("fused", [False, True], ids=["single", "fused"])
def test_narrow_keys_and_the_fused_weight_mode_match_transformers(fused):
    """q and k narrower than v (qk_dim_factor 0.5, 32 channels: transformers' cache rounds them up to 64, so its
    forward runs uncached), more tokens than the cell's chunk of 32; the fused weight mode's tensors (which
    transformers' own _init_weights fails to build) read into the same layers."""
    hf = _hf_model()
    state = hf.state_dict()
    model = GPT(XLSTM).eval()
    model.load_state_dict(xlstm.to_redline(_Source(_fused(state) if fused else state), XLSTM))
    tokens = torch.randint(0, 96, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens, use_cache=False).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute(chunk):
    assert_engine_decodes_as_full_recompute(sharp(XLSTM), chunk)


def test_decode_batch_rows_and_spans():
    model = sharp(XLSTM)
    assert_freed_row_refills(assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model), model)


def test_engine_cache_holds_the_memory_alone():
    engine = InferenceEngine(sharp(XLSTM), compile=False)
    assert engine.kv_bytes_per_token() == 0  # no convolution: nothing a token
    engine.reserve(2, 16)
    assert engine._state.cache.states[0].shape == (2, 2, 8 + 1, 16 + 1)  # C, n and m of each head, packed


def test_packed_documents_start_from_the_initial_state():
    model = sharp(XLSTM)
    a, b = torch.randint(0, 96, (1, 7)), torch.randint(0, 96, (1, 5))
    doc_ids = torch.tensor([[0] * 7 + [1] * 5])
    with torch.no_grad():
        got = model(torch.cat([a, b], dim=1), doc_ids=doc_ids)
        torch.testing.assert_close(got[:, :7], model(a), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[:, 7:], model(b), rtol=1e-5, atol=1e-5)


def test_training_reaches_every_parameter():
    torch.manual_seed(0)
    model = GPT(replace(XLSTM, context_len=80)).train()
    with torch.no_grad():  # gates off their closed initial values, so that the memory carries something
        for block in model.blocks:
            block.attn.igate.bias.zero_()
            block.attn.igate.weight.normal_(0, 0.1)
            block.attn.fgate.weight.normal_(0, 0.1)
    idx = torch.randint(0, 96, (2, 70))  # three chunks
    model(idx, idx).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


@pytest.mark.slow  # `redline train` end to end: the engine and gradient tests above run always
def test_train_init_from_an_import(tmp_path, capsys):
    from tests.test_interop_commands import check_train_init_from

    check_train_init_from("xlstm", tmp_path, capsys)


def test_refusals():
    with pytest.raises(UserError, match="use_bias=true"):
        xlstm.model_config({**HUB, "use_bias": True})
    with pytest.raises(UserError, match="eps=1e-05"):
        xlstm.model_config({**HUB, "eps": 1e-5})
    with pytest.raises(UserError, match="not whole heads of num_heads=3"):
        xlstm.model_config({**HUB, "num_heads": 3})
    with pytest.raises(UserError, match="model.delta_rule=mlstm has a gate pair"):
        replace(XLSTM, delta_key_heads=1).validate()
    with pytest.raises(UserError, match="model.delta_gate_softcap=15.0"):
        replace(XLSTM, delta_rule="gated_delta").validate()
    with pytest.raises(UserError, match="xLSTM, the one architecture with them, soft-caps"):
        xlstm.check_exportable(replace(XLSTM, logit_softcap=0.0))
    with pytest.raises(UserError, match="xLSTM, the one architecture with them, has a SwiGLU"):
        xlstm.check_exportable(replace(XLSTM, mlp="geglu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and the input gates' gradients match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = replace(XLSTM, n_embd=128, vocab_size=512, context_len=128, delta_heads=4, delta_key_heads=4,
                  delta_key_dim=16, delta_value_dim=32, mlp_hidden=256)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[0].attn.q.weight)
