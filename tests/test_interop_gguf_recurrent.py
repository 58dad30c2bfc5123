"""GGUF files of the recurrent hybrids as llama.cpp's converter writes them: Granite 4.0's Mamba-2 hybrids
(granitehybrid, dense and with experts) and Qwen3.5's gated delta nets (qwen35). Exported by redline, read back by
the gguf package and by redline's import with the logits of the transformers model they came from; the keys and the
tensors' names and shapes checked against those llama.cpp's converter writes; what llama.cpp's architectures cannot
hold refused in one line. transformers' GGUF loader (5.x) has mamba, not the hybrids: the mamba files are loaded
with it too, the parity that shows the layout is llama.cpp's."""

from __future__ import annotations

import pytest
import torch

from redline.training.checkpoint import load_for_inference
from tests.test_interop import TOKENS, run_cli
from tests.interop_models import hf_folder
from tests.test_interop_gguf import assert_gguf_export_refused, export_gguf, import_gguf

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


def _shapes(reader) -> dict:
    """GGUF name -> its shape as the file gives it (ggml's ne: innermost first)."""
    return {t.name: tuple(int(n) for n in t.shape.tolist()) for t in reader.tensors}


def _fields(reader, arch) -> dict:
    return {k[len(arch) + 1:]: f.contents() for k, f in reader.fields.items() if k.startswith(arch + ".")}


@pytest.mark.parametrize("kind", ["granitemoehybrid-mamba", "granitemoehybrid-moe", "granitemoehybrid-nope",
                                  "qwen3_5_text", "mamba"])
def test_recurrent_gguf_round_trip(kind, tmp_path, capsys):
    """export -> import gives back the redline model it came from: its config, and logits equal to transformers'."""
    hf, path = export_gguf(kind, tmp_path, capsys)
    with torch.no_grad():
        expected = hf(TOKENS).logits
    model, tokenizer, back_cfg = import_gguf(path, tmp_path / "back", capsys)
    _, _, cfg = load_for_inference(tmp_path / "ckpt")
    # GGUF keeps float keys (the scalars, the norm's epsilon) as float32
    back, ours = (vars(c.model) for c in (back_cfg, cfg))
    assert back == {k: pytest.approx(v, rel=1e-6) if isinstance(v, float) else v for k, v in ours.items()}
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
    assert tokenizer.chat_template and tokenizer.stop_ids == [1, 2]
    if kind == "mamba":  # transformers' own GGUF loader reads the same file to the same logits
        theirs = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
        assert type(theirs).__name__ == "MambaForCausalLM"
        with torch.no_grad():
            torch.testing.assert_close(theirs(TOKENS).logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, tolerance", [("fp16", 2e-2), ("bf16", 5e-2)])
def test_recurrent_gguf_half_precision(dtype, tolerance, tmp_path, capsys):
    """Matrices in the file's type; the convolution, A, D, dt's bias and the norms in F32, as llama.cpp's converter
    keeps them."""
    for kind, arch in (("granitemoehybrid-mamba", "granitehybrid"), ("qwen3_5_text", "qwen35")):
        root = tmp_path / arch
        hf, path = export_gguf(kind, root, capsys, dtype=dtype)
        kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
        half = dtype.upper().replace("FP", "F")
        matrix = "blk.0.ssm_in.weight" if arch == "granitehybrid" else "blk.0.attn_qkv.weight"
        assert kinds[matrix] == half and kinds["blk.0.ssm_out.weight"] == half
        assert {kinds[f"blk.0.{n}"] for n in ("ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ssm_norm.weight")} == \
            {"F32"}
        model, _, _ = import_gguf(path, root / "back", capsys)
        with torch.no_grad():
            torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=0, atol=tolerance)


