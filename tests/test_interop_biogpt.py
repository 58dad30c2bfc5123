"""BioGPT (biogpt.py): its scaled embeddings and offset position table showing in the logits, the config's unread
layer_norm_eps, a BioGPT without scale_embedding exported as the GPT-2 it is, and the one-line refusals. Parity
through the engine, export (an imported XGLM's too), PEFT and the GGUF refusal are the shared tables'."""

from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.interop.families import TensorSource, _families, export_family
from redline.model import GPT, ModelConfig
from tests.interop_models import VOCAB, hf_model
from tests.test_interop_llamalike import TOKENS, _imported, _written_as

transformers = pytest.importorskip("transformers")


def test_scale_and_norm_eps_show_in_the_logits():
    """layer_norm_eps (1e-12 by default) is never read: every LayerNorm takes 1e-5, as transformers builds them."""
    hf, model = _imported("biogpt")
    assert hf.config.layer_norm_eps == 1e-12 and model.cfg.norm_eps == 1e-5 and model.cfg.embed_scale
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        other = GPT(replace(model.cfg, embed_scale=False)).eval()
        other.load_state_dict(model.state_dict())
        assert (other(TOKENS) - expected).abs().max() > 1e-4


def test_unscaled_biogpt_exports_as_gpt2(tmp_path):
    config = transformers.BioGptConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=96, max_position_embeddings=64, scale_embedding=False,
                                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=None)
    torch.manual_seed(0)
    hf = transformers.BioGptForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    family = _families()["biogpt"]
    cfg = family.model_config(config.to_dict())
    state = hf.state_dict()
    model = GPT(cfg).eval()
    model.load_state_dict(family.to_redline(TensorSource(state, state.__getitem__, "test"), cfg), strict=False)
    assert export_family(cfg).name == "gpt2"
    back = _written_as(tmp_path, model, "gpt2")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(back(TOKENS).logits, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_import_refusals_name_the_field():
    family = _families()["biogpt"]
    hf = hf_model("biogpt")
    with pytest.raises(UserError, match="hidden_act='relu'"):
        family.model_config({**hf.config.to_dict(), "hidden_act": "relu"})
    cfg = family.model_config({**hf.config.to_dict(), "max_position_embeddings": 60})
    state = hf.state_dict()
    with pytest.raises(UserError, match="embed_positions has 66 rows; max_position_embeddings=60 needs 62"):
        family.to_redline(TensorSource(state, state.__getitem__, "test"), cfg)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(norm="rmsnorm"), "has pre-LayerNorm blocks with weights"),
    (dict(norm_eps=1e-6), "takes LayerNorm's eps of 1e-05"),
    (dict(mlp="relu"), "has a GELU MLP"),
    (dict(n_kv_head=2), "BioGPT is multi-head"),
    (dict(attn_scale=1.0), "has no model.attn_scale"),
])
def test_export_refusals_name_the_option(overrides, fragment):
    base = dict(vocab_size=VOCAB, context_len=64, n_layer=2, n_embd=64, n_head=4, pos_emb="learned",
                norm="layernorm", mlp="gelu", bias=True, embed_scale=True)
    assert export_family(ModelConfig(**base)).name == "biogpt"
    with pytest.raises(UserError, match=fragment):
        export_family(ModelConfig(**{**base, **overrides}))
