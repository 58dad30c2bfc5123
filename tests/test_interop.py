"""Import from and export to Hugging Face folders, against transformers itself on tiny random models of each family
built in the test: logits equal in fp32, greedy tokens equal (redline's engine vs `generate(do_sample=False)`),
exported folders loaded by `from_pretrained` with no missing or unexpected keys, and each bad input one line."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from fractions import Fraction

import pytest
import torch

from redline import cli
from redline.errors import UserError
from redline.interop.families import export_family
from redline.model import GPT, ModelConfig
from redline.training.checkpoint import load_for_inference
from tests.interop_models import FAMILIES, VOCAB, causal_lm_class, hf_folder

transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def run_cli(argv, capsys):
    capsys.readouterr()  # drop what building the models printed (transformers' progress bars)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def imported(kind, tmp_path, capsys, dtype="fp32"):
    """(HF model, redline model, tokenizer, checkpoint dir) after `redline import`."""
    hf = hf_folder(kind, tmp_path / "hf")
    code, out, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", dtype],
                             capsys)
    assert code == 0, err
    model, tokenizer, _ = load_for_inference(tmp_path / "ckpt")
    return hf, model, tokenizer, tmp_path / "ckpt"



def written_and_loaded(tmp_path, model, tokenizer, family):
    """`model` written as `family`'s Hugging Face folder (fp32) and loaded by transformers, with no missing or
    unexpected keys, as the architecture the family names."""
    from redline.interop.hf import write_folder

    write_folder(tmp_path / "out", model.state_dict(), model.cfg, tokenizer, family, torch.float32)
    back, info = causal_lm_class(family.architecture).from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(back).__name__ == family.architecture
    return back.eval()

TOKENS = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_import_logits_and_greedy_tokens_equal_transformers(kind, tmp_path, capsys):
    from redline.inference import InferenceEngine, SamplingParams

    hf, model, tokenizer, _ = imported(kind, tmp_path, capsys)
    with torch.no_grad():
        expected, got = hf(TOKENS).logits, model(TOKENS)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert tokenizer.stop_ids == [1, 2]  # generation_config.json's EOS ids
    # greedy decoding: the engine on the CPU, prompts of different lengths in one batch, vs transformers one by one
    prompts = [TOKENS[0, :9].tolist(), TOKENS[1, :4].tolist()]
    results = InferenceEngine(model, compile=False).generate(prompts, 10, SamplingParams(temperature=0))
    hf.generation_config.eos_token_id = None  # every row runs all 10 steps, as stop_tokens=() does here
    for prompt, result in zip(prompts, results):
        reference = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert result.tokens == reference[0, len(prompt):].tolist()


# a family whose import maps it onto another architecture's layout exports as that one (ernie.py; Phi-3 with
# whole heads rotated and no LongRoPE is a Mistral, and so is Ministral 3 within its original context)
EXPORTED_AS = {"ernie4_5": "LlamaForCausalLM", "helium": "LlamaForCausalLM", "seed_oss": "Qwen2ForCausalLM",
               "granitemoehybrid": "GraniteForCausalLM",
               "phi3-window": "MistralForCausalLM", "ministral3": "MistralForCausalLM", "codegen": "GPTJForCausalLM",
               # Falcon's one norm for parallel sublayers is Phi's block (Phi takes GQA and zero biases); its
               # sequential block GPT-NeoX's (multi-head) or StarCoder2's (multi-query)
               "falcon": "PhiForCausalLM", "falcon-new-one-norm": "PhiForCausalLM",
               "falcon-sequential": "GPTNeoXForCausalLM", "falcon-sequential-mqa": "Starcoder2ForCausalLM",
               # GLM-4.7-Flash is DeepSeek-V3's attention and router: transformers' DeepSeek-V3 gives its logits
               "glm4_moe_lite": "DeepseekV3ForCausalLM",
               # Youtu is a dense DeepSeek-V3; DeepSeek-V3.2 and GLM-5 within index_topk keys DeepSeek-V3 (their
               # indexer not kept: deepseek_kin.py)
               "youtu": "DeepseekV3ForCausalLM", "deepseek_v32": "DeepseekV3ForCausalLM",
               "glm_moe_dsa": "DeepseekV3ForCausalLM",
               # CWM is Ministral's block with windowed and full layers in any order
               "cwm": "MinistralForCausalLM",
               # HY-V3 is dots.llm1's layout (its groupless routing, its choosing bias named beside the router)
               "hy_v3": "Dots1ForCausalLM",
               # HyperCLOVA X without its post norms is Granite's block, its logits scaled
               "hyperclovax-pre": "GraniteForCausalLM",
               # Apertus 1.5's text model is Apertus's
               "apertus1p5_text": "ApertusForCausalLM",
               # Cohere Compass with Cohere2's layout (NoPE full layers one in every N) or Cohere's (no window)
               "cohere_compass_text": "Cohere2ForCausalLM", "cohere_compass_text-full": "CohereForCausalLM",
               # Aria's text model is GraniteMoeShared's mixture without Granite's scalars
               "aria_text": "GraniteMoeSharedForCausalLM",
               # Gemma 4 Unified's text model is Gemma 4's without per-layer inputs
               "gemma4_unified_text": "Gemma4ForCausalLM",
               # Sarvam MoE with QK-norm and no biases is dots.llm1's layout (its router, whole heads rotated)
               "sarvam_moe": "Dots1ForCausalLM",
               # XGLM's sinusoid, held as a learned table, is BioGPT's block and positions (biogpt.py)
               "xglm": "BioGptForCausalLM",
               "emu3_text_model": "LlamaForCausalLM"}


# families imported but not exported, with the export's one-line refusal (CTRL's head bias beside scaled embeddings:
# ctrl.py; XGLM, whose positions redline holds as a learned table, exports as BioGPT)
IMPORT_ONLY = {"ctrl": "has no model.head_bias",
               # MiniMax-M3's Gemma norms with sigmoid-scored experts: no architecture redline writes has both
               "minimax_m3_vl_text": "model.norm_unit_offset",
               # HY-V4's value gates and sinks on latent attention (and its hyper-connections): no architecture
               # redline writes has them
               "hy_v4": "HY-V4's, which redline imports alone"}


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_export_round_trip_through_from_pretrained(kind, tmp_path, capsys):
    hf, model, _, ckpt = imported(kind, tmp_path, capsys)
    code, _, err = run_cli(["export", str(ckpt), "--out", str(tmp_path / "exported")], capsys)
    if kind in IMPORT_ONLY:
        assert code == 2 and IMPORT_ONLY[kind] in err and len(err.strip().splitlines()) == 1, err
        return
    assert code == 0, err
    arch = EXPORTED_AS.get(kind, FAMILIES[kind][1])
    back, info = causal_lm_class(arch).from_pretrained(tmp_path / "exported", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(back).__name__ == arch
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(TOKENS).logits, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    assert json.loads((tmp_path / "exported" / "generation_config.json").read_text())["eos_token_id"] == [1, 2]


@pytest.mark.parametrize("kind, name", [("granite_swa", "Granite SWA"), ("lfm3", "LFM3"),
                                        ("gpt_neo", "GPT-Neo"), ("gptj", "GPT-J"),
                                        ("codegen", "GPT-J"), ("falcon-new", "Falcon"), ("jamba", "Jamba"),
                                        ("gemma3n", "Gemma 3n"),
                                        ("minicpm3-longrope", "MiniCPM3"), ("flex_olmo", "FlexOlmo"),
                                        ("exaone_moe", "EXAONE-MoE"),
                                        ("granitemoe_swa", "GraniteMoeSWA"), ("mistral4", "Mistral 4"),
                                        ("axk1", "A.X-K1"), ("dots3_note_text", "dots.3 Note"), ("mimo_v2_flash", "MiMo-V2-Flash"), ("cwm", "Ministral"),
                                        ("solar_open", "Solar Open"), ("hyperclovax", "HyperCLOVA X"),
                                        ("persimmon", "Persimmon"), ("lara_mini", "Lara Mini"),
                                        ("zamba2-gqa", "Zamba2"), ("bitnet", "BitNet"),
                                        ("diffllama", "DiffLlama"), ("recurrent_gemma", "RecurrentGemma"),
                                        ("rwkv", "RWKV-4"), ("xlstm", "xLSTM"),
                                        ("doge", "Doge"), ("dory", "Dory"), ("phimoe", "PhiMoE"),
                                        ("dbrx", "DBRX"),
                                        ("afmoe", "AFMoE"), ("mellum", "Mellum"), ("flint", "Flint"),
                                        ("kolibri1", "Kolibri-1"), ("laguna", "Laguna"),
                                        ("longcat_flash", "LongCat-Flash"), ("axk2", "A.X-K2"),
                                        ("qwen4_exp_text", "Qwen4-Exp"), ("qwen4_exp_text-ple", "Qwen4-Exp"),
                                        ("jetmoe", "JetMoE"), ("zamba", "Zamba"),
                                        ("kimi_linear", "Kimi Linear"), ("bailing_hybrid", "Ling 3"),
                                        ("cohere_compass_text-bases", "Cohere Compass"),
                                        ("sarvam_moe-bias", "Sarvam MoE"), ("openai-gpt", "GPT-1"),
                                        ("biogpt", "BioGPT"), ("modernbert-decoder", "ModernBERT-Decoder"),
                                        ("minimax", "MiniMax"), ("deepseek_v4", "DeepSeek-V4"),
                                        ("zaya", "ZAYA")])
def test_not_written_as_gguf(kind, name, tmp_path, capsys):
    _, _, _, ckpt = imported(kind, tmp_path, capsys)
    out = tmp_path / "x.gguf"
    code, _, err = run_cli(["export", str(ckpt), "--format", "gguf", "--out", str(out)], capsys)
    assert code == 2 and f"{name} models are not written as GGUF" in err and not out.exists(), err


def test_import_bf16_stores_bf16_and_matches_bf16_reference(tmp_path, capsys):
    hf, model, _, ckpt = imported("llama-gqa-tied", tmp_path, capsys, dtype="bf16")
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        assert all(f.get_slice(n).get_dtype() == "BF16" for n in f.keys())
    with torch.no_grad():  # the weights are bf16-rounded: round transformers' parameters alike (not its buffers)
        for p in hf.parameters():
            p.copy_(p.bfloat16().float())
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------------
# exporting redline's own architectures


REDLINE_EXPORTS = {
    # a prediction head and a norm-free first layer: ModernBERT-Decoder's alone (untied, a windowed layer)
    "ModernBertDecoderForCausalLM": dict(norm="layernorm", mlp="geglu", gelu_approximate="none", embed_norm=True,
                                         first_norm_free=True, head_transform=True, head_bias=True,
                                         sliding_window=4, window_layers=(1,), tie_embeddings=False),
    # Kimi Delta Attention beside NoPE latent attention, the head tied (Kimi Linear writes it as its own)
    "KimiLinearForCausalLM": dict(pos_emb="none", n_kv_head=4, kv_lora_rank=16, head_size=12, rope_dims=4,
                                  v_head_dim=8, delta_layers=(0,), delta_heads=4, delta_key_heads=4, delta_key_dim=8,
                                  delta_value_dim=8, delta_decay="channel", delta_gate_rank=8,
                                  tie_embeddings=True),
    "KimiLinearForCausalLM-attention": dict(pos_emb="none", n_kv_head=4, kv_lora_rank=16, head_size=12, rope_dims=4),
    # KDA with full-rank gates and a bounded decay beside RoPE latent attention with gated heads (Ling 3's)
    "BailingHybridForCausalLM": dict(n_kv_head=4, kv_lora_rank=16, head_size=12, rope_dims=4, attn_gate="head",
                                     delta_layers=(0,), delta_heads=4, delta_key_heads=4, delta_key_dim=8,
                                     delta_value_dim=8, delta_decay="bounded", delta_decay_floor=-5.0),
    # lightning attention beside RoPE attention, Mixtral's experts, residuals from the normed inputs (MiniMax's)
    "MiniMaxForCausalLM": dict(n_kv_head=2, delta_layers=(0,), delta_rule="lightning", delta_heads=4,
                               delta_key_heads=4, delta_key_dim=16, delta_value_dim=16, delta_norm_eps=1e-6,
                               moe_experts=4, moe_top_k=2, normed_residual=(1.0, 0.9, 1.1, 1.2, 0.8, 1.0)),
    # LongCat-Flash: the shortcut MoE over two blocks, identity experts, latent attention through a query rank
    "LongcatFlashForCausalLM": dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=16,
                                    fused_qkv=False, moe_experts=4, moe_identity_experts=2, moe_top_k=3, mlp_hidden=32,
                                    moe_expert_bias=True, moe_norm_topk=False, moe_scale=2.0, moe_shortcut=True,
                                    moe_dense_hidden=48),
    # A.X-K2: gated norms and the latent query gate on DeepSeek-V3's layers (an indexer of zeros written)
    "AXK2ForCausalLM": dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=16,
                            fused_qkv=False, moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_gating="sigmoid",
                            moe_expert_bias=True, moe_norm_eps=1e-20, moe_shared_hidden=32, moe_shared_gate=False,
                            moe_dense_layers=1, moe_dense_hidden=64, q_latent_gate=True, norm_gate_rank=8),
    "BitNetForCausalLM": dict(sub_norms=True, mlp="relu2_glu", n_kv_head=2),  # sub-norms, the gated ReLU² MLP
    "DiffLlamaForCausalLM": dict(diff_attention=True, n_kv_head=2, n_layer=3),  # differential attention
    "Qwen3ForCausalLM": dict(qk_norm=True, n_kv_head=2),  # the modern presets
    "GPT2LMHeadModel": dict(pos_emb="learned", norm="layernorm", mlp="gelu", bias=True, tie_embeddings=True),
    "GPT2LMHeadModel-nobias": dict(pos_emb="learned", norm="layernorm", mlp="gelu", bias=False),
    "OPTForCausalLM": dict(pos_emb="learned", norm="layernorm", mlp="relu", bias=True, tie_embeddings=True),
    # BioGPT: learned positions beside embeddings times sqrt(n_embd), exact GELU, biases
    "BioGptForCausalLM": dict(pos_emb="learned", norm="layernorm", mlp="gelu", gelu_approximate="none", bias=True,
                              embed_scale=True),
    # GPT-1: post-norm blocks (no final norm), a ReLU MLP, learned positions, untied
    "OpenAIGPTLMHeadModel": dict(pos_emb="learned", norm="layernorm", mlp="relu", bias=True, norm_position="post"),
    "LlamaForCausalLM": dict(n_kv_head=2, fused_qkv=False, fused_mlp=False, head_size=8),
    "MistralForCausalLM": dict(sliding_window=5),
    "Qwen2ForCausalLM": dict(qkv_bias=True, tie_embeddings=True),
    "Qwen2ForCausalLM-window": dict(qkv_bias=True, sliding_window=5),
    "Qwen3ForCausalLM-window": dict(qk_norm=True, n_kv_head=2, sliding_window=5),
    "Olmo2ForCausalLM": dict(norm_position="output", qk_norm=True, qk_norm_scope="all", n_kv_head=2),
    "Olmo2ForCausalLM-qkvbias": dict(norm_position="output", qk_norm=True, qk_norm_scope="all", qkv_bias=True),
    # OLMo 3: a windowed layer (its own RoPE base) before each full one
    "Olmo3ForCausalLM": dict(norm_position="output", qk_norm=True, qk_norm_scope="all", n_kv_head=2,
                             sliding_window=5, sliding_window_pattern=2, rope_local_theta=1000.0),
    # Gemma 3 with a windowed layer before a full one, the windowed layer's own RoPE base, query_pre_attn_scalar 16
    # and final logit soft-capping
    # GPT-NeoX: Pythia's block (parallel sublayers, a quarter of each head rotated, exact GELU), and a sequential one
    # without biases, its q/k/v apart, tied, with Llama 3 RoPE scaling
    "GPTNeoXForCausalLM": dict(norm="layernorm", mlp="gelu", bias=True, parallel_residual=True, rope_dims=4,
                               gelu_approximate="none", rope_theta=500.0),
    "GPTNeoXForCausalLM-plain": dict(norm="layernorm", mlp="gelu", fused_qkv=False, tie_embeddings=True,
                                     rope_scaling="llama3", rope_factor=8.0, rope_original_context=16),
    # StableLM: LayerNorm with biases beside Linear layers without (but q/k/v), SwiGLU, a quarter of each head rotated
    "StableLmForCausalLM": dict(norm="layernorm", norm_bias=True, qkv_bias=True, rope_dims=4, n_kv_head=2),
    # Phi: one norm a block for its parallel sublayers, a head bias, GQA, a third of each head rotated
    "PhiForCausalLM": dict(norm="layernorm", mlp="gelu", bias=True, parallel_residual=True,
                           parallel_shared_norm=True, head_bias=True, rope_dims=6, n_kv_head=2),
    # Mistral 4: latent attention with softmax-scored experts chosen within groups and rescaled (its router alone),
    # or rescaled alone; DeepSeek-V2 where they are taken as they are (its router)
    "Mistral4ForCausalLM": dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=16,
                                fused_qkv=False, moe_experts=8, moe_top_k=2, mlp_hidden=32, moe_groups=4,
                                moe_topk_groups=2, moe_shared_hidden=32, moe_shared_gate=False, moe_dense_layers=1,
                                moe_dense_hidden=48, moe_scale=1.5),
    "Mistral4ForCausalLM-ungrouped": dict(kv_lora_rank=16, head_size=24, rope_dims=8, fused_qkv=False, moe_experts=4,
                                          moe_top_k=2, mlp_hidden=32, moe_shared_hidden=64, moe_shared_gate=False),
    "DeepseekV2ForCausalLM": dict(kv_lora_rank=16, head_size=24, rope_dims=8, fused_qkv=False, moe_experts=4,
                                  moe_top_k=2, mlp_hidden=32, moe_norm_topk=False, moe_shared_hidden=64,
                                  moe_shared_gate=False),
    # A.X-K1: DeepSeek-V3's attention and router with a norm on each mixture's output (its alone)
    # latent attention with a norm on the RoPE key part, gated heads and windowed layers (dots.3 Note's)
    "Dots3NoteForCausalLM": dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=16,
                                 fused_qkv=False, attn_gate="head", latent_key_norm=True, latent_norm_eps=1e-5,
                                 sliding_window=5, window_layers=(1,), rope_local_theta=300.0, moe_experts=8,
                                 moe_top_k=2, mlp_hidden=32, moe_gating="sigmoid", moe_expert_bias=True, moe_groups=4,
                                 moe_topk_groups=2, moe_norm_eps=1e-20, moe_shared_hidden=64, moe_shared_gate=False,
                                 moe_dense_layers=1, moe_dense_hidden=48, moe_scale=1.5),
    "AXK1ForCausalLM": dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=16,
                            fused_qkv=False, moe_experts=8, moe_top_k=2, mlp_hidden=32, moe_gating="sigmoid",
                            moe_expert_bias=True, moe_groups=4, moe_topk_groups=2, moe_norm_eps=1e-20,
                            moe_shared_hidden=32, moe_shared_gate=False, moe_dense_layers=1, moe_dense_hidden=48,
                            moe_scale=2.5, moe_post_norm=True),
    # MiMo-V2-Flash: sinks on the windowed layers alone (its alone), twice the full layer's KV heads there, a RoPE
    # base per layer kind on a third of each head, DeepSeek-V3's router without a shared expert
    "MiMoV2FlashForCausalLM": dict(n_layer=3, n_kv_head=4, global_kv_head=2, head_size=24, rope_dims=8,
                                   fused_qkv=False, sliding_window=5, window_layers=(1, 2), rope_local_theta=100.0,
                                   attn_sinks=True, attn_sinks_windowed=True, moe_experts=8, moe_top_k=2,
                                   mlp_hidden=32, moe_gating="sigmoid", moe_expert_bias=True, moe_groups=4,
                                   moe_topk_groups=2, moe_norm_eps=1e-20, moe_dense_layers=1, moe_dense_hidden=48),
    # EXAONE 4.0's hybrid layers: output norms, QK-norm per head, windowed layers rotating, every second full and NoPE
    "Exaone4ForCausalLM": dict(norm_position="output", qk_norm=True, n_kv_head=2, sliding_window=5,
                               sliding_window_pattern=2, nope_interval=2),
    # StarCoder2: RoPE, LayerNorm, GELU, biases, GQA, a window
    "Starcoder2ForCausalLM": dict(norm="layernorm", mlp="gelu", bias=True, n_kv_head=2, sliding_window=5),
    # Gemma: pre-norm blocks with its norms by 1 + weight, GeGLU, scaled embeddings, MQA, tied
    "GemmaForCausalLM": dict(norm_unit_offset=True, embed_scale=True, mlp="geglu", n_kv_head=1, tie_embeddings=True),
    # Hunyuan: QK-norm after RoPE, GQA, untied
    "HunYuanDenseV1ForCausalLM": dict(qk_norm=True, qk_norm_after_rope=True, n_kv_head=2),
    # Phi-3: Llama's block with RoPE on part of each head (Phi-4-mini's three quarters), GQA
    "Phi3ForCausalLM": dict(rope_dims=12, n_kv_head=2),
    # GLM: Phi-3's block with biases on q/k/v (half of each head rotated, written in GLM's interleaved pairs); GLM-4:
    # the same with plain RMSNorms on the sublayers' inputs and outputs; GLM-4-MoE: top 2 of 8 sigmoid-scored experts
    # chosen with a bias within the best 2 of 4 groups, rescaled (1e-20, as GLM's router), times 2, two ungated
    # shared experts, a dense first layer, QK-norm per head
    "GlmForCausalLM": dict(rope_dims=8, qkv_bias=True, n_kv_head=2),
    "Glm4ForCausalLM": dict(norm_position="sandwich", rope_dims=8, qkv_bias=True, n_kv_head=2, tie_embeddings=True),
    "Glm4MoeForCausalLM": dict(n_layer=3, rope_dims=8, qkv_bias=True, qk_norm=True, n_kv_head=2, moe_experts=8,
                               moe_top_k=2, mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True,
                               moe_groups=4, moe_topk_groups=2, moe_norm_eps=1e-20, moe_scale=2.0,
                               moe_shared_hidden=32, moe_shared_gate=False, moe_dense_layers=1,
                               moe_dense_hidden=80),
    # Granite: its four scalars, GQA, untied
    "GraniteForCausalLM": dict(embed_multiplier=2.0, residual_multiplier=0.3, logit_divisor=3.0, attn_scale=0.2,
                               n_kv_head=2),
    # SmolLM3: RoPE on layer 0 but not 1, untied, with biases on every Linear layer
    "SmolLM3ForCausalLM": dict(nope_interval=2, n_kv_head=2, bias=True),
    # Gemma 2: Gemma 3's block without QK-norm, its attention scores and logits soft-capped, one RoPE base
    "Gemma2ForCausalLM": dict(norm_position="sandwich", norm_unit_offset=True, mlp="geglu", embed_scale=True,
                              n_kv_head=2, sliding_window=5, sliding_window_pattern=2, attn_scale=0.25,
                              attn_softcap=2.0, logit_softcap=30.0, tie_embeddings=True),
    "Gemma3ForCausalLM": dict(norm_position="sandwich", norm_unit_offset=True, mlp="geglu", qk_norm=True,
                              embed_scale=True, n_kv_head=2, sliding_window=5, sliding_window_pattern=2,
                              rope_local_theta=1000.0, attn_scale=0.25, tie_embeddings=True, logit_softcap=30.0),
    # VaultGemma: Gemma 2's without the norms on the sublayers' outputs; every layer windowed, untied
    "VaultGemmaForCausalLM": dict(norm_unit_offset=True, mlp="geglu", embed_scale=True, n_kv_head=2, sliding_window=5,
                                  attn_scale=0.25, attn_softcap=2.0, logit_softcap=3.0),
    # mixtures of experts: Mixtral (rescaled top k, a window), Qwen2-MoE (a shared expert, weights not rescaled),
    # Qwen3-MoE (QK-norm per head), OLMoE (QK-norm over whole projections)
    "MixtralForCausalLM": dict(moe_experts=4, moe_top_k=2, mlp_hidden=48, n_kv_head=2, sliding_window=5),
    "Qwen2MoeForCausalLM": dict(moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_shared_hidden=48,
                                moe_norm_topk=False, n_kv_head=2),
    "Qwen3MoeForCausalLM": dict(moe_experts=6, moe_top_k=3, mlp_hidden=32, qk_norm=True, n_kv_head=2),
    "OlmoeForCausalLM": dict(moe_experts=4, moe_top_k=1, mlp_hidden=32, qk_norm=True, qk_norm_scope="all",
                             moe_norm_topk=False),
    # FlexOlmo: OLMoE's experts in OLMo 2's block (norms on the sublayers' outputs)
    "FlexOlmoForCausalLM": dict(moe_experts=4, moe_top_k=2, mlp_hidden=32, qk_norm=True, qk_norm_scope="all",
                                norm_position="output", n_kv_head=2),
    # GraniteMoeSWA: sinks on a mixture of plain SwiGLU experts (GPT-OSS's are clamped), a windowed layer, a RoPE
    # base per layer, an ungated shared MLP
    "GraniteMoeSWAForCausalLM": dict(attn_sinks=True, sliding_window=4, window_layers=(1,),
                                     rope_layer_theta=(0.0, 50.0), n_kv_head=2, moe_experts=4, moe_top_k=2,
                                     mlp_hidden=32, moe_shared_hidden=48, moe_shared_gate=False, embed_multiplier=2.0),
    # EXAONE-MoE: dots.llm1's experts (a dense first layer, sigmoid scores with a bias, a shared expert) with EXAONE
    # 4.0's attention (layer 1 full without RoPE, layer 0 windowed)
    "ExaoneMoeForCausalLM": dict(qk_norm=True, n_kv_head=2, sliding_window=4, sliding_window_pattern=2,
                                 nope_interval=2, moe_experts=4, moe_top_k=2, mlp_hidden=16, moe_dense_layers=1,
                                 moe_dense_hidden=48, moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20,
                                 moe_shared_hidden=32, moe_shared_gate=False, moe_scale=2.0),
    # AFMoE: gated heads, sandwich norms, layer 0 windowed and rotating, layer 1 full without RoPE, sigmoid-scored
    # experts chosen with a bias beside a shared one, µP embedding scale
    "AfmoeForCausalLM": dict(norm_position="sandwich", attn_gate="element", qk_norm=True, n_kv_head=2,
                             sliding_window=4, sliding_window_pattern=2, nope_interval=2, moe_experts=4, moe_top_k=2,
                             mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20,
                             moe_shared_hidden=32, moe_shared_gate=False, moe_scale=2.0, embed_multiplier=8.0),
    # Mellum: Qwen3-MoE's block with layer 0 windowed (its own RoPE base), layer 1 full, the first MLP dense; and
    # with experts on layer 1 alone after a dense one, every layer full (moe_layers)
    "MellumForCausalLM": dict(qk_norm=True, n_kv_head=2, sliding_window=4, window_layers=(0,), rope_local_theta=50.0,
                              moe_experts=4, moe_top_k=2, mlp_hidden=16, moe_dense_layers=1, moe_dense_hidden=48),
    "MellumForCausalLM-layers": dict(qk_norm=True, n_kv_head=2, moe_experts=4, moe_top_k=2, mlp_hidden=16,
                                     moe_layers=(1,), moe_dense_hidden=48, moe_norm_topk=False, rope_theta=500.0),
    # Flint: sinks on Qwen3-MoE's attention, layer 0 windowed and rotating, layer 1 full without RoPE, top 2 of 4
    # sigmoid-scored experts rescaled without an epsilon beside an ungated shared expert
    "FlintForCausalLM": dict(qk_norm=True, attn_sinks=True, n_kv_head=2, sliding_window=4, sliding_window_pattern=2,
                             nope_interval=2, moe_experts=4, moe_top_k=2, mlp_hidden=16, moe_gating="sigmoid",
                             moe_norm_eps=0.0, moe_shared_hidden=24, moe_shared_gate=False),
    # Kolibri-1: sandwich norms, QK-norm, layer 0 windowed and rotating, layer 1 full without RoPE, experts chosen by
    # logits plus a bias beside an ungated shared one; and every layer rotating without a window
    "Kolibri1ForCausalLM": dict(norm_position="sandwich", qk_norm=True, n_kv_head=2, sliding_window=4,
                                sliding_window_pattern=2, nope_interval=2, moe_experts=4, moe_top_k=2, mlp_hidden=16,
                                moe_gating="sigmoid", moe_expert_bias=True, moe_bias_on_logits=True, moe_norm_eps=0.0,
                                moe_shared_hidden=24, moe_shared_gate=False),
    "Kolibri1ForCausalLM-rope": dict(norm_position="sandwich", qk_norm=True, moe_experts=4, moe_top_k=2, mlp_hidden=16,
                                     moe_gating="sigmoid", moe_expert_bias=True, moe_bias_on_logits=True,
                                     moe_norm_topk=False, moe_shared_hidden=16, moe_shared_gate=False,
                                     tie_embeddings=True),
    # Laguna: a softplus gate a head, layer 0 windowed with its own base on whole heads, layer 1 full on half of each
    # head, a dense first MLP, sigmoid experts chosen with a bias, times 2, beside a shared one; and a softplus gate
    # an element, every layer full and experts
    "LagunaForCausalLM": dict(qk_norm=True, n_kv_head=2, attn_gate="head", attn_gate_fn="softplus", sliding_window=4,
                              window_layers=(0,), rope_dims=8, rope_local_theta=50.0, rope_local_dims=16,
                              moe_experts=4, moe_top_k=2, mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True,
                              moe_norm_eps=0.0, moe_scale=2.0, moe_shared_hidden=24, moe_shared_gate=False,
                              moe_dense_layers=1, moe_dense_hidden=48),
    "LagunaForCausalLM-element": dict(qk_norm=True, attn_gate="element", attn_gate_fn="softplus", moe_experts=4,
                                      moe_top_k=2, mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True,
                                      moe_norm_eps=0.0, moe_shared_hidden=24, moe_shared_gate=False,
                                      tie_embeddings=True),
    # LFM2: short convolutions on layer 0, attention with QK-norm on 1
    "Lfm2ForCausalLM": dict(conv_layers=(0,), qk_norm=True, n_kv_head=2, tie_embeddings=True),
    # LFM2-MoE: layer 0 dense (80 wide), layer 1 top 2 of 4 sigmoid-scored experts chosen with a bias, times 2
    # Cohere: parallel sublayers under one LayerNorm without a bias, SwiGLU, a logit scale; Cohere2 with its window
    "CohereForCausalLM": dict(norm="layernorm", norm_bias=False, parallel_residual=True, parallel_shared_norm=True,
                              logit_divisor=4.0, n_kv_head=2, tie_embeddings=True),
    "Cohere2ForCausalLM": dict(norm="layernorm", norm_bias=False, parallel_residual=True, parallel_shared_norm=True,
                               logit_divisor=2.0, n_kv_head=2, tie_embeddings=True, sliding_window=5,
                               sliding_window_pattern=2, nope_interval=2),
    # Cohere Compass: Cohere's block with windowed layers that rotate by a base of their own beside full ones; with
    # windowed layers alone, every one rotating
    "CohereCompassForCausalLM": dict(norm="layernorm", norm_bias=False, parallel_residual=True,
                                     parallel_shared_norm=True, logit_divisor=2.0, n_kv_head=2, sliding_window=5,
                                     sliding_window_pattern=2, rope_local_theta=50.0),
    "CohereCompassForCausalLM-windowed": dict(norm="layernorm", norm_bias=False, parallel_residual=True,
                                              parallel_shared_norm=True, n_kv_head=2, sliding_window=5),
    "Lfm2MoeForCausalLM": dict(conv_layers=(0,), qk_norm=True, n_kv_head=2, moe_experts=4, moe_top_k=2,
                               mlp_hidden=32, moe_dense_layers=1, moe_dense_hidden=80, moe_gating="sigmoid",
                               moe_expert_bias=True, moe_scale=2.0),
    "GraniteMoeForCausalLM": dict(moe_experts=4, moe_top_k=2, mlp_hidden=32, embed_multiplier=2.0,
                                  residual_multiplier=0.3, logit_divisor=3.0, attn_scale=0.2, n_kv_head=2),
    # GPT-OSS: sinks, biased clamped experts (a clamp that bites), windowed and full layers; and one without any
    # bias (written as zeros) and with q, k, v apart
    "GptOssForCausalLM": dict(attn_sinks=True, moe_experts=4, moe_top_k=2, mlp="swiglu_clamped", swiglu_limit=0.5,
                              mlp_hidden=32, moe_bias=True, bias=True, n_kv_head=2, sliding_window=5,
                              sliding_window_pattern=2),
    # Granite SWA: a dense model with sinks, its windowed layers and layers without RoPE given by patterns (written
    # as layer lists), and a RoPE base per layer
    "GraniteSWAForCausalLM": dict(attn_sinks=True, n_kv_head=2, sliding_window=5, sliding_window_pattern=2,
                                  nope_interval=2),
    "GraniteSWAForCausalLM-bases": dict(attn_sinks=True, bias=True, sliding_window=3, window_layers=(0,),
                                        rope_layer_theta=(100.0, 0.0), rope_scaling="yarn", rope_factor=2.0,
                                        rope_original_context=16),
    # LFM3: a convolution then a windowed attention layer with its own RoPE base, gated heads, output norms; and one
    # of two full layers with proportional RoPE, neither gates nor output norms
    "Lfm3ForCausalLM": dict(conv_layers=(0,), qk_norm=True, n_kv_head=2, attn_gate="head", norm_position="sandwich",
                            sliding_window=5, rope_local_theta=500.0),
    "Lfm3ForCausalLM-proportional": dict(qk_norm=True, n_kv_head=2, head_size=32, rope_scaling="proportional",
                                         rope_proportion=0.5, rope_factor=2.0, rope_theta=100.0),
    # Arcee: a redline model with a ReLU² MLP and Llama's block, biases on every Linear layer
    "ArceeForCausalLM": dict(mlp="relu2", n_kv_head=2, bias=True),
    # Qwen3.5: a gated delta net, then a full layer whose heads are gated element-wise, norms by 1 + weight
    "Qwen3_5ForCausalLM": dict(delta_layers=(0,), delta_heads=4, delta_key_heads=2, delta_key_dim=8,
                               delta_value_dim=8, attn_gate="element", qk_norm=True, norm_unit_offset=True,
                               rope_dims=8, n_kv_head=2),
    # Qwen3.5-MoE: Qwen3.5's layers with top 2 of 4 experts (rescaled) and a shared expert on each; Qwen3-Next where
    # the first layer is dense or the top-k weights are not rescaled (its delta nets' projections grouped by key head)
    "Qwen3_5MoeForCausalLM": dict(delta_layers=(0,), delta_heads=4, delta_key_heads=2, delta_key_dim=8,
                                  delta_value_dim=8, attn_gate="element", qk_norm=True, norm_unit_offset=True,
                                  rope_dims=8, n_kv_head=2, moe_experts=4, moe_top_k=2, mlp_hidden=32,
                                  moe_shared_hidden=48),
    # Qwen4-Exp: Qwen3.5-MoE's layers on 3 hyper-connected streams, the attention layer's QSA indexer (zeros: within
    # its budget of 64 keys it keeps them all) written back
    "Qwen4ExpForCausalLM": dict(delta_layers=(0,), delta_heads=4, delta_key_heads=2, delta_key_dim=8,
                                delta_value_dim=8, attn_gate="element", qk_norm=True, norm_unit_offset=True,
                                rope_dims=8, n_kv_head=2, moe_experts=4, moe_top_k=2, mlp_hidden=32,
                                moe_shared_hidden=48, hc_streams=3, hc_rank=8, qsa_heads=2, qsa_head_dim=16,
                                qsa_budget=64, qsa_block=1),
    # Lara Mini: a gated delta net, then a windowed layer with RoPE and no output gate (plain norms), top 2 of 4
    # experts with an ungated shared expert
    "LaraMiniForCausalLM": dict(delta_layers=(0,), delta_heads=4, delta_key_heads=2, delta_key_dim=8,
                                delta_value_dim=12, qk_norm=True, n_kv_head=2, sliding_window=5, window_layers=(1,),
                                rope_layer_theta=(0.0, 500.0), moe_experts=4, moe_top_k=2, mlp_hidden=32,
                                moe_shared_hidden=48, moe_shared_gate=False),
    # Zamba2: Mamba-2 layers alone, the second calling a shared block (heads of 2·64 / 4, GQA, adapters on q, k, v
    # and gate_up; tied, so transformers ties the block to its first caller); untied with two callers of one block
    "Zamba2ForCausalLM": dict(delta_layers=(0, 1), mlp_free_layers=(0, 1), delta_rule="mamba2", delta_heads=4,
                              delta_key_heads=2, delta_key_dim=8, delta_value_dim=32, delta_conv_bias=True,
                              delta_dt_min=0.001, delta_norm_eps=1e-5, shared_attn_layers=(1,),
                              shared_attn_adapter_rank=4, head_size=32, attn_scale=16 ** -0.5, mlp="geglu",
                              mlp_hidden=96, n_kv_head=2, tie_embeddings=True),
    "Zamba2ForCausalLM-untied": dict(delta_layers=(0, 1), mlp_free_layers=(0, 1), delta_rule="mamba2",
                                     delta_heads=4, delta_key_heads=2, delta_key_dim=8, delta_value_dim=32,
                                     delta_dt_min=0.001, delta_norm_eps=1e-5, shared_attn_layers=(0, 1),
                                     shared_attn_adapter_rank=4, shared_attn_qkv_adapters=True, n_kv_head=4,
                                     head_size=32, attn_scale=16 ** -0.5, mlp="geglu", mlp_hidden=96,
                                     pos_emb="none"),
    "Qwen3NextForCausalLM": dict(delta_layers=(1,), delta_heads=4, delta_key_heads=2, delta_key_dim=8,
                                 delta_value_dim=12, attn_gate="element", qk_norm=True, norm_unit_offset=True,
                                 rope_dims=8, n_kv_head=2, moe_experts=4, moe_top_k=2, mlp_hidden=32,
                                 moe_shared_hidden=48, moe_dense_layers=1, moe_dense_hidden=80),
    "Qwen3NextForCausalLM-unrescaled": dict(delta_layers=(0,), delta_heads=2, delta_key_heads=2, delta_key_dim=8,
                                            delta_value_dim=8, attn_gate="element", qk_norm=True,
                                            norm_unit_offset=True, n_kv_head=2, moe_experts=4, moe_top_k=2,
                                            mlp_hidden=32, moe_shared_hidden=48, moe_norm_topk=False),
    # Nemotron: LayerNorms by 1 + weight with biases, a ReLU² MLP, RoPE on a quarter of each head
    "NemotronForCausalLM": dict(norm="layernorm", norm_unit_offset=True, norm_bias=True, mlp="relu2", rope_dims=4,
                                n_kv_head=2),
    "GptOssForCausalLM-no-biases": dict(attn_sinks=True, moe_experts=4, moe_top_k=2, mlp="swiglu_clamped",
                                        mlp_hidden=32, fused_qkv=False),
    # Nemotron-H: Mamba-2 alone, attention alone without positions (q/k/v apart), a ReLU² MLP alone; a tied head
    # (written out as lm_head), dt floored
    "NemotronHForCausalLM": dict(n_layer=3, delta_layers=(0,), delta_rule="mamba2", delta_heads=4, delta_key_heads=2,
                                 delta_key_dim=8, delta_value_dim=16, delta_conv_bias=True, delta_dt_min=0.02,
                                 mlp_free_layers=(0, 1), mixer_free_layers=(2,), pos_emb="none", mlp="relu2",
                                 n_kv_head=2, fused_qkv=False, tie_embeddings=True),
    # GPTBigCode: learned positions with multi-query attention, tied; multi-head with unscaled scores, q/k/v apart,
    # no biases (written as zeros), the erf GELU
    # Nemotron-H with E layers: Mamba-2, experts (ReLU², 6 in 3 groups, the best 2 groups' top 2, sigmoid scores
    # with a routing bias, scaled, an ungated shared expert 24 wide), attention, a dense ReLU² MLP 80 wide
    "NemotronHForCausalLM-experts": dict(n_layer=4, delta_layers=(0,), delta_rule="mamba2", delta_heads=4,
                                         delta_key_heads=2, delta_key_dim=8, delta_value_dim=16, delta_dt_min=0.01,
                                         mlp_free_layers=(0, 2), mixer_free_layers=(1, 3), pos_emb="none",
                                         mlp="relu2", n_kv_head=2, moe_experts=6, moe_top_k=2, moe_groups=3,
                                         moe_topk_groups=2, moe_layers=(1,), mlp_hidden=16, moe_dense_hidden=80,
                                         moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20,
                                         moe_scale=1.5, moe_shared_hidden=24, moe_shared_gate=False),
    # dots.llm1: Qwen3's attention, a dense first layer 80 wide, then sigmoid-scored SwiGLU experts (8 in 4 groups,
    # the best 2 groups' top 2) with a routing bias, scaled, and an ungated shared expert of two experts' width; the
    # last layer windowed
    "Dots1ForCausalLM": dict(n_layer=3, qk_norm=True, n_kv_head=2, moe_experts=8, moe_top_k=2, moe_groups=4,
                             moe_topk_groups=2, mlp_hidden=16, moe_dense_layers=1, moe_dense_hidden=80,
                             moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20, moe_scale=1.5,
                             moe_shared_hidden=32, moe_shared_gate=False, sliding_window=5, window_layers=(2,)),
    # HyperCLOVA X: Granite's scalars with plain RMSNorms on the sublayers' outputs too, GQA
    "HyperCLOVAXForCausalLM": dict(norm_position="sandwich", embed_multiplier=2.0, residual_multiplier=0.3,
                                   logit_divisor=3.0, attn_scale=0.2, n_kv_head=2),
    # Persimmon: a LayerNorm QK-norm, a quarter of each head rotated, LayerNorms and ReLU², tied, no biases (written
    # as zeros)
    "PersimmonForCausalLM": dict(norm="layernorm", mlp="relu2", qk_norm=True, qk_layernorm=True, rope_dims=4,
                                 tie_embeddings=True),
    # Jais 2: RoPE, LayerNorm without biases (written as zeros) and a ReLU² MLP, GQA, untied
    "Jais2ForCausalLM": dict(norm="layernorm", mlp="relu2", n_kv_head=2),
    # Solar Open: sigmoid-scored SwiGLU experts on every layer (8 in 4 groups, the best 2 groups' top 2) with a routing
    # bias, scaled, and an ungated shared expert, under Llama's attention with q/k/v biases (no QK-norm, whole heads)
    "SolarOpenForCausalLM": dict(qkv_bias=True, n_kv_head=2, moe_experts=8, moe_top_k=2, moe_groups=4,
                                 moe_topk_groups=2, mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True,
                                 moe_norm_eps=1e-20, moe_scale=1.5, moe_shared_hidden=32, moe_shared_gate=False),
    # MiniMax-M2: QK-norm over whole projections, a quarter of each head rotated, top 2 of 4 sigmoid-scored experts
    # chosen with a routing bias and rescaled with no epsilon
    "MiniMaxM2ForCausalLM": dict(qk_norm=True, qk_norm_scope="all", rope_dims=4, n_kv_head=2, moe_experts=4,
                                 moe_top_k=2, mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True,
                                 moe_norm_eps=0.0),
    # PhiMoE: SparseMixer's top 2 of 4 (a threshold some second choices share), LayerNorms and attention with biases,
    # a head bias, LongRoPE's short factors and table scale; and biases on q/k/v alone (zeros on o_proj), LayerNorms
    # without biases (zeros), a window, unscaled RoPE
    "PhimoeForCausalLM": dict(norm="layernorm", bias=True, head_bias=True, n_kv_head=2, moe_experts=4, moe_top_k=2,
                              mlp_hidden=16, moe_gating="sparsemixer", moe_norm_topk=False, moe_jitter_eps=0.3,
                              rope_scaling="longrope", rope_pair_factors=(1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4),
                              rope_original_context=64, rope_factor=4.0, rope_attention_factor=1.2),
    # JetMoE: 4 attention experts of 2 KV heads (routed, top 2), 4 SwiGLU experts with a bias on their sum, the
    # output projection's bias; and top 1 of 2 over 2 KV heads without biases (written as zeros), tied
    "JetMoeForCausalLM": dict(n_head=8, n_kv_head=2, head_size=16, attn_gate="routed", attn_experts=4, bias=True,
                              qkv_bias=False, norm_bias=False, norm_eps=1e-6, moe_experts=4, moe_top_k=2,
                              mlp_hidden=16, moe_out_bias=True),
    "JetMoeForCausalLM-plain": dict(n_kv_head=2, attn_gate="routed", attn_experts=2, norm_eps=1e-6, moe_experts=2,
                                    moe_top_k=1, mlp_hidden=16, tie_embeddings=True),
    # Zamba: Mamba-1 mixers in 2 heads, layers 0 and 2 calling one shared block (no positions, GeGLU), tied; and
    # untied (a block each), SwiGLU, one head, mixer biases
    "ZambaForCausalLM": dict(n_layer=3, n_embd=32, n_head=4, n_kv_head=2, head_size=16, attn_scale=(16 / 2) ** -0.5,
                             pos_emb="none", mlp="geglu", gelu_approximate="none", mlp_hidden=48,
                             delta_layers=(0, 1, 2), mlp_free_layers=(0, 1, 2), delta_rule="mamba1", delta_heads=64,
                             delta_key_heads=2, delta_key_dim=8, delta_value_dim=1, delta_conv_bias=True,
                             delta_dt_rank=4, shared_attn_layers=(0, 2), tie_embeddings=True),
    "ZambaForCausalLM-untied": dict(n_layer=3, n_embd=32, n_head=4, head_size=16, attn_scale=(16 / 2) ** -0.5,
                                    pos_emb="none", mlp="swiglu", mlp_hidden=48, delta_layers=(0, 1, 2),
                                    mlp_free_layers=(0, 1, 2), delta_rule="mamba1", delta_heads=64,
                                    delta_key_heads=1, delta_key_dim=8, delta_value_dim=1, delta_proj_bias=True,
                                    shared_attn_layers=(0, 2), shared_attn_blocks=2, tie_embeddings=False),
    "PhimoeForCausalLM-plain": dict(norm="layernorm", norm_bias=False, qkv_bias=True, moe_experts=4, moe_top_k=2,
                                    mlp_hidden=16, moe_gating="sparsemixer", moe_norm_topk=False, sliding_window=5),
    # DBRX: q/k/v clamped, LayerNorms without biases, top 2 of 4 experts rescaled, GQA; and no clamp (written as a
    # bound past every float), top 1 of 3 not rescaled
    "DbrxForCausalLM": dict(norm="layernorm", norm_bias=False, qkv_clip=0.2, n_kv_head=2, moe_experts=4, moe_top_k=2,
                            mlp_hidden=16),
    "DbrxForCausalLM-noclip": dict(norm="layernorm", norm_bias=False, moe_experts=3, moe_top_k=1, moe_norm_topk=False,
                                   mlp_hidden=16, rope_theta=500.0),
    "GPTBigCodeForCausalLM": dict(pos_emb="learned", norm="layernorm", mlp="gelu", bias=True, n_kv_head=1,
                                  tie_embeddings=True),
    "GPTBigCodeForCausalLM-mha": dict(pos_emb="learned", norm="layernorm", mlp="gelu", attn_scale=1.0, bias=True,
                                      fused_qkv=False, gelu_approximate="none"),
    # GPT-Neo: learned positions with a windowed layer after a full one (window_layers), unscaled scores, biases on
    # out_proj and the MLP alone; and every layer windowed, no biases (written as zeros), the erf GELU, untied
    "GPTNeoForCausalLM": dict(pos_emb="learned", norm="layernorm", mlp="gelu", attn_scale=1.0, bias=True,
                              qkv_bias=False, sliding_window=5, window_layers=(1,), tie_embeddings=True),
    "GPTNeoForCausalLM-local": dict(pos_emb="learned", norm="layernorm", mlp="gelu", attn_scale=1.0,
                                    sliding_window=4, gelu_approximate="none"),
    # GPT-Neo from a window pattern (layer 0 windowed, layer 1 full), written as its layer types
    "GPTNeoForCausalLM-pattern": dict(pos_emb="learned", norm="layernorm", mlp="gelu", attn_scale=1.0,
                                      sliding_window=3, sliding_window_pattern=2),
    # GPT-J: one LayerNorm for parallel sublayers, a quarter of each head rotated (GPT-J's interleaved pairs on
    # export), biases on the MLP and attn.proj (folded into fc_out's) but not q/k/v, a head bias; and q/k/v apart,
    # whole heads rotated, tied, no head bias (written as zeros)
    "GPTJForCausalLM": dict(norm="layernorm", mlp="gelu", bias=True, qkv_bias=False, parallel_residual=True,
                            parallel_shared_norm=True, head_bias=True, rope_dims=4),
    "GPTJForCausalLM-whole": dict(norm="layernorm", mlp="gelu", bias=True, qkv_bias=False, parallel_residual=True,
                                  parallel_shared_norm=True, fused_qkv=False, tie_embeddings=True),
    # Mamba-2 mixers alone, tied, biases on in_proj and out_proj, dt floored
    "Mamba2ForCausalLM": dict(delta_layers=(0, 1), delta_rule="mamba2", delta_heads=8, delta_key_heads=2,
                              delta_key_dim=8, delta_value_dim=16, delta_conv_bias=True, delta_proj_bias=True,
                              delta_dt_min=0.02, mlp_free_layers=(0, 1), pos_emb="none", tie_embeddings=True),
    # Mamba-1 mixers alone: 96 channels (not a multiple of n_embd: intermediate_size written as it is), biases on
    # in_proj and out_proj, tied; Falcon-Mamba's with its B, C and dt norms, untied, dt of "auto" rank
    "MambaForCausalLM": dict(delta_layers=(0, 1), delta_rule="mamba1", delta_heads=96, delta_key_heads=1,
                             delta_key_dim=8, delta_value_dim=1, delta_dt_rank=3, delta_conv_bias=True,
                             delta_proj_bias=True, mlp_free_layers=(0, 1), pos_emb="none", tie_embeddings=True),
    "FalconMambaForCausalLM": dict(delta_layers=(0, 1), delta_rule="mamba1", delta_heads=128, delta_key_heads=1,
                                   delta_key_dim=8, delta_value_dim=1, delta_bcdt_norm_eps=1e-3,
                                   mlp_free_layers=(0, 1), pos_emb="none"),
    # Jamba from a redline model: Mamba-1 layers with weightless dt/B/C norms (written as weights of one), attention
    # on layer 2 with q/k/v apart, gate and up apart, experts on layers 1 and 3 (top 2, unrenormalized); and every
    # layer dense, attention on layers 0 and 2, weighted norms, tied
    "JambaForCausalLM": dict(n_layer=4, delta_layers=(0, 1, 3), delta_rule="mamba1", delta_heads=128,
                             delta_key_heads=1, delta_key_dim=8, delta_value_dim=1, delta_bcdt_norm_eps=1e-5,
                             pos_emb="none", n_kv_head=2, fused_qkv=False, fused_mlp=False, moe_experts=4,
                             moe_top_k=2, moe_norm_topk=False, mlp_hidden=32, moe_layers=(1, 3)),
    "JambaForCausalLM-dense": dict(n_layer=3, delta_layers=(1,), delta_rule="mamba1", delta_heads=64,
                                   delta_key_heads=1, delta_key_dim=8, delta_value_dim=1, delta_bcdt_norm_eps=1e-5,
                                   delta_bcdt_norm_weight=True, delta_conv_bias=True, pos_emb="none",
                                   tie_embeddings=True),
    # ALiBi: BLOOM where the embeddings have a LayerNorm (with biases; and without any, written as zeros, q/k/v
    # apart, untied, 6 heads), MPT where they have none (no biases, exact GELU, a score scale)
    "BloomForCausalLM": dict(pos_emb="alibi", embed_norm=True, norm="layernorm", mlp="gelu", bias=True,
                             tie_embeddings=True),
    "BloomForCausalLM-no-biases": dict(pos_emb="alibi", embed_norm=True, norm="layernorm", mlp="gelu",
                                       fused_qkv=False, n_head=6, n_embd=48),
    "MptForCausalLM": dict(pos_emb="alibi", norm="layernorm", mlp="gelu", gelu_approximate="none", attn_scale=0.3,
                           tie_embeddings=True),
    # Falcon (its new decoder architecture): parallel sublayers under two LayerNorms with 2 KV heads, exact GELU, no
    # biases (written without), tied; and multi-query with biases on q/k/v alone (written with zeros elsewhere),
    # q/k/v apart, tanh-GELU, untied
    "FalconForCausalLM": dict(norm="layernorm", mlp="gelu", gelu_approximate="none", parallel_residual=True,
                              n_kv_head=2, tie_embeddings=True),
    "FalconForCausalLM-mqa": dict(norm="layernorm", mlp="gelu", parallel_residual=True, n_kv_head=1, qkv_bias=True,
                                  fused_qkv=False, rope_theta=500.0),
    # nGPT layers (Dory's alone): every layer once, then with a section of two layers run three times (a window on
    # one of them), its q/k/v and gate/up apart
    "DoryForCausalLM": dict(ngpt=True, norm="l2", norm_eps=1e-6, norm_position="sandwich", qk_norm=True,
                            attn_gate="element", mlp="swiglu", n_kv_head=2),
    "DoryForCausalLM-loop": dict(ngpt=True, norm="l2", norm_eps=1e-6, norm_position="sandwich", qk_norm=True,
                                 attn_gate="element", mlp="swiglu", n_kv_head=2, n_layer=8, loop_section=(1, 2),
                                 loop_passes=3, sliding_window=4, window_layers=(2, 4, 6), rope_local_theta=100.0,
                                 fused_qkv=False, fused_mlp=False),
    # ZAYA's layers (its alone): convolutional attention, scaled residuals, the MLP router carried between layers; and
    # with a windowed layer of its own RoPE base
    "ZayaForCausalLM": dict(n_kv_head=2, fused_qkv=False, cca_kernels=(2, 3), residual_affine=True, moe_experts=3,
                            moe_top_k=1, moe_norm_topk=False, moe_router_hidden=16, mlp="swiglu", mlp_hidden=32,
                            rope_dims=8),
    "ZayaForCausalLM-window": dict(n_kv_head=1, fused_qkv=False, cca_kernels=(3, 1), residual_affine=True,
                                   moe_experts=2, moe_top_k=1, moe_norm_topk=False, moe_router_hidden=16, mlp="swiglu",
                                   mlp_hidden=32, rope_dims=8, sliding_window=4, window_layers=(1,),
                                   rope_local_theta=100.0, tie_embeddings=True),
}


@pytest.mark.parametrize("arch", list(REDLINE_EXPORTS))
def test_export_redline_architectures(arch, tmp_path, capsys):
    from redline.config import TrainConfig, to_dict
    from redline.tokenizer import load_tokenizer
    from tests.interop_models import byte_level_tokenizer

    cfg = ModelConfig(**{"vocab_size": VOCAB - 8, "context_len": 64, "n_layer": 2, "n_embd": 64, "n_head": 4,
                         **REDLINE_EXPORTS[arch]})
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    tokenizer = load_tokenizer(byte_level_tokenizer(tmp_path / "tok"))
    family = export_family(cfg)
    assert family.architecture == arch.split("-")[0]
    back = written_and_loaded(tmp_path, model, tokenizer, family)
    tokens = TOKENS.clamp(max=cfg.vocab_size - 1)
    with torch.no_grad():
        torch.testing.assert_close(back(tokens).logits, model(tokens), rtol=1e-5, atol=1e-5)
    assert to_dict(TrainConfig(model=cfg))  # the config is a plain one (nothing export-specific)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(norm_position="post"), "post-norm"),
    (dict(mlp="relu2", qk_norm=True), "model.mlp=relu2: Arcee, the one architecture with it and Llama's block"),
    (dict(pos_emb="learned", norm="layernorm", mlp="relu", n_kv_head=2), "OPT is multi-head"),
    (dict(pos_emb="learned"), "LayerNorm"),  # learned positions with RMSNorm
    (dict(pos_emb="learned", norm="layernorm", mlp="gelu", n_kv_head=1, attn_scale=1.0, sliding_window=4),
     "model.n_kv_head=1 with learned positions and windowed layers: GPT-Neo is multi-head"),
    (dict(pos_emb="learned", norm="layernorm", mlp="gelu", sliding_window=4),
     "model.attn_scale=0.0 with learned positions and windowed layers: GPT-Neo leaves its scores unscaled"),
    (dict(norm="layernorm", mlp="gelu", bias=True, qkv_bias=False, parallel_residual=True, parallel_shared_norm=True,
          rope_theta=500.0), "model.rope_theta=500.0 with one norm for parallel sublayers and no q/k/v biases: GPT-J"),
    (dict(norm="layernorm", mlp="gelu", bias=True, qkv_bias=False, parallel_residual=True, parallel_shared_norm=True,
          n_kv_head=2), "model.n_kv_head=2 with one norm for parallel sublayers and no q/k/v biases: GPT-J is multi"),
    (dict(pos_emb="learned", norm="layernorm", mlp="gelu", sliding_window=4, attn_scale=1.0, bias=True),
     "q/k/v biases .model.bias or model.qkv_bias. with learned positions and windowed layers: GPT-Neo's q/k/v"),
    (dict(pos_emb="learned", norm="layernorm", mlp="gelu", attn_scale=1.0, embed_scale=True),
     "model.embed_scale with learned positions"),
    (dict(logit_softcap=30.0), "logit_softcap"),
    (dict(delta_layers=(0,), delta_heads=4, delta_key_heads=2, delta_key_dim=8, delta_value_dim=8,
          delta_decay="channel", delta_gate_rank=8, pos_emb="none", n_kv_head=4, kv_lora_rank=16, rope_dims=4),
     "Kimi Linear, the one architecture with them, has as many key heads as value heads"),
    (dict(n_layer=2, delta_layers=(0,), delta_heads=4, delta_key_heads=4, delta_key_dim=8, delta_value_dim=8,
          delta_decay="channel", delta_gate_rank=8),
     "attends on its other layers with latent attention without positions"),
    (dict(delta_layers=(0,), delta_heads=4, delta_key_heads=4, delta_key_dim=8, delta_value_dim=8, pos_emb="none",
          n_kv_head=4, kv_lora_rank=16, rope_dims=4), "runs Kimi Delta Attention on its linear layers"),
    (dict(n_layer=2, delta_layers=(0,), delta_heads=4, delta_key_heads=4, delta_key_dim=8, delta_value_dim=8,
          delta_decay="bounded", delta_decay_floor=-5.0), "attends on its other layers with latent attention under "
                                                          "RoPE, its heads gated"),
    (dict(pos_emb="none"), "pos_emb=none: of the architectures redline exports to, only Granite 4.0"),
    # (sequential: Jais 2's)
    (dict(norm="layernorm", mlp="relu2", parallel_residual=True),
     "model.mlp=relu2 with LayerNorm and RoPE: GPT-NeoX's MLP is GELU"),
    (dict(parallel_residual=True), "GPT-NeoX, the one architecture with these redline exports to, uses LayerNorm"),
    (dict(norm="layernorm", mlp="gelu", n_kv_head=2, qkv_bias=True), "StarCoder2, the one architecture with them "
                                                                      "redline exports to, has biases on every Linear"),
    (dict(norm_position="sandwich", norm_unit_offset=True, rope_dims=4), "only GPT-NeoX, Phi and Phi-3 rotate part"),
    (dict(norm_position="output", qk_norm=True, bias=True), "per-head QK-norm: EXAONE 4.0, the one architecture "
                                                            "with it redline exports to, has no biases"),
    (dict(norm_position="output", qk_norm=True, sliding_window=4, sliding_window_pattern=2),
     "leaves RoPE out of exactly its full-attention layers"),
    (dict(qk_norm=True, qk_norm_after_rope=True, sliding_window=8), "model.qk_norm_after_rope: Hunyuan, the one "
                                                                    "architecture with it redline exports to, attends "
                                                                    "to the whole context"),
    (dict(rope_dims=4, qk_norm=True), "model.rope_dims=4: Phi-3, the one architecture with it redline exports to, "
                                      "has no QK-norm"),
    (dict(rope_scaling="longrope", rope_pair_factors=(1.0, 2.0, 3.0, 4.0), rope_original_context=32, bias=True),
     "model.rope_scaling=longrope: Phi-3, the one architecture with it redline exports to, has no biases"),
    (dict(head_bias=True), "only Phi has a bias on its head"),
    (dict(norm="layernorm", bias=True), "StableLM has biases on q, k and v alone"),
    (dict(parallel_residual=True, parallel_shared_norm=True), "Phi, the one architecture with one norm a block"),
    (dict(sliding_window=8, bias=True), "sliding_window with model.bias=true"),
    (dict(pos_emb="learned", norm="layernorm", mlp="gelu", n_kv_head=2), "GPTBigCode's attention is multi-query .one "
                                                                        "KV head. or multi-head, not grouped .GQA."),
    (dict(norm_position="output"), "model.qk_norm_scope=all"),  # OLMo 2 always has its QK-norm
    (dict(norm_position="output", qk_norm=True, qk_norm_scope="all", bias=True), "no MLP biases"),
    (dict(qk_norm=True, qk_norm_scope="all"), "norm_position=output"),
    (dict(norm_position="sandwich", qk_norm=True), "model.norm_unit_offset=true"),  # (without QK-norm: HyperCLOVA X)
    (dict(norm_unit_offset=True, embed_scale=True), "Gemma, the one architecture with them redline exports to, has "
                                                    "a GeGLU MLP"),
    (dict(mlp="geglu"), "model.mlp=geglu without Gemma's norms"),
    (dict(norm_position="output", qk_norm=True, qk_norm_scope="all", norm_unit_offset=True),
     "model.norm_unit_offset without Gemma's norms"),
    (dict(norm_position="sandwich", norm_unit_offset=True, mlp="geglu", qk_norm=True, embed_scale=True,
          attn_scale=0.3), "integer query_pre_attn_scalar"),
    (dict(nope_interval=2, qk_norm=True), "model.nope_interval with model.qk_norm"),
    (dict(attn_softcap=50.0), "only Gemma 2 .norm_position=sandwich. caps its attention scores"),
    (dict(norm_unit_offset=True, mlp="geglu", embed_scale=True, attn_softcap=50.0, qk_norm=True),
     "VaultGemma, the one architecture with them redline exports to, has no QK-norm"),
    (dict(norm_unit_offset=True, mlp="geglu", sliding_window=4), "VaultGemma, the one architecture with them redline "
                                                                 "exports to, has RMSNorm by 1 . weight and scaled "
                                                                 "embeddings"),
    (dict(norm_position="sandwich", norm_unit_offset=True, mlp="geglu", qk_norm=True, embed_scale=True,
          attn_softcap=50.0), "model.attn_softcap=50.0 with model.qk_norm: Gemma 2"),
    (dict(norm_position="sandwich", norm_unit_offset=True, mlp="geglu", embed_scale=True, sliding_window=4,
          rope_local_theta=100.0), "model.rope_local_theta without model.qk_norm"),
    (dict(residual_multiplier=0.5, qk_norm=True), "model.residual_multiplier: Granite, the one architecture with it "
                                                  "redline exports to, has no QK-norm"),
    (dict(embed_multiplier=2.0, norm="layernorm"), "has RMSNorm and SwiGLU"),
    (dict(nope_interval=2, norm="layernorm", mlp="gelu"), "only SmolLM3 has layers without RoPE"),
    (dict(attn_sinks=True, moe_bias=True, mlp="swiglu_clamped"),
     "GPT-OSS, the one architecture with them redline exports to, is a mixture of experts"),
    (dict(attn_sinks=True, qk_norm=True), "Granite SWA, the one architecture with it redline exports to, has no QK"),
    (dict(attn_sinks=True, sliding_window=4, rope_local_theta=5.0, rope_scaling="linear", rope_factor=2.0),
     "scales every layer's RoPE alike"),
    (dict(rope_layer_theta=(5.0,)), "only Granite SWA has a RoPE base per layer"),
    (dict(attn_gate="head"), "normalizes q and k per head before RoPE"),
    (dict(delta_layers=(0,), delta_heads=2, delta_key_heads=2, attn_gate="element", qk_norm=True,
          norm_unit_offset=True, moe_experts=4), "Qwen3.5-MoE and Qwen3-Next, the architectures with both redline "
                                                 "exports to, have a shared expert"),
    (dict(attn_gate="element", qk_norm=True, norm_unit_offset=True, moe_experts=4, moe_shared_hidden=32,
          moe_gating="sigmoid"), "weight their experts by a softmax"),
    (dict(attn_gate="element", qk_norm=True, norm_unit_offset=True, moe_experts=4, moe_shared_hidden=32,
          moe_shared_gate=False), "have a shared expert under a sigmoid gate"),
    (dict(delta_layers=(0,), delta_rule="mamba2", delta_heads=2, delta_key_heads=1, delta_value_dim=40),
     "a whole multiple of model.n_embd"),
    (dict(delta_layers=(0,), delta_rule="mamba2", delta_heads=2, delta_key_heads=1, delta_value_dim=32,
          qk_norm=True), "Granite 4.0, the one architecture with Mamba-2 layers"),
    (dict(moe_experts=4, moe_shared_hidden=32, moe_shared_gate=False, embed_multiplier=2.0, moe_norm_topk=False),
     "GraniteMoE weights each token's experts"),
    (dict(delta_layers=(0,), delta_heads=2, delta_key_heads=2, norm_position="output", qk_norm=True,
          qk_norm_scope="all", delta_norm_position="pre"), "fixes its gated output norm's epsilon at 1e-05"),
    (dict(delta_layers=(0,), delta_heads=2, delta_key_heads=2, norm_position="output", qk_norm=True),
     "puts its attention blocks' norms on the sublayers' outputs"),
    (dict(norm="layernorm", norm_unit_offset=True, mlp="gelu"), "Nemotron, the one architecture with it"),
    (dict(attn_gate="element", qk_norm=True), "pre-RMSNorms scaling by 1 "),
    (dict(attn_gate="element", qk_norm=True, norm_unit_offset=True, sliding_window=4), "has no window, sinks"),
    (dict(attn_gate="head", qk_norm=True, attn_sinks=True), "has no sinks, scales, caps"),
    (dict(rope_scaling="proportional", rope_proportion=0.5, qk_norm=True, bias=True), "LFM3, the architecture"),
    (dict(sliding_window=4, window_layers=(0,), norm="layernorm"),
     "only Granite SWA and GPT-OSS take windowed layers in any order"),  # Ministral's block has RMSNorm
    (dict(attn_sinks=True, moe_experts=4, mlp="swiglu_clamped", qk_norm=True), "QK-norm, a score scale or cap"),
    (dict(attn_sinks=True, moe_experts=4, mlp="swiglu_clamped", moe_norm_topk=False), "softmaxes its top k"),
    (dict(moe_experts=4, moe_bias=True), "with both sinks and clamped SwiGLU experts"),
    # blocks of one sublayer: Nemotron-H's and Mamba2's
    (dict(n_layer=2, mlp_free_layers=(0,), pos_emb="none", mlp="relu2"),
     "Nemotron-H, the architecture with them, has a token mixer or an MLP on each layer, never both "
     ".layers .1. have both"),
    (dict(n_layer=2, mixer_free_layers=(1,), mlp_free_layers=(0,), pos_emb="none"),
     "Nemotron-H, the architecture with them, has ReLU² MLPs .model.mlp=swiglu"),
    (dict(n_layer=2, mixer_free_layers=(1,), mlp_free_layers=(0,), mlp="relu2"),
     "has attention without positions .model.pos_emb=rope"),
    (dict(n_layer=2, mixer_free_layers=(1,), mlp_free_layers=(0,), mlp="relu2", pos_emb="none", qk_norm=True),
     "has plain attention: no QK-norm"),
    (dict(n_layer=2, delta_layers=(0,), delta_rule="mamba2", delta_heads=2, delta_key_heads=1, delta_value_dim=32,
          mixer_free_layers=(1,), mlp_free_layers=(0,), mlp="relu2", pos_emb="none"),
     "model.delta_dt_min=0: Nemotron-H floors Mamba-2's time step at time_step_min"),
    (dict(n_layer=2, delta_layers=(0, 1), delta_rule="mamba2", delta_heads=2, delta_key_heads=1, delta_value_dim=24,
          mlp_free_layers=(0, 1), pos_emb="none"), "Mamba2, the architecture of them, makes its layers' inner width"),
    (dict(n_layer=2, delta_layers=(0, 1), delta_rule="mamba2", delta_heads=2, delta_key_heads=1, delta_value_dim=32,
          mlp_free_layers=(0, 1), pos_emb="none", norm="layernorm"), "Mamba2, the architecture of them, has RMSNorms"),
    (dict(n_layer=2, delta_layers=(0, 1), delta_heads=2, delta_key_heads=1, mlp_free_layers=(0, 1), pos_emb="none",
          mlp="relu2", delta_dt_min=0.0), "has Mamba-2 mixers, not gated delta nets"),
    # Mamba-1 layers: Mamba's and Falcon-Mamba's alone, every layer one
    # Mamba-1 beside attention (layer 1): Jamba's, which has an MLP on every layer
    (dict(n_layer=2, delta_layers=(0,), delta_rule="mamba1", delta_heads=64, delta_key_heads=1, delta_value_dim=1,
          mlp_free_layers=(0,), pos_emb="none"),
     "model.mlp_free_layers: Jamba, the architecture with Mamba-1 layers beside attention and MLPs, has no such"),
    # the rest of what Jamba cannot express, refused by name
    (dict(n_layer=2, delta_layers=(0,), delta_rule="mamba1", delta_heads=64, delta_key_heads=1, delta_value_dim=1,
          pos_emb="none"), "Mamba-1 layers without dt, B and C norms .model.delta_bcdt_norm_eps=0, Mamba's.: Jamba"),
    (dict(n_layer=2, delta_layers=(0,), delta_rule="mamba1", delta_heads=64, delta_key_heads=1, delta_value_dim=1,
          delta_bcdt_norm_eps=1e-6), "model.pos_emb=rope: Jamba, the architecture with Mamba-1 layers beside "
                                     "attention and MLPs, has no positional encoding"),
    (dict(n_layer=2, delta_layers=(0,), delta_rule="mamba1", delta_heads=64, delta_key_heads=1, delta_value_dim=1,
          delta_bcdt_norm_eps=1e-6, pos_emb="none"), "model.delta_bcdt_norm_eps=1e-06 apart from model.norm_eps=1e-05"),
    (dict(n_layer=2, delta_layers=(0,), delta_rule="mamba1", delta_heads=48, delta_key_heads=1, delta_value_dim=1,
          delta_bcdt_norm_eps=1e-5, pos_emb="none"), "model.delta_heads=48: Jamba.* mamba_expand x n_embd=32"),
    (dict(n_layer=5, delta_layers=(0, 1, 3), delta_rule="mamba1", delta_heads=64, delta_key_heads=1,
          delta_value_dim=1, delta_bcdt_norm_eps=1e-5, pos_emb="none"),
     "attention on layers .2, 4. .those off model.delta_layers.: Jamba.* every attn_layer_period-th layer"),
    (dict(n_layer=4, delta_layers=(0, 1, 3), delta_rule="mamba1", delta_heads=64, delta_key_heads=1,
          delta_value_dim=1, delta_bcdt_norm_eps=1e-5, pos_emb="none", moe_experts=4, moe_layers=(0, 1)),
     "experts on layers .0, 1. .model.moe_layers.: Jamba"),
    (dict(n_layer=2, delta_layers=(0,), delta_rule="mamba1", delta_heads=64, delta_key_heads=1, delta_value_dim=1,
          delta_bcdt_norm_eps=1e-5, pos_emb="none", moe_experts=4), "model.moe_norm_topk, moe_gating=softmax, "
                                                                    "moe_scale=1.0: Jamba"),
    (dict(n_layer=2, delta_layers=(0, 1), delta_rule="mamba1", delta_heads=64, delta_key_heads=1, delta_value_dim=1,
          mlp_free_layers=(0, 1), pos_emb="none", delta_bcdt_norm_eps=1e-5, delta_bcdt_norm_weight=True),
     "model.mlp_free_layers: Jamba"),
    # experts on some layers without Mamba-1: no architecture
    (dict(moe_experts=4, moe_layers=(0,)), "model.moe_layers=.0,.: of the architectures redline exports to, only "
                                           "Jamba"),
    (dict(n_layer=2, delta_layers=(0, 1), delta_rule="mamba1", delta_heads=64, delta_key_heads=1, delta_value_dim=1,
          mlp_free_layers=(0, 1), pos_emb="none", norm_unit_offset=True), "Mamba and Falcon-Mamba, the architectures "
                                                                          "with them, have RMSNorms with a weight"),
    (dict(n_layer=2, delta_layers=(0, 1), delta_rule="mamba1", delta_heads=64, delta_key_heads=1, delta_value_dim=1,
          mlp_free_layers=(0, 1), pos_emb="none", logit_softcap=5.0), "have no embedding scale, scalars, logit cap"),
    # ALiBi: BLOOM with a norm on the embeddings, MPT without; whatever else neither has, refused by name
    (dict(pos_emb="alibi", embed_norm=True, norm="layernorm", mlp="gelu", n_kv_head=2),
     "model.n_kv_head=2: BLOOM, the architecture a model with model.pos_emb=alibi exports as here, has n_kv_head=4"),
    (dict(pos_emb="alibi", embed_norm=True), "model.mlp='swiglu': BLOOM"),
    (dict(pos_emb="alibi", embed_norm=True, norm="layernorm", mlp="gelu", gelu_approximate="none"),
     "model.gelu_approximate='none': BLOOM"),
    (dict(pos_emb="alibi", norm="layernorm", mlp="gelu", gelu_approximate="none", bias=True),
     "model.bias .or qkv_bias, norm_bias. with model.pos_emb=alibi: MPT has no biases"),
    (dict(pos_emb="alibi", norm="layernorm", mlp="gelu", gelu_approximate="none", sliding_window=8),
     "model.sliding_window=8: MPT"),
    (dict(pos_emb="alibi", norm="layernorm", mlp="gelu", gelu_approximate="none", logit_divisor=2.0),
     "model.logit_divisor=2.0: MPT's logit_scale is left out by transformers"),
    (dict(pos_emb="alibi", norm="layernorm", mlp="gelu", gelu_approximate="none", mlp_hidden=64),
     "model.mlp_hidden=64: transformers' MPT builds its MLP 4 × d_model = 128 wide"),
    (dict(pos_emb="alibi", mlp="gelu", gelu_approximate="none"), "model.norm='rmsnorm': MPT"),
    # Falcon's new decoder architecture: parallel sublayers under two LayerNorms with GQA; what else it lacks, by name
    (dict(norm="layernorm", mlp="gelu", parallel_residual=True, n_kv_head=2, sliding_window=8),
     "model.sliding_window=8: Falcon, the architecture a model with parallel sublayers under two LayerNorms with GQA "
     "and GELU exports as here, has sliding_window=0"),
    (dict(norm="layernorm", mlp="gelu", parallel_residual=True, n_kv_head=2, rope_dims=4),
     "model.rope_dims=4: Falcon"),
    (dict(norm="layernorm", mlp="gelu", parallel_residual=True, n_kv_head=2, head_size=16),
     "model.head_size=16: Falcon"),
    # MiniMax-M2: sigmoid-scored experts with QK-norm over whole projections; what else it lacks, by name
    (dict(qk_norm=True, qk_norm_scope="all", moe_experts=4, moe_gating="sigmoid", moe_shared_hidden=32,
          moe_shared_gate=False), "model.moe_shared_hidden with sigmoid-scored experts with QK-norm over whole "
                                  "projections: MiniMax-M2"),
    (dict(qk_norm=True, qk_norm_scope="all", moe_experts=4, moe_gating="sigmoid", moe_norm_eps=1e-6),
     "moe_norm_eps=1e-06: sigmoid-scored experts with QK-norm over whole projections: MiniMax-M2"),
    (dict(qk_norm=True, qk_norm_scope="all", moe_experts=4, moe_gating="sigmoid", moe_norm_eps=0.0, moe_scale=2.0),
     "model.moe_scale=2.0, moe_groups=1: sigmoid-scored"),
    # PhiMoE: SparseMixer routing; what else it lacks, by name
    (dict(moe_experts=4, moe_gating="sparsemixer", moe_norm_topk=False), "model.norm=rmsnorm"),
    (dict(norm="layernorm", moe_experts=4, moe_gating="sparsemixer", moe_norm_topk=False, qk_norm=True),
     "model.qk_norm with SparseMixer routing"),
    # DBRX: clamped q/k/v, or softmax-routed experts with LayerNorm; what else it lacks, by name
    (dict(qkv_clip=1.0), "model.qkv_clip: DBRX, the architecture with it, has experts on every layer"),
    (dict(qkv_clip=1.0, moe_experts=4, sliding_window=8), "model.sliding_window with model.qkv_clip: DBRX"),
    (dict(norm="layernorm", moe_experts=4, norm_bias=True), "model.norm_bias with softmax-routed experts with "
                                                            "LayerNorm: DBRX"),
    # Cohere's block with a RoPE base per layer: Cohere Compass's, one base a layer type, unscaled
    (dict(norm="layernorm", norm_bias=False, parallel_residual=True, parallel_shared_norm=True, n_layer=3,
          sliding_window=4, window_layers=(0, 1), rope_layer_theta=(10.0, 20.0, 30.0)),
     "model.rope_layer_theta with Cohere's parallel block: Cohere Compass"),
    (dict(norm="layernorm", norm_bias=False, parallel_residual=True, parallel_shared_norm=True, sliding_window=4,
          rope_local_theta=10.0, rope_scaling="linear", rope_factor=2.0),
     "model.rope_scaling=linear with Cohere's parallel block and a RoPE base per layer type"),
    # lightning attention: MiniMax's, whose residuals come from the normed inputs and whose MLPs are experts
    (dict(delta_layers=(0,), delta_rule="lightning", delta_heads=4, delta_key_heads=4, delta_key_dim=8,
          delta_value_dim=8, delta_norm_eps=1e-6, moe_experts=4, moe_top_k=2),
     "MiniMax, the architecture with lightning attention and normed residuals, has residuals from the normed inputs"),
    (dict(delta_layers=(0,), delta_rule="lightning", delta_heads=4, delta_key_heads=4, delta_key_dim=8,
          delta_value_dim=8, delta_norm_eps=1e-6, normed_residual=(1.0,) * 6),
     "has a mixture of experts in every layer"),
    (dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, latent_key_norm=True),
     "dots.3 Note .Dots3NoteForCausalLM., the one architecture with a norm on the RoPE key part, gates each head's"),
    (dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, latent_norm_eps=1e-5),
     "model.latent_key_norm, latent_norm_eps or attn_gate with latent attention: DeepSeek-V3 has no norm"),
])
def test_export_refuses_options_no_architecture_has(overrides, fragment):
    cfg = replace(ModelConfig(vocab_size=100, context_len=32, n_layer=1, n_embd=32, n_head=4), **overrides)
    with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
        export_family(cfg)


def test_export_presets_choose_architecture():
    from redline.presets import PRESETS

    for name, cfg in PRESETS.items():
        expected = "GPT2LMHeadModel" if name.startswith("gpt2") else "Qwen3ForCausalLM"
        assert export_family(cfg).architecture == expected, name


def test_export_cli_error_names_option_and_writes_nothing(tmp_path, capsys):
    from redline.config import TrainConfig, to_dict
    from redline.tokenizer import ByteTokenizer
    from redline.training.checkpoint import save_checkpoint

    cfg = TrainConfig(model=ModelConfig(vocab_size=257, context_len=32, n_layer=1, n_embd=32, n_head=4,
                                        mlp="relu2", qk_norm=True))
    ckpt = save_checkpoint(tmp_path / "run", 1, GPT(cfg.model), {}, to_dict(cfg), ByteTokenizer(), keep=1)
    code, _, err = run_cli(["export", str(ckpt), "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and "model.mlp=relu2" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".tmp-*"))


def test_export_bytes_tokenizer_encodes_alike(tmp_path, capsys):
    """A model trained with the bytes tokenizer exports a tokenizer.json that gives the same ids."""
    from redline.config import TrainConfig, to_dict
    from redline.tokenizer import ByteTokenizer
    from redline.training.checkpoint import save_checkpoint

    cfg = TrainConfig(model=ModelConfig(vocab_size=257, context_len=32, n_layer=1, n_embd=32, n_head=4,
                                        qk_norm=True))
    ckpt = save_checkpoint(tmp_path / "run", 1, GPT(cfg.model), {}, to_dict(cfg), ByteTokenizer(), keep=1)
    code, _, err = run_cli(["export", str(tmp_path / "run"), "--out", str(tmp_path / "x")], capsys)
    assert code == 0, err
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "x")
    text = "héllo wörld 🚀 <|endoftext|>\n\tend"
    ids = tok(text[:-17], add_special_tokens=False)["input_ids"]
    assert ids == ByteTokenizer().encode(text[:-17])
    assert tok.decode(ids) == text[:-17] and tok.eos_token == "<|endoftext|>"
    assert ckpt.exists()


def test_tiktoken_encoding_written_as_tokenizer_json(tmp_path):
    """tiktoken keeps ranks, not merges: the merges recovered from the ranks of a byte-level BPE are its own, and
    the tokenizer.json written from them encodes alike (a trained tokenizer stands in for tiktoken's gpt2 files,
    which this machine cannot download)."""
    from tokenizers import Tokenizer

    from redline.interop.tokenizer_files import _GPT2_PATTERNS, _byte_alphabet, tiktoken_tokenizer_json
    from tests.interop_models import byte_level_tokenizer

    original = Tokenizer.from_file(str(byte_level_tokenizer(tmp_path) / "tokenizer.json"))
    data = json.loads(original.to_str())
    unspell = {c: b for b, c in enumerate(_byte_alphabet())}
    specials = {t["content"]: t["id"] for t in data["added_tokens"]}
    ranks = {bytes(unspell[c] for c in token): i for token, i in data["model"]["vocab"].items()
             if token not in specials}
    shift = len(specials)  # tiktoken numbers specials after the ranks: move them there
    ranks = {t: r - shift for t, r in ranks.items()}
    moved = {name: len(ranks) + k for k, name in enumerate(specials)}
    rebuilt = Tokenizer.from_str(tiktoken_tokenizer_json(ranks, moved, _GPT2_PATTERNS[1]))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in data["model"]["merges"]]
    assert [tuple(m) for m in json.loads(rebuilt.to_str())["model"]["merges"]] == merges
    for text in ("hello world, the model says hi", "Ünïcödé café 日本 1234\ttabs", "  two  spaces\n\nend"):
        expected = [i - shift for i in original.encode(text, add_special_tokens=False).ids]
        assert rebuilt.encode(text, add_special_tokens=False).ids == expected
    assert rebuilt.token_to_id("<|im_end|>") == moved["<|im_end|>"]


# ----------------------------------------------------------------------------------------------------
# bad input: one line, nothing written


def _expect_import_error(src, out, capsys, fragment):
    code, _, err = run_cli(["import", str(src), "--out", str(out)], capsys)
    assert code == 2, err
    assert fragment in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and not list(out.parent.glob(".tmp-*"))


def test_import_unsupported_architecture(tmp_path, capsys):
    hf_folder("llama-gqa-tied", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["model_type"] = "falcon2"
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys,
                         "redline imports afmoe, apertus, apertus1p5, apertus1p5_text, arcee, aria, aria_text, axk1, axk2, "
                         "aya_vision, bailing_hybrid, bamba, biogpt, bitnet, bloom, chameleon, codegen, cohere, cohere2, "
                         "cohere2_moe, cohere2_vision, cohere_compass, cohere_compass_text, cosmos3_edge, cosmos3_omni, ctrl, "
                         "cwm, dbrx, deepseek_ocr2, deepseek_v2, deepseek_v3, deepseek_v32, deepseek_v4, deepseek_vl, "
                         "deepseek_vl_hybrid, diffllama, doge, dory, dots1, dots3_note, dots3_note_text, emu3, "
                         "emu3_text_model, ernie4_5, ernie4_5_moe, ernie4_5_vl_moe, exaone, exaone4, exaone4_5, exaone_moe, "
                         "falcon, falcon_h1, falcon_mamba, fast_vlm, flex_olmo, flint, gemma, gemma2, gemma3, gemma3_text, "
                         "gemma3n, gemma3n_text, gemma4, gemma4_text, gemma4_unified, gemma4_unified_text, glm, glm4, glm46v, "
                         "glm4_moe, glm4_moe_lite, glm4v, glm4v_moe, glm5_next, glm5_next_text, glm_moe_dsa, glm_ocr, glmga, "
                         "gpt2, gpt_bigcode, gpt_neo, gpt_neox, gpt_oss, gptj, granite, granite4_vision, granite_docling, "
                         "granite_swa, granitemoe, granitemoe_swa, granitemoehybrid, granitemoeshared, helium, "
                         "hunyuan_v1_dense, hunyuan_v1_moe, hunyuan_vl, hy_v3, hy_v4, hy_v4_vl, hyperclovax, "
                         "hyperclovax_vision_v2, idefics2, idefics3, internlm3, internvl, iquestcoder, jais2, jamba, janus, "
                         "jetmoe, kimi_k25, kimi_linear, kolibri1, laguna, lara_mini, lfm2, lfm2_moe, lfm2_vl, lfm3, lfm3_vl, "
                         "lighton_ocr, llama, llama4, llama4_text, llava, llava_next, llava_next_video, llava_onevision, "
                         "longcat_flash, mamba, mamba2, mellum, mimo_v2_flash, minicpm3, minicpm_ocr, minicpmv4_6, "
                         "minicpmv4_7, minimax, minimax_m2, minimax_m3_vl, minimax_m3_vl_text, ministral, ministral3, mistral,"
                         " mistral3, mistral4, mistral_large4, mixtral, mllama, modernbert-decoder, molmo2, mpt, nanochat, "
                         "nemotron, nemotron_h, nemotron_h_omni, olmo, olmo2, olmo3, olmo_hybrid, olmoe, openai-gpt, opt, "
                         "ovis2, paddleocr_vl, paligemma, perception_lm, persimmon, phi, phi3, phimoe, qianfan_ocr, qwen2, "
                         "qwen2_5_omni_thinker, qwen2_5_vl, qwen2_moe, qwen2_vl, qwen3, qwen3_5, qwen3_5_moe, "
                         "qwen3_5_moe_text, qwen3_5_text, qwen3_moe, qwen3_next, qwen3_omni_moe_thinker, qwen3_vl, "
                         "qwen3_vl_moe, qwen4_exp, qwen4_exp_text, recurrent_gemma, rwkv, sarvam_mla, sarvam_moe, seed_oss, "
                         "shieldgemma2, smollm3, smolvlm, solar_open, stablelm, starcoder2, step3p5, step3p7, unlimited_ocr, "
                         "vaultgemma, video_llama_3, video_llava, vipllava, xglm, xlstm, youtu, zamba, zamba2, zaya")


@pytest.mark.parametrize("model_type, fragment", [("gemma4_assistant", "multi-token-prediction drafter"),
                                                   ("gemma4_unified_assistant", "multi-token-prediction drafter"),
                                                   ("gpt_neox_japanese", "lowest-id vocabulary match"),
                                                   ("inkling_text", "relative-position bias"),
                                                   ("inkling2_text", "L2-clipped"),
                                                   ("inkling2_loop_text", "loop_num_passes times")])
def test_import_refuses_the_architectures_redline_cannot_express_by_name(model_type, fragment, tmp_path, capsys):
    hf_folder("llama-gqa-tied", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, f"model_type {model_type!r} is not supported: ")
    _expect_import_error(tmp_path / "hf", tmp_path / "out2", capsys, fragment)


def test_dots3_note_released_shapes_are_refused_by_name():
    """dots.3 Note's released config (Dots3NoteTextConfig's defaults): its windowed layers' 64 heads of a 1024-wide
    latent beside the DSA layers' 128 of a 512-wide one, which redline's one head shape cannot hold."""
    from redline.interop.families import family_for

    config = transformers.Dots3NoteTextConfig().to_dict()
    with pytest.raises(UserError, match=r"per_layer_config\[2\] \(sliding_attention\) sets kv_lora_rank=1024 apart "
                                        r"from the model's 512: redline's latent attention keeps one head shape"):
        family_for(config, "dots3").model_config(config)


def test_import_config_that_is_not_a_json_object_or_not_text(tmp_path, capsys):
    hf_folder("llama-gqa-tied", tmp_path / "hf")
    config = tmp_path / "hf" / "config.json"
    config.write_text("[1, 2]")
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, "holds a JSON list, not an object")
    config.write_bytes(b'{"model_type": "llama\xff"}')
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, "it is not UTF-8 text")
    config.write_text('{"model_type":\n "llama",\n')
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, "the model config")


def test_import_missing_and_mismatched_tensors(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    hf_folder("qwen2", tmp_path / "hf")
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    missing = dict(weights)
    del missing["model.layers.1.mlp.up_proj.weight"]
    save_file(missing, str(tmp_path / "hf" / "model.safetensors"))
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, "model.layers.1.mlp.up_proj.weight")
    wrong = dict(weights)
    wrong["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(64, 32)
    save_file(wrong, str(tmp_path / "hf" / "model.safetensors"))
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, "blocks.0.attn.proj.weight")
    # a q/k/v weight that cannot be fused with the others: the fusing torch.cat fails before the shape check
    wrong = {**weights, "model.layers.0.self_attn.q_proj.weight": torch.zeros(3, 3)}
    save_file(wrong, str(tmp_path / "hf" / "model.safetensors"))
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, "model.layers.0.self_attn")
    extra = {**weights, "model.layers.0.self_attn.o_proj.bias": torch.zeros(64)}
    save_file(extra, str(tmp_path / "hf" / "model.safetensors"))
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, "model.layers.0.self_attn.o_proj.bias")


def test_import_config_fields_missing_mistyped_or_disagreeing_with_the_weights(tmp_path, capsys):
    """What transformers refuses (a vocab_size the weights do not have), and config.json edits that would
    otherwise end in a stack trace, are one-line errors."""
    hf_folder("llama-gqa-tied", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for edit, fragment in [
        ({"vocab_size": VOCAB + 40}, f"has {VOCAB} rows but the config's vocab_size is {VOCAB + 40}"),
        ({"intermediate_size": None}, "no 'intermediate_size'"),
        ({"vocab_size": str(VOCAB)}, "wrong type"),
        ({"rope_scaling": {"rope_type": "linear"}}, "needs factor"),
    ]:
        changed = {k: v for k, v in {**config, **edit}.items() if v is not None}
        path.write_text(json.dumps(changed))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)


def test_import_gemma3_options_redline_cannot_express(tmp_path, capsys):
    """Gemma 3 configs redline cannot run as transformers does are one-line errors naming the option."""
    hf_folder("gemma3", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    sliding, full = "sliding_attention", "full_attention"
    for edit, fragment in [
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0: transformers' Gemma 3 caps the scores in "
                                           "its eager attention and not in SDPA"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"layer_types": [full, sliding, sliding]}, "not a repeating pattern"),
        ({"rope_parameters": {full: {"rope_type": "default", "rope_theta": 1e4},
                              sliding: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
         "sliding-window layers' RoPE scaling 'linear'"),
        ({"hidden_activation": "gelu"}, "hidden_activation='gelu'"),
    ]:
        path.write_text(json.dumps({**config, **edit}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)


def test_import_gpt_neox_reads_pythias_config_and_refuses_what_it_cannot_run(tmp_path, capsys):
    """A config.json as the Pythia files on the Hub have it (rotary_pct and rotary_emb_base, before transformers 5's
    rope_parameters) reads as transformers reads it; options redline cannot run are one-line errors naming them."""
    from redline.interop.gpt_neox import model_config

    pythia = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": 50304,
              "hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8, "intermediate_size": 2048,
              "hidden_act": "gelu", "rotary_pct": 0.25, "rotary_emb_base": 10000, "max_position_embeddings": 2048,
              "layer_norm_eps": 1e-05, "use_parallel_residual": True, "tie_word_embeddings": False}
    cfg = model_config(pythia)
    assert (cfg.head_dim, cfg.rope_dims, cfg.rope_theta, cfg.parallel_residual, cfg.gelu_approximate, cfg.bias,
            cfg.norm, cfg.tie_embeddings, cfg.hidden_dim) == (64, 16, 10000.0, True, "none", True, "layernorm",
                                                              False, 2048)
    assert model_config({**pythia, "rotary_pct": 1.0}).rope_dims == 0  # the whole head
    hf_folder("gpt_neox", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for edit, fragment in [({"attention_bias": False}, "attention_bias=false"),
                           ({"hidden_act": "relu"}, "hidden_act='relu'"),
                           ({"rope_parameters": {**config["rope_parameters"], "partial_rotary_factor": 0.1}},
                            "rotates 1 of each head's 16 dimensions")]:
        path.write_text(json.dumps({**config, **edit}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)


def test_import_phi_reads_phi2s_config_and_refuses_what_it_cannot_run(tmp_path, capsys):
    """phi-2's config.json as the Hub has it (rope_theta and partial_rotary_factor at the top) reads as transformers
    reads it; options redline cannot run are one-line errors naming them."""
    from redline.interop.phi import model_config

    phi2 = {"model_type": "phi", "architectures": ["PhiForCausalLM"], "vocab_size": 51200, "hidden_size": 2560,
            "intermediate_size": 10240, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": None, "hidden_act": "gelu_new", "max_position_embeddings": 2048,
            "layer_norm_eps": 1e-05, "partial_rotary_factor": 0.4, "rope_theta": 10000.0, "rope_scaling": None,
            "qk_layernorm": False, "tie_word_embeddings": False}
    cfg = model_config(phi2)
    assert (cfg.head_dim, cfg.rope_dims, cfg.kv_heads, cfg.parallel_shared_norm, cfg.head_bias,
            cfg.gelu_approximate) == (80, 32, 32, True, True, "tanh")
    hf_folder("phi", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for edit, fragment in [({"qk_layernorm": True}, "qk_layernorm=true"),
                           ({"hidden_act": "relu"}, "hidden_act='relu'")]:
        path.write_text(json.dumps({**config, **edit}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)


def test_import_stablelm_reads_the_hubs_config_and_refuses_what_it_cannot_run(tmp_path, capsys):
    """stablelm-2-1_6b's config.json as the Hub has it (rope_theta and partial_rotary_factor at the top) reads as
    transformers reads it; its per-head QK LayerNorm is a one-line error naming it."""
    from redline.interop.stablelm import model_config

    hub = {"model_type": "stablelm", "architectures": ["StableLmForCausalLM"], "vocab_size": 100352,
           "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 32,
           "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 4096, "layer_norm_eps": 1e-05,
           "use_qkv_bias": True, "qk_layernorm": False, "use_parallel_residual": False, "rope_theta": 10000,
           "partial_rotary_factor": 0.25, "tie_word_embeddings": False}
    cfg = model_config(hub)
    assert (cfg.head_dim, cfg.rope_dims, cfg.has_qkv_bias, cfg.bias, cfg.norm, cfg.norm_bias, cfg.parallel_residual,
            cfg.hidden_dim) == (64, 16, True, False, "layernorm", True, False, 5632)
    hf_folder("stablelm", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "qk_layernorm": True}))
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, "qk_layernorm=true")


def test_import_smollm3_reads_the_hubs_config_and_refuses_what_it_cannot_run(tmp_path, capsys):
    """SmolLM3-3B's config.json as the Hub has it (no_rope_layers spelled out, one layer in four without RoPE) reads
    as nope_interval 4; a list that is not every N-th layer, and a window on its NoPE layers, are one-line errors."""
    from redline.interop.llama import model_config_for

    hub = {"model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"], "vocab_size": 128256,
           "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
           "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-06,
           "rope_theta": 5000000.0, "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
           "no_rope_layer_interval": 4, "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(36)],
           "use_sliding_window": False, "sliding_window": None, "tie_word_embeddings": True}
    cfg = model_config_for("smollm3")(hub)
    assert (cfg.nope_interval, cfg.kv_heads, cfg.tie_embeddings, cfg.rope_theta, cfg.sliding_window) == \
        (4, 4, True, 5e6, 0)
    assert [cfg.layer_rope(i) for i in range(8)] == [True, True, True, False] * 2
    hf_folder("smollm3", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for edit, fragment in [({"no_rope_layers": [1, 0, 0]}, "not on one layer in every 2"),
                           ({"no_rope_layers": [1, 0]}, "no_rope_layers has 2 entries for 3 layers"),
                           ({"use_sliding_window": True, "sliding_window": 4}, "use_sliding_window=true")]:
        path.write_text(json.dumps({**config, **edit}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)


def test_ernie_writer_gives_back_ernies_layout(tmp_path, capsys):
    """ERNIE 4.5's own folder from an imported ERNIE model (ernie.py's inverse map: q and k rows back to interleaved
    RoPE pairs, use_bias, rope_parameters): transformers loads it as Ernie4_5ForCausalLM with the source's logits."""
    from redline.interop.families import _families

    hf, model, tokenizer, _ = imported("ernie4_5", tmp_path, capsys)
    back = written_and_loaded(tmp_path, model, tokenizer, _families()["ernie4_5"])
    with torch.no_grad():
        torch.testing.assert_close(back(TOKENS).logits, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_import_phi3_reads_the_hubs_configs_as_transformers_does(tmp_path, capsys):
    """Phi-3-mini-128k's config.json as the Hub has it (LongRoPE as rope_scaling type "su" and the original context
    at the top) and Phi-4-mini's (three quarters of each head rotated, tied): LongRoPE's frequencies (short factors at
    the imported context, long ones past it) and table factor equal transformers' own; a model past the original
    context equals transformers on a sequence that long; bad factors are one-line errors."""
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from redline.interop.phi3 import model_config
    from redline.model import rope_attention_factor, rope_frequencies

    short = [1.0 + 0.05 * i for i in range(48)]
    mini128k = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": 32064, "hidden_size": 3072,
                "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 131072,
                "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
                "rope_scaling": {"type": "su", "short_factor": short, "long_factor": [2 * f for f in short]},
                "sliding_window": 262144, "tie_word_embeddings": False, "pad_token_id": 32000}
    phi4mini = {**mini128k, "vocab_size": 200064, "num_attention_heads": 24, "num_key_value_heads": 8,
                "partial_rotary_factor": 0.75, "tie_word_embeddings": True, "rope_theta": 250000.0,
                "rope_scaling": {"type": "longrope", "short_factor": short, "long_factor": short[::-1]}}
    for hub, rotated in ((mini128k, 0), (phi4mini, 96)):
        cfg = model_config(hub)
        assert (cfg.context_len, cfg.rope_scaling, cfg.rope_factor, cfg.rope_dims) == (4096, "longrope", 32.0, rotated)
        given = {k: v for k, v in hub.items() if k not in ("model_type", "architectures")}  # transformers 5 wants
        given["rope_scaling"] = {**hub["rope_scaling"], "original_max_position_embeddings": 4096}  # it here too
        theirs = Phi3Config(**given)
        inv_freq, factor = ROPE_INIT_FUNCTIONS["longrope"](theirs, "cpu")
        torch.testing.assert_close(rope_frequencies(cfg), inv_freq)
        assert rope_attention_factor(cfg) == pytest.approx(factor) and factor > 1.1
    with pytest.raises(UserError, match="short_factor and long_factor need 48 entries .one per rotating dimension "
                                        "pair., got 40 and 48"):
        model_config({**mini128k, "rope_scaling": {"type": "su", "short_factor": short[:40], "long_factor": short}})
        long = replace(model_config(hub), context_len=8192)  # past the original context: the long factors
        inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](theirs, "cpu", seq_len=8192)
        torch.testing.assert_close(rope_frequencies(long), inv_freq)
    with pytest.raises(UserError, match="model.context_len=8192 with rope_scaling=longrope past "
                                        "rope_original_context=4096 needs model.rope_long_pair_factors"):
        replace(model_config(mini128k), context_len=8192, rope_long_pair_factors=()).validate()
    hf, model, _, _ = imported("phi3-longrope", tmp_path, capsys)
    long = GPT(replace(model.cfg, context_len=128)).eval()  # transformers switches to the long factors past 32
    long.load_state_dict(model.state_dict())
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(long(tokens), hf(tokens).logits, rtol=1e-5, atol=1e-5)
        assert (model(tokens[:, :32]) - long(tokens[:, :32])).abs().max() > 1e-2  # the two sets differ


