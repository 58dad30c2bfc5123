"""GGUF files of the classic families as llama.cpp's converter writes them: GPTBigCode as starcoder (learned
positions, multi-query c_attn as attn_qkv) and MPT as mpt (ALiBi, no biases). Exported by redline, read back by
redline's import with the logits and greedy tokens of the transformers model they came from; the keys and the tensors'
names and shapes checked against those llama.cpp's converter writes (ggml-org/llama.cpp conversion/starcoder.py
StarCoderModel, conversion/mpt.py MPTModel; the gguf package's MODEL_TENSORS); what llama.cpp's architectures cannot
hold refused in one line. transformers' GGUF loader (5.x) has neither architecture: redline's reader is the check."""

from __future__ import annotations

import pytest
import torch

from redline.model import ModelConfig
from tests.test_interop import TOKENS
from tests.test_interop_gguf import assert_gguf_export_refused, export_gguf, import_gguf

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


def _shapes(reader) -> dict:
    """GGUF name -> its shape as the file gives it (ggml's ne: innermost first)."""
    return {t.name: tuple(int(n) for n in t.shape.tolist()) for t in reader.tensors}


def _fields(reader, arch) -> dict:
    return {k[len(arch) + 1:]: f.contents() for k, f in reader.fields.items() if k.startswith(arch + ".")}


def _names_in_gguf_package(reader, arch: str) -> None:
    """Every tensor name is one the gguf package's MODEL_TENSORS gives the architecture."""
    a = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[a]}
    for t in reader.tensors:
        stem = t.name.rsplit(".", 1)[0] if t.name.endswith((".weight", ".bias")) else t.name  # ssm_a, ssm_d bare
        parts = stem.split(".")
        assert (stem if parts[0] != "blk" else f"blk.{{bid}}.{'.'.join(parts[2:])}") in allowed, t.name


def assert_reads_back_as(hf, path, tmp_path, capsys, new: int = 8):
    """The GGUF file at path, imported by redline: fp32 logits equal to transformers' model hf, the chat template and
    stop ids kept, and greedy tokens through redline's engine equal to hf.generate's; returns the import's config."""
    from redline.inference import InferenceEngine, SamplingParams

    with torch.no_grad():
        expected = hf(TOKENS).logits
    model, tokenizer, cfg = import_gguf(path, tmp_path / "back", capsys)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
    assert tokenizer.chat_template and tokenizer.stop_ids == [1, 2]
    prompts = [TOKENS[0, :9].tolist(), TOKENS[1, :4].tolist()]
    results = InferenceEngine(model, compile=False).generate(prompts, new, SamplingParams(temperature=0))
    hf.generation_config.eos_token_id = None
    for prompt, result in zip(prompts, results):
        reference = hf.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, pad_token_id=0)
        assert result.tokens == reference[0, len(prompt):].tolist()
    return cfg


@pytest.mark.parametrize("kind, arch", [("gpt_bigcode", "starcoder"), ("mpt-gguf", "mpt"),
                                        ("mpt-gguf-untied", "mpt")])
