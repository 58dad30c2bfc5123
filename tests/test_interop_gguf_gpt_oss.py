"""GPT-OSS as llama.cpp's gpt-oss GGUF: the file llama.cpp's converter (convert_hf_to_gguf.py, GptOssModel) writes,
checked tensor by tensor against that converter's rules applied here to transformers' own weights (its names, the
experts as rows with gate_up_proj's interleaved gate and up columns taken apart, the sinks as attn_sinks), its
metadata keys, redline's import of the file with the model's logits, the dtypes (bf16, q8_0, the experts in MXFP4),
the layouts llama.cpp would run as another model refused in one line, and transformers' GGUF loader, which cannot
read a gpt-oss file (test_transformers_gguf_loader_cannot_read_gpt_oss says where it breaks)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from redline.errors import UserError
from redline.training.checkpoint import load_for_inference
from tests.interop_models import VOCAB, byte_level_tokenizer
from tests.test_interop import TOKENS, run_cli
from tests.test_interop_gguf import imported_as_gguf

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

YARN = {"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 32}


def gpt_oss_folder(path, clamp_bites=True, **overrides):
    """A tiny transformers GPT-OSS saved at `path` with a tokenizer: heads 24 wide (not n_embd / n_head, so the
    file's key_length matters), 3 layers (windowed, full, windowed: llama.cpp's fixed order), sinks, biases on q/k/v/o,
    top 2 of 4 experts with biases, YaRN without rounding its band, and llama.cpp's clamp of 7 (gate_up_proj scaled
    so that it bites, unless clamp_bites is false); every parameter perturbed."""
    config = transformers.GptOssConfig(**{
        **dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, head_dim=24, num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
               swiglu_limit=7.0, max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1,
               pad_token_id=None, tie_word_embeddings=False, rope_parameters=YARN), **overrides})
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.05)
            if name.endswith("gate_up_proj") and clamp_bites:
                p.mul_(40.0)  # pre-activations of ±20 and more: past the clamp
    model.save_pretrained(path)
    byte_level_tokenizer(path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2], "bos_token_id": 0}))
    return model


def export(tmp_path, capsys, dtype="fp32", clamp_bites=True, **overrides):
    """(transformers model, GGUF path) after `redline import` of its folder and `redline export --format gguf`."""
    hf = gpt_oss_folder(tmp_path / "hf", clamp_bites, **overrides)
    return hf, imported_as_gguf(tmp_path, capsys, dtype)


def import_logits(path, out, capsys) -> torch.Tensor:
    code, _, err = run_cli(["import", str(path), "--out", str(out)], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(out)
    with torch.no_grad():
        return model(TOKENS)


def converter_tensors(hf) -> dict[str, torch.Tensor]:
    """What llama.cpp's converter writes for transformers' GPT-OSS `hf` (its GptOssModel, gate and up unfused),
    worked out here from transformers' tensors: its names, the sinks as attn_sinks.weight, the router as ffn_gate_inp,
    the experts as rows (the transpose of transformers' (E, C, 2F) / (E, F, C)) with gate_up_proj's gate columns
    [..., ::2] and up columns [..., 1::2] apart."""
    sd = {k: v.detach().float() for k, v in hf.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
           "output.weight": sd["lm_head.weight"]}
    names = {"attn_norm.weight": "input_layernorm.weight",
             "post_attention_norm.weight": "post_attention_layernorm.weight", "attn_sinks.weight": "self_attn.sinks",
             "ffn_gate_inp.weight": "mlp.router.weight", "ffn_gate_inp.bias": "mlp.router.bias",
             "ffn_down_exps.bias": "mlp.experts.down_proj_bias",
             **{f"attn_{g}.{kind}": f"self_attn.{h}_proj.{kind}"
                for g, h in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o")) for kind in ("weight", "bias")}}
    for i in range(hf.config.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out.update({b + g: sd[p + h] for g, h in names.items()})
        gate_up, bias = sd[p + "mlp.experts.gate_up_proj"].transpose(1, 2), sd[p + "mlp.experts.gate_up_proj_bias"]
        out[b + "ffn_gate_exps.weight"], out[b + "ffn_up_exps.weight"] = gate_up[:, ::2], gate_up[:, 1::2]
        out[b + "ffn_gate_exps.bias"], out[b + "ffn_up_exps.bias"] = bias[:, ::2], bias[:, 1::2]
        out[b + "ffn_down_exps.weight"] = sd[p + "mlp.experts.down_proj"].transpose(1, 2)
    return out


def file_tensors(path) -> dict[str, torch.Tensor]:
    """Every tensor of a GGUF file dequantized to fp32, in numpy's order (the reverse of ggml's ne)."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: torch.from_numpy(np.array(gguf.dequantize(t.data, t.tensor_type), dtype=np.float32)).reshape(
        tuple(int(n) for n in reversed(t.shape.tolist()))) for t in reader.tensors}


