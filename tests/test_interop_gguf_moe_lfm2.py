"""GGUF files of mixtures of experts, as llama.cpp's converter writes them: Mixtral as a llama file with expert
keys, Qwen2-MoE (qwen2moe: its shared expert and gate), Qwen3-MoE (qwen3moe), OLMoE (olmoe) and GraniteMoE
(granitemoe); experts stacked as ffn_gate_exps / ffn_up_exps (E, F, C) and ffn_down_exps (E, C, F), the router as
ffn_gate_inp. Read back by redline's import and, where transformers' GGUF loader reads the file as llama.cpp
does, by it; the layouts redline does not write refused in one line; LFM2's short convolutions as llama.cpp's
lfm2."""

from __future__ import annotations

import pytest
import torch

from tests.test_interop import TOKENS
from tests.test_interop_gguf import assert_gguf_export_refused, export_gguf, import_gguf

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


# transformers' GGUF loader (5.x) has qwen2moe and qwen3moe, but reads neither expert width from the file (its
# configs' defaults stand) nor Qwen3-MoE's rescaled top k (llama.cpp's qwen3moe rescales; transformers' default does
# not): its read-back is checked on a Qwen2-MoE of the default widths
@pytest.mark.parametrize("kind, arch, transformers_reads", [
    ("mixtral-gguf", "llama", False), ("qwen2_moe", "qwen2moe", False), ("qwen2_moe-gguf", "qwen2moe", True),
    ("qwen3_moe", "qwen3moe", False), ("olmoe", "olmoe", False), ("granitemoe", "granitemoe", False)])
def test_moe_gguf_read_back(kind, arch, transformers_reads, tmp_path, capsys):
    hf, path = export_gguf(kind, tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    E = getattr(hf.config, "num_local_experts", None) or hf.config.num_experts
    assert reader.fields["general.architecture"].contents() == arch
    assert reader.fields[f"{arch}.expert_count"].contents() == E
    assert reader.fields[f"{arch}.expert_used_count"].contents() == hf.config.num_experts_per_tok
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape.tolist())) for t in reader.tensors}
    assert shapes["blk.0.ffn_gate_exps.weight"][0] == E and shapes["blk.0.ffn_gate_inp.weight"] == (E, 64)
    with torch.no_grad():
        expected = hf(TOKENS).logits
    model, _, _ = import_gguf(path, tmp_path / "back", capsys)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
    if transformers_reads:
        back = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
        with torch.no_grad():
            torch.testing.assert_close(back(TOKENS).logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("extra, named", [
    (dict(moe_norm_topk=True, moe_shared_hidden=16), "qwen2moe"),  # llama.cpp's qwen2moe does not rescale
    (dict(moe_norm_topk=False, qk_norm=True), "qwen3moe"),  # llama.cpp's qwen3moe rescales
    (dict(moe_norm_topk=False), "shared expert"),  # exported as Qwen2-MoE, whose llama.cpp form needs one
    (dict(conv_layers=(0,), qk_norm=True, moe_gating="sigmoid", moe_scale=2.0), "llama.cpp's lfm2moe rescales"),
])
def test_moe_gguf_refusals(extra, named, tmp_path, capsys):
    from redline.model import ModelConfig
    from tests.interop_models import VOCAB

    cfg = ModelConfig(vocab_size=VOCAB - 8, context_len=64, n_layer=2, n_embd=64, n_head=4, n_kv_head=2,
                      mlp_hidden=32, **{"moe_experts": 4, "moe_top_k": 2, **extra})
    assert_gguf_export_refused(cfg, named, tmp_path, capsys)


def test_lfm2_gguf_read_back_by_redline_and_transformers(tmp_path, capsys):
    """LFM2 as llama.cpp's lfm2: a convolution layer has no kv heads (attention.head_count_kv, one entry a layer),
    its kernel is shortconv.conv (C, L), the final norm token_embd_norm."""
    hf, path = export_gguf("lfm2", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    assert list(reader.fields["lfm2.attention.head_count_kv"].contents()) == [0, 2, 0]
    assert reader.fields["lfm2.shortconv.l_cache"].contents() == 3
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape.tolist())) for t in reader.tensors}
    assert shapes["blk.0.shortconv.conv.weight"] == (64, 3) and "token_embd_norm.weight" in shapes
    with torch.no_grad():
        expected = hf(TOKENS).logits
    model, _, _ = import_gguf(path, tmp_path / "back", capsys)
    back = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(back(TOKENS).logits, expected, rtol=1e-5, atol=1e-5)


def test_lfm2_moe_gguf_read_back(tmp_path, capsys):
    """LFM2-MoE as llama.cpp's lfm2moe: the leading dense layer's width as feed_forward_length, the experts' as
    expert_feed_forward_length, sigmoid gating (2), the routing bias as blk.N.exp_probs_b.bias."""
    hf, path = export_gguf("lfm2_moe-gguf", tmp_path, capsys)
    reader = gguf.GGUFReader(str(path))
    fields = {name: f.contents() for name, f in reader.fields.items() if name.startswith("lfm2moe.")}
    assert (fields["lfm2moe.feed_forward_length"], fields["lfm2moe.expert_feed_forward_length"]) == (48, 32)
    assert fields["lfm2moe.leading_dense_block_count"] == 1 and fields["lfm2moe.expert_gating_func"] == 2
    names = {t.name for t in reader.tensors}
    assert "blk.1.exp_probs_b.bias" in names and "blk.0.exp_probs_b.bias" not in names
    with torch.no_grad():
        expected = hf(TOKENS).logits
    model, _, _ = import_gguf(path, tmp_path / "back", capsys)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
