"""MiniMax's lightning attention (model.delta_rule=lightning) against its token-by-token recurrence: outputs, final
states and gradients, in chunks, with a state carried in, padding tokens passed by, and packed documents; the
decays' slopes as transformers computes them; the refusals. The engine (chunked prefill, DecodeBatch) and GPU checks
are tests/test_delta_net.py's (LIGHTNING in RULES); parity with transformers' MiniMaxForCausalLM is
tests/test_interop.py's (the minimax family)."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from redline.errors import UserError
from redline.model import GPT, Lightning, lightning_slopes

from tests.test_delta_net import LIGHTNING

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def lightning_loop(mixer: Lightning, x, state=None, valid=None, starts=None):
    """The mixer token by token: S ← exp(−slope)·S + kᵀv per head (S unchanged on a padding token, zeroed before a
    document's first), o = q·S; the heads' outputs RMS-normed together, gated, projected."""
    B, T, _ = x.shape
    H, D = mixer.heads, mixer.dk
    q, k, v = F.silu(mixer.qkv_proj(x)).view(B, T, H, 3 * D).split(D, -1)
    decay = torch.exp(-lightning_slopes(mixer.heads, mixer.layer, mixer.n_layer))[:, None, None]  # (H, 1, 1)
    S = torch.zeros(B, H, D, D) if state is None else state.clone()
    out = []
    for t in range(T):
        if starts is not None:
            S = S * (~starts[:, t]).float()[:, None, None, None]
        step = decay * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        S = step if valid is None else torch.where(valid[:, t, None, None, None], step, S)
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    o = torch.stack(out, 1).reshape(B, T, H * D)
    o = mixer.norm * o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + mixer.eps)
    return mixer.out_proj(torch.sigmoid(mixer.output_gate(x)) * o), S


def test_slopes_are_transformers():
    """ALiBi's slopes scaled down with depth, as MiniMaxLightningAttention.get_slope_rate gives them."""
    pytest.importorskip("transformers")
    from transformers import MiniMaxConfig
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    config = MiniMaxConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=5, head_dim=8, block_size=8)
    for layer in range(5):
        want = MiniMaxLightningAttention(config, layer).get_slope_rate().flatten()
        torch.testing.assert_close(lightning_slopes(4, layer, 5), want, rtol=0, atol=0)


