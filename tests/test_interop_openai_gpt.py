"""GPT-1 (openai_gpt.py): its ReLU MLP read as transformers runs it, the post-norm blocks showing in the logits, and
the one-line refusals on import and export. Parity through the engine, export, PEFT and the GGUF refusal are the
shared tables' (test_interop.py, test_lora_export.py)."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.interop.families import TensorSource, _families, export_family
from redline.model import GPT, ModelConfig
from tests.interop_models import VOCAB, hf_model
from tests.test_interop_llamalike import TOKENS, _imported

transformers = pytest.importorskip("transformers")


def test_gelu_kind_and_relu_mlp_show_in_the_logits():
    hf, model = _imported("openai-gpt")
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        for changed in (replace(model.cfg, gelu_approximate="none"), replace(model.cfg, mlp="relu")):
            other = GPT(changed).eval()
            other.load_state_dict(model.state_dict())
            assert (other(TOKENS) - expected).abs().max() > 2e-5, changed  # beyond the parity tests' 1e-5
    config = transformers.OpenAIGPTConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                          afn="relu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    relu = transformers.OpenAIGPTLMHeadModel(config).eval()
    family = _families()["openai-gpt"]
    cfg = family.model_config(config.to_dict())
    assert (cfg.mlp, cfg.norm_position, cfg.tie_embeddings) == ("relu", "post", True)
    state = relu.state_dict()
    model = GPT(cfg).eval()
    model.load_state_dict(family.to_redline(TensorSource(state, state.__getitem__, "test"), cfg), strict=False)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), relu(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_silu_is_refused_by_name():
    hf = hf_model("openai-gpt").config.to_dict()
    with pytest.raises(UserError, match="afn='silu'"):
        _families()["openai-gpt"].model_config({**hf, "afn": "silu"})


@pytest.mark.parametrize("overrides, fragment", [
    (dict(pos_emb="rope"), "has learned positions"),
    (dict(norm="rmsnorm"), "has LayerNorms with weights"),
    (dict(mlp_hidden=96), "an MLP 4 x n_embd wide"),
    (dict(n_kv_head=2), "GPT-1 is multi-head"),
    (dict(gelu_approximate="none"), "tanh-GELU or ReLU MLP"),
])
def test_export_refusals_name_the_option(overrides, fragment):
    base = dict(vocab_size=VOCAB, context_len=64, n_layer=2, n_embd=64, n_head=4, pos_emb="learned",
                norm="layernorm", mlp="gelu", bias=True, norm_position="post")
    assert export_family(ModelConfig(**base)).name == "openai-gpt"
    with pytest.raises(UserError, match=fragment):
        export_family(ModelConfig(**{**base, **overrides}))


def test_train_init_from_an_imported_gpt1(tmp_path, capsys):
    """`redline train --init-from` on an imported GPT-1: the first step's loss is transformers' on the same batch, and
    training moves the post-norm blocks' LayerNorms and the position table."""
    from tests.test_interop_commands import Imported, trained_two_steps

    before, after = trained_two_steps(Imported("openai-gpt", tmp_path / "src"), tmp_path, capsys)
    old, new = before.state_dict(), after.state_dict()
    for name in ("blocks.0.norm1.weight", "blocks.1.norm2.bias", "wpe.weight", "blocks.0.attn.qkv.weight"):
        assert not torch.equal(old[name], new[name]), name
