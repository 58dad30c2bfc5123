"""RWKV-4's layers (model.delta_rule=rwkv, mlp=rwkv, rescale_every): the chunked WKV equals transformers' token by
token recurrence, the engine's prefill, chunked prefill, decode and DecodeBatch give the full recompute's tokens,
packed documents start their state and token shifts afresh, training reaches every parameter, and what redline
cannot compute or write is refused by name. Import and export parity with transformers run in the shared tables
(tests/interop_models.py "rwkv", "rwkv-tied"; test_lora_export.ARCHS)."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.inference import InferenceEngine
from redline.interop import rwkv
from redline.model import GPT
from redline.recurrent import wkv
from tests.engine_checks import assert_decode_batch_parks_rows, assert_freed_row_refills
from tests.test_diffllama import assert_engine_decodes_as_full_recompute
from tests.test_latent_attention import sharp

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

HUB = dict(vocab_size=96, hidden_size=32, num_hidden_layers=3, intermediate_size=64, rescale_every=2,
           context_length=64)
RWKV = rwkv.model_config(HUB)  # three blocks, the last one's norms (and the final norm) at 4·eps


def _reference(k, v, time_decay, u, state=None):
    """transformers' CPU recurrence, token by token, from its (num, den, max) state list."""
    from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu

    return rwkv_linear_attention_cpu(time_decay, u, k, v, state=state, return_state=True)


def test_chunked_wkv_is_the_recurrence():
    """Chunks of 4 over 11 tokens, carried on into 5 more (as a chunked prefill or decode does): transformers' loop's
    outputs; padding tokens (valid False) leave the state as the real tokens left it; keys large enough to overflow
    fp32's exp without the running maximum."""
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 16, 8, generator=g) * 30, torch.randn(2, 16, 8, generator=g)
    time_decay, u = torch.randn(8, generator=g), torch.randn(8, generator=g)
    expected, _ = _reference(k, v, time_decay, u)
    first, state = wkv(k[:, :11], v[:, :11], time_decay.exp(), u, chunk=4)
    rest, _ = wkv(k[:, 11:], v[:, 11:], time_decay.exp(), u, state, chunk=4)
    torch.testing.assert_close(torch.cat([first, rest], 1), expected, rtol=1e-5, atol=1e-5)
    valid = torch.tensor([[True] * 11, [True] * 6 + [False] * 5])
    _, padded = wkv(k[:, :11], v[:, :11], time_decay.exp(), u, valid=valid, chunk=4)
    _, short = wkv(k[1:, :6], v[1:, :6], time_decay.exp(), u, chunk=4)
    torch.testing.assert_close(padded[1], short[0], rtol=1e-6, atol=0)  # (num, den, m): the same representation
    torch.testing.assert_close(padded[0], state[0], rtol=1e-6, atol=0)


def test_attention_width_of_its_own_matches_transformers():
    """attention_hidden_size apart from hidden_size (transformers' cached generation cannot run it: its state takes
    hidden_size channels; its forward without the cache can), with every block rescaled (rescale_every=1)."""
    torch.manual_seed(0)
    config = transformers.RwkvConfig(**{**HUB, "attention_hidden_size": 24, "rescale_every": 1})
    hf = transformers.RwkvForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    cfg = rwkv.model_config(config.to_dict())
    model = GPT(cfg).eval()
    state = rwkv.to_redline(_Source(hf.state_dict()), cfg)
    model.load_state_dict(state)
    tokens = torch.randint(0, 96, (2, 40))  # more than the WKV's chunk of 32
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens, use_cache=False).logits, rtol=1e-5, atol=1e-5)


class _Source:
    """A TensorSource stand-in over a state dict (rwkv.to_redline reads take and `in`)."""

    def __init__(self, state):
        self.state = state

    def take(self, name):
        return self.state[name]

    def __contains__(self, name):
        return name in self.state


@pytest.mark.parametrize("chunk", [32768, 3])
def test_engine_decodes_as_full_recompute(chunk):
    assert_engine_decodes_as_full_recompute(sharp(RWKV), chunk)


def test_decode_batch_rows_and_spans():
    model = sharp(RWKV)
    assert_freed_row_refills(assert_decode_batch_parks_rows(InferenceEngine(model, compile=False), model), model)