def test_classic_gguf_round_trip(kind, arch, tmp_path, capsys):
    """export -> import: logits equal to transformers' in fp32, greedy tokens equal through redline's engine."""
    hf, path = export_gguf(kind, tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == arch
    _names_in_gguf_package(reader, arch)
    assert_reads_back_as(hf, path, tmp_path, capsys)


def test_starcoder_keys_and_tensors_follow_llama_cpp(tmp_path, capsys):
    """starcoder (StarCoderModel): its keys (head_count_kv 1), learned positions as position_embd, c_attn's
    multi-query rows [q (C); k (D); v (D)] as attn_qkv unchanged, nn.Linear weights untransposed, biases on every
    layer, the tied head as no output tensor."""
    hf, path = export_gguf("gpt_bigcode", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    keys = _fields(reader, "starcoder")
    C, D, F, V = 64, 16, 96, keys["vocab_size"]
    assert {k: v for k, v in keys.items() if k != "attention.layer_norm_epsilon"} == {
        "context_length": 64, "embedding_length": C, "block_count": 2, "feed_forward_length": F,
        "attention.head_count": 4, "attention.head_count_kv": 1, "vocab_size": V}
    assert keys["attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    block = {"attn_norm": (C,), "attn_qkv": (C, C + 2 * D), "attn_output": (C, C), "ffn_norm": (C,),
             "ffn_up": (C, F), "ffn_down": (F, C)}
    expected = {"token_embd.weight": (C, V), "position_embd.weight": (C, 64), "output_norm.weight": (C,),
                "output_norm.bias": (C,)}
    for i in range(2):
        for n, s in block.items():
            expected[f"blk.{i}.{n}.weight"] = s
            expected[f"blk.{i}.{n}.bias"] = s[-1:]
    assert _shapes(reader) == expected
    qkv = next(t for t in reader.tensors if t.name == "blk.1.attn_qkv.weight").data
    theirs = hf.state_dict()["transformer.h.1.attn.c_attn.weight"]
    torch.testing.assert_close(torch.from_numpy(qkv.copy()), theirs)


def test_mpt_keys_and_tensors_follow_llama_cpp(tmp_path, capsys):
    """mpt (MPTModel): its keys (max_alibi_bias 8, no head_count_kv or clamp), Wqkv's [q; k; v] rows as attn_qkv,
    no biases, the tied head as no output tensor."""
    hf, path = export_gguf("mpt-gguf", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    keys = _fields(reader, "mpt")
    C, V = 64, keys["vocab_size"]
    assert {k: v for k, v in keys.items() if k != "attention.layer_norm_epsilon"} == {
        "context_length": 64, "embedding_length": C, "block_count": 2, "feed_forward_length": 4 * C,
        "attention.head_count": 4, "attention.max_alibi_bias": 8.0, "vocab_size": V}
    assert keys["attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    block = {"attn_norm": (C,), "attn_qkv": (C, 3 * C), "attn_output": (C, C), "ffn_norm": (C,),
             "ffn_up": (C, 4 * C), "ffn_down": (4 * C, C)}
    expected = {"token_embd.weight": (C, V), "output_norm.weight": (C,)}
    expected.update({f"blk.{i}.{n}.weight": s for i in range(2) for n, s in block.items()})
    assert _shapes(reader) == expected
    qkv = next(t for t in reader.tensors if t.name == "blk.0.attn_qkv.weight").data
    torch.testing.assert_close(torch.from_numpy(qkv.copy()), hf.state_dict()["transformer.blocks.0.attn.Wqkv.weight"])


@pytest.mark.parametrize("changes, named", [
    (dict(n_kv_head=None, attn_scale=1.0), "multi-head attention on a GPTBigCode"),  # unscaled: GPTBigCode's
    (dict(gelu_approximate="none"), "model.gelu_approximate=none"),
    (dict(attn_scale=1.0), "model.attn_scale=1.0"),
])
def test_starcoder_refuses_what_llama_cpp_runs_otherwise(changes, named, tmp_path, capsys):
    base = dict(vocab_size=64, context_len=32, n_layer=1, n_embd=32, n_head=4, n_kv_head=1, qk_norm=False,
                fused_qkv=True, pos_emb="learned", mlp="gelu", gelu_approximate="tanh", norm="layernorm", bias=True)
    cfg = ModelConfig(**{**base, **changes})
    assert_gguf_export_refused(cfg, named, tmp_path, capsys)


def test_mpt_refuses_a_score_scale(tmp_path, capsys):
    cfg = ModelConfig(vocab_size=64, context_len=32, n_layer=1, n_embd=32, n_head=4, qk_norm=False, fused_qkv=True,
                      pos_emb="alibi", attn_scale=0.2, mlp="gelu", gelu_approximate="none", norm="layernorm",
                      norm_bias=False, bias=False)
    assert_gguf_export_refused(cfg, "model.attn_scale=0.2", tmp_path, capsys)


@pytest.mark.parametrize("kind", ["gpt_bigcode", "mpt-gguf", "falcon_h1"])
def test_gguf_half_precision(kind, tmp_path, capsys):
    """fp16 files: matrices in F16; norms, biases, learned positions and the Mamba-2 convolution, A, D and dt in
    F32, as llama.cpp's converter keeps them; read back within fp16's rounding."""
    hf, path = export_gguf(kind, tmp_path, capsys, dtype="fp16")
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert kinds["token_embd.weight"] == "F16" and kinds["output_norm.weight"] == "F32"
    kept = ("norm", "position_embd", "ssm_conv1d", "ssm_a", "ssm_d", "ssm_dt")
    f32 = [n for n in kinds if n.endswith(".bias") or any(k in n for k in kept)]
    assert f32 and {kinds[n] for n in f32} == {"F32"}
    model, _, _ = import_gguf(path, tmp_path / "back", capsys)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=0, atol=2e-2)