def assert_converter_layout(path, hf) -> None:
    got, want = file_tensors(path), converter_tensors(hf)
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=0, atol=0, msg=name)


def test_gpt_oss_gguf_is_the_converters_file(tmp_path, capsys):
    """An fp32 export holds exactly the tensors llama.cpp's converter writes for the model (names, shapes, values),
    under names of gguf-py's GPT_OSS tensor list, with the keys llama.cpp's gpt-oss loader reads; redline's import of
    it gives the model's logits (with the clamp of 7 changing them), and the window on layers 0 and 2."""
    hf, path = export(tmp_path, capsys)
    assert_converter_layout(path, hf)
    reader = gguf.GGUFReader(str(path))
    allowed = {gguf.TENSOR_NAMES[t].format(bid=i) for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GPT_OSS]
               for i in range(3)}
    assert {t.name.rsplit(".", 1)[0] for t in reader.tensors} <= allowed
    assert {t.tensor_type.name for t in reader.tensors} == {"F32"}
    # the tensors llama.cpp's loader requires (llama_model::load_tensors, LLM_ARCH_OPENAI_MOE), in its shapes
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape.tolist())) for t in reader.tensors}
    per_layer = ["attn_norm.weight", "post_attention_norm.weight", "attn_sinks.weight",
                 *(f"{n}.{k}" for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp", "ffn_gate_exps",
                                        "ffn_up_exps", "ffn_down_exps") for k in ("weight", "bias"))]
    assert set(shapes) == {"token_embd.weight", "output_norm.weight", "output.weight",
                           *(f"blk.{i}.{n}" for i in range(3) for n in per_layer)}
    assert [shapes[f"blk.0.{n}"] for n in ("attn_q.weight", "attn_k.weight", "attn_output.weight", "attn_sinks.weight",
                                           "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.bias",
                                           "ffn_down_exps.weight", "ffn_down_exps.bias")] == \
        [(96, 64), (48, 64), (64, 96), (4,), (4, 64), (4, 32, 64), (4, 32), (4, 64, 32), (4, 64)]
    fields = {name: f.contents() for name, f in reader.fields.items()}
    assert gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GPT_OSS] == fields["general.architecture"] == "gpt-oss"
    want = {"block_count": 3, "context_length": 64, "embedding_length": 64, "feed_forward_length": 32,
            "expert_feed_forward_length": 32, "expert_count": 4, "expert_used_count": 2, "attention.head_count": 4,
            "attention.head_count_kv": 2, "attention.key_length": 24, "attention.value_length": 24,
            "attention.sliding_window": 5, "rope.freq_base": 500.0, "rope.scaling.type": "yarn",
            "rope.scaling.factor": 2.0, "rope.scaling.original_context_length": 32,
            "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0,
            "attention.layer_norm_rms_epsilon": pytest.approx(1e-5)}
    assert {k: fields[f"gpt-oss.{k}"] for k in want} == want
    assert fields["general.file_type"] == gguf.LlamaFileType.ALL_F32 and fields["tokenizer.ggml.model"] == "gpt2"

    logits = import_logits(path, tmp_path / "back", capsys)
    with torch.no_grad():
        expected = hf(TOKENS).logits
        for layer in hf.model.layers:  # the clamp lifted: other logits, so the comparison sees the clamp
            layer.mlp.experts.limit = 1e9
        unclamped = hf(TOKENS).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert (unclamped - expected).abs().max() > 1e-2
    _, tokenizer, train_cfg = load_for_inference(tmp_path / "back")
    cfg = train_cfg.model
    assert [cfg.layer_window(i) for i in range(3)] == [5, 0, 5] and cfg.swiglu_limit == 7.0
    assert not cfg.rope_truncate and tokenizer.stop_ids == [1, 2]


