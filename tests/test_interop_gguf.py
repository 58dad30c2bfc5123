"""GGUF: redline's export read back by transformers' GGUF loader and by redline's import, a file written the way
llama.cpp's converter writes one (permuted q/k rows, Q8_0 tensors, a vocabulary without tokenizer.json; Gemma 3's
norms as 1 + weight) imported with logits equal to transformers' loading of the same file, tokenizers rebuilt from
GGUF metadata, bad files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from redline.errors import UserError
from redline.model import GPT
from redline.training.checkpoint import load_for_inference
from tests.interop_models import VOCAB, byte_level_tokenizer, hf_folder, hf_model, sentencepiece_style_tokenizer
from tests.test_interop import TOKENS, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


def export_gguf(kind, tmp_path, capsys, dtype="fp32"):
    hf = hf_folder(kind, tmp_path / "hf")
    return hf, imported_as_gguf(tmp_path, capsys, dtype)


def imported_as_gguf(tmp_path, capsys, dtype="fp32"):
    """`redline import` of the folder tmp_path/hf, then `redline export --format gguf` -> the GGUF's path."""
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    out = tmp_path / "gguf" / "model.gguf"
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--format", "gguf", "--dtype", dtype, "--out",
                            str(out)], capsys)
    assert code == 0, err
    return out



def import_gguf(path, out, capsys):
    """`redline import` of a GGUF file -> (model, tokenizer, train config) of the checkpoint it wrote."""
    code, _, err = run_cli(["import", str(path), "--out", str(out)], capsys)
    assert code == 0, err
    return load_for_inference(out)

# (cohere and cohere2, llama.cpp's command-r and cohere2, have no transformers GGUF loader either)
# transformers' GGUF loader reads qwen3 without its head width, gpt2 without n_positions (it maps the context length
# to n_ctx) and llama without its attention biases, and has no olmo, olmo2, gptneox, phi2, smollm3 or granite: those round
# trips are checked through redline's reader only, as are StableLM away from its loader's fixed quarter of each head
# rotated at base 10000 (stablelm-parallel) and Gemma 3 away from the defaults its loader assumes (gemma3-gguf: the
# window pattern, the windowed layers' base, query_pre_attn_scalar; redline's keys carry the gemma3 model's own)
@pytest.mark.parametrize("kind, transformers_reads", [("llama-gqa-tied", True), ("llama-untied", True),
                                                      ("qwen2", True), ("llama-untied-bias", False),
                                                      ("qwen3", False), ("olmo2", False), ("gpt2", False),
                                                      ("gpt2-1024", True), ("gemma3", False),
                                                      ("gemma3-gguf", True), ("gpt_neox", False),
                                                      ("gpt_neox-sequential", False), ("stablelm", True),
                                                      ("stablelm-parallel", False), ("phi", False),
                                                      ("smollm3-gguf", False), ("granite-gguf", False),
                                                      ("gemma2", False), ("gemma2-gguf", True),
                                                      ("phi3-longrope", False), ("starcoder2-gguf", True),
                                                      ("gemma", False), ("cohere", False), ("cohere2", False),
                                                      ("olmo", False), ("arcee", False), ("bloom", True),
                                                      ("internlm3", False), ("iquestcoder", True),
                                                      ("emu3_text_model", True)])
def test_export_gguf_read_back(kind, transformers_reads, tmp_path, capsys):
    hf, path = export_gguf(kind, tmp_path, capsys)
    with torch.no_grad():
        expected = hf(TOKENS).logits
    model, tokenizer, _ = import_gguf(path, tmp_path / "back", capsys)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
    assert tokenizer.chat_template and tokenizer.stop_ids == [1, 2]  # EOS, then the second as end-of-turn
    if transformers_reads:
        back = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
        with torch.no_grad():
            torch.testing.assert_close(back(TOKENS).logits, expected, rtol=1e-5, atol=1e-5)