def test_import_vaultgemma_reads_gemma2s_options_on_pre_norm_blocks_and_refuses_the_rest():
    """VaultGemma's config as Gemma 2's (caps, query_pre_attn_scalar, alternating layers) on pre-norm blocks; what
    Gemma 2's import refuses (q/k/v/o biases, another layer order, another activation) is refused by name."""
    from redline.interop.gemma2 import vault_model_config

    base = {"model_type": "vaultgemma", "vocab_size": 256000, "hidden_size": 1152, "intermediate_size": 6912,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
            "query_pre_attn_scalar": 256, "sliding_window": 512, "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    cfg = vault_model_config(base)
    assert (cfg.norm_position, cfg.norm_unit_offset, cfg.embed_scale, cfg.mlp, cfg.attn_softcap, cfg.logit_softcap,
            cfg.attn_scale, cfg.sliding_window, cfg.sliding_window_pattern, cfg.qk_norm) == \
        ("pre", True, True, "geglu", 50.0, 30.0, 1 / 16, 512, 2, False)
    for extra, fragment in [({"attention_bias": True}, "attention_bias=True"),
                            ({"layer_types": ["full_attention"] + ["sliding_attention"] * 3}, "layer_types"),
                            ({"hidden_activation": "gelu"}, "hidden_activation='gelu'")]:
        with pytest.raises(UserError, match=fragment):
            vault_model_config({**base, **extra})


def test_import_exaone4_reads_its_layer_kinds_and_refuses_what_it_cannot_run():
    """EXAONE 4.0's layers from layer_types, or from sliding_window_pattern ("LLLG" or N) as transformers builds them:
    one full layer without RoPE in every N is sliding_window_pattern N with nope_interval N; other mixes are one-line
    errors."""
    from redline.interop.exaone4 import model_config

    base = {"model_type": "exaone4", "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 4096,
            "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
            "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
            "tie_word_embeddings": True}
    for extra in ({"sliding_window": 4096, "sliding_window_pattern": "LLLG"},
                  {"sliding_window": 4096, "sliding_window_pattern": 4},
                  {"sliding_window": 4096, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]
                   + ["sliding_attention"] * 3 + ["full_attention"]}):
        cfg = model_config({**base, **extra})
        assert (cfg.sliding_window, cfg.sliding_window_pattern, cfg.nope_interval, cfg.qk_norm_scope) == \
            (4096, 4, 4, "head")
    cfg = model_config({**base, "sliding_window": None, "layer_types": ["full_attention"] * 8})
    assert (cfg.sliding_window, cfg.nope_interval, cfg.norm_position) == (0, 0, "output")
    for extra, fragment in [({"sliding_window": 4096, "layer_types": ["full_attention"] * 8}, "with every layer full"),
                            ({"sliding_window": 4096, "layer_types": ["sliding_attention"] * 2 + ["full_attention"]
                              + ["sliding_attention"] * 4 + ["full_attention"]}, "not one in every 3"),
                            ({"sliding_window": 4096}, "without layer_types or sliding_window_pattern"),
                            ({"layer_types": ["sliding_attention"] * 8}, "sliding_window is not set")]:
        with pytest.raises(UserError, match=fragment):
            model_config({**base, **extra})