@pytest.mark.parametrize("length", [1, 7, 70, 150])
def test_mixer_is_the_recurrence(length):
    """Chunked (chunks of 64: one, part of one, several) and one-token forms equal the loop, with and without a
    state carried in, a right-padded row's padding leaving the state as it was, documents packed in one row; the
    gradients of the weights too."""
    torch.manual_seed(0)
    mixer = Lightning(LIGHTNING, layer=1)
    x = torch.randn(2, length, LIGHTNING.n_embd)
    state = torch.randn(2, mixer.heads, mixer.dk, mixer.dk)
    valid = torch.ones(2, length, dtype=torch.bool)
    valid[1, length // 2 + 1:] = False
    doc_ids = torch.zeros(2, length, dtype=torch.long)
    doc_ids[0, length // 3:] = 1
    doc_ids[1, 2 * length // 3:] = 1
    starts = doc_ids != F.pad(doc_ids, (1, 0), value=-1)[:, :length]
    for kw, loop_kw in (({}, {}), ({"state": state}, {"state": state}), ({"state": state, "valid": valid},
                                                                          {"state": state, "valid": valid}),
                        ({"doc_ids": doc_ids}, {"starts": starts})):
        y, u, s = mixer.mix(x, **kw)
        want_y, want_s = lightning_loop(mixer, x, **loop_kw)
        assert u.shape == (2, length, 0)
        torch.testing.assert_close(y, want_y, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(s, want_s, rtol=1e-4, atol=1e-4)
    grads = [torch.autograd.grad(f().pow(2).sum(), list(mixer.parameters()))
             for f in (lambda: mixer.mix(x, state=state)[0], lambda: lightning_loop(mixer, x, state)[0])]
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_normed_residual_blocks():
    """Each sublayer's normed input is the stream its scaled output joins: a block is α₂·u₂ + β₂·mlp(u₂) with
    u₂ = norm2(α₁·u₁ + β₁·mixer(u₁)), u₁ = norm1(x), the mixer's (α, β) its kind's."""
    torch.manual_seed(0)
    model = GPT(LIGHTNING).eval()
    x = torch.randn(1, 5, LIGHTNING.n_embd)
    a_attn, b_attn, a_delta, b_delta, a_mlp, b_mlp = LIGHTNING.normed_residual
    for layer, (a, b) in ((0, (a_delta, b_delta)), (1, (a_attn, b_attn))):
        block = model.blocks[layer]
        u = block.norm1(x)
        if layer in LIGHTNING.delta_layers:
            h = block.attn(u)
        else:
            rope = (model.rope_cos[:5], model.rope_sin[:5]) if hasattr(model, "rope_cos") else None
            h = block.attn(u, rope)
        u = block.norm2(a * u + b * h)
        with torch.no_grad():
            want = a_mlp * u + b_mlp * block.mlp(u)
            got = block(x, rope if layer == 1 else None)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_refusals():
    with pytest.raises(UserError, match="delta_rule=lightning"):
        replace(LIGHTNING, delta_key_heads=2).validate()
    with pytest.raises(UserError, match="delta_rule=lightning"):
        replace(LIGHTNING, delta_value_dim=16).validate()
    with pytest.raises(UserError, match="normed_residual"):
        replace(LIGHTNING, normed_residual=(1.0, 1.0)).validate()
    with pytest.raises(UserError, match="normed_residual"):
        replace(LIGHTNING, norm_position="post").validate()


@pytest.mark.parametrize("kind", ["minimax", "minimax-default"])
def test_imported_minimax_serves_as_transformers_generates(kind, tmp_path, capsys):
    """The imported model through the engine: prompts prefilled in chunks of 3 tokens (each chunk starting from the
    rows' lightning states) then decoded greedily give transformers' tokens; the server's DecodeBatch (rows parked
    and refilled) gives the model's own; teacher-forced scores are the full forward's."""
    pytest.importorskip("transformers")
    from redline.inference import InferenceEngine, SamplingParams
    from tests.engine_checks import assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward
    from tests.interop_models import VOCAB
    from tests.test_interop import imported

    hf, model, _, _ = imported(kind, tmp_path, capsys)
    prompts = [list(range(3, 14)), [7, 8], list(range(40, 47)), list(range(60, 72))]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=3)
    for prompt, result in zip(prompts, engine.generate(prompts, 8, SamplingParams(temperature=0))):
        reference = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0,
                                eos_token_id=None)
        assert result.tokens == reference[0, len(prompt):].tolist()
    assert_scores_equal_full_forward(model, VOCAB)
    assert_decode_batch_serves_like_generate(model, prompts)


def test_train_init_from_an_imported_minimax_moves_its_lightning_weights(tmp_path, capsys):
    """`redline train --init-from` an imported MiniMax: the first step's loss is transformers' on the same batch
    (tests/test_interop_commands.trained_two_steps) and every lightning weight moves."""
    pytest.importorskip("transformers")
    from tests.test_interop_commands import Imported, trained_two_steps

    before, after = trained_two_steps(Imported("minimax", tmp_path / "src"), tmp_path, capsys)
    old, new = before.state_dict(), after.state_dict()
    for name in ("attn.qkv_proj.weight", "attn.output_gate.weight", "attn.norm", "attn.out_proj.weight"):
        assert not torch.equal(old[f"blocks.0.{name}"], new[f"blocks.0.{name}"]), name


def test_import_refuses_partial_rope_and_foreign_decays(tmp_path, capsys):
    """A rotary_dim short of the head (the original MiniMax code's, which transformers does not run) and decay
    rates other than MiniMax's are refused by name, in one line, before anything is written."""
    pytest.importorskip("transformers")
    import json

    from safetensors.torch import load_file, save_file

    from tests.interop_models import hf_folder
    from tests.test_interop import run_cli

    hf_folder("minimax", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "rotary_dim": 8}))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "a")], capsys)
    assert code == 2 and "rotary_dim=8" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "a").exists()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    weights["model.layers.2.self_attn.slope_rate"] = weights["model.layers.2.self_attn.slope_rate"] * 2
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "b")], capsys)
    assert code == 2 and "slope_rate" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "b").exists()
