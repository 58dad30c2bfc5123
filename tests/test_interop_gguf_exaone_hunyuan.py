"""GGUF both ways for EXAONE 4.0 and Hunyuan dense, as llama.cpp's exaone4 and hunyuan-dense: redline's export read
back with logits equal to the Hugging Face model's (q/k rows unpermuted, the QK-norms, the output norms, Hunyuan's
stretched RoPE base, EXAONE-4.0-32B's windowed layout, Llama 3 RoPE scaling as rope_freqs), files written the way
llama.cpp's converter writes them (the gguf package's own tensor-name map, the converter's keys) imported alike, and
the layouts llama.cpp cannot run as the model refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from redline.errors import UserError
from tests.interop_models import VOCAB, byte_level_tokenizer, hf_model
from tests.test_interop import TOKENS, run_cli
from tests.test_interop_gguf import (_add_llama_cpp_vocab, _llama_cpp_header, _write_out, export_gguf, import_gguf,
                                     llama_cpp_rope_freqs)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


def fields_of(path) -> dict:
    return {name: field.contents() for name, field in gguf.GGUFReader(str(path)).fields.items()}


def tensors_of(path) -> dict:
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors}


def exaone4_32b_layout(seed=0):
    """EXAONE-4.0-32B's layout at toy widths: 64 layers, three windowed (rotating) to one full (NoPE), a
    window shorter than the test sequences; heads n_embd / n_head wide, GQA, untied."""
    config = transformers.Exaone4Config(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=64, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0,
        eos_token_id=1, sliding_window=5, sliding_window_pattern=4, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    torch.manual_seed(seed)
    model = transformers.Exaone4ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def save_folder(model, path):
    """A Hugging Face folder of `model` as tests/interop_models.hf_folder writes one (tokenizer, EOS ids [1, 2])."""
    model.save_pretrained(path)
    byte_level_tokenizer(path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2], "bos_token_id": 0}))
    return model


def export_folder(model, tmp_path, capsys):
    save_folder(model, tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    out = tmp_path / "gguf" / "model.gguf"
    return run_cli(["export", str(tmp_path / "ckpt"), "--format", "gguf", "--out", str(out)], capsys), out


def test_hunyuan_gguf_read_back(tmp_path, capsys):
    """hunyuan-dense: its alpha-stretched base as rope.freq_base (theta · alpha ** (d / (d - 2)), as llama.cpp's
    converter writes it), key_length the head width (24 != 64 / 4), QK-norms as attn_q_norm / attn_k_norm, q/k rows
    as Hugging Face stores them, tied (no output tensor)."""
    hf, path = export_gguf("hunyuan", tmp_path, capsys)
    fields, tensors = fields_of(path), tensors_of(path)
    assert fields["general.architecture"] == "hunyuan-dense"
    assert fields["hunyuan-dense.rope.freq_base"] == pytest.approx(500.0 * 5.0 ** (24 / 22), rel=1e-6)
    assert (fields["hunyuan-dense.attention.key_length"], fields["hunyuan-dense.attention.head_count_kv"]) == (24, 2)
    assert "output.weight" not in tensors and "hunyuan-dense.attention.sliding_window" not in fields
    state = hf.state_dict()
    np.testing.assert_array_equal(tensors["blk.1.attn_q.weight"], state["model.layers.1.self_attn.q_proj.weight"])
    np.testing.assert_array_equal(tensors["blk.1.attn_k.weight"], state["model.layers.1.self_attn.k_proj.weight"])
    np.testing.assert_array_equal(tensors["blk.0.attn_q_norm.weight"],
                                  state["model.layers.0.self_attn.query_layernorm.weight"])
    model, tokenizer, train_cfg = import_gguf(path, tmp_path / "back", capsys)
    assert train_cfg.model.qk_norm_after_rope
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    assert tokenizer.chat_template and tokenizer.stop_ids == [1, 2]


def test_exaone4_gguf_read_back_global(tmp_path, capsys):
    """exaone4 as EXAONE-4.0-1.2B is (no window: every layer full and rotating): no window keys, the output norms as
    post_attention_norm / post_ffw_norm, q/k unpermuted, Llama 3 scaling as the rope_freqs tensor llama.cpp's
    converter writes (its Exaone4Model.generate_extra_tensors)."""
    hf, path = export_gguf("exaone4-global", tmp_path, capsys)
    fields, tensors = fields_of(path), tensors_of(path)
    assert fields["general.architecture"] == "exaone4"
    assert not any(k.startswith("exaone4.attention.sliding_window") for k in fields)
    scaling = hf.config.rope_parameters
    np.testing.assert_allclose(tensors["rope_freqs.weight"], llama_cpp_rope_freqs(scaling["rope_theta"],
                                                                                  64 // 4, scaling),
                               rtol=1e-6)
    state = hf.state_dict()
    for gguf_name, hf_name in (("blk.1.attn_q.weight", "self_attn.q_proj.weight"),
                               ("blk.1.attn_k.weight", "self_attn.k_proj.weight"),
                               ("blk.1.post_attention_norm.weight", "post_attention_layernorm.weight"),
                               ("blk.1.post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
                               ("blk.1.attn_k_norm.weight", "self_attn.k_norm.weight")):
        np.testing.assert_array_equal(tensors[gguf_name], state[f"model.layers.1.{hf_name}"])
    assert not any(".attn_norm." in n or ".ffn_norm." in n for n in tensors)  # no input norms in EXAONE 4.0
    model, _, train_cfg = import_gguf(path, tmp_path / "back", capsys)
    assert (train_cfg.model.rope_scaling, train_cfg.model.sliding_window, train_cfg.model.nope_interval) == (
        "llama3", 0, 0)
    positions = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(3))  # past the original 16
    with torch.no_grad():
        torch.testing.assert_close(model(positions), hf(positions).logits, rtol=1e-5, atol=1e-5)


def test_exaone4_gguf_read_back_32b_layout(tmp_path, capsys):
    """EXAONE-4.0-32B's layout: the window and one bool per layer (true: windowed) as llama.cpp's converter writes
    layer_types; read back with the window biting and the full layers unrotated."""
    hf = exaone4_32b_layout()
    (code, _, err), path = export_folder(hf, tmp_path, capsys)
    assert code == 0, err
    fields = fields_of(path)
    assert fields["exaone4.attention.sliding_window"] == 5 and fields["exaone4.block_count"] == 64
    assert fields["exaone4.attention.sliding_window_pattern"] == [True, True, True, False] * 16
    model, _, train_cfg = import_gguf(path, tmp_path / "back", capsys)
    assert (train_cfg.model.sliding_window_pattern, train_cfg.model.nope_interval) == (4, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def write_converter_style(hf, path, arch: str, keys) -> None:
    """A GGUF of a transformers model as llama.cpp's converter writes one through its TextModel: the common keys,
    `keys(writer)` for the architecture's own, tensors named by the gguf package's own map for the architecture,
    unpermuted, in F32, a gpt2-type vocabulary without tokenizer.json; a tied head left out."""
    cfg = hf.config
    w = _llama_cpp_header(path, arch, cfg)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(cfg.vocab_size)
    keys(w)
    _add_llama_cpp_vocab(w, path, cfg.vocab_size)
    model_arch = {name: a for a, name in gguf.MODEL_ARCH_NAMES.items()}[arch]
    names = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base, kind = name.rsplit(".", 1)
        w.add_tensor(f"{names.get_name(base)}.{kind}", t.float().numpy())
    _write_out(w, path)


def test_import_converter_style_exaone4_hybrid(tmp_path, capsys):
    """A hybrid EXAONE 4.0 of any depth as llama.cpp's converter writes it (window, per-layer pattern array): read as
    the Hugging Face model is (the keys' layout). Without the pattern the window's layers are not given: one line."""
    hf = hf_model("exaone4")  # four layers, windowed and full alternating, a window of 5
    theta = hf.config.rope_parameters["rope_theta"]

    def keys(w, pattern=True):
        w.add_rope_freq_base(theta)
        w.add_sliding_window(hf.config.sliding_window)
        if pattern:
            w.add_sliding_window_pattern([t == "sliding_attention" for t in hf.config.layer_types])

    path = tmp_path / "exaone4.gguf"
    write_converter_style(hf, path, "exaone4", keys)
    model, _, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    assert (train_cfg.model.sliding_window, train_cfg.model.nope_interval) == (5, 2)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)

    bad = tmp_path / "no-pattern.gguf"
    write_converter_style(hf, bad, "exaone4", lambda w: keys(w, pattern=False))
    code, _, err = run_cli(["import", str(bad), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "sliding_window_pattern" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_import_converter_style_hunyuan_dynamic_rope(tmp_path, capsys):
    """Hunyuan's "dynamic" RoPE as llama.cpp's converter writes it (HunYuanModel.set_gguf_parameters): the stretched
    base, scaling type none with factor 1, a 256k context; read back to the model's logits."""
    hf = hf_model("hunyuan")
    params = hf.config.rope_parameters
    dim = hf.config.head_dim

    def keys(w):
        w.add_rope_freq_base(params["rope_theta"] * params["alpha"] ** (dim / (dim - 2)))
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
        w.add_rope_scaling_factor(1)
        w.add_rope_scaling_orig_ctx_len(256 * 1024)

    path = tmp_path / "hunyuan.gguf"
    write_converter_style(hf, path, "hunyuan-dense", keys)
    model, _, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    assert train_cfg.model.rope_scaling == "none" and train_cfg.model.qk_norm_after_rope
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_exaone4_layouts_read_as_llama_cpp_defaults():
    """llama.cpp's exaone4 windows a 64-layer file without window keys as EXAONE-4.0-32B (4096 tokens, three layers
    windowed in four); at any other depth a file without them has every layer full."""
    from redline.interop.gguf_file import _exaone4_config

    common = {"num_hidden_layers": 64}
    got = _exaone4_config(lambda name, default=None: default, common)
    assert got["sliding_window"] == 4096 and got["layer_types"][:4] == ["sliding_attention"] * 3 + ["full_attention"]
    got = _exaone4_config(lambda name, default=None: default, {"num_hidden_layers": 30})
    assert got["sliding_window"] is None and set(got["layer_types"]) == {"full_attention"}


def test_exaone4_gguf_export_refuses_a_hybrid_llama_cpp_would_run_unwindowed(tmp_path, capsys):
    """Four layers, windowed and full alternating: llama.cpp's exaone4 would run every layer full and rotating."""
    (code, _, err), path = export_folder(hf_model("exaone4"), tmp_path, capsys)
    assert code == 2 and "model.sliding_window" in err and "--format hf" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not path.exists() and not list(path.parent.glob(".tmp-*"))


def test_refusals_of_layouts_without_a_gguf_form(tmp_path):
    """A 64-layer EXAONE 4.0 without a window (llama.cpp would window it) or with another period, EXAONE 4.0 with
    heads apart from n_embd / n_head (llama.cpp's exaone4 loads o_proj as (n_embd, n_embd)), Hunyuan with Llama 3
    scaling (llama.cpp's hunyuan-dense loads no rope_freqs); a hunyuan-dense file with a window."""
    from dataclasses import replace

    from redline.interop import exaone4, hunyuan
    from redline.interop.gguf_file import _arch, _hf_config

    cfg = exaone4.model_config(exaone4_32b_layout().config.to_dict())
    with pytest.raises(UserError, match="no model.sliding_window on a 64-layer"):
        _arch(exaone4.FAMILY, replace(cfg, sliding_window=0, sliding_window_pattern=0, nope_interval=0))
    with pytest.raises(UserError, match="model.sliding_window_pattern=2"):
        _arch(exaone4.FAMILY, replace(cfg, sliding_window_pattern=2, nope_interval=2))
    with pytest.raises(UserError, match="model.head_size"):
        _arch(exaone4.FAMILY, replace(cfg, head_size=24))
    cfg = hunyuan.model_config(hf_model("hunyuan").config.to_dict())
    with pytest.raises(UserError, match="model.rope_scaling=llama3"):
        _arch(hunyuan.FAMILY, replace(cfg, rope_scaling="llama3", rope_factor=8.0))
    fields = {"hunyuan-dense.embedding_length": 64, "hunyuan-dense.attention.head_count": 4,
              "hunyuan-dense.block_count": 2, "hunyuan-dense.vocab_size": VOCAB,
              "hunyuan-dense.attention.sliding_window": 8}
    with pytest.raises(UserError, match="sliding window"):
        _hf_config(fields, "hunyuan-dense", {"token_embd.weight"})
