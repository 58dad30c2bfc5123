"""GGUF files of the models with Mamba-2 layers as llama.cpp's converter writes them: mamba2 (Mamba2Model,
ggml-org/llama.cpp conversion/mamba.py), nemotron_h (NemotronHModel on GraniteHybridModel, conversion/nemotron.py and
granite.py) and falcon-h1 (FalconH1Model, conversion/falcon_h1.py); names from the gguf package's MODEL_TENSORS.
Exported by redline, read back by redline's import with the logits and greedy tokens of the transformers model they
came from; the keys and the tensors' names and shapes checked against those the converter writes; what llama.cpp's
architectures cannot hold refused in one line. transformers' GGUF loader (5.x) has none of the three: redline's
reader is the check."""

from __future__ import annotations

import pytest
import torch

from tests.test_interop import TOKENS, run_cli
from tests.test_interop_gguf import export_gguf, import_gguf
from tests.test_interop_gguf_classic import _fields, _names_in_gguf_package, _shapes, assert_reads_back_as

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


def test_mamba2_gguf_round_trip(tmp_path, capsys):
    """export -> import: logits equal to transformers' in fp32, greedy tokens equal through redline's engine, the
    time-step floor back from redline's key (and the export saying llama.cpp has none)."""
    from redline.training.checkpoint import load_for_inference

    hf, path = export_gguf("mamba2", tmp_path, capsys)
    _names_in_gguf_package(gguf.GGUFReader(str(path)), "mamba2")
    back_cfg = assert_reads_back_as(hf, path, tmp_path, capsys)
    _, _, cfg = load_for_inference(tmp_path / "ckpt")
    back, ours = (vars(c.model) for c in (back_cfg, cfg))  # GGUF keeps float keys as float32
    assert back == {k: pytest.approx(v, rel=1e-6) if isinstance(v, float) else v for k, v in ours.items()}
    assert ours["delta_dt_min"] == pytest.approx(0.01)