def test_gate_up_swapped_is_caught(tmp_path, capsys):
    """The layout check and the import both fail on a file whose gate and up experts are swapped (one layer's): the
    checks above would catch that mistake in the writer."""
    hf, path = export(tmp_path, capsys)
    swapped = tmp_path / "swapped" / "model.gguf"
    swapped.parent.mkdir()
    shutil.copy(path, swapped)
    reader = gguf.GGUFReader(str(swapped), "r+")
    gate, up = (next(t for t in reader.tensors if t.name == f"blk.1.ffn_{n}_exps.weight") for n in ("gate", "up"))
    held = gate.data.copy()
    gate.data[...] = up.data
    up.data[...] = held
    reader.data.flush()
    del reader
    with pytest.raises(AssertionError):
        assert_converter_layout(swapped, hf)
    with torch.no_grad():
        expected = hf(TOKENS).logits
    assert (import_logits(swapped, tmp_path / "back", capsys) - expected).abs().max() > 1e-2


@pytest.mark.parametrize("dtype", ["bf16", "q8_0"])
def test_gpt_oss_gguf_dtypes(dtype, tmp_path, capsys):
    """bf16 and q8_0: every matrix in the type (the experts' 3-D stacks too, in blocks along the file's rows) but the
    router, which llama.cpp's converter keeps in F32 as it keeps norms, sinks and every bias (the experts' 2-D ones
    too): each tensor is the converter's, rounded so; redline reads the file back near the model's logits."""
    hf, path = export(tmp_path, capsys, dtype=dtype, clamp_bites=False)
    qtype = gguf.GGMLQuantizationType[dtype.upper()]
    kinds = {t.name: t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}
    got = file_tensors(path)
    for name, want in converter_tensors(hf).items():
        exact = want.dim() == 1 or name.endswith(".bias") or name.split(".")[-2] == "ffn_gate_inp"
        assert kinds[name] == (gguf.GGMLQuantizationType.F32 if exact else qtype), name
        if not exact:
            want = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(want.numpy(), qtype), qtype))
        assert torch.equal(got[name], want), name
    logits = import_logits(path, tmp_path / "back", capsys)
    with torch.no_grad():
        expected = hf(TOKENS).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=5e-2)