def test_bloom_gguf_follows_llama_cpp(tmp_path, capsys):
    """bloom (the converter's BloomModel): its keys, the embeddings' norm as token_embd_norm, biases everywhere, the
    head tied (no output tensor: llama.cpp's loader falls back to token_embd), query_key_value's (heads, 3, width)
    rows regrouped to all q, all k, all v."""
    hf, path = export_gguf("bloom", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "bloom"
    keys = {k[len("bloom."):]: f.contents() for k, f in reader.fields.items() if k.startswith("bloom.")}
    C, H, V = 48, 6, keys["vocab_size"]
    assert {k: v for k, v in keys.items() if k != "attention.layer_norm_epsilon"} == {
        "context_length": 2048, "embedding_length": C, "block_count": 2, "feed_forward_length": 4 * C,
        "attention.head_count": H, "attention.head_count_kv": H, "vocab_size": V}
    assert keys["attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    shapes = {t.name: tuple(int(n) for n in t.shape.tolist()) for t in reader.tensors}
    block = {"attn_norm": (C,), "attn_qkv": (C, 3 * C), "attn_output": (C, C), "ffn_norm": (C,),
             "ffn_up": (C, 4 * C), "ffn_down": (4 * C, C)}
    expected = {"token_embd.weight": (C, V), "token_embd_norm.weight": (C,), "token_embd_norm.bias": (C,),
                "output_norm.weight": (C,), "output_norm.bias": (C,)}
    for i in range(2):
        for n, s in block.items():
            expected[f"blk.{i}.{n}.weight"] = s
            expected[f"blk.{i}.{n}.bias"] = s[-1:]
    assert shapes == expected
    qkv = next(t for t in reader.tensors if t.name == "blk.1.attn_qkv.bias").data
    theirs = hf.state_dict()["transformer.h.1.self_attention.query_key_value.bias"].detach()
    torch.testing.assert_close(torch.from_numpy(qkv.copy()), theirs.reshape(H, 3, -1).transpose(0, 1).reshape(-1))


def test_export_gguf_refuses_biases_on_arcee():
    from redline.interop.families import export_family
    from redline.interop.gguf_file import _arch
    from redline.model import ModelConfig

    cfg = ModelConfig(vocab_size=100, context_len=32, n_layer=1, n_embd=32, n_head=4, mlp="relu2", bias=True)
    family = export_family(cfg)
    assert family.name == "arcee"
    with pytest.raises(UserError, match="llama.cpp's arcee loads no biases"):
        _arch(family, cfg)
    assert _arch(family, ModelConfig(vocab_size=100, context_len=32, n_layer=1, n_embd=32, n_head=4,
                                     mlp="relu2")) == "arcee"


@pytest.mark.parametrize("dtype, tolerance", [("fp16", 2e-2), ("bf16", 5e-2)])
def test_export_gguf_half_precision(dtype, tolerance, tmp_path, capsys):
    hf, path = export_gguf("qwen2", tmp_path, capsys, dtype=dtype)
    reader = gguf.GGUFReader(str(path))
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["blk.0.attn_q.weight"] == dtype.upper().replace("FP", "F")
    assert kinds["blk.0.attn_norm.weight"] == "F32" and kinds["blk.0.attn_q.bias"] == "F32"
    back = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(TOKENS).logits, hf(TOKENS).logits, rtol=0, atol=tolerance)


@pytest.mark.parametrize("kind", ["qwen2", "gpt2-1024"])
def test_export_gguf_q8_0(kind, tmp_path, capsys):
    """--dtype q8_0: matrices in llama.cpp's 8-bit blocks (F16 where rows are not whole blocks), norms, biases and
    learned positions in F32; redline's import and transformers' GGUF loader dequantize the same bytes to the same
    logits, close to the model's own."""
    hf, path = export_gguf(kind, tmp_path, capsys, dtype="q8_0")
    reader = gguf.GGUFReader(str(path))
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["blk.0.attn_qkv.weight" if kind == "gpt2-1024" else "blk.0.attn_q.weight"] == "Q8_0"
    assert kinds["blk.1.ffn_down.weight"] == "Q8_0" and kinds["token_embd.weight"] == "Q8_0"
    assert kinds["blk.0.attn_norm.weight"] == "F32"
    assert kinds["position_embd.weight" if kind == "gpt2-1024" else "blk.0.attn_q.bias"] == "F32"
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0
    model, _, _ = import_gguf(path, tmp_path / "back", capsys)
    back = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    with torch.no_grad():
        ours, theirs, original = model(TOKENS), back(TOKENS).logits, hf(TOKENS).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours, original, rtol=0, atol=3e-2)
    assert not torch.equal(ours, original)  # quantized: not the fp32 weights
    from redline.interop.gguf_file import _tensor_type

    # rows of 40 are not whole 32-blocks: F16, as llama.cpp's converter falls back
    assert _tensor_type(gguf, "blk.0.attn_q.weight", torch.zeros(8, 40), "q8_0").name == "F16"
    assert _tensor_type(gguf, "position_embd.weight", torch.zeros(8, 64), "q8_0").name == "F32"


@pytest.mark.parametrize("kind, dtype", [("qwen2", "q4_0"), ("llama-untied", "q4_1"), ("qwen2", "q5_0"),
                                         ("llama-untied", "q5_1")])
def test_export_gguf_4_and_5_bit_blocks(kind, dtype, tmp_path, capsys):
    """--dtype q4_0 / q4_1 / q5_0 / q5_1: the block matrices in llama.cpp's 4- or 5-bit blocks, the head's matrix
    (output, or token_embd where the head is tied to it) in Q8_0, norms and biases in F32; redline's import and
    transformers' GGUF loader dequantize the same bytes to the same logits, near the model's own."""
    hf, path = export_gguf(kind, tmp_path, capsys, dtype=dtype)
    reader = gguf.GGUFReader(str(path))
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["blk.0.attn_q.weight"] == kinds["blk.1.ffn_down.weight"] == dtype.upper()
    if kind == "llama-untied":
        assert kinds["output.weight"] == "Q8_0" and kinds["token_embd.weight"] == dtype.upper()
    else:
        assert "output.weight" not in kinds and kinds["token_embd.weight"] == "Q8_0"
    assert kinds["blk.0.attn_norm.weight"] == "F32"
    assert reader.fields["general.file_type"].contents() == getattr(gguf.LlamaFileType, f"MOSTLY_{dtype.upper()}")
    model, _, _ = import_gguf(path, tmp_path / "back", capsys)
    back = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    with torch.no_grad():
        ours, theirs, original = model(TOKENS), back(TOKENS).logits, hf(TOKENS).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    err = (ours - original).abs().mean()  # quantized: near the fp32 weights' logits (q4 ~0.13 of their spread,
    assert 0 < err < 0.2 * original.std()  # q5 ~0.06; rows of another layout's weights would give ~1), not them
    assert path.stat().st_size < 0.6 * (tmp_path / "hf" / "model.safetensors").stat().st_size