def test_mamba2_keys_and_tensors_follow_llama_cpp(tmp_path, capsys):
    """mamba2 (Mamba2Model): 2 layers of 8 heads of 16 (I = 128), 2 groups, N = 8, kernel 4, untied. Shapes are
    ggml's ne, innermost first: ssm_in (C, 2I + 2GN + H), ssm_conv1d (K, I + 2GN), ssm_a / ssm_d (1, H),
    ssm_norm (I / G, G)."""
    hf, path = export_gguf("mamba2", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    keys = _fields(reader, "mamba2")
    C, I, H, G, N, K, V = 64, 128, 8, 2, 8, 4, keys["vocab_size"]
    assert {k: v for k, v in keys.items() if k != "attention.layer_norm_rms_epsilon"} == {
        "context_length": 2 ** 20, "embedding_length": C, "block_count": 2, "feed_forward_length": 0,
        "attention.head_count": 0, "vocab_size": V, "ssm.conv_kernel": K, "ssm.inner_size": I, "ssm.state_size": N,
        "ssm.time_step_rank": H, "ssm.group_count": G}
    assert keys["attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    block = {"attn_norm.weight": (C,), "ssm_in.weight": (C, 2 * I + 2 * G * N + H),
             "ssm_conv1d.weight": (K, I + 2 * G * N), "ssm_conv1d.bias": (I + 2 * G * N,), "ssm_dt.bias": (H,),
             "ssm_a": (1, H), "ssm_d": (1, H), "ssm_norm.weight": (I // G, G), "ssm_out.weight": (I, C)}
    expected = {"token_embd.weight": (C, V), "output_norm.weight": (C,), "output.weight": (C, V)}
    expected.update({f"blk.{i}.{n}": s for i in range(2) for n, s in block.items()})
    assert _shapes(reader) == expected
    a = next(t for t in reader.tensors if t.name == "blk.1.ssm_a").data
    torch.testing.assert_close(torch.from_numpy(a.copy()).reshape(-1),
                               -hf.state_dict()["backbone.layers.1.mixer.A_log"].exp())
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.ssm_a"] == types["blk.0.ssm_conv1d.weight"] == "F32"


def test_mamba2_gguf_refuses_projection_biases(tmp_path, capsys):
    """mamba2-tied has biases on in_proj and out_proj, which llama.cpp's mamba2 does not load."""
    hf_folder = __import__("tests.interop_models", fromlist=["hf_folder"]).hf_folder
    hf_folder("mamba2-tied", tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    out = tmp_path / "m.gguf"
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--format", "gguf", "--out", str(out)], capsys)
    assert code == 2 and "model.delta_proj_bias" in err and "mamba2" in err and not out.exists(), err


def test_nemotron_h_gguf_round_trip(tmp_path, capsys):
    """nemotron_h: Mamba-2, MLP, attention, Mamba-2, MLP layers; export -> import gives logits equal to
    transformers' in fp32 and the same greedy tokens through redline's engine."""
    hf, path = export_gguf("nemotron_h", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    _names_in_gguf_package(reader, "nemotron_h")
    assert_reads_back_as(hf, path, tmp_path, capsys, new=6)


def test_nemotron_h_keys_and_tensors_follow_llama_cpp(tmp_path, capsys):
    """nemotron_h (NemotronHModel on GraniteHybridModel): layers M - * M - (Mamba-2: 8 heads of 16, 2 groups, N = 8,
    kernel 4; the MLP 96 wide; attention 4 heads of 24, 2 kv heads), the layer kinds in the per-layer
    head_count_kv and feed_forward_length, q/k rows permuted as llama's; the export names the time-step floor it
    keeps in redline's key."""
    from tests.interop_models import hf_folder

    hf = hf_folder("nemotron_h", tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    path = tmp_path / "n.gguf"
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--format", "gguf", "--out", str(path)], capsys)
    assert code == 0 and "redline.ssm.dt_min" in err and "never clamps dt" in err, err
    reader = gguf.GGUFReader(str(path))
    keys = _fields(reader, "nemotron_h")
    C, I, H, G, N, K, F, D, V = 64, 128, 8, 2, 8, 4, 96, 24, keys["vocab_size"]
    assert {k: v for k, v in keys.items() if k != "attention.layer_norm_rms_epsilon"} == {
        "context_length": 2 ** 20, "embedding_length": C, "block_count": 5, "feed_forward_length": [0, F, 0, 0, F],
        "attention.head_count": 4, "attention.head_count_kv": [0, 0, 2, 0, 0], "vocab_size": V,
        "attention.key_length": D, "attention.value_length": D, "rope.dimension_count": D,
        "ssm.conv_kernel": K, "ssm.state_size": N, "ssm.group_count": G, "ssm.inner_size": I,
        "ssm.time_step_rank": H, "rope.scaling.finetuned": False}
    mamba = {"attn_norm.weight": (C,), "ssm_in.weight": (C, 2 * I + 2 * G * N + H),
             "ssm_conv1d.weight": (K, I + 2 * G * N), "ssm_conv1d.bias": (I + 2 * G * N,), "ssm_dt.bias": (H,),
             "ssm_a": (1, H), "ssm_d": (1, H), "ssm_norm.weight": (I // G, G), "ssm_out.weight": (I, C)}
    mlp = {"attn_norm.weight": (C,), "ffn_up.weight": (C, F), "ffn_down.weight": (F, C)}
    attention = {"attn_norm.weight": (C,), "attn_q.weight": (C, 4 * D), "attn_k.weight": (C, 2 * D),
                 "attn_v.weight": (C, 2 * D), "attn_output.weight": (4 * D, C)}
    expected = {"token_embd.weight": (C, V), "output_norm.weight": (C,), "output.weight": (C, V)}
    for i, block in enumerate([mamba, mlp, attention, mamba, mlp]):
        expected.update({f"blk.{i}.{n}": s for n, s in block.items()})
    assert _shapes(reader) == expected
    q = torch.from_numpy(next(t for t in reader.tensors if t.name == "blk.2.attn_q.weight").data.copy())
    theirs = hf.state_dict()["model.layers.2.mixer.q_proj.weight"]
    # llama.cpp's converter permutation: each head's rows (pairs of halves) interleaved
    torch.testing.assert_close(q, theirs.reshape(4, 2, D // 2, C).transpose(1, 2).reshape(4 * D, C))


@pytest.mark.parametrize("kind", ["falcon_h1", "falcon_h1-gguf"])
def test_falcon_h1_gguf_round_trip(kind, tmp_path, capsys):
    """falcon-h1: untied with every µP multiplier away from 1 and no gated norm; tied with its embedding and head
    multipliers (written untied, both folded, as the converter writes them), the norm after the gate and a time-step
    floor. Logits equal to transformers' in fp32, greedy tokens through redline's engine."""
    hf, path = export_gguf(kind, tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    _names_in_gguf_package(reader, "falcon-h1")
    names = {t.name for t in reader.tensors}
    assert "output.weight" in names and ("blk.0.ssm_norm.weight" in names) == (kind == "falcon_h1-gguf")
    assert_reads_back_as(hf, path, tmp_path, capsys, new=6)


def test_falcon_h1_keys_and_tensors_follow_llama_cpp(tmp_path, capsys):
    """falcon-h1 (FalconH1Model): 3 layers, attention 4 heads of 24 (2 kv), Mamba-2 8 heads of 8 (I = 64), 2 groups,
    N = 8, kernel 4, the MLP 96 wide, no gated norm; q/k unpermuted (llama.cpp rotates falcon-h1 as NeoX), the
    multipliers folded as the converter folds them (k times key_multiplier and attention_in_multiplier)."""
    hf, path = export_gguf("falcon_h1", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    keys = _fields(reader, "falcon-h1")
    C, I, H, G, N, K, F, D, V = 64, 64, 8, 2, 8, 4, 96, 24, keys["vocab_size"]
    eps, theta = keys.pop("attention.layer_norm_rms_epsilon"), keys.pop("rope.freq_base")
    assert eps == pytest.approx(1e-5) and theta == pytest.approx(500.0)
    assert keys == {"context_length": 64, "embedding_length": C, "block_count": 3, "feed_forward_length": F,
                    "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": D,
                    "attention.value_length": D, "vocab_size": V, "ssm.conv_kernel": K, "ssm.inner_size": I,
                    "ssm.state_size": N, "ssm.time_step_rank": H, "ssm.group_count": G}
    block = {"attn_norm.weight": (C,), "attn_q.weight": (C, 4 * D), "attn_k.weight": (C, 2 * D),
             "attn_v.weight": (C, 2 * D), "attn_output.weight": (4 * D, C),
             "ssm_in.weight": (C, 2 * I + 2 * G * N + H), "ssm_conv1d.weight": (K, I + 2 * G * N),
             "ssm_conv1d.bias": (I + 2 * G * N,), "ssm_dt.bias": (H,), "ssm_a": (1, H), "ssm_d": (1, H),
             "ssm_out.weight": (I, C), "ffn_norm.weight": (C,), "ffn_gate.weight": (C, F), "ffn_up.weight": (C, F),
             "ffn_down.weight": (F, C)}
    expected = {"token_embd.weight": (C, V), "output_norm.weight": (C,), "output.weight": (C, V)}
    expected.update({f"blk.{i}.{n}": s for i in range(3) for n, s in block.items()})
    assert _shapes(reader) == expected
    k = torch.from_numpy(next(t for t in reader.tensors if t.name == "blk.1.attn_k.weight").data.copy())
    theirs = hf.state_dict()["model.layers.1.self_attn.k_proj.weight"] * 0.7 * 1.3
    torch.testing.assert_close(k, theirs)


def test_falcon_h1_gguf_refuses_a_norm_before_the_gate(tmp_path, capsys):
    """falcon_h1-norm norms before the gate and has biases: llama.cpp's falcon-h1 runs neither."""
    from tests.interop_models import hf_folder

    hf_folder("falcon_h1-norm", tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    out = tmp_path / "f.gguf"
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--format", "gguf", "--out", str(out)], capsys)
    assert code == 2 and "falcon-h1" in err and not out.exists(), err


def test_falcon_mamba_gguf_round_trip(tmp_path, capsys):
    """Falcon-Mamba as llama.cpp's mamba with ssm.dt_b_c_rms true (MambaModel's falcon_mamba case): logits equal to
    transformers' in fp32; its mixer_rms_eps (1e-2 here, the blocks' 1e-5) back from redline's key, and the export
    saying llama.cpp norms dt, B and C at the blocks' epsilon."""
    from tests.interop_models import hf_folder

    hf = hf_folder("falcon_mamba", tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    path = tmp_path / "fm.gguf"
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--format", "gguf", "--out", str(path)], capsys)
    assert code == 0 and "redline.ssm.dt_b_c_rms_epsilon" in err, err
    reader = gguf.GGUFReader(str(path))
    keys = _fields(reader, "mamba")
    assert keys["ssm.dt_b_c_rms"] is True and reader.fields["general.architecture"].contents() == "mamba"
    model, _, cfg = import_gguf(path, tmp_path / "back", capsys)
    assert cfg.model.delta_bcdt_norm_eps == pytest.approx(1e-2)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_granitehybrid_keeps_its_time_step_floor(tmp_path, capsys):
    """A granitehybrid file keeps a Mamba-2 time-step floor in redline's key (llama.cpp's has none) and reads it
    back: the model's config and logits as they were."""
    hf, path = export_gguf("granitemoehybrid-floor", tmp_path, capsys)
    assert gguf.GGUFReader(str(path)).fields["redline.ssm.dt_min"].contents() == pytest.approx(0.05)
    model, _, back_cfg = import_gguf(path, tmp_path / "back", capsys)
    assert back_cfg.model.delta_dt_min == pytest.approx(0.05)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