def test_gpt_oss_gguf_mxfp4(tmp_path, capsys):
    """--dtype mxfp4: the experts in llama.cpp's MXFP4 blocks, the other matrices BF16, file type MOSTLY_MXFP4_MOE,
    as llama.cpp's converter writes the released checkpoints. Experts whose weights are MXFP4 values (as those
    checkpoints' are) come back exactly, whatever scale their blocks had: the file dequantizes to the converter's
    tensors, and redline's import gives the logits of the bf16 export, those of the model with the file's bf16
    matrices."""
    from redline.interop.gpt_oss import dequantize_mxfp4

    hf = gpt_oss_folder(tmp_path / "hf", clamp_bites=False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every expert weight an MXFP4 value, as a released checkpoint's: random codes and scales
        for layer in hf.model.layers:  # (blocks of 32 along the file's rows), half the rows' codes below 2.0, so
            for param in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj):  # their scales are larger
                E, cols, rows = param.shape  # than the quantizer picks: the same values from other bytes
                blocks = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
                blocks[:, ::2] &= 0x33  # FP4 codes 0-3: 0, 0.5, 1, 1.5
                scales = torch.randint(127 - 9, 127 - 4, (E, rows, cols // 32), generator=g, dtype=torch.uint8)
                param.copy_(dequantize_mxfp4(blocks, scales, torch.float32).transpose(1, 2))
    hf.save_pretrained(tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    paths = {}
    for dtype in ("mxfp4", "bf16"):
        paths[dtype] = tmp_path / dtype / "model.gguf"
        code, out, err = run_cli(["export", str(tmp_path / "ckpt"), "--format", "gguf", "--dtype", dtype, "--out",
                                  str(paths[dtype])], capsys)
        assert code == 0, err
    reader = gguf.GGUFReader(str(paths["mxfp4"]))
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert {kinds[f"blk.2.ffn_{n}_exps.weight"] for n in ("gate", "up", "down")} == {"MXFP4"}
    assert {kinds[n] for n in ("blk.0.attn_q.weight", "token_embd.weight", "output.weight")} == {"BF16"}
    assert {kinds[n] for n in ("blk.0.ffn_gate_inp.weight", "blk.0.ffn_down_exps.bias")} == {"F32"}
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_MXFP4_MOE
    got, want = file_tensors(paths["mxfp4"]), converter_tensors(hf)
    for name in (f"blk.{i}.ffn_{n}_exps.weight" for i in range(3) for n in ("gate", "up", "down")):
        assert torch.equal(got[name], want[name]), name
    ours = import_logits(paths["mxfp4"], tmp_path / "back", capsys)
    assert torch.equal(ours, import_logits(paths["bf16"], tmp_path / "back-bf16", capsys))
    with torch.no_grad():  # the model with the file's bf16 matrices (not the router, nor the experts or their biases)
        for name, p in hf.named_parameters():
            if p.dim() == 2 and "router" not in name and "experts" not in name:
                p.copy_(p.to(torch.bfloat16))
        torch.testing.assert_close(ours, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def _redline_checkpoint(tmp_path, **extra):
    """A redline checkpoint of a GPT-OSS-shaped model (random weights), for what an export refuses."""
    from redline.config import TrainConfig, to_dict
    from redline.model import GPT, ModelConfig
    from redline.tokenizer import load_tokenizer
    from redline.training import checkpoint as ckpt_io

    cfg = ModelConfig(**{**dict(vocab_size=VOCAB - 8, context_len=64, n_layer=2, n_embd=64, n_head=4, n_kv_head=2,
                                mlp_hidden=32, attn_sinks=True, moe_experts=4, moe_top_k=2, mlp="swiglu_clamped",
                                swiglu_limit=7.0, moe_bias=True, moe_norm_topk=True, bias=True, sliding_window=5,
                                sliding_window_pattern=2, tie_embeddings=False), **extra})
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ckpt_io.write_weights_checkpoint(ckpt, ckpt_io.model_weights(GPT(cfg)), to_dict(TrainConfig(model=cfg)),
                                     load_tokenizer(byte_level_tokenizer(tmp_path / "tok")), {})
    return ckpt


@pytest.mark.parametrize("extra, argv, named", [
    (dict(swiglu_limit=0.5), [], "clamps its SwiGLU at 7"),
    (dict(sliding_window_pattern=0), [], "windows the even layers"),  # every layer windowed
    (dict(sliding_window=0, sliding_window_pattern=0), [], "windows the even layers"),  # none
    (dict(tie_embeddings=True), [], "output matrix of its own"),
    (dict(), ["--format", "hf", "--dtype", "mxfp4"], "is a GGUF type"),
    (dict(attn_sinks=False, moe_experts=0, moe_top_k=0, mlp="swiglu", moe_bias=False, moe_norm_topk=False,
          sliding_window=0, sliding_window_pattern=0, bias=False), ["--dtype", "mxfp4"],
     "--dtype mxfp4 writes a GPT-OSS"),  # a dense Llama-shaped model
])
def test_gpt_oss_gguf_refusals(extra, argv, named, tmp_path, capsys):
    """What llama.cpp's gpt-oss would run as another model (its clamp, window order and untied head are fixed in its
    code), and MXFP4 where it means nothing: one line, nothing written."""
    ckpt = _redline_checkpoint(tmp_path, **extra)
    out = tmp_path / ("x" if "--format" in argv else "x.gguf")
    argv = argv if "--format" in argv else ["--format", "gguf", *argv]
    code, _, err = run_cli(["export", str(ckpt), *argv, "--out", str(out)], capsys)
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))


def test_gpt_oss_gguf_without_bias_writes_zeros(tmp_path, capsys):
    """A GPT-OSS model without q/k/v/o biases: llama.cpp's loader requires them, so they are written as zeros, and
    the import gives the model's logits."""
    ckpt = _redline_checkpoint(tmp_path, bias=False)
    out = tmp_path / "g" / "model.gguf"
    code, _, err = run_cli(["export", str(ckpt), "--format", "gguf", "--out", str(out)], capsys)
    assert code == 0, err
    got = file_tensors(out)
    assert all(got[f"blk.1.attn_{n}.bias"].abs().max() == 0 for n in ("q", "k", "v", "output"))
    model, _, _ = load_for_inference(ckpt)
    tokens = TOKENS % (VOCAB - 8)
    code, _, err = run_cli(["import", str(out), "--out", str(tmp_path / "back")], capsys)
    assert code == 0, err
    back, _, _ = load_for_inference(tmp_path / "back")
    with torch.no_grad():
        torch.testing.assert_close(back(tokens), model(tokens), rtol=1e-5, atol=1e-5)


def test_transformers_gguf_loader_cannot_read_gpt_oss(tmp_path, capsys):
    """transformers' GGUF loader (5.x) does not read the gpt-oss files llama.cpp's converter writes, so the tests
    above check the file against the converter's rules and redline's import instead. Where it breaks:
    - YaRN (every GPT-OSS has it): load_gguf_checkpoint reads each gpt-oss.rope.scaling.* value as field.parts[0],
      the key's length, not its value, and fails on it (a TypeError) before any weight;
    - without YaRN: the config takes no head width (no attention.key_length in GGUF_CONFIG_MAPPING["gpt_oss"]), so
      GptOssConfig's default 64 gives q/k/v/o other shapes; the tensor processor is looked up under the file's
      "gpt-oss" while TENSOR_PROCESSORS names it "gpt_oss", and GptOssTensorProcessor's patterns
      (ffn_*_projs, ffn_gate_up_projs) match none of llama.cpp's names (ffn_*_exps); so the sinks and every expert
      tensor map to nothing.
    When this test fails, transformers has changed: compare its logits with the model's instead."""
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, GptOssTensorProcessor, TensorProcessor,
                                                          get_gguf_hf_weights_map, load_gguf_checkpoint)

    hf, path = export(tmp_path / "yarn", capsys)
    with pytest.raises(TypeError):
        load_gguf_checkpoint(str(path))
    with pytest.raises(TypeError):
        transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    hf, path = export(tmp_path / "plain", capsys, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    config = load_gguf_checkpoint(str(path))["config"]
    assert config["model_type"] == "gpt_oss" and "head_dim" not in config
    with pytest.raises(RuntimeError, match="mismatched"):
        transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    assert TENSOR_PROCESSORS.get("gpt-oss", TensorProcessor) is TensorProcessor
    assert not GptOssTensorProcessor.GGUF_MOE_WEIGHTS_PATTERN.match("blk.0.ffn_gate_exps.weight")
    mapped = get_gguf_hf_weights_map(hf, TensorProcessor())
    names = {t.name for t in gguf.GGUFReader(str(path)).tensors}
    unmapped = {n for n in names if n not in mapped and n.startswith("blk.0.")}
    assert unmapped == {"blk.0.attn_sinks.weight", *(f"blk.0.ffn_{p}_exps.{k}" for p in ("gate", "up", "down")
                                                      for k in ("weight", "bias"))}


def test_gpt_oss_gguf_keys_read(tmp_path, capsys):
    """The import reads a gpt-oss file as llama.cpp does: the window on even layers whatever the file says, the
    clamp of 7; a file from llama.cpp's converter (no redline key) keeps GPT-OSS's unrounded YaRN band; a file
    without the window or expert keys llama.cpp requires, or with another scaling, is a one-line UserError."""
    from redline.interop.gguf_file import YARN_ROPE_KEY, _fields, _hf_config

    _, path = export(tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    fields, names = _fields(reader), {t.name for t in reader.tensors}
    config = _hf_config(fields, "gpt-oss", names)
    assert config["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert config["swiglu_limit"] == 7.0 and config["head_dim"] == 24 and config["intermediate_size"] == 32
    assert config["rope_parameters"]["truncate"] is False and config["attention_bias"]
    converters = {k: v for k, v in fields.items() if k != YARN_ROPE_KEY}
    rope = _hf_config(converters, "gpt-oss", names)["rope_parameters"]
    assert rope == {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32, "beta_fast": 32.0,
                    "beta_slow": 1.0, "truncate": False, "rope_theta": 500.0}
    for drop, named in (("gpt-oss.attention.sliding_window", "no attention.sliding_window"),
                        ("gpt-oss.expert_count", "expert_count")):
        with pytest.raises(UserError, match=named):
            _hf_config({k: v for k, v in fields.items() if k != drop}, "gpt-oss", names)
    with pytest.raises(UserError, match="GPT-OSS has YaRN or none"):
        _hf_config({**fields, "gpt-oss.rope.scaling.type": "linear"}, "gpt-oss", names)


def test_gpt_oss_fused_gate_up_read_as_split():
    """llama.cpp's converter with --fuse-gate-up-exps writes ffn_gate_up_exps ([gate; up] along the rows) and its
    bias: read into the same transformers tensors as the split ffn_gate_exps / ffn_up_exps."""
    from redline.interop.gguf_file import _gpt_oss_source

    g = torch.Generator().manual_seed(0)
    E, F, C = 2, 3, 4
    x = "model.layers.0.mlp.experts."
    split = {x + "gate_proj.weight": torch.randn(E, F, C, generator=g), x + "up_proj.weight": torch.randn(E, F, C,
                                                                                                         generator=g),
             x + "gate_proj.bias": torch.randn(E, F, generator=g), x + "up_proj.bias": torch.randn(E, F, generator=g),
             x + "down_proj.weight": torch.randn(E, C, F, generator=g), x + "down_proj.bias": torch.randn(E, C,
                                                                                                        generator=g)}
    fused = {x + "gate_up_proj.weight": torch.cat([split[x + "gate_proj.weight"], split[x + "up_proj.weight"]], 1),
             x + "gate_up_proj.bias": torch.cat([split[x + "gate_proj.bias"], split[x + "up_proj.bias"]], 1),
             **{k: v for k, v in split.items() if "down" in k}}
    read = {}
    for tensors in (split, fused):
        names, reader = _gpt_oss_source(set(tensors), tensors.__getitem__, 1)
        assert names == {x + n for n in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")}
        read[len(tensors)] = {n: reader(n) for n in names}
    for name, t in read[len(split)].items():
        assert torch.equal(t, read[len(fused)][name]), name
    gate_up = read[len(split)][x + "gate_up_proj"]  # (E, C, 2F): gate at even columns, as transformers holds it
    assert gate_up.shape == (E, C, 2 * F) and torch.equal(gate_up[..., ::2], split[x + "gate_proj.weight"].mT)


def test_o200k_pre_tokenizer_named_gpt_4o(tmp_path):
    """GPT-OSS's tokenizer splits text with OpenAI's o200k pattern, llama.cpp's "gpt-4o" pre-tokenizer (what its
    converter writes for GPT-OSS); redline writes that name and rebuilds the tokenizer from it without the
    tokenizer.json it also stores."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from redline.interop.gguf_vocab import _O200K_SPLIT, HF_JSON_KEY, gguf_vocab, tokenizer_from_gguf
    from redline.tokenizer import BPETokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_O200K_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|return|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = "Hello WORLD, it's GPT-OSS's tokenizer: 12345 tabs\tand\nnewlines / slashes//\n"
    tok.train_from_iterator([text] * 30, trainer)
    vocab = gguf_vocab(BPETokenizer(tok), 300)
    assert vocab["tokenizer.ggml.pre"] == "gpt-4o"
    rebuilt, _ = tokenizer_from_gguf({k: v for k, v in vocab.items() if k != HF_JSON_KEY})
    assert rebuilt.encode(text).ids == tok.encode(text).ids
