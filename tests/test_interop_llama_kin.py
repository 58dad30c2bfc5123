"""InternLM3 and IQuest-Coder (llama_kin.py: configs of their own that transformers runs as Llama): their config
classes' defaults and spellings, the dynamic RoPE read within its context, each family's own folder written back,
and the one-line refusals. Parity through the engine, export and GGUF are the FAMILIES tables' (test_interop.py,
test_interop_gguf.py)."""

import json

import pytest
import torch

from redline.errors import UserError
from redline.interop.families import _families, export_family
from redline.training.checkpoint import load_for_inference
from tests.interop_models import VOCAB, hf_folder, hf_model
from tests.test_interop import run_cli
from tests.test_interop_llamalike import TOKENS, _imported, _written_as

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name, config_class, kv_heads", [("internlm3", "InternLM3Config", 2),
                                                          ("iquestcoder", "IQuestCoderConfig", 8)])
def test_config_defaults_are_the_config_classes(name, config_class, kv_heads):
    """A config.json without head_dim, num_key_value_heads, rms_norm_eps or max_position_embeddings reads as the
    config class fills them in (a head width of 128, not hidden_size / heads; LlamaConfig's would differ)."""
    hf = getattr(transformers, config_class)(hidden_size=64, num_attention_heads=8, intermediate_size=96,
                                             num_hidden_layers=2, vocab_size=VOCAB)
    left_out = ("head_dim", "num_key_value_heads", "rms_norm_eps", "max_position_embeddings")
    bare = {k: v for k, v in hf.to_dict().items() if k not in left_out}
    for source in (hf.to_dict(), bare):
        cfg = _families()[name].model_config(source)
        assert (cfg.head_dim, cfg.kv_heads, cfg.norm_eps, cfg.context_len) == (
            128, kv_heads, 1e-5, hf.max_position_embeddings)


def test_internlm3_released_spellings_and_dynamic_rope(tmp_path, capsys):
    """The released config.json's `qkv_bias` / `bias` (InternLM3Config's attribute_map) and its dynamic NTK RoPE
    (plain up to max_position_embeddings, where the import's context stops) read as transformers reads them."""
    hf = hf_folder("internlm3", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "dynamic"
    config["qkv_bias"], config["bias"] = config.pop("attention_bias"), config.pop("mlp_bias")
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert reference.config.attention_bias and reference.config.mlp_bias
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    cfg = model.cfg
    assert (cfg.bias, cfg.has_qkv_bias, cfg.rope_scaling, cfg.rope_theta, cfg.context_len) == (
        True, True, "none", 500.0, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), reference(TOKENS).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["internlm3", "iquestcoder"])
def test_written_as_its_own_family_and_exported_as_llama(name, tmp_path):
    """The family's own folder (model_type internlm3 / iquestcoder) loads as LlamaForCausalLM with the same logits;
    export_family sends the model to Llama, every option of it Llama's."""
    hf, model = _imported(name)
    assert export_family(model.cfg).name == "llama"
    back = _written_as(tmp_path, model, name)
    assert back.config.model_type == name
    with torch.no_grad():
        torch.testing.assert_close(back(TOKENS).logits, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, overrides, fragment", [
    ("iquestcoder", {"clip_qkv": 8.0}, "clip_qkv=8.0 on an IQuest-Coder model"),
    ("iquestcoder", {"use_sliding_window": True, "sliding_window": 4}, "use_sliding_window=true on an IQuest-Coder"),
    ("internlm3", {"attention_bias": True, "mlp_bias": False}, "attention_bias=True with mlp_bias=False"),
    ("internlm3", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
])
def test_refusals_name_the_field(name, overrides, fragment):
    hf = hf_model(name).config.to_dict()
    with pytest.raises(UserError, match=fragment):
        _families()[name].model_config({**hf, **overrides})