def test_import_exaone_reads_the_hubs_config():
    """EXAONE-3.5-2.4B-Instruct's config.json as the Hub has it (its own names for depth, eps and activation; Llama 3
    RoPE; head_dim 80 apart from 2560 / 32), and ExaoneConfig's base where a config gives none."""
    from redline.interop.exaone import model_config

    hub = {"model_type": "exaone", "architectures": ["ExaoneForCausalLM"], "vocab_size": 102400, "hidden_size": 2560,
           "intermediate_size": 7168, "num_layers": 30, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 80, "activation_function": "silu", "layer_norm_epsilon": 1e-05,
           "max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": True,
           "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                            "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
    cfg = model_config(hub)
    assert (cfg.n_layer, cfg.head_dim, cfg.kv_heads, cfg.norm_eps, cfg.rope_scaling, cfg.rope_factor,
            cfg.rope_original_context, cfg.tie_embeddings) == (30, 80, 8, 1e-5, "llama3", 8.0, 8192, True)
    assert model_config({k: v for k, v in hub.items() if k not in ("rope_theta", "rope_scaling")}).rope_theta == 5e5
    with pytest.raises(UserError, match="gelu"):
        model_config({**hub, "activation_function": "gelu"})


@pytest.mark.parametrize("kind, model_type, architecture", [
    ("qwen3_5_text", "qwen3_5", "Qwen3_5ForConditionalGeneration"),
    ("qwen3_5_moe_text", "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"),
    ("qwen4_exp_text", "qwen4_exp", "Qwen4ExpForConditionalGeneration")])
def test_import_qwen3_5_multimodal_folder_reads_its_text_model(kind, model_type, architecture, tmp_path, capsys):
    """A Qwen3_5ForConditionalGeneration folder as the Hub holds Qwen3.5 (Qwen3_5MoeForConditionalGeneration:
    Qwen3.5-MoE; Qwen4ExpForConditionalGeneration: Qwen4-Exp): config.json nests the text model's config (text_config) and the weights sit under
    model.language_model. beside a vision tower, which is left unread."""
    from safetensors.torch import load_file, save_file

    hf = hf_folder(kind, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    text = {k: v for k, v in config.items() if k not in ("architectures", "transformers_version")}
    (tmp_path / "hf" / "config.json").write_text(json.dumps({
        "model_type": model_type, "architectures": [architecture],
        "tie_word_embeddings": config["tie_word_embeddings"], "text_config": {**text, "model_type": kind},
        "vision_config": {"model_type": f"{model_type}_vision", "depth": 1}}))
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    moved = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
             for k, v in weights.items()}
    save_file({**moved, "model.visual.patch_embed.proj.weight": torch.zeros(4, 3)},
              str(tmp_path / "hf" / "model.safetensors"))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_import_qwen3_next_reads_its_dense_layers_and_refuses_the_layouts_redline_cannot_express():
    """Qwen3-Next's configs as transformers writes them (Qwen3NextConfig's defaults: 48 layers, a full one in four,
    512 experts): dense MLP layers (mlp_only_layers, decoder_sparse_step) as redline's dense first layers, dense layers
    anywhere else and a shared expert of width 0 refused by name; num_experts 0 is a dense model. Qwen3.5-MoE's
    config has no norm_topk_prob: its top k are always rescaled."""
    from redline.interop import qwen3_5, qwen3_next

    def config(name, **overrides):
        return getattr(transformers, name)(**overrides).to_dict()

    cfg = qwen3_next.model_config(config("Qwen3NextConfig"))
    assert (cfg.n_layer, len(cfg.delta_layers), cfg.delta_layers[:4], cfg.head_dim, cfg.rope_dims, cfg.kv_heads,
            cfg.moe_experts, cfg.moe_top_k, cfg.hidden_dim, cfg.moe_shared_hidden, cfg.moe_norm_topk,
            cfg.moe_dense_layers) == (48, 36, (0, 1, 2, 4), 256, 64, 2, 512, 10, 512, 512, True, 0)
    cfg = qwen3_next.model_config(config("Qwen3NextConfig", mlp_only_layers=[0, 1], norm_topk_prob=False))
    assert (cfg.moe_dense_layers, cfg.moe_dense_hidden, cfg.moe_norm_topk) == (2, 5632, False)
    dense = qwen3_next.model_config(config("Qwen3NextConfig", num_experts=0))
    assert (dense.moe_experts, dense.hidden_dim) == (0, 5632)
    with pytest.raises(UserError, match=r"decoder_sparse_step=2 / mlp_only_layers=\[\]: dense MLPs on layers "
                                        r"\[0, 2, 4, .*have their dense layers first"):
        qwen3_next.model_config(config("Qwen3NextConfig", decoder_sparse_step=2))
    with pytest.raises(UserError, match=r"mlp_only_layers=\[0, 3\]: dense MLPs on layers \[0, 3\]"):
        qwen3_next.model_config(config("Qwen3NextConfig", mlp_only_layers=[3, 0]))
    with pytest.raises(UserError, match="shared_expert_intermediate_size=0: redline reads"):
        qwen3_next.model_config(config("Qwen3NextConfig", shared_expert_intermediate_size=0))
    with pytest.raises(UserError, match="attention_bias=true"):
        qwen3_next.model_config(config("Qwen3NextConfig", attention_bias=True))
    moe = qwen3_5.moe_model_config(config("Qwen3_5MoeTextConfig"))
    assert (moe.moe_experts, moe.moe_top_k, moe.moe_norm_topk, moe.moe_dense_layers, moe.n_layer) == (
        256, 8, True, 0, 40)


def test_import_lara_mini_reads_its_layer_kinds_and_refuses_what_it_cannot_run(tmp_path, capsys):
    """Lara Mini's config as transformers writes it (LaraMiniConfig's defaults: 34 layers of the period-5 pattern,
    128 experts): windowed layers rotate, full layers are NoPE, the shared expert is ungated; a file with Qwen3.5's
    split delta-net names reads alike; what transformers' model cannot run or redline cannot express is refused by
    name, and so is an export that Lara Mini cannot hold."""
    from safetensors.torch import load_file, save_file

    from redline.interop import lara_mini

    def config(**overrides):
        return transformers.LaraMiniConfig(**overrides).to_dict()

    cfg = lara_mini.model_config(config())
    assert (cfg.n_layer, cfg.delta_layers[:3], cfg.window_layers[:3], cfg.sliding_window, cfg.layer_rope(1),
            cfg.layer_rope(3), cfg.moe_experts, cfg.moe_top_k, cfg.moe_shared_gate, cfg.norm_unit_offset,
            cfg.attn_gate) == (34, (0, 2, 5), (1, 4, 6), 512, True, False, 128, 4, False, False, "none")
    for overrides, fragment in ((dict(attention_bias=True), "attention_bias=true"),
                                (dict(shared_expert_intermediate_size=0), "shared_expert_intermediate_size=0"),
                                (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                       "partial_rotary_factor": 0.5}), "partial_rotary_factor=0.5"),
                                (dict(hidden_act="gelu"), "hidden_act='gelu'")):
        with pytest.raises(UserError, match=re.escape(fragment)):
            lara_mini.model_config(config(**overrides))
    with pytest.raises(UserError, match="layer_types"):
        lara_mini.model_config({**config(), "layer_types": ["mamba"] * 34})
    # the split names transformers holds in memory (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, norm)
    hf = hf_folder("lara_mini", tmp_path / "hf")
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    for i in (0, 2):
        d = f"model.layers.{i}.linear_attn."
        for name, t in zip(("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
                           weights.pop(d + "in_proj.weight").split([2 * 2 * 8 + 4 * 12, 4 * 12, 4, 4])):
            weights[f"{d}{name}.weight"] = t
        weights[d + "norm.weight"] = weights.pop(d + "out_norm.weight")
    save_file(weights, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    # exports: a gated delta net beside ungated attention is Lara Mini's, which has no norms by 1 + weight and
    # rotates its windowed layers alone
    base = dict(vocab_size=100, context_len=32, n_layer=2, n_embd=32, n_head=4, delta_layers=(0,), delta_heads=2,
                delta_key_heads=2, delta_key_dim=8, delta_value_dim=8, qk_norm=True, sliding_window=4,
                window_layers=(1,), rope_layer_theta=(0.0, 500.0), moe_experts=4, moe_top_k=2, mlp_hidden=32,
                moe_shared_hidden=32, moe_shared_gate=False)
    assert export_family(ModelConfig(**base)).name == "lara_mini"
    nope = dict(window_layers=(), sliding_window=0, rope_layer_theta=(), pos_emb="none")  # full layers alone
    assert export_family(ModelConfig(**{**base, **nope})).name == "lara_mini"
    for overrides, fragment in ((dict(norm_unit_offset=True), "plain weights"),
                                (dict(window_layers=(), sliding_window=0, rope_layer_theta=()), "windowed"),
                                (dict(moe_shared_gate=True), "shared expert without a gate")):
        with pytest.raises(UserError, match=f"Lara Mini.*{fragment}"):
            export_family(ModelConfig(**{**base, **overrides}))


def test_import_zamba2_reads_its_configs_and_refuses_what_it_cannot_run():
    """Zamba2's config as transformers writes it (Zamba2Config's defaults: Zamba2-2.7B's 54 layers, 9 hybrid, one
    shared block, adapters on the MLP alone): every layer a Mamba-2 mixer alone, the hybrid ones calling the shared
    block; untied embeddings give every caller a block of its own (transformers ties the blocks only with tied
    embeddings); what transformers cannot run or redline's block has not is refused by name, and so is an export
    Zamba2 cannot hold."""
    from redline.interop import zamba2

    def config(**overrides):
        return transformers.Zamba2Config(**overrides).to_dict()

    cfg = zamba2.model_config(config())
    assert (cfg.n_layer, cfg.shared_attn_layers[:3], len(cfg.shared_attn_layers), cfg.shared_attn_blocks,
            cfg.head_dim, cfg.attn_scale, cfg.delta_heads, cfg.delta_value_dim, cfg.delta_norm_eps, cfg.mlp,
            cfg.gelu_approximate, cfg.shared_attn_adapter_rank, cfg.shared_attn_qkv_adapters, cfg.pos_emb) == (
        54, (6, 12, 18), 9, 1, 160, 80 ** -0.5, 8, 640, 1e-5, "geglu", "none", 128, False, "none")
    assert cfg.attention_layers == list(cfg.shared_attn_layers) == list(cfg.parallel_delta_layers)
    untied = zamba2.model_config(config(tie_word_embeddings=False, num_mem_blocks=2))
    assert untied.shared_attn_blocks == 9
    assert zamba2.model_config(config(num_mem_blocks=2)).shared_attn_blocks == 2
    for overrides, fragment in ((dict(add_bias_linear=True), "add_bias_linear=true"),
                                (dict(hidden_act="silu"), "hidden_act='silu'"),
                                (dict(adapter_rank=0), "adapter_rank=0"),
                                (dict(use_shared_attention_adapter=True, num_key_value_heads=8),
                                 "num_key_value_heads=8 with use_shared_attention_adapter=true"),
                                (dict(use_mem_rope=True, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                          "rope_theta": 1e4}),
                                 "rope_type='linear'")):
        with pytest.raises(UserError, match=re.escape(fragment)):
            zamba2.model_config(config(**overrides))
    with pytest.raises(UserError, match="layers_block_type"):
        zamba2.model_config({**config(), "layers_block_type": ["attention"] * 54})
    for overrides, fragment in ((dict(mlp="swiglu"), "GeGLU MLP"),
                                (dict(delta_dt_min=0.0), "model.delta_dt_min=0.0"),
                                (dict(attn_scale=0.0), "(model.attn_scale)"),
                                (dict(delta_norm_eps=1e-6), "1e-05")):
        with pytest.raises(UserError, match=re.escape(fragment)):
            export_family(replace(cfg, **overrides))
    assert export_family(cfg).name == "zamba2"


def test_import_granite_reads_the_hubs_config():
    """granite-3.3-2b-instruct's config.json as the Hub has it: its four scalars as redline's fields (a multiplier of
    1 is none); the scalars must be above 0."""
    from redline.interop.granite import model_config

    hub = {"model_type": "granite", "architectures": ["GraniteForCausalLM"], "vocab_size": 49159, "hidden_size": 2048,
           "intermediate_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
           "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 10000000.0,
           "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True, "embedding_multiplier": 12.0,
           "residual_multiplier": 0.22, "attention_multiplier": 0.015625, "logits_scaling": 8.0}
    cfg = model_config(hub)
    assert (cfg.embed_multiplier, cfg.residual_multiplier, cfg.attn_scale, cfg.logit_divisor, cfg.kv_heads) == \
        (12.0, 0.22, 0.015625, 8.0, 8)
    cfg = model_config({**hub, "embedding_multiplier": 1.0, "residual_multiplier": 1, "logits_scaling": 1.0})
    assert (cfg.embed_multiplier, cfg.residual_multiplier, cfg.logit_divisor) == (0.0, 0.0, 0.0)
    with pytest.raises(UserError, match="logits_scaling=0.0: Granite's scalars must be above 0"):
        model_config({**hub, "logits_scaling": 0})


def test_import_granite4_hybrid_reads_a_hub_style_config():
    """A Granite 4.0 hybrid MoE config.json as the Hub writes them (legacy layer_types "mamba" / "attention",
    position_embedding_type "nope", no time_step_limit, rope_scaling null): Mamba-2 layers as delta_layers with
    delta_rule=mamba2 (heads of mamba_d_head, one group, a state of mamba_d_state), no positions, experts with the
    ungated shared MLP, Granite's scalars."""
    from redline.interop.granite import hybrid_model_config

    hub = {"model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "vocab_size": 49152,
           "hidden_size": 512, "intermediate_size": 1024, "shared_intermediate_size": 512, "num_hidden_layers": 8,
           "num_attention_heads": 8, "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 4096,
           "rms_norm_eps": 1e-05, "rope_theta": 10000, "rope_scaling": None, "attention_bias": False,
           "tie_word_embeddings": True, "embedding_multiplier": 12, "residual_multiplier": 0.22,
           "attention_multiplier": 0.015625, "logits_scaling": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
           "router_aux_loss_coef": 0.0, "output_router_logits": False, "position_embedding_type": "nope",
           "layer_types": ["mamba", "mamba", "mamba", "attention"] * 2, "mamba_chunk_size": 256,
           "mamba_conv_bias": True, "mamba_d_conv": 4, "mamba_d_head": 128, "mamba_d_state": 128, "mamba_expand": 2,
           "mamba_n_groups": 1, "mamba_n_heads": 8, "mamba_proj_bias": False, "normalization_function": "rmsnorm"}
    cfg = hybrid_model_config(hub)
    assert cfg.delta_layers == (0, 1, 2, 4, 5, 6) and cfg.delta_rule == "mamba2" and cfg.pos_emb == "none"
    assert (cfg.delta_heads, cfg.delta_key_heads, cfg.delta_key_dim, cfg.delta_value_dim, cfg.delta_conv_kernel,
            cfg.delta_conv_bias, cfg.delta_proj_bias) == (8, 1, 128, 128, 4, True, False)
    assert (cfg.moe_experts, cfg.moe_top_k, cfg.hidden_dim, cfg.moe_shared_hidden, cfg.moe_shared_gate) == \
        (8, 2, 1024, 512, False)
    assert (cfg.embed_multiplier, cfg.residual_multiplier, cfg.attn_scale, cfg.logit_divisor) == \
        (12.0, 0.22, 0.015625, 2.0)
    dense = hybrid_model_config({**hub, "num_local_experts": 0, "mamba_d_head": "auto"})
    assert (dense.moe_experts, dense.hidden_dim, dense.delta_value_dim) == (0, 512, 128)


def test_import_granite4_refuses_what_it_cannot_run(tmp_path, capsys):
    """Granite 4.0's attention biases, a clamped time step, Mamba-2 widths that do not add up and a layer list of the
    wrong length are one-line errors naming them."""
    hf_folder("granitemoehybrid-mamba", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for edit, fragment in [({"layer_types": ["mamba", "attention"]}, "Granite 4.0 takes 4 entries"),
                           ({"time_step_limit": [0.001, 0.1]}, "time_step_limit=[0.001, 0.1]: redline's Mamba-2 "
                                                                "layers floor the time step"),
                           ({"mamba_d_head": 8}, "mamba_n_heads=8 x mamba_d_head=8 != mamba_expand x hidden_size"),
                           ({"attention_bias": True}, "attention_bias=true"),
                           ({"position_embedding_type": "alibi"}, "position_embedding_type='alibi'")]:
        path.write_text(json.dumps({**config, **edit}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)


def test_import_falcon_h1_reads_a_hub_style_config_and_refuses_what_it_cannot_run(tmp_path, capsys):
    """Falcon-H1-0.5B's config.json as the Hub writes it (mamba_d_ssm apart from mamba_expand, mamba_d_head given,
    µP multipliers, the time step unclamped in {"__float__": "Infinity"} form): every layer attention and Mamba-2 side
    by side, the mixer's output gated without a norm; a clamped time step, in_proj and out_proj biases that differ
    and widths that do not add up are one-line errors naming them."""
    from redline.interop.falcon_h1 import model_config

    hub = {"model_type": "falcon_h1", "vocab_size": 32784, "hidden_size": 1024, "intermediate_size": 2048,
           "num_hidden_layers": 36, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
           "hidden_act": "silu", "max_position_embeddings": 16384, "rms_norm_eps": 1e-05, "rope_theta": 100000000000.0,
           "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "projectors_bias": False,
           "mamba_d_ssm": 1536, "mamba_n_heads": 24, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128,
           "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 128, "mamba_conv_bias": True,
           "mamba_proj_bias": False, "mamba_rms_norm": False, "mamba_norm_before_gate": False,
           "time_step_limit": [0.0, {"__float__": "Infinity"}], "embedding_multiplier": 5.656854249492381,
           "lm_head_multiplier": 0.0390625, "key_multiplier": 0.390625, "attention_in_multiplier": 1.0,
           "attention_out_multiplier": 0.9375, "ssm_in_multiplier": 1.25, "ssm_out_multiplier": 0.23570226039551587,
           "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
           "mlp_multipliers": [0.8838834764831844, 0.5859375]}
    cfg = model_config(hub)
    cfg.validate()
    assert cfg.delta_parallel and cfg.delta_layers == tuple(range(36)) and cfg.attention_layers == list(range(36))
    assert (cfg.delta_heads, cfg.delta_key_heads, cfg.delta_key_dim, cfg.delta_value_dim, cfg.delta_gate_norm,
            cfg.delta_dt_min, cfg.head_dim, cfg.kv_heads, cfg.rope_theta) == (24, 1, 128, 64, "none", 0.0, 64, 2, 1e11)
    assert cfg.embed_multiplier == cfg.logit_divisor == 0.0  # untied: folded into the embedding and the head
    tied = model_config({**hub, "tie_word_embeddings": True})
    assert (tied.embed_multiplier, tied.logit_divisor) == (5.656854249492381, 25.6)
    assert model_config({**hub, "time_step_limit": [0.001, float("inf")]}).delta_dt_min == 0.001
    assert model_config({**hub, "mamba_rms_norm": True}).delta_gate_norm == "after_gate"

    hf_folder("falcon_h1", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for edit, fragment in [({"time_step_limit": [0.001, 0.1]}, "time_step_limit=[0.001, 0.1]"),
                           ({"projectors_bias": True}, "mamba_proj_bias=False with projectors_bias=True"),
                           ({"mamba_d_head": 16}, "mamba_n_heads=8 x mamba_d_head=16 != mamba_d_ssm=64"),
                           ({"attention_bias": True}, "attention_bias=True with mlp_bias=False"),
                           ({"ssm_multipliers": [1.0, 2.0]}, "Falcon-H1 takes 5 (z, x, B, C, dt)"),
                           ({"hidden_act": "gelu"}, "hidden_act='gelu'")]:
        path.write_text(json.dumps({**config, **edit}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)


@pytest.mark.parametrize("overrides, fragment", [
    (dict(delta_layers=(1,)), r"has both on every layer \(model.delta_layers=\(1,\) of 2\)"),
    (dict(residual_multiplier=0.5), "has no residual multiplier"),
    (dict(qk_norm=True), "no QK-norm"),
    (dict(qkv_bias=True), "biases on every attention and MLP Linear layer or none"),
    (dict(rope_dims=4), "rotates whole heads of every layer with one RoPE"),
    (dict(mlp="geglu"), "RMSNorms with weights and SwiGLU MLPs"),
    (dict(delta_norm_eps=1e-3), "model.delta_norm_eps=0.001"),
])
def test_export_falcon_h1_refuses_what_it_has_not(overrides, fragment):
    """A model with Mamba-2 beside attention (model.delta_parallel) goes to Falcon-H1 alone, which refuses by name
    what it cannot hold; the other Mamba-2 architectures refuse the mixer's other norm places."""
    cfg = ModelConfig(vocab_size=100, context_len=32, n_layer=2, n_embd=32, n_head=4, delta_layers=(0, 1),
                      delta_rule="mamba2", delta_parallel=True, delta_heads=4, delta_key_heads=1, delta_key_dim=8,
                      delta_value_dim=8)
    assert export_family(cfg).name == "falcon_h1"
    with pytest.raises(UserError, match=fragment):
        export_family(replace(cfg, **overrides))
    for gate_norm in ("before_gate", "none"):
        for rope_dims in (0, 4):  # Granite 4.0's, Bamba's
            alone = replace(cfg, delta_parallel=False, delta_layers=(0,), delta_gate_norm=gate_norm,
                            rope_dims=rope_dims)
            with pytest.raises(UserError, match=f"after its gate \\(model.delta_gate_norm={gate_norm}\\)"):
                export_family(alone)
@pytest.mark.parametrize("kind", ["nemotron_h", "mamba2", "bamba"])
def test_import_time_step_floor_is_delta_dt_min(kind, tmp_path, capsys):
    """Nemotron-H's time_step_min and Mamba2's and Bamba's time_step_limit (min, inf) are model.delta_dt_min: with a
    floor of 2, above these models' time steps, the logits are transformers', and without it they are not."""
    hf_folder(kind, tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    edit = {"time_step_min": 2.0} if kind == "nemotron_h" else {"time_step_limit": [2.0, {"__float__": "Infinity"}]}
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    assert model.cfg.delta_dt_min == 2.0
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        for i in model.cfg.delta_layers:
            model.blocks[i].attn.dt_min = 0.0
        assert (model(TOKENS) - expected).abs().max() > 1e-3


def test_import_nemotron_h_and_mamba2_refuse_what_they_cannot_run(tmp_path, capsys):
    """Nemotron-H's experts in a latent space (moe_latent_size), Mamba-2 clamps with an upper bound, activations other than theirs and Mamba-2
    models of LayerNorm blocks are one-line errors naming them; Nemotron-H's multi-token-prediction weights are
    ignored, as transformers ignores them."""
    from safetensors.torch import load_file, save_file

    from redline.interop.nemotron_h import mamba2_model_config, model_config

    hf_folder("nemotron_h-legacy", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for edit, fragment in [({"layers_block_type": ["linear_attention", "moe", "full_attention"], "moe_latent_size": 16},
                            "moe_latent_size=16: Nemotron-H's experts then work in a latent space"),
                           ({"mlp_hidden_act": "silu"}, "mlp_hidden_act='silu': Nemotron-H's is relu2"),
                           ({"mlp_bias": True}, "mlp_bias=true"),
                           ({"mamba_n_groups": 3}, "3 groups do not divide 4 heads")]:
        path.write_text(json.dumps({**config, **edit}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)
    cfg = model_config({**config, "layers_block_type": None, "hybrid_override_pattern": "M-E*"})
    assert (cfg.moe_layers, cfg.mixer_free_layers, cfg.moe_dense_hidden) == ((2,), (1, 2), config["intermediate_size"])
    # multi-token-prediction layers: their weights are read by nothing, and the model imports as without them
    path.write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    weights = tmp_path / "hf" / "model.safetensors"
    save_file({**load_file(weights), "mtp.layers.0.norm.weight": torch.ones(64)}, weights, metadata={"format": "pt"})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    mamba = {"model_type": "mamba2", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_heads": 4,
             "head_dim": 16, "n_groups": 1, "state_size": 8, "expand": 2}
    assert mamba2_model_config(mamba).n_head == 4
    for edit, fragment in [({"time_step_limit": [0.0, 0.1]}, r"time_step_limit=\[0.0, 0.1\]: redline's Mamba-2 "
                                                             r"layers floor the time step"),
                           ({"rms_norm": False}, "rms_norm=false"), ({"norm_before_gate": True}, "norm_before_gate"),
                           ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
                           ({"head_dim": 8}, "num_heads=4 x head_dim=8 != expand x hidden_size = 64")]:
        with pytest.raises(UserError, match=fragment):
            mamba2_model_config({**mamba, **edit})


def test_import_mamba_refuses_what_it_cannot_run():
    """A convolution activation other than SiLU is refused by name, for either family; "auto" time_step_rank is
    ceil(hidden_size / 16); intermediate_size wins over expand where given (as transformers' config lets it);
    Falcon-Mamba's mixer_rms_eps becomes model.delta_bcdt_norm_eps and must be above 0."""
    from redline.interop.mamba import falcon_model_config, model_config

    hf = {"model_type": "mamba", "vocab_size": 64, "hidden_size": 40, "num_hidden_layers": 2, "state_size": 8,
          "expand": 2, "time_step_rank": "auto"}
    cfg = model_config(hf)
    assert (cfg.delta_heads, cfg.dt_rank, cfg.delta_bcdt_norm_eps, cfg.tie_embeddings) == (80, 3, 0.0, True)
    assert model_config({**hf, "intermediate_size": 72}).delta_heads == 72
    assert falcon_model_config({**hf, "mixer_rms_eps": 1e-5}).delta_bcdt_norm_eps == 1e-5
    for build in (model_config, falcon_model_config):
        with pytest.raises(UserError, match="hidden_act='gelu': Mamba's convolution is followed by SiLU"):
            build({**hf, "hidden_act": "gelu"})
    with pytest.raises(UserError, match="mixer_rms_eps=0.0: Falcon-Mamba's B, C and dt norms"):
        falcon_model_config({**hf, "mixer_rms_eps": 0.0})


def test_import_jamba_reads_hub_configs_and_stacked_experts_and_refuses_what_it_cannot_run():
    """Jamba-v0.1's config.json as the Hub has it: attention every 8th layer from 4, experts every 2nd from 1 (16,
    top 2, not renormalized), dt of "auto" rank, the B, C and dt norms at rms_norm_eps; a layers_block_type list
    (newer configs) wins over the periods; a file with the experts stacked (transformers' in-memory layout) imports
    with transformers' logits; what Jamba's config says wrong, or redline cannot run, is one line naming it."""
    from redline.interop.families import TensorSource
    from redline.interop.jamba import model_config, to_redline
    from tests.interop_models import hf_model

    hub = {"model_type": "jamba", "vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "attn_layer_period": 8,
           "attn_layer_offset": 4, "expert_layer_period": 2, "expert_layer_offset": 1, "num_experts": 16,
           "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
           "mamba_dt_rank": "auto", "mamba_conv_bias": True, "mamba_proj_bias": False, "rms_norm_eps": 1e-6,
           "use_mamba_kernels": True, "max_position_embeddings": 262144, "tie_word_embeddings": False}
    cfg = model_config(hub)
    assert [i for i in range(32) if i not in cfg.delta_layers] == [4, 12, 20, 28] and cfg.pos_emb == "none"
    assert cfg.moe_layers == tuple(range(1, 32, 2)) and (cfg.moe_experts, cfg.moe_top_k) == (16, 2)
    assert not cfg.moe_norm_topk and cfg.kv_heads == 8 and cfg.mlp_hidden == 14336
    assert (cfg.delta_heads, cfg.dt_rank, cfg.delta_key_dim, cfg.delta_bcdt_norm_eps) == (8192, 256, 16, 1e-6)
    assert cfg.delta_bcdt_norm_weight and cfg.context_len == 262144
    listed = model_config({**hub, "num_hidden_layers": 3, "layers_block_type": ["mamba", "attention", "mamba"],
                           "layers_num_experts": [1, 1, 16]})
    assert listed.delta_layers == (0, 2) and listed.moe_layers == (2,)
    assert not model_config({**hub, "num_experts": 1}).moe_experts  # one expert: a SwiGLU on every layer
    for edit, fragment in [({"hidden_act": "gelu"}, "hidden_act='gelu': Jamba's MLPs and Mamba convolution run SiLU"),
                           ({"attn_layer_offset": 8}, "attn_layer_offset=8 with attn_layer_period=8: Jamba takes "
                                                      "0 <= offset < period"),
                           ({"layers_block_type": ["mamba"]}, "layers_block_type=.'mamba'.: Jamba takes "
                                                              "num_hidden_layers=32 entries")]:
        with pytest.raises(UserError, match=fragment):
            model_config({**hub, **edit})
    hf = hf_model("jamba")
    state = hf.state_dict()  # transformers' in-memory names: experts.gate_up_proj (E, 2F, C), experts.down_proj
    assert "model.layers.1.feed_forward.experts.gate_up_proj" in state
    cfg = model_config(hf.config.to_dict())
    src = TensorSource(state, state.__getitem__, "state")
    model = GPT(cfg)
    model.load_state_dict(to_redline(src, cfg))
    assert not src.unused(lambda name: False)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_import_opt_refuses_the_layouts_it_cannot_express(tmp_path, capsys):
    """opt-350m's post-norm blocks and narrow embedding, and other OPT options redline has no layer for, are one-line
    errors naming them; the position table must hold the context plus OPT's two extra rows."""
    hf_folder("opt", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for edit, fragment in [({"do_layer_norm_before": False}, "do_layer_norm_before=False"),
                           ({"word_embed_proj_dim": 32}, "word_embed_proj_dim=32"),
                           ({"activation_function": "gelu"}, "activation_function='gelu'"),
                           ({"max_position_embeddings": 60}, "embed_positions has 66 rows")]:
        path.write_text(json.dumps({**config, **edit}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)


def test_import_gpt_bigcode_reads_santacoders_config_and_refuses_what_it_cannot_run(tmp_path, capsys):
    """SantaCoder's config.json as the Hub has it (transformers-format: multi-query, tanh-GELU) reads as
    transformers reads it; options redline cannot run are one-line errors naming them."""
    from redline.interop.gpt_bigcode import model_config

    santacoder = {"model_type": "gpt_bigcode", "architectures": ["GPTBigCodeForCausalLM"], "vocab_size": 49280,
                  "n_positions": 2048, "n_embd": 2048, "n_layer": 24, "n_head": 16, "n_inner": 8192,
                  "activation_function": "gelu_pytorch_tanh", "layer_norm_epsilon": 1e-05, "multi_query": True,
                  "scale_attn_weights": True, "attention_softmax_in_fp32": True}
    cfg = model_config(santacoder)
    assert (cfg.kv_heads, cfg.head_dim, cfg.hidden_dim, cfg.attn_scale, cfg.gelu_approximate, cfg.tie_embeddings,
            cfg.bias) == (1, 128, 8192, 0.0, "tanh", True, True)
    assert model_config({**santacoder, "multi_query": False, "scale_attn_weights": False}).kv_heads == 16
    hf_folder("gpt_bigcode", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for edit, fragment in [({"activation_function": "relu"}, "activation_function='relu'"),
                           ({"add_cross_attention": True}, "add_cross_attention=true")]:
        path.write_text(json.dumps({**config, **edit}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)


def test_import_gpt_neo_reads_its_layer_types_and_refuses_what_it_cannot_run(tmp_path, capsys):
    """gpt-neo-1.3B's config.json as the Hub has it (attention_types as pattern and repeats) reads as transformers
    expands it: the local layers windowed, scores unscaled; bad layer types are one-line errors naming them."""
    from redline.interop.gpt_neo import model_config

    neo = {"model_type": "gpt_neo", "architectures": ["GPTNeoForCausalLM"], "vocab_size": 50257,
           "max_position_embeddings": 2048, "hidden_size": 2048, "num_layers": 24, "num_heads": 16,
           "attention_types": [[["global", "local"], 12]], "window_size": 256, "intermediate_size": None,
           "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05}
    cfg = model_config(neo)
    assert (cfg.sliding_window, cfg.window_layers, cfg.attn_scale, cfg.has_qkv_bias, cfg.bias, cfg.hidden_dim,
            cfg.tie_embeddings) == (256, tuple(range(1, 24, 2)), 1.0, False, True, 8192, True)
    every = model_config({**neo, "attention_types": [[["global"], 24]]})
    assert (every.sliding_window, every.window_layers) == (0, ())
    hf_folder("gpt_neo", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for edit, fragment in [({"attention_types": [[["global", "sparse"], 1]]}, "attention_types holds 'sparse'"),
                           ({"attention_types": [[["global"], 3]]}, "gives 3 layers, num_layers is 2"),
                           ({"activation_function": "relu"}, "activation_function='relu'")]:
        path.write_text(json.dumps({**config, **edit}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)


def test_import_gptj_and_codegen_read_the_hubs_configs_and_refuse_what_they_cannot_run(tmp_path, capsys):
    """GPT-J-6B's and codegen-350M-mono's config.json as the Hub has them read as transformers reads them (RoPE on the
    first rotary_dim of each head, base 10000); options redline cannot run are one-line errors naming them."""
    from redline.interop.gptj import codegen_model_config, model_config

    gptj6b = {"model_type": "gptj", "architectures": ["GPTJForCausalLM"], "vocab_size": 50400, "n_positions": 2048,
              "n_embd": 4096, "n_layer": 28, "n_head": 16, "rotary_dim": 64, "n_inner": None,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, "tie_word_embeddings": False}
    cfg = model_config(gptj6b)
    assert (cfg.head_dim, cfg.rope_dims, cfg.rope_theta, cfg.parallel_shared_norm, cfg.head_bias, cfg.has_qkv_bias,
            cfg.bias, cfg.hidden_dim, cfg.tie_embeddings) == (256, 64, 10000.0, True, True, False, True, 16384, False)
    codegen = {**gptj6b, "model_type": "codegen", "n_embd": 1024, "n_layer": 20, "rotary_dim": 32, "n_ctx": 2048,
               "vocab_size": 51200}
    assert (codegen_model_config(codegen).head_dim, codegen_model_config(codegen).rope_dims) == (64, 32)
    with pytest.raises(UserError, match="n_embd=1022: CodeGen's qkv_proj is 4 blocks"):
        codegen_model_config({**codegen, "n_embd": 1022, "n_head": 2})
    hf_folder("gptj", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for edit, fragment in [({"rotary_dim": None}, "rotary_dim=null"), ({"rotary_dim": 5}, "rotary_dim=5"),
                           ({"activation_function": "relu"}, "activation_function='relu'")]:
        path.write_text(json.dumps({**config, **edit}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)
def test_import_bloom_and_mpt_refuse_what_they_cannot_express(tmp_path, capsys):
    """BLOOM's residual after the norm and MPT's options that transformers does not compute or redline has no layer
    for are one-line errors naming them."""
    for kind, edits in [("bloom", [({"apply_residual_connection_post_layernorm": True},
                                    "apply_residual_connection_post_layernorm=true")]),
                        ("mpt", [({"attn_config": {"clip_qkv": 6.0}}, "attn_config.clip_qkv=6.0"),
                                 ({"attn_config": {"qk_ln": True}}, "attn_config.qk_ln=true"),
                                 ({"attn_config": {"alibi": False}}, "attn_config.alibi=false"),
                                 ({"attn_config": {"alibi_bias_max": 16}}, "attn_config.alibi_bias_max=16"),
                                 ({"attn_config": {"prefix_lm": True}}, "attn_config.prefix_lm=true"),
                                 ({"attn_config": {"attn_type": "multiquery_attention"}}, "multiquery_attention"),
                                 ({"no_bias": False}, "no_bias=false"),
                                 ({"norm_type": "rmsnorm"}, "norm_type='rmsnorm'"),
                                 ({"logit_scale": "sqrt"}, "logit_scale='sqrt'")])]:
        hf_folder(kind, tmp_path / kind)
        path = tmp_path / kind / "config.json"
        config = json.loads(path.read_text())
        for edit, fragment in edits:
            path.write_text(json.dumps({**config, **edit}))
            _expect_import_error(tmp_path / kind, tmp_path / "out", capsys, fragment)


def test_import_falcon_refuses_what_transformers_or_redline_cannot_run(tmp_path, capsys):
    """Falcon-RW's ALiBi (scaled with the scores, bfloat16-rounded: not redline's), the flag combinations
    transformers' layer fails on, and activations other than the GELUs are one-line errors naming them."""
    hf_folder("falcon", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for edit, fragment in [({"alibi": True}, "alibi=true (Falcon-RW)"),
                           ({"new_decoder_architecture": True, "parallel_attn": False},
                            "new_decoder_architecture=true with parallel_attn=false"),
                           ({"num_ln_in_parallel_attn": 2}, "num_ln_in_parallel_attn=2 without new_decoder"),
                           ({"multi_query": False, "num_kv_heads": 2}, "num_kv_heads=2 with multi_query=false"),
                           ({"activation": "relu"}, "activation='relu'")]:
        path.write_text(json.dumps({**config, **edit}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, fragment)


def test_falcon_alibi_is_not_redlines():
    """Why alibi=true is refused: Falcon's bias per key position, as its model adds it to the scaled scores (divided
    by sqrt(head width), rounded to bfloat16), is not redline's ALiBi bias for any shift along a query's row; both
    taken for 4 heads 8 wide, the last query of 40 positions."""
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    from redline.model import alibi_bias

    H, D, T = 4, 8, 40
    theirs = build_alibi_tensor(torch.ones(1, T, dtype=torch.long), H, torch.float32)[:, 0] / D ** 0.5  # (H, T)
    pos = torch.arange(T)
    ours = alibi_bias(H, pos, pos)[:, -1]  # (H, T): the last query's row, -m_h·(T - 1 - j)
    shift = (theirs - ours)[:, :1]
    assert not torch.allclose(theirs - shift, ours, atol=1e-4)
    # the slopes are BLOOM's: what differs is the scale and the rounding (to bfloat16's 8 bits)
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom_alibi

    bloom = bloom_alibi(torch.ones(1, T, dtype=torch.long), H, torch.float32)[:, 0]
    torch.testing.assert_close(theirs * D ** 0.5, bloom, rtol=2 ** -7, atol=0)
    torch.testing.assert_close(bloom - bloom[:, -1:], ours, rtol=1e-6, atol=1e-6)


def test_import_falcon_reads_the_hubs_configs():
    """falcon-7b's and falcon-40b's config.json as the Hub has them (falcon-7b without num_kv_heads or
    max_position_embeddings; falcon-40b without num_ln_in_parallel_attn: two norms), and Falcon2-11B's."""
    from redline.interop.falcon import model_config

    base = {"model_type": "falcon", "architectures": ["FalconForCausalLM"], "alibi": False,
            "apply_residual_connection_post_layernorm": False, "bias": False, "layer_norm_epsilon": 1e-5,
            "vocab_size": 65024}
    f7 = model_config({**base, "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
                       "multi_query": True, "new_decoder_architecture": False, "parallel_attn": True})
    assert (f7.kv_heads, f7.head_dim, f7.hidden_dim, f7.context_len, f7.rope_theta) == (1, 64, 18176, 2048, 10000.0)
    assert f7.parallel_residual and f7.parallel_shared_norm and not f7.bias and f7.tie_embeddings
    assert f7.gelu_approximate == "none"
    f40 = model_config({**base, "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60,
                        "num_kv_heads": 8, "new_decoder_architecture": True, "parallel_attn": True})
    assert (f40.kv_heads, f40.parallel_residual, f40.parallel_shared_norm) == (8, True, False)
    f11 = model_config({**base, "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 60,
                        "num_kv_heads": 8, "new_decoder_architecture": True, "num_ln_in_parallel_attn": 1,
                        "rope_theta": 500042, "max_position_embeddings": 8192, "tie_word_embeddings": False})
    assert (f11.kv_heads, f11.parallel_shared_norm, f11.rope_theta, f11.context_len) == (8, True, 500042.0, 8192)


def test_import_bloom_reads_n_embed_and_mpt_its_logit_scale(tmp_path, capsys):
    """BLOOM's older configs name the width n_embed (bloom-560m's); MPT's logit_scale multiplies the logits in
    MosaicML's code (transformers leaves it out): imported as logit_divisor, the logits transformers' times it."""
    from redline.interop.bloom import model_config

    hub = {"model_type": "bloom", "vocab_size": 250880, "n_embed": 1024, "n_head": 16, "n_layer": 24,
           "layer_norm_epsilon": 1e-5, "apply_residual_connection_post_layernorm": False, "pretraining_tp": 1,
           "slow_but_exact": False, "offset_alibi": 100}
    cfg = model_config(hub)
    assert (cfg.n_embd, cfg.n_head, cfg.n_layer, cfg.hidden_dim, cfg.context_len) == (1024, 16, 24, 4096, 2048)
    hf = hf_folder("mpt", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "logit_scale": "inv_sqrt_d_model"}))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    assert model.cfg.logit_divisor == 8.0  # sqrt(64)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits / 8.0, rtol=1e-5, atol=1e-5)


def test_import_olmo2_attention_bias_is_refused_by_name(tmp_path, capsys):
    """OLMo 2's attention_bias puts a bias on o_proj with none in the MLP, which redline's biases cannot express."""
    hf_folder("olmo2", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "attention_bias": True}))
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, "attention_bias=true")


def test_import_llama3_rope_takes_the_context_when_the_original_is_not_given(tmp_path, capsys):
    """transformers reads a llama3 rope_scaling without original_max_position_embeddings as the model's
    max_position_embeddings: so does the import, logit for logit."""
    hf_folder("llama-untied-rope3", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(config.get(key), dict):
            config[key].pop("original_max_position_embeddings", None)
    path.write_text(json.dumps(config))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ok")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ok")
    assert model.cfg.rope_original_context == 64
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("extra", [{"attention_factor": 1.25, "beta_fast": 16, "beta_slow": 2},
                                   {"mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False}])
def test_import_yarn_reads_its_optional_parameters_as_transformers_does(extra, tmp_path, capsys):
    """YaRN's attention factor given, or derived from DeepSeek-style mscale / mscale_all_dim, other ramp ends and an
    untruncated band: logits equal transformers', and the export writes them back (from_pretrained: equal logits)."""
    hf_folder("qwen3-yarn", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(config.get(key), dict):
            config[key].update(extra)
    path.write_text(json.dumps(config))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.model.rotary_emb.attention_scaling != 1.0
    code, out, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ok")], capsys)
    assert code == 0, err
    assert "context 64 (yarn RoPE ×2 over 32)" in out  # the summary names the scaling it read
    model, _, _ = load_for_inference(tmp_path / "ok")
    code, _, err = run_cli(["export", str(tmp_path / "ok"), "--out", str(tmp_path / "back")], capsys)
    assert code == 0, err
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(back(TOKENS).logits, expected, rtol=1e-5, atol=1e-5)


def test_ministral3_context_stops_where_its_query_scale_starts(tmp_path, capsys):
    """Ministral 3 scales its queries by 1 + beta · ln(1 + floor(position / original)), which redline has not: the
    import stops the context at the original one, below which the scale is 1 (a longer context would differ from
    transformers from there on); its own writer gives a Ministral3ForCausalLM with the source's logits;
    Ministral3Config's defaults read as 16,384 tokens of YaRN ×16, a config without the scale keeps its whole context."""
    from redline.interop.families import _families
    from redline.interop.llama import ministral3_model_config

    hf, model, tokenizer, _ = imported("ministral3", tmp_path, capsys)
    assert model.cfg.context_len == 32  # max_position_embeddings 64, original_max_position_embeddings 32
    longer = GPT(replace(model.cfg, context_len=64)).eval()
    longer.load_state_dict(model.state_dict())
    tokens = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected, got = hf(tokens).logits, longer(tokens)
    torch.testing.assert_close(got[:, :32], expected[:, :32], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got[:, 32:], expected[:, 32:], rtol=1e-3, atol=1e-3)

    back = written_and_loaded(tmp_path, model, tokenizer, _families()["ministral3"])
    with torch.no_grad():
        torch.testing.assert_close(back(TOKENS).logits, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)

    defaults = transformers.Ministral3Config().to_dict()  # Ministral-3-8B's shape, YaRN and query scale
    cfg = ministral3_model_config(defaults)
    assert (cfg.context_len, cfg.rope_scaling, cfg.rope_factor, cfg.rope_original_context, cfg.rope_attention_factor,
            cfg.sliding_window) == (16384, "yarn", 16.0, 16384, 1.0, 0)
    unscaled = {**defaults, "rope_parameters": {**defaults["rope_parameters"], "llama_4_scaling_beta": 0.0}}
    assert ministral3_model_config(unscaled).context_len == 262144
    params = {k: v for k, v in defaults["rope_parameters"].items() if k != "original_max_position_embeddings"}
    with pytest.raises(UserError, match="llama_4_scaling_beta without original_max_position_embeddings"):
        ministral3_model_config({**defaults, "rope_parameters": params})


def test_import_ignores_an_eos_id_outside_the_vocabulary_with_a_warning(tmp_path, capsys):
    """A small GPT-2 built with GPT2Config's default eos_token_id (50256): transformers warns and loads it."""
    hf_folder("gpt2", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "eos_token_id": 50256}))
    generation = tmp_path / "hf" / "generation_config.json"
    if generation.exists():
        generation.write_text(json.dumps({**json.loads(generation.read_text()), "eos_token_id": 50256}))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ok")], capsys)
    assert code == 0, err
    assert "eos_token_id [50256] is outside the tokenizer's" in err


def test_import_sharded_and_missing_shard(tmp_path, capsys):
    hf = hf_folder("llama-gqa-tied", tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").unlink()
    hf.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    shards = sorted((tmp_path / "hf").glob("model-*.safetensors"))
    assert len(shards) > 1
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ok")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ok")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    shards[-1].unlink()
    _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, f"shard {shards[-1].name}")


def _gpt2_bin_state(hf) -> dict:
    """hf's weights as OpenAI's gpt2 pytorch_model.bin holds them: GPT2Model's names (no head: it is tied) and the
    causal-mask buffers older transformers saved."""
    state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    for i in range(hf.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return state


def test_import_pytorch_bin_single_sharded_and_damaged(tmp_path, capsys):
    hf = hf_folder("gpt2", tmp_path / "hf")
    folder = tmp_path / "hf"
    (folder / "model.safetensors").unlink()
    state = _gpt2_bin_state(hf)
    torch.save(state, folder / "pytorch_model.bin")
    code, _, err = run_cli(["import", str(folder), "--out", str(tmp_path / "one")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "one")
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
    # two shards and their index, as transformers wrote large models before safetensors
    (folder / "pytorch_model.bin").unlink()
    names = sorted(state)
    shards = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for shard, keys in shards.items():
        torch.save({k: state[k] for k in keys}, folder / shard)
    index = {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    code, _, err = run_cli(["import", str(folder), "--out", str(tmp_path / "two")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "two")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
    last = folder / "pytorch_model-00002-of-00002.bin"
    last.write_bytes(last.read_bytes()[:200])  # truncated
    _expect_import_error(folder, tmp_path / "out", capsys, "damaged or incomplete")
    torch.save({"weights": state, "optimizer": Fraction(1, 3)}, last)  # an object weights_only refuses
    _expect_import_error(folder, tmp_path / "out", capsys, "holds more than tensors")


def test_import_converts_a_vocab_and_merges_tokenizer_as_transformers_does(tmp_path, capsys):
    hf_folder("gpt2", tmp_path / "hf")
    folder = tmp_path / "hf"
    model = json.loads((folder / "tokenizer.json").read_text())["model"]
    (folder / "tokenizer.json").unlink()  # an older upload: the slow tokenizer's files only
    (folder / "vocab.json").write_text(json.dumps(model["vocab"]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "model_max_length": 64}))
    code, _, err = run_cli(["import", str(folder), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    _, tokenizer, _ = load_for_inference(tmp_path / "ckpt")
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in ["hello world, the model", "Ünïcödé café 日本 1234\ttabs", "  spaces  and\nnewlines ",
                 "says hi<|endoftext|>hello"]:
        ids = reference(text)["input_ids"]
        assert tokenizer.encode_prompt(text) == ids, text
        assert tokenizer.decode(ids) == reference.decode(ids, skip_special_tokens=True), text
    (folder / "merges.txt").unlink()  # vocab.json alone is no tokenizer
    _expect_import_error(folder, tmp_path / "out", capsys, "--tokenizer PATH")


def test_import_converts_a_sentencepiece_model_as_transformers_does(tmp_path, capsys):
    spm = pytest.importorskip("sentencepiece")
    import io

    hf_folder("llama-gqa-tied", tmp_path / "hf")
    folder = tmp_path / "hf"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()  # Llama 2's older uploads: tokenizer.model alone
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["hello world, the model reads tokens", "Ünïcödé café 日本 1234 says hi"] * 40),
        model_writer=model, vocab_size=VOCAB, model_type="bpe", byte_fallback=True, character_coverage=1.0,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "legacy": False}))
    code, _, err = run_cli(["import", str(folder), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    _, tokenizer, _ = load_for_inference(tmp_path / "ckpt")
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in ["hello world", " two  spaces", "日本 x\nnewline ☃", "says hi</s>x"]:
        ids = reference(text)["input_ids"]
        assert ids[0] == 1 and tokenizer.encode_prompt(text) == ids, text  # BOS first, as transformers adds it
        assert tokenizer.decode(ids) == reference.decode(ids, skip_special_tokens=True), text


def test_import_refuses_existing_out_and_unknown_source(tmp_path, capsys):
    hf_folder("gpt2", tmp_path / "hf")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "taken")], capsys)
    assert code == 2 and "already exists" in err
    _expect_import_error(tmp_path / "nowhere", tmp_path / "out", capsys, "does not exist")
    (tmp_path / "weights.bin").write_bytes(b"0")
    _expect_import_error(tmp_path / "weights.bin", tmp_path / "out", capsys, "not a .gguf")


def test_hub_name_offline_says_how_to_pass_a_folder(tmp_path, capsys, monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty cache
    _expect_import_error("SomeOrg/some-model-redline-test", tmp_path / "out", capsys, "--local-dir DIR")


def test_hub_name_from_the_cache_with_pytorch_bin_weights(tmp_path, capsys, monkeypatch):
    pytest.importorskip("huggingface_hub")
    import shutil

    # huggingface_hub's cache layout, as `hf download` leaves it, of an upload with pytorch_model.bin only
    repo = tmp_path / "hf-home" / "hub" / "models--SomeOrg--old-gpt2"
    commit = "0123456789abcdef0123456789abcdef01234567"
    hf = hf_folder("gpt2", repo / "snapshots" / commit)
    (repo / "snapshots" / commit / "model.safetensors").unlink()
    torch.save(_gpt2_bin_state(hf), repo / "snapshots" / commit / "pytorch_model.bin")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from huggingface_hub import constants  # read from HF_HOME when huggingface_hub is imported, as it already is

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    code, _, err = run_cli(["import", "SomeOrg/old-gpt2", "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    shutil.rmtree(repo / "snapshots" / commit)  # the name no longer in the cache: the offline error
    _expect_import_error("SomeOrg/old-gpt2", tmp_path / "out", capsys, "--local-dir DIR")


def test_imported_checkpoint_works_with_generate_and_eval_commands(tmp_path, capsys):
    _, _, _, ckpt = imported("qwen3", tmp_path, capsys)
    code, out, err = run_cli(["generate", "--checkpoint", str(ckpt), "--prompt", "hello world",
                              "--max-new-tokens", "5", "--temperature", "0", "--jsonl", "-"], capsys)
    assert code == 0, err
    row = json.loads(out.strip().splitlines()[-1])
    assert row["prompt"] == "hello world" and row["completion_tokens"] <= 5


def test_generate_samples_as_the_imported_models_generation_config_recommends(tmp_path, capsys):
    """An imported model's generation_config.json sets the sampling a command line leaves out (as vLLM and
    transformers' generate use it): temperature 0 there is greedy decoding, token for token transformers'."""
    hf = hf_folder("llama-gqa-tied", tmp_path / "hf")
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [1, 2], "temperature": 0.0, "top_p": 0.9, "top_k": "20", "do_sample": True}))
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    argv = ["generate", "--checkpoint", str(tmp_path / "ckpt"), "--prompt", "hello world", "--max-new-tokens", "6",
            "--no-stop-at-eot", "--jsonl", "-"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "temperature 0, top_p 0.9, from the model's generation_config.json" in err  # top_k "20": not a number
    _, tokenizer, _ = load_for_inference(tmp_path / "ckpt")
    prompt = tokenizer.encode_prompt("hello world")
    hf.generation_config.eos_token_id = None
    reference = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0)
    expected = tokenizer.decode(reference[0, len(prompt):].tolist())
    assert json.loads(out.strip().splitlines()[-1])["completion"] == expected
    # given on the command line, a setting is the user's: sampled with a seed, nothing taken from the model
    code, out, err = run_cli(argv + ["--temperature", "1.5", "--top-p", "1", "--seed", "3"], capsys)
    assert code == 0 and "generation_config" not in err, err


def test_import_shard_index_without_shards(tmp_path, capsys):
    hf_folder("gpt2", tmp_path / "hf")
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        (tmp_path / "hf" / "model.safetensors").unlink(missing_ok=True)
        (tmp_path / "hf" / index).write_text(json.dumps({"metadata": {}, "weight_map": {}}))
        _expect_import_error(tmp_path / "hf", tmp_path / "out", capsys, "names no shard files")
        (tmp_path / "hf" / index).unlink()


def test_hub_download_fetches_the_files_the_index_names_and_nothing_else(tmp_path, capsys, monkeypatch):
    """Online: configs and tokenizer first, then the weights the index names; a second copy of the weights that
    some repositories hold (Mistral's consolidated.safetensors) is never fetched. The Hub is a local folder here."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    import fnmatch
    import shutil

    from huggingface_hub import errors

    from redline.interop import hub

    repo = tmp_path / "repo"
    hf = hf_folder("llama-gqa-tied", repo)
    (repo / "model.safetensors").unlink()
    hf.save_pretrained(repo, max_shard_size="40KB")
    (repo / "consolidated.safetensors").write_bytes(b"not fetched")
    fetched = []

    def snapshot_download(name, revision=None, allow_patterns=None, local_files_only=False):
        if local_files_only:
            raise errors.LocalEntryNotFoundError("not cached")
        out = tmp_path / "snapshot"
        out.mkdir(exist_ok=True)
        for f in repo.iterdir():
            if any(fnmatch.fnmatch(f.name, p) for p in allow_patterns):
                shutil.copy(f, out / f.name)
                fetched.append(f.name)
        return str(out)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr("redline.tokenizer._can_reach", lambda host: True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    folder = hub.download("SomeOrg/sharded")
    shards = sorted(p.name for p in repo.glob("model-*.safetensors"))
    assert len(shards) > 1 and sorted(f for f in fetched if f.endswith(".safetensors")) == shards
    code, _, err = run_cli(["import", str(folder), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_export_in_shards_as_save_pretrained_writes_them(tmp_path, capsys):
    hf, _, _, ckpt = imported("qwen2", tmp_path, capsys)
    out = tmp_path / "exported"
    code, _, err = run_cli(["export", str(ckpt), "--out", str(out), "--max-shard-size", "40KB"], capsys)
    assert code == 0, err
    shards = sorted(p.name for p in out.glob("model-*-of-*.safetensors"))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(shards) > 1 and not (out / "model.safetensors").exists()
    assert sorted(set(index["weight_map"].values())) == shards
    back, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(TOKENS).logits, hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    from safetensors.torch import load_file

    stored = [t for shard in shards for t in load_file(str(out / shard)).values()]
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in stored)
    code, _, err = run_cli(["export", str(ckpt), "--out", str(tmp_path / "bad"), "--max-shard-size", "lots"], capsys)
    assert code == 2 and "--max-shard-size 'lots' is not a size" in err and not (tmp_path / "bad").exists(), err


def _mxfp4_packed(shape: tuple[int, ...], generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 blocks (..., rows, cols / 32, 16) and E8M0 scales (..., rows, cols / 32) for a (..., rows, cols)
    weight: every FP4 code, scales 2^-9 .. 2^-5 (weights of a few hundredths, as a trained model's)."""
    *lead, cols = shape
    blocks = torch.randint(0, 256, (*lead, cols // 32, 16), generator=generator, dtype=torch.uint8)
    scales = torch.randint(127 - 9, 127 - 4, (*lead, cols // 32), generator=generator, dtype=torch.uint8)
    return blocks, scales


def test_mxfp4_dequantizes_as_transformers_does():
    """redline's MXFP4 reader against transformers' own (integrations/mxfp4.py, which also transposes to its
    in-memory (E, cols, rows) layout), every code and the whole scale range, NaN's 255 aside."""
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    from redline.interop.gpt_oss import dequantize_mxfp4

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(0, 255, (3, 10, 4), generator=g, dtype=torch.uint8)
    for dtype in (torch.float32, torch.bfloat16):
        want = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # (3, 128, 10)
        got = dequantize_mxfp4(blocks, scales, dtype)  # (3, 10, 128)
        assert got.dtype == dtype and torch.equal(got.transpose(1, 2), want)
    assert dequantize_mxfp4(torch.tensor([[[0x21] + [0] * 15]], dtype=torch.uint8),
                            torch.tensor([[128]], dtype=torch.uint8))[0, :2].tolist() == [1.0, 2.0]  # low nibble first


def test_import_gpt_oss_with_mxfp4_experts(tmp_path, capsys):
    """A GPT-OSS folder whose experts are MXFP4 as the released checkpoints store them (`*_blocks`, `*_scales` in
    place of gate_up_proj and down_proj, a quantization_config): the import dequantizes them, logits equal to
    transformers' model holding the same values; the other weights' dtype (fp32) is what the import stores. Other
    quantizations, and GGUF export, are refused by name."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from tests.interop_models import hf_folder

    folder = tmp_path / "hf"
    hf = hf_folder("gpt_oss", folder)
    state = load_file(str(folder / "model.safetensors"))
    g = torch.Generator().manual_seed(2)
    for i, layer in enumerate(hf.model.layers):
        experts, x = layer.mlp.experts, f"model.layers.{i}.mlp.experts."
        for name in ("gate_up_proj", "down_proj"):
            param = getattr(experts, name)  # (E, cols, rows): the packed tensors hold rows of cols
            blocks, scales = _mxfp4_packed((param.shape[0], param.shape[2], param.shape[1]), g)
            with torch.no_grad():
                param.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
            del state[x + name]
            state[x + name + "_blocks"], state[x + name + "_scales"] = blocks, scales
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (folder / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(["import", str(folder), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    assert model.blocks[0].mlp.fc.dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--format", "gguf", "--out", str(tmp_path / "g")], capsys)
    assert code == 2 and "clamps its SwiGLU at 7" in err, err  # llama.cpp's gpt-oss: a constant (this clamp is 0.3)
    config["quantization_config"] = {"quant_method": "bitsandbytes"}
    (folder / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(["import", str(folder), "--out", str(tmp_path / "ckpt2")], capsys)
    assert code == 2 and "quant_method='bitsandbytes'" in err, err