# What llama.cpp's converter writes for these tiny models, from reading its code (ggml-org/llama.cpp:
# conversion/granite.py GraniteHybridModel.__init__ / set_gguf_parameters / modify_tensors, with GraniteMoeModel's
# and GraniteModel's; conversion/mamba.py Mamba2Model.modify_tensors; conversion/qwen.py Qwen3NextModel,
# _LinearAttentionVReorderBase, _Qwen35MRopeMixin and Qwen3_5TextModel; conversion/base.py TextModel
# .set_gguf_parameters) and the shapes its loaders create (src/llama-model.cpp LLM_ARCH_GRANITE_HYBRID,
# src/models/qwen35.cpp load_arch_tensors). Shapes are ggml's ne, innermost first.
def test_granitehybrid_keys_and_tensors_follow_llama_cpp(tmp_path, capsys):
    """granitehybrid: Mamba-2 layers 0, 2, 3 (H=8 heads of P=16, G=2 groups, N=8, kernel 4), attention on 1 without
    positions (4 heads, 2 kv, of 16), Granite's scalars, a dense MLP of 96."""
    _, path = export_gguf("granitemoehybrid-mamba", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "granitehybrid"
    keys = _fields(reader, "granitehybrid")
    assert {k: keys[k] for k in keys if k != "attention.layer_norm_rms_epsilon"} == {
        "context_length": 2 ** 20,  # the converter's value where the hybrid has no RoPE
        "embedding_length": 64, "block_count": 4, "feed_forward_length": 96, "attention.head_count": 4,
        "attention.head_count_kv": [0, 2, 0, 0], "vocab_size": keys["vocab_size"], "rope.freq_base": 10000.0,
        "rope.dimension_count": 16, "embedding_scale": 3.0, "residual_scale": pytest.approx(0.4),
        "logit_scale": 2.5, "attention.scale": pytest.approx(0.2), "expert_count": 0, "expert_used_count": 0,
        "expert_shared_feed_forward_length": 96, "ssm.conv_kernel": 4, "ssm.state_size": 8, "ssm.group_count": 2,
        "ssm.inner_size": 128, "ssm.time_step_rank": 8, "rope.scaling.finetuned": False}
    assert keys["attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    shapes = _shapes(reader)
    I, G, N, H, C = 128, 2, 8, 8, 64
    mamba = {"attn_norm.weight": (C,), "ffn_norm.weight": (C,), "ffn_gate.weight": (C, 96), "ffn_up.weight": (C, 96),
             "ffn_down.weight": (96, C), "ssm_in.weight": (C, 2 * I + 2 * G * N + H),
             "ssm_conv1d.weight": (4, I + 2 * G * N), "ssm_conv1d.bias": (I + 2 * G * N,), "ssm_dt.bias": (H,),
             "ssm_a": (1, H), "ssm_d": (1, H), "ssm_norm.weight": (I // G, G), "ssm_out.weight": (I, C)}
    attention = {"attn_norm.weight": (C,), "ffn_norm.weight": (C,), "ffn_gate.weight": (C, 96),
                 "ffn_up.weight": (C, 96), "ffn_down.weight": (96, C), "attn_q.weight": (C, 64),
                 "attn_k.weight": (C, 32), "attn_v.weight": (C, 32), "attn_output.weight": (64, C)}
    expected = {"token_embd.weight": (C, shapes["token_embd.weight"][1]), "output_norm.weight": (C,)}  # tied
    for i in range(4):
        expected.update({f"blk.{i}.{n}": s for n, s in (attention if i == 1 else mamba).items()})
    assert shapes == expected


def test_granitehybrid_experts_follow_llama_cpp(tmp_path, capsys):
    """With experts (4 of width 48, top 2) and the shared MLP (40): GraniteMoeModel's split of input_linear into
    ffn_gate_exps / ffn_up_exps and of shared_mlp into ffn_*_shexp, the widths as feed_forward_length and
    expert_shared_feed_forward_length."""
    _, path = export_gguf("granitemoehybrid-moe", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    keys = _fields(reader, "granitehybrid")
    assert (keys["expert_count"], keys["expert_used_count"], keys["feed_forward_length"],
            keys["expert_shared_feed_forward_length"], keys["attention.head_count_kv"]) == (4, 2, 48, 40, [0, 2, 0])
    shapes = _shapes(reader)
    assert {n[len("blk.1."):]: s for n, s in shapes.items() if n.startswith("blk.1.ffn")} == {
        "ffn_norm.weight": (64,), "ffn_gate_inp.weight": (64, 4), "ffn_gate_exps.weight": (64, 48, 4),
        "ffn_up_exps.weight": (64, 48, 4), "ffn_down_exps.weight": (48, 64, 4), "ffn_gate_shexp.weight": (64, 40),
        "ffn_up_shexp.weight": (64, 40), "ffn_down_shexp.weight": (40, 64)}
    assert shapes["output.weight"] == shapes["token_embd.weight"]  # untied


def test_qwen35_keys_and_tensors_follow_llama_cpp(tmp_path, capsys):
    """qwen35: gated delta nets on 0, 1, 3 (2 key heads of 8, 4 value heads of 8, kernel 4), gated attention on 2
    (4 heads, 2 kv, of 16, RoPE on half of each), an MLP of 96, untied: full_attention_interval 3 gives that
    layout."""
    _, path = export_gguf("qwen3_5_text", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "qwen35"
    keys = _fields(reader, "qwen35")
    assert {k: keys[k] for k in keys if k != "attention.layer_norm_rms_epsilon"} == {
        "context_length": 64, "embedding_length": 64, "block_count": 4, "feed_forward_length": 96,
        "attention.head_count": 4, "attention.head_count_kv": 2, "vocab_size": keys["vocab_size"],
        "rope.freq_base": 500.0, "attention.key_length": 16, "attention.value_length": 16,
        "rope.dimension_count": 8, "rope.dimension_sections": [11, 11, 10, 0], "full_attention_interval": 3,
        "ssm.conv_kernel": 4, "ssm.state_size": 8, "ssm.group_count": 2, "ssm.time_step_rank": 4,
        "ssm.inner_size": 32}
    shapes = _shapes(reader)
    C, conv = 64, 2 * 2 * 8 + 4 * 8
    delta = {"attn_norm.weight": (C,), "post_attention_norm.weight": (C,), "ffn_gate.weight": (C, 96),
             "ffn_up.weight": (C, 96), "ffn_down.weight": (96, C), "attn_qkv.weight": (C, conv),
             "attn_gate.weight": (C, 32), "ssm_beta.weight": (C, 4), "ssm_alpha.weight": (C, 4),
             "ssm_conv1d.weight": (4, conv), "ssm_a": (4,), "ssm_dt.bias": (4,), "ssm_norm.weight": (8,),
             "ssm_out.weight": (32, C)}
    attention = {"attn_norm.weight": (C,), "post_attention_norm.weight": (C,), "ffn_gate.weight": (C, 96),
                 "ffn_up.weight": (C, 96), "ffn_down.weight": (96, C), "attn_q.weight": (C, 2 * 64),
                 "attn_k.weight": (C, 32), "attn_v.weight": (C, 32), "attn_output.weight": (64, C),
                 "attn_q_norm.weight": (16,), "attn_k_norm.weight": (16,)}
    vocab = shapes["token_embd.weight"][1]
    expected = {"token_embd.weight": (C, vocab), "output.weight": (C, vocab), "output_norm.weight": (C,)}
    for i in range(4):
        expected.update({f"blk.{i}.{n}": s for n, s in (attention if i == 2 else delta).items()})
    assert shapes == expected


def test_mamba_keys_and_tensors_follow_llama_cpp(tmp_path, capsys):
    """mamba (MambaModel; llama.cpp's LLM_ARCH_MAMBA): two layers of I=96 channels from C=64, a state of N=8, dt of
    rank 4, kernel 4, the conv bias, tied; feed_forward_length and head_count 0, the context 2**20; the values:
    ssm_a = −exp(A_log), the convolution squeezed."""
    hf, path = export_gguf("mamba", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "mamba"
    keys = _fields(reader, "mamba")
    assert {k: keys[k] for k in keys if k != "attention.layer_norm_rms_epsilon"} == {
        "context_length": 2 ** 20, "embedding_length": 64, "block_count": 2, "feed_forward_length": 0,
        "attention.head_count": 0, "vocab_size": keys["vocab_size"], "ssm.conv_kernel": 4, "ssm.inner_size": 96,
        "ssm.state_size": 8, "ssm.time_step_rank": 4, "ssm.dt_b_c_rms": False}
    assert keys["attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    shapes = _shapes(reader)
    C, I, N, R = 64, 96, 8, 4
    block = {"attn_norm.weight": (C,), "ssm_in.weight": (C, 2 * I), "ssm_conv1d.weight": (4, I),
             "ssm_conv1d.bias": (I,), "ssm_x.weight": (I, R + 2 * N), "ssm_dt.weight": (R, I), "ssm_dt.bias": (I,),
             "ssm_a": (N, I), "ssm_d": (I,), "ssm_out.weight": (I, C)}
    expected = {"token_embd.weight": (C, shapes["token_embd.weight"][1]), "output_norm.weight": (C,)}
    for i in range(2):
        expected.update({f"blk.{i}.{n}": s for n, s in block.items()})
    assert shapes == expected
    tensors = {t.name: torch.from_numpy(t.data.copy()).reshape(tuple(reversed([int(n) for n in t.shape])))
               for t in reader.tensors}
    m = "backbone.layers.1.mixer."
    sd = {k: v.detach() for k, v in hf.state_dict().items()}
    torch.testing.assert_close(tensors["blk.1.ssm_a"], -sd[m + "A_log"].exp())
    torch.testing.assert_close(tensors["blk.1.ssm_conv1d.weight"], sd[m + "conv1d.weight"][:, 0])


def test_qwen35_tensors_hold_the_converters_values(tmp_path, capsys):
    """The values as Qwen3NextModel / _LinearAttentionVReorderBase write them from transformers' tensors: norms as
    1 + weight (not the delta net's), ssm_a = −exp(A_log), the value heads tiled ([v0 of each key head, v1 of
    each, ...]) in attn_qkv's v rows, attn_gate, ssm_alpha, ssm_a and ssm_out's columns; q_proj as it is."""
    hf, path = export_gguf("qwen3_5_text", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: torch.from_numpy(t.data.copy()).reshape(tuple(reversed([int(n) for n in t.shape])))
               for t in reader.tensors}
    sd = {k: v.detach() for k, v in hf.state_dict().items()}
    d = "model.layers.0.linear_attn."

    def tiled(t, width):  # (Hk=2, r=2, width, ...) -> (r, Hk, width, ...)
        return t.reshape(2, 2, width, *t.shape[1:]).transpose(0, 1).reshape(t.shape)

    torch.testing.assert_close(tensors["blk.0.attn_norm.weight"], sd["model.layers.0.input_layernorm.weight"] + 1)
    torch.testing.assert_close(tensors["blk.2.attn_q_norm.weight"], sd["model.layers.2.self_attn.q_norm.weight"] + 1)
    torch.testing.assert_close(tensors["blk.0.ssm_norm.weight"], sd[d + "norm.weight"])
    torch.testing.assert_close(tensors["blk.0.ssm_a"], tiled(-sd[d + "A_log"].exp(), 1))
    qkv = sd[d + "in_proj_qkv.weight"]
    torch.testing.assert_close(tensors["blk.0.attn_qkv.weight"], torch.cat([qkv[:32], tiled(qkv[32:], 8)]))
    torch.testing.assert_close(tensors["blk.0.attn_gate.weight"], tiled(sd[d + "in_proj_z.weight"], 8))
    torch.testing.assert_close(tensors["blk.0.ssm_alpha.weight"], tiled(sd[d + "in_proj_a.weight"], 1))
    torch.testing.assert_close(tensors["blk.0.ssm_out.weight"], tiled(sd[d + "out_proj.weight"].t(), 8).t())
    torch.testing.assert_close(tensors["blk.2.attn_q.weight"], sd["model.layers.2.self_attn.q_proj.weight"])


@pytest.mark.parametrize("extra, named", [
    # Qwen3.5: full attention on layer 0 then delta nets: no full_attention_interval gives that
    (dict(delta_layers=(1, 2, 3), n_layer=4), "full_attention_interval"),
    (dict(delta_layers=(0, 1, 2), n_layer=4, delta_key_dim=16), "ssm.state_size"),
    # Granite 4.0: biases on the Mamba projections, which llama.cpp's granitehybrid does not load
    (dict(delta_rule="mamba2", delta_layers=(0,), n_layer=2, delta_heads=8, delta_key_heads=1, delta_key_dim=8,
          delta_value_dim=16, delta_proj_bias=True, pos_emb="none", rope_dims=0, attn_gate="none", qk_norm=False,
          norm_unit_offset=False), "delta_proj_bias"),
])
def test_recurrent_gguf_refusals(extra, named, tmp_path, capsys):
    from dataclasses import replace

    from redline.model import ModelConfig
    from tests.interop_models import VOCAB

    qwen = ModelConfig(vocab_size=VOCAB - 8, context_len=64, n_layer=4, n_embd=64, n_head=4, n_kv_head=2,
                       head_size=16, mlp_hidden=32, qk_norm=True, fused_qkv=True, attn_gate="element",
                       rope_dims=8, norm_unit_offset=True, delta_heads=4, delta_key_heads=2, delta_key_dim=8,
                       delta_value_dim=8, delta_conv_kernel=4)
    assert_gguf_export_refused(replace(qwen, **extra), named, tmp_path, capsys)


def test_mamba_gguf_refuses_projection_biases(tmp_path, capsys):
    """llama.cpp's mamba loads no in/out projection biases and requires the conv bias: a model with them refused."""
    from redline.model import ModelConfig
    from tests.interop_models import VOCAB

    layers = (0, 1)
    cfg = ModelConfig(vocab_size=VOCAB - 8, context_len=64, n_layer=2, n_embd=32, n_head=1, pos_emb="none",
                      norm="rmsnorm", mlp_free_layers=layers, delta_layers=layers, delta_rule="mamba1",
                      delta_heads=64, delta_key_heads=1, delta_value_dim=1, delta_key_dim=8, delta_conv_kernel=3,
                      delta_conv_bias=False, delta_proj_bias=True, delta_dt_rank=2)
    assert_gguf_export_refused(cfg, "delta_proj_bias", tmp_path, capsys)


def test_export_names_the_loaders_that_read_the_file(tmp_path, capsys):
    """`redline export --format gguf` names transformers' GGUF loader only for an architecture it has: a
    granitehybrid file is llama.cpp's alone, a llama or mamba file both's."""
    for kind, transformers_reads in (("granitemoehybrid-mamba", False), ("llama-gqa-tied", True), ("mamba", True)):
        folder = tmp_path / kind
        hf_folder(kind, folder / "hf")
        assert run_cli(["import", str(folder / "hf"), "--out", str(folder / "ckpt")], capsys)[0] == 0
        code, out, err = run_cli(["export", str(folder / "ckpt"), "--format", "gguf", "--out",
                                  str(folder / "model.gguf")], capsys)
        assert code == 0, err
        said = out.splitlines()[0]
        assert said.endswith("llama.cpp") and ("gguf_file='model.gguf'" in said) == transformers_reads, said