def test_engine_cache_holds_two_token_shifts_and_the_wkv_state():
    engine = InferenceEngine(sharp(RWKV), compile=False)
    assert engine.kv_bytes_per_token() == 3 * 2 * 32 * 4  # each layer's two (C,) predecessors, fp32
    engine.reserve(2, 16)
    assert engine._state.cache.states[0].shape == (2, 3, 32)  # (num, den, m) a channel


def test_packed_documents_start_their_state_afresh():
    """Two documents packed in one row (doc_ids): each one's logits are its own forward's (the WKV state and both
    token shifts restart)."""
    model = sharp(RWKV)
    a, b = torch.randint(0, 96, (1, 7)), torch.randint(0, 96, (1, 5))
    doc_ids = torch.tensor([[0] * 7 + [1] * 5])
    with torch.no_grad():
        got = model(torch.cat([a, b], dim=1), doc_ids=doc_ids)
        torch.testing.assert_close(got[:, :7], model(a), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[:, 7:], model(b), rtol=1e-5, atol=1e-5)


def test_training_reaches_every_parameter():
    torch.manual_seed(0)
    model = GPT(replace(RWKV, context_len=80)).train()
    idx = torch.randint(0, 96, (2, 70))  # three WKV chunks
    model(idx, idx).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_rescale_every_sets_the_norms_epsilon():
    model = GPT(RWKV)
    assert [(b.norm1.eps, b.norm2.eps) for b in model.blocks] == [(1e-5, 1e-5), (1e-5, 1e-5), (4e-5, 4e-5)]
    assert model.norm_f.eps == 4e-5 and model.embed_norm.eps == 1e-5


@pytest.mark.slow  # `redline train` end to end: the engine and gradient tests above run always
def test_train_init_from_an_import(tmp_path, capsys):
    from tests.test_interop_commands import check_train_init_from

    check_train_init_from("rwkv", tmp_path, capsys)


def test_refusals():
    with pytest.raises(UserError, match="layer_norm_epsilon=1e-06"):
        rwkv.model_config({**HUB, "layer_norm_epsilon": 1e-6})
    with pytest.raises(UserError, match="model.delta_rule=rwkv keeps a state a channel"):
        replace(RWKV, delta_key_dim=2).validate()
    with pytest.raises(UserError, match="model.mlp=rwkv"):
        replace(RWKV, delta_layers=(0, 1)).validate()
    with pytest.raises(UserError, match="RWKV, the one architecture with them, has LayerNorms"):
        rwkv.check_exportable(replace(RWKV, norm_eps=1e-6))
    with pytest.raises(UserError, match="RWKV, the one architecture with them, has time mixing"):
        rwkv.check_exportable(replace(RWKV, mlp="gelu"))


def test_peft_adapter_on_a_rescaled_output_is_refused(tmp_path, capsys, monkeypatch):
    """transformers' RWKV divides a rescaled block's attention.output and feed_forward.value base weights in eval mode
    but not their adapters' products: such adapters are refused by name; the others load with redline's logits."""
    from tests import test_lora_export as lora

    arch = "RwkvForCausalLM"
    monkeypatch.setitem(lora.ARCHS, arch, {**lora.ARCHS[arch], "rescale_every": 1})
    _, ckpt = lora.lora_run(tmp_path / "all", arch)
    assert lora.export(str(ckpt), "--adapter", str(tmp_path / "a")) == 2
    err = capsys.readouterr().err
    assert "the adapter on blocks.1.attn.proj: transformers' RWKV divides that layer's base weight by 2^1" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "a").exists()
    base, ckpt = lora.lora_run(tmp_path / "in", arch, targets=("attn.key", "attn.value", "attn.receptance",
                                                                "mlp.fc", "mlp.receptance"))
    lora.assert_peft_gives_redlines_logits(tmp_path / "in", base, ckpt, arch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step():
    """On a GPU: the compiled, graph-captured engine decodes greedily, as the eager one does (tests/engine_checks.py);
    the compiled training step's loss and the WKV's gradients match eager ones."""
    from tests.engine_checks import assert_compiled_engine_stays_greedy, assert_compiled_training_step_matches

    torch.manual_seed(0)
    cfg = replace(RWKV, n_embd=128, vocab_size=512, context_len=128, delta_value_dim=128, mlp_hidden=256)
    model = GPT(cfg).cuda()
    assert_compiled_engine_stays_greedy(model, [list(range(1, 20)), [5, 6, 7], list(range(30, 90))])
    assert_compiled_training_step_matches(model, model.blocks[0].attn.time_decay)