def test_export_q8_0_is_gguf_only(tmp_path, capsys):
    hf_folder("qwen2", tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--dtype", "q8_0", "--out", str(tmp_path / "o")],
                           capsys)
    assert code == 2 and "add --format gguf" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (each head's halves interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _add_llama_cpp_vocab(w, path, vocab_size):
    """The test's byte-level BPE as llama.cpp's converter writes a gpt2-type vocabulary (arrays, no tokenizer.json),
    EOS 2 and a chat template."""
    from tests.interop_models import byte_level_tokenizer

    tok = json.loads((byte_level_tokenizer(path.parent / "tok") / "tokenizer.json").read_text())
    vocab = {i: t for t, i in tok["model"]["vocab"].items()} | {t["id"]: t["content"] for t in tok["added_tokens"]}
    tokens = [vocab.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [3 if i in {t["id"] for t in tok["added_tokens"]} else 1 if i in vocab else 5 for i in range(len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_eos_token_id(2)
    w.add_chat_template("{{ messages[0]['content'] }}")


def _write_out(w, path):
    """Write a GGUFWriter's header, keys and tensors, close it; -> path."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _llama_cpp_header(path, arch: str, cfg):
    """A GGUFWriter for `arch` with the shape keys llama.cpp's converter writes for every Llama-layout model."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    return w


def write_llama_cpp_style(hf, path, quant="Q8_0", unsupported: str | None = None, arch: str = "llama"):
    """A llama-arch GGUF of a transformers Llama as llama.cpp's converter writes one: q/k permuted, 2-D tensors
    quantized, a gpt2-type vocabulary without tokenizer.json. arch="exaone": its ExaoneModel, which writes the
    Llama layout's tensors unpermuted (llama.cpp rotates exaone's halves, NEOX)."""
    cfg = hf.config
    w = _llama_cpp_header(path, arch, cfg)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    _add_llama_cpp_vocab(w, path, cfg.vocab_size)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if name not in names:
            _, _, layer, rest = name.split(".", 3)
            names[name] = f"blk.{layer}.{parts[rest.rsplit('.', 1)[0]]}.weight"
        data = t.float().numpy()
        if "q_proj" in name and arch == "llama":
            data = _llama_cpp_permute(data, cfg.num_attention_heads)
        elif "k_proj" in name and arch == "llama":
            data = _llama_cpp_permute(data, cfg.num_key_value_heads)
        if data.ndim == 2 and names[name] == unsupported:
            qtype = gguf.GGMLQuantizationType.Q8_1  # 32 values in 40 bytes; the gguf package cannot dequantize it
            w.add_tensor(names[name], np.zeros((data.shape[0], data.shape[1] // 32 * 40), np.uint8), raw_dtype=qtype)
        elif data.ndim == 2:
            qtype = getattr(gguf.GGMLQuantizationType, quant)
            w.add_tensor(names[name], gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(names[name], data)
    scaling = cfg.rope_parameters if cfg.rope_parameters.get("rope_type") == "llama3" else None
    if scaling:  # llama.cpp's converter: no scaling keys, each frequency's divisor in a rope_freqs tensor
        w.add_tensor("rope_freqs.weight", llama_cpp_rope_freqs(cfg.rope_parameters["rope_theta"], cfg.head_dim,
                                                               scaling))
    return _write_out(w, path)


def llama_cpp_rope_freqs(theta: float, dim: int, scaling: dict) -> np.ndarray:
    """The rope_freqs tensor llama.cpp's converter writes for Llama 3 scaling, by its own rule in float64."""
    import math

    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi / (1.0 / theta ** (i / dim))
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_export_gguf_with_llama3_rope_scaling(tmp_path, capsys):
    """Llama 3.1 RoPE scaling in a GGUF: llama.cpp's rope_freqs tensor (its converter's values) and redline's own
    key, read back exactly."""
    hf, path = export_gguf("llama-untied-rope3", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    (freqs,) = [t for t in reader.tensors if t.name == "rope_freqs.weight"]
    scaling = hf.config.rope_parameters
    np.testing.assert_allclose(np.array(freqs.data), llama_cpp_rope_freqs(scaling["rope_theta"], hf.config.head_dim,
                                                                          scaling), rtol=1e-6)
    model, _, train_cfg = import_gguf(path, tmp_path / "back", capsys)
    assert (train_cfg.model.rope_scaling, train_cfg.model.rope_original_context) == ("llama3", 16)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_export_gguf_with_yarn_rope_scaling(tmp_path, capsys):
    """YaRN in a GGUF: the keys llama.cpp's converter writes (type, factor, original context, betas) and redline's
    own, read back to transformers' logits; a file with llama.cpp's keys alone reads as transformers' defaults."""
    from redline.interop.gguf_file import _yarn_scaling

    hf, path = export_gguf("qwen3-yarn", tmp_path, capsys)
    fields = {name: field.contents() for name, field in gguf.GGUFReader(str(path)).fields.items()}
    assert (fields["qwen3.rope.scaling.type"], fields["qwen3.rope.scaling.factor"],
            fields["qwen3.rope.scaling.original_context_length"], fields["qwen3.rope.scaling.yarn_beta_fast"],
            fields["qwen3.rope.scaling.yarn_beta_slow"]) == ("yarn", 2.0, 32, 32.0, 1.0)
    model, _, train_cfg = import_gguf(path, tmp_path / "back", capsys)
    assert (train_cfg.model.rope_scaling, train_cfg.model.rope_original_context) == ("yarn", 32)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    llama_cpp = {k: v for k, v in fields.items() if not k.startswith("redline.")}
    assert _yarn_scaling(llama_cpp, lambda name, default=None: llama_cpp.get(f"qwen3.{name}", default)) == {
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32, "beta_fast": 32.0,
        "beta_slow": 1.0}
    deepseek = {**llama_cpp, "qwen3.rope.scaling.yarn_log_multiplier": 0.0707}
    with pytest.raises(UserError, match="yarn_log_multiplier"):
        _yarn_scaling(deepseek, lambda name, default=None: deepseek.get(f"qwen3.{name}", default))


def test_import_llama_cpp_gguf_with_rope_freqs(tmp_path, capsys):
    """A Llama 3.x GGUF as llama.cpp writes it (rope_freqs alone, no scaling keys): the scaling is recovered from the
    divisors, and the model computes what transformers' Llama does with the Hugging Face config."""
    import transformers as t

    config = t.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                           rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, tie_word_embeddings=True,
                           rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                              "original_max_position_embeddings": 256})
    torch.manual_seed(0)
    hf = t.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = write_llama_cpp_style(hf, tmp_path / "model.gguf", "F32")
    model, _, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    assert (train_cfg.model.rope_scaling, train_cfg.model.rope_factor) == ("llama3", 8.0)
    positions = torch.randint(0, VOCAB, (1, 300), generator=torch.Generator().manual_seed(2))  # past 256
    with torch.no_grad():
        torch.testing.assert_close(model(positions), hf(positions).logits, rtol=1e-4, atol=1e-4)
    # divisors that no Llama 3 scaling gives: one line, nothing written
    reader_path = tmp_path / "bad.gguf"
    hf.config.rope_parameters = {**hf.config.rope_parameters, "factor": 8.0}
    bad = write_llama_cpp_style(hf, reader_path, "F32")
    raw = bytearray(bad.read_bytes())
    freqs = llama_cpp_rope_freqs(500000.0, 32, hf.config.rope_parameters)
    at = bytes(raw).rfind(freqs.tobytes())
    raw[at:at + freqs.nbytes] = np.linspace(1, 3, freqs.size, dtype=np.float32).tobytes()  # a ramp, no plateaus
    bad.write_bytes(bytes(raw))
    code, _, err = run_cli(["import", str(bad), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "rope_freqs" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_import_llama_cpp_exaone_gguf(tmp_path, capsys):
    """EXAONE 3.5 as llama.cpp's converter writes it (arch exaone: Llama's tensor names unpermuted, Llama 3 RoPE as
    rope_freqs): imported with the logits of transformers' model (whose GGUF loader has no exaone)."""
    hf = hf_model("exaone-gguf")
    path = write_llama_cpp_style(hf, tmp_path / "model.gguf", "F32", arch="exaone")
    model, _, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    assert (train_cfg.model.rope_scaling, train_cfg.model.rope_factor, train_cfg.model.tie_embeddings) == \
        ("llama3", 4.0, True)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quant", ["Q8_0", "F16"])
def test_import_llama_cpp_style_gguf_matches_transformers_loader(quant, tmp_path, capsys):
    hf = hf_model("llama-gqa-tied")
    path = write_llama_cpp_style(hf, tmp_path / "model.gguf", quant)
    model, tokenizer, _ = import_gguf(path, tmp_path / "ckpt", capsys)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).eval()
    with torch.no_grad():
        # the same dequantized weights in both: tight
        torch.testing.assert_close(model(TOKENS), reference(TOKENS).logits, rtol=1e-5, atol=1e-5)
        # and close to the unquantized model
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=0, atol=0.05)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in ("hello world, the model says hi", "Ünïcödé café 日本 1234\ttabs", "  two  spaces\n\nend"):
        assert tokenizer.encode(text) == hf_tok(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.stop_ids == [2] and tokenizer.chat_template == "{{ messages[0]['content'] }}"


def test_gguf_bad_inputs(tmp_path, capsys):
    hf = hf_model("llama-gqa-tied")
    path = write_llama_cpp_style(hf, tmp_path / "q81.gguf", unsupported="blk.1.ffn_up.weight")
    code, _, err = run_cli(["import", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "blk.1.ffn_up.weight is Q8_1" in err and "cannot dequantize" in err, err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-*"))

    w = gguf.GGUFWriter(str(tmp_path / "falcon.gguf"), "falcon")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    _write_out(w, None)
    code, _, err = run_cli(["import", str(tmp_path / "falcon.gguf"), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "'falcon' is not supported" in err and "llama, qwen2, qwen3, olmo2, gemma, gemma2, gemma3, gpt2" in err

    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all" * 10)
    code, _, err = run_cli(["import", str(tmp_path / "junk.gguf"), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "cannot read" in err and len(err.strip().splitlines()) == 1


def write_llama_cpp_gemma3(hf, path, quant="F32", extra: dict | None = None):
    """A gemma3 GGUF of a transformers Gemma3ForCausalLM as llama.cpp's converter writes one for Gemma3Model (the
    keys transformers' GGUF_CONFIG_MAPPING["gemma3"] reads, key_length / value_length as head_dim, the window, no
    pattern, local base or query_pre_attn_scalar), tensor names from the gguf package's own name map, every norm
    stored as 1 + weight, q/k unpermuted, 2-D tensors in `quant`; `extra`: more keys, {name: (value, GGUFValueType[,
    array item type])}."""
    cfg = hf.config
    w = _llama_cpp_header(path, "gemma3", cfg)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
    w.add_sliding_window(cfg.sliding_window)
    for name, spec in (extra or {}).items():
        w.add_key_value(name, *spec)
    _add_llama_cpp_vocab(w, path, cfg.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, cfg.num_hidden_layers)
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base, kind = name.rsplit(".", 1)
        gguf_name = f"{names.get_name(base)}.{kind}"
        data = t.float().numpy() + (1.0 if base.endswith("norm") else 0.0)
        if data.ndim == 2 and quant != "F32":
            qtype = getattr(gguf.GGMLQuantizationType, quant)
            w.add_tensor(gguf_name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name, data)
    return _write_out(w, path)


def test_export_gguf_gemma3_layout(tmp_path, capsys):
    """A Gemma 3 export in llama.cpp's gemma3 layout: its tensor names, norms stored as 1 + weight, q/k unpermuted,
    the window and head width in llama.cpp's keys; the values no reader but redline's takes from the file in
    redline's keys, and said on stderr where they differ from what the others assume."""
    from redline.interop.gguf_file import LOCAL_ROPE_KEY, QUERY_SCALAR_KEY, WINDOW_PATTERN_KEY

    hf, path = export_gguf("gemma3-gguf", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "gemma3"
    assert (fields["gemma3.attention.sliding_window"], fields["gemma3.attention.key_length"],
            fields["gemma3.rope.freq_base"]) == (5, 256, 5000.0)
    assert (fields[QUERY_SCALAR_KEY], fields[WINDOW_PATTERN_KEY], fields[LOCAL_ROPE_KEY]) == (256, 6, 10000.0)
    tensors = {t.name: np.array(t.data) for t in reader.tensors}
    assert "output.weight" not in tensors  # tied
    state = hf.state_dict()
    for gguf_name, hf_name in (("blk.0.attn_norm", "input_layernorm"), ("blk.0.post_attention_norm",
                                                                          "post_attention_layernorm"),
                               ("blk.0.ffn_norm", "pre_feedforward_layernorm"), ("blk.0.post_ffw_norm",
                                                                                  "post_feedforward_layernorm"),
                               ("blk.0.attn_q_norm", "self_attn.q_norm"), ("blk.0.attn_q", "self_attn.q_proj")):
        offset = 1.0 if gguf_name.endswith("norm") else 0.0
        np.testing.assert_allclose(tensors[f"{gguf_name}.weight"],
                                   state[f"model.layers.0.{hf_name}.weight"].numpy() + offset, rtol=1e-6)
    np.testing.assert_allclose(tensors["output_norm.weight"], state["model.norm.weight"].numpy() + 1, rtol=1e-6)

    # the gemma3 model of the Hugging Face tests (pattern 2, local base 300, query_pre_attn_scalar 20): exact
    # through redline's keys (test_export_gguf_read_back), and the export says what the other readers miss
    hf_folder("gemma3", tmp_path / "hf2")
    run_cli(["import", str(tmp_path / "hf2"), "--out", str(tmp_path / "ckpt2")], capsys)
    code, _, err = run_cli(["export", str(tmp_path / "ckpt2"), "--format", "gguf", "--out",
                            str(tmp_path / "g2.gguf")], capsys)
    assert code == 0 and "sliding_window_pattern 2" in err and "RoPE base 300" in err, err
    assert "query_pre_attn_scalar 20" in err and "llama.cpp" in err
    fields = {name: field.contents() for name, field in gguf.GGUFReader(str(tmp_path / "g2.gguf")).fields.items()}
    assert (fields["gemma3.rope.scaling.type"], fields["gemma3.rope.scaling.factor"]) == ("linear", 2.0)


@pytest.mark.parametrize("dtype, tolerance", [("fp16", 2e-2), ("bf16", 0.1), ("q8_0", 0.1)])
def test_export_gguf_gemma3_dtypes(dtype, tolerance, tmp_path, capsys):
    """Gemma 3 matrices in f16, bf16 or Q8_0 with its norms (1 + weight) in f32: redline's import and transformers'
    loader read the same values (up to the bf16 checkpoint an all-bf16 file imports as), close to the model's own
    logits."""
    hf, path = export_gguf("gemma3-gguf", tmp_path, capsys, dtype=dtype)
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert kinds["blk.0.ffn_up.weight"] == {"fp16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}[dtype]
    assert kinds["blk.0.post_ffw_norm.weight"] == kinds["blk.0.attn_k_norm.weight"] == "F32"
    model, _, _ = import_gguf(path, tmp_path / "back", capsys)
    back = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    same = 2e-3 if dtype == "bf16" else 1e-5  # an all-bf16 file imports as a bf16 checkpoint, its norms rounded too
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), back(TOKENS).logits, rtol=0, atol=same)
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=0, atol=tolerance)


@pytest.mark.parametrize("quant", ["F32", "Q8_0"])
def test_import_llama_cpp_style_gemma3_gguf(quant, tmp_path, capsys):
    """A gemma3 GGUF as llama.cpp's converter writes it (no redline keys): the implicit values at Gemma 3's defaults,
    logits equal to transformers' loading of the same file and to the model itself."""
    hf = hf_model("gemma3-gguf")
    path = write_llama_cpp_gemma3(hf, tmp_path / "model.gguf", quant)
    model, tokenizer, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    m = train_cfg.model
    assert (m.sliding_window, m.sliding_window_pattern, m.rope_theta, m.rope_local_theta) == (5, 6, 5000.0, 10000.0)
    assert m.norm_position == "sandwich" and m.attn_scale == 256 ** -0.5
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), reference(TOKENS).logits, rtol=1e-5, atol=1e-5)
        # the same dequantized weights as transformers: tight; Q8_0 against the model itself: close (the embedding,
        # scaled by sqrt(width), carries its rounding into every layer)
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=0, atol=1e-5 if quant == "F32" else 0.1)
    assert tokenizer.stop_ids == [2] and tokenizer.chat_template == "{{ messages[0]['content'] }}"


def write_llama_cpp_partial_rope(hf, path, arch: str):
    """A gptneox or phi2 GGUF of a transformers GPTNeoXForCausalLM or PhiForCausalLM as llama.cpp's converter writes
    one (GPTNeoXModel, Phi2Model): their keys (no RoPE base: llama.cpp takes 10000; no GELU key), GPT-NeoX's
    query_key_value rows regrouped from (heads, 3, head width) to all q, all k, all v, names from the gguf package's
    own map, F32."""
    cfg = hf.config
    heads, head_dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_rope_dimension_count(int(cfg.rope_parameters["partial_rotary_factor"] * head_dim))
    w.add_head_count(heads)
    if arch == "gptneox":
        w.add_parallel_residual(cfg.use_parallel_residual)
    else:
        w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    _add_llama_cpp_vocab(w, path, cfg.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPTNEOX if arch == "gptneox" else gguf.MODEL_ARCH.PHI2,
                                     cfg.num_hidden_layers)
    for name, t in hf.state_dict().items():
        base, kind = name.rsplit(".", 1)
        data = t.float()
        if base.endswith("query_key_value"):
            data = data.reshape(heads, 3, head_dim, *data.shape[1:]).transpose(0, 1).reshape(data.shape)
        w.add_tensor(f"{names.get_name(base)}.{kind}", data.numpy())
    return _write_out(w, path)


@pytest.mark.parametrize("kind, named", [("phi-tied", "llama.cpp's phi2 has neither"),
                                         ("gpt2-erf", "model.gelu_approximate=none"),
                                         ("opt", "OPT models are not written as GGUF"),
                                         ("vaultgemma", "VaultGemma models are not written as GGUF"),
                                         ("smollm3", "a step no GGUF key changes"),
                                         ("starcoder2", "llama.cpp's starcoder2 has none of these")])
def test_export_gguf_refuses_what_no_gguf_layout_holds(kind, named, tmp_path, capsys):
    hf_folder(kind, tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    out = tmp_path / "gguf" / "model.gguf"
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--format", "gguf", "--out", str(out)], capsys)
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.rglob(".tmp-*"))


def test_phi3_gguf_as_transformers_loader_reads_it_and_with_longrope(tmp_path, capsys):
    """A phi3 file (attn_qkv and ffn_up fused as Hugging Face's qkv_proj and gate_up_proj): transformers' GGUF loader
    reads redline's with the source model's logits; LongRoPE's factors travel as llama.cpp's rope_factors_long /
    rope_factors_short tensors with its attn_factor and original-context keys, and come back as the same model."""
    from redline.interop import phi3
    from redline.interop.gguf_file import write_gguf
    from redline.tokenizer import load_tokenizer

    hf_folder("phi3-gguf", tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, tokenizer, _ = load_for_inference(tmp_path / "ckpt")
    path = write_gguf(tmp_path / "g" / "model.gguf", model.state_dict(), model.cfg, tokenizer, phi3.FAMILY,
                      torch.float32)
    assert gguf.GGUFReader(str(path)).fields["general.architecture"].contents() == "phi3"
    hf = hf_model("phi3-gguf")
    back = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(TOKENS).logits, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    _, path = export_gguf("phi3-longrope", tmp_path / "lr", capsys)
    fields = {name: f.contents() for name, f in gguf.GGUFReader(str(path)).fields.items()
              if name.startswith("phi3.")}
    assert fields["phi3.rope.scaling.original_context_length"] == 32 and fields["phi3.context_length"] == 128
    assert fields["phi3.rope.dimension_count"] == 12 and fields["phi3.rope.scaling.attn_factor"] > 1.1
    tensors = {t.name: t.data.tolist() for t in gguf.GGUFReader(str(path)).tensors if t.name.startswith("rope_")}
    assert tensors["rope_factors_short.weight"] == pytest.approx([1.0, 1.4, 2.1, 2.9, 3.6, 4.8])
    assert tensors["rope_factors_long.weight"] == pytest.approx([1.2, 2.5, 4.0, 6.5, 9.0, 12.0])
    _, _, train_cfg = import_gguf(path, tmp_path / "lr" / "back", capsys)
    assert train_cfg.model.rope_long_pair_factors == pytest.approx((1.2, 2.5, 4.0, 6.5, 9.0, 12.0))


def test_import_llama_cpp_style_phi2_gguf(tmp_path, capsys):
    """A phi2 GGUF as llama.cpp's converter writes it (q, k, v apart, one norm a block, the head's bias, GQA, partial
    RoPE from rope.dimension_count): logits equal to the transformers model's."""
    hf = hf_model("phi")
    path = write_llama_cpp_partial_rope(hf, tmp_path / "model.gguf", "phi2")
    model, _, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    m = train_cfg.model
    assert (m.rope_dims, m.kv_heads, m.parallel_shared_norm, m.head_bias) == (8, 2, True, True)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_import_llama_cpp_style_gptneox_gguf(tmp_path, capsys):
    """A Pythia-style gptneox GGUF as llama.cpp's converter writes it: partial RoPE from rope.dimension_count, the
    parallel block, the erf GELU of the model it came from; logits equal to the transformers model's."""
    hf = hf_model("gpt_neox-pythia")
    path = write_llama_cpp_partial_rope(hf, tmp_path / "model.gguf", "gptneox")
    model, tokenizer, train_cfg = import_gguf(path, tmp_path / "ckpt", capsys)
    m = train_cfg.model
    assert (m.rope_dims, m.rope_theta, m.parallel_residual, m.gelu_approximate, m.norm) == (4, 10000.0, True, "none",
                                                                                            "layernorm")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    assert tokenizer.stop_ids == [2]


def test_gemma3_gguf_bad_inputs(tmp_path, capsys):
    """What a gemma3 GGUF does not say, or says and redline cannot express: one line, nothing written."""
    import transformers as t

    config = t.Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=5,
                                max_position_embeddings=64, rms_norm_eps=1e-5)
    narrow = t.Gemma3ForCausalLM(config).eval()
    U32, F32, ARRAY = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.ARRAY
    not_periodic = [True, False, True, True, True, False]  # windowed layers: full ones at 1 and 5
    cases = [  # (model, extra keys, what the error names)
        (narrow, {}, "query_pre_attn_scalar"),  # heads 16 wide: 256 would be a guess
        (hf_model("gemma3-gguf"), {"gemma3.final_logit_softcapping": (30.0, F32)}, "final_logit_softcapping"),
        (hf_model("gemma3-gguf"), {"gemma3.attention.sliding_window_pattern": (not_periodic, ARRAY,
                                                                                gguf.GGUFValueType.BOOL)},
         "layer_types"),
    ]
    for i, (hf, extra, named) in enumerate(cases):
        path = write_llama_cpp_gemma3(hf, tmp_path / f"bad{i}.gguf", extra=extra)
        code, _, err = run_cli(["import", str(path), "--out", str(tmp_path / "out")], capsys)
        assert code == 2 and named in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-*"))
    # with redline's key the narrow heads are read, at the scale the key gives
    path = write_llama_cpp_gemma3(narrow, tmp_path / "keyed.gguf", extra={
        "redline.attention.query_pre_attn_scalar": (256, U32)})
    model, _, _ = import_gguf(path, tmp_path / "keyed", capsys)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), narrow(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_export_gguf_refuses_what_gemma3_gguf_lacks(tmp_path):
    """Logit soft-capping (llama.cpp's gemma3 has none) and windowed layers on the full ones' scaled RoPE: one
    UserError naming the option, nothing written."""
    from dataclasses import replace

    from redline.interop.families import export_family
    from redline.interop.gemma3 import model_config
    from redline.interop.gguf_file import write_gguf
    from redline.tokenizer import load_tokenizer

    cfg = model_config(hf_model("gemma3").config.to_dict())
    tokenizer = load_tokenizer(byte_level_tokenizer(tmp_path / "tok"))
    torch.manual_seed(0)
    state = GPT(cfg).state_dict()
    for bad, named in ((replace(cfg, logit_softcap=30.0), "logit_softcap"),
                       (replace(cfg, rope_local_theta=0.0), "rope_local_theta")):
        with pytest.raises(UserError, match=named):
            write_gguf(tmp_path / "g.gguf", state, bad, tokenizer, export_family(bad), torch.float32)
        assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".tmp-*"))


def test_export_gguf_refuses_sliding_window_and_writes_nothing(tmp_path, capsys):
    hf_folder("mistral-window", tmp_path / "hf")
    run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--format", "gguf", "--out",
                            str(tmp_path / "m.gguf")], capsys)
    assert code == 2 and "sliding_window" in err
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".tmp-*"))


# ----------------------------------------------------------------------------------------------------
# tokenizers rebuilt from GGUF metadata (no tokenizer.json in the file)


TEXTS = ["hello world, the model says hi", "Ünïcödé café 日本 1234\ttabs 🚀", "  two  spaces\n\nend", "x"]


@pytest.mark.parametrize("build", ["byte_level", "sentencepiece"])
def test_tokenizer_rebuilt_from_gguf_arrays_encodes_alike(build, tmp_path):
    from redline.interop.gguf_vocab import HF_JSON_KEY, gguf_vocab, tokenizer_from_gguf
    from redline.tokenizer import BPETokenizer, load_tokenizer

    folder = byte_level_tokenizer(tmp_path) if build == "byte_level" else sentencepiece_style_tokenizer(tmp_path)
    original = load_tokenizer(folder)
    fields = gguf_vocab(original, original.vocab_size + 5)
    assert fields["tokenizer.ggml.model"] == ("gpt2" if build == "byte_level" else "llama")
    del fields[HF_JSON_KEY]  # as a file from llama.cpp's converter: the arrays alone
    hf, config = tokenizer_from_gguf(fields)
    rebuilt = BPETokenizer(hf, hf_config=config)
    for text in TEXTS:
        assert rebuilt.encode(text) == original.encode(text), text
        assert rebuilt.encode(text, add_special_tokens=True) == original.encode(text, add_special_tokens=True)
        assert rebuilt.decode(original.encode(text)) == original.decode(original.encode(text))
    assert rebuilt.bos_id == original.bos_id and rebuilt.eot_id == original.eot_id


def test_unknown_pre_tokenizer_is_one_line_error():
    from redline.interop.gguf_vocab import tokenizer_from_gguf

    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "some-new-model", "tokenizer.ggml.tokens": ["a"],
              "tokenizer.ggml.merges": []}
    with pytest.raises(UserError, match="'some-new-model'.*--tokenizer"):
        tokenizer_from_gguf(fields)


def test_gguf_export_of_redline_preset_architecture(tmp_path):
    """The modern presets' architecture (QK-norm, GQA) as a qwen3 GGUF, read back by redline."""
    from redline.interop.families import export_family
    from redline.interop.gguf_file import read_gguf, write_gguf
    from redline.model import ModelConfig
    from redline.tokenizer import load_tokenizer

    cfg = ModelConfig(vocab_size=VOCAB - 8, context_len=64, n_layer=2, n_embd=64, n_head=4, n_kv_head=2,
                      qk_norm=True)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    tokenizer = load_tokenizer(byte_level_tokenizer(tmp_path / "tok"))
    write_gguf(tmp_path / "m.gguf", model.state_dict(), cfg, tokenizer, export_family(cfg), torch.float32)
    back = read_gguf(tmp_path / "m.gguf")
    assert back.family == "qwen3" and back.cfg.qk_norm and back.cfg.kv_heads == 2
    again = GPT(back.cfg).eval()
    again.load_state_dict(back.state, strict=False)
    tokens = TOKENS.clamp(max=cfg.vocab_size - 1)
    with torch.no_grad():
        torch.testing.assert_close(again(tokens), model(tokens), rtol=1e-6, atol=1e-6)


def test_cohere_gguf_holds_transformers_rows_and_cohere2_s_layout(tmp_path, capsys):
    """llama.cpp's command-r and cohere2 rotate consecutive pairs and their converter permutes nothing: the file's
    q rows are transformers' own (redline permutes its own order back on export); cohere2's window and period."""
    hf, path = export_gguf("cohere2", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    rows = torch.from_numpy(np.array(q.data, dtype=np.float32)).reshape(hf.config.hidden_size, -1)
    torch.testing.assert_close(rows, hf.state_dict()["model.layers.0.self_attn.q_proj.weight"])
    fields = {name: f.contents() for name, f in reader.fields.items() if name.startswith("cohere2.")}
    assert fields["cohere2.attention.sliding_window"] == 5 and fields["cohere2.attention.sliding_window_pattern"] == 4
    assert fields["cohere2.logit_scale"] == pytest.approx(0.5)
    assert "output.weight" not in {t.name for t in reader.tensors}


def test_olmo_gguf_holds_llama_cpp_s_permuted_rows_and_no_norms(tmp_path, capsys):
    """llama.cpp's converter writes the original OLMo as its LlamaModel does, q and k rows permuted for consecutive-
    pair RoPE (OlmoModel.modify_tensors); its LayerNorms have no weights, so the file holds no norm tensors, and
    llama_model_olmo reads their eps from attention.layer_norm_epsilon."""
    from redline.interop.families import interleave_rope_rows

    hf, path = export_gguf("olmo", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    q = torch.from_numpy(np.array(tensors["blk.0.attn_q.weight"].data, dtype=np.float32)).reshape(64, -1)
    expected = hf.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    torch.testing.assert_close(q, interleave_rope_rows(expected, 4, inverse=False))
    assert not (q - expected).abs().max() < 1e-3  # the permutation moves rows
    assert not [name for name in tensors if "norm" in name]
    fields = {name: f.contents() for name, f in reader.fields.items()}
    assert fields["general.architecture"] == "olmo" and fields["olmo.attention.layer_norm_epsilon"] == pytest.approx(1e-5)


def assert_gguf_export_refused(cfg, named: str, tmp_path, capsys) -> None:
    """A checkpoint of `cfg` (random weights) refused by `redline export --format gguf` in one line naming `named`,
    nothing written."""
    from redline.config import TrainConfig, to_dict
    from redline.model import GPT
    from redline.tokenizer import load_tokenizer
    from redline.training import checkpoint as ckpt_io
    from tests.interop_models import byte_level_tokenizer

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ckpt_io.write_weights_checkpoint(ckpt, ckpt_io.model_weights(GPT(cfg)), to_dict(TrainConfig(model=cfg)),
                                     load_tokenizer(byte_level_tokenizer(tmp_path / "tok")), {})
    out = tmp_path / "x.gguf"
    code, _, err = run_cli(["export", str(ckpt), "--format", "gguf", "--out", str(out)], capsys)
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))

