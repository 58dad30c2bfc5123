"""The text model of multimodal folders (redline/interop/multimodal.py): tiny Gemma3ForConditionalGeneration,
Mistral3ForConditionalGeneration (a mistral, ministral3 or mistral4 text model),
Qwen3VLForConditionalGeneration and the LLaVA-like ForConditionalGeneration models
(LLaVA, LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL, Qwen2.5-VL, InternVL, SmolVLM, Idefics3, Aya Vision, Command A
Vision, LFM2-VL, VipLLaVA, Video-LLaVA, LLaVA-NeXT-Video, Qwen3-VL-MoE, GLM-4.1V, GLM-4.5V, HunYuan-VL, EXAONE 4.5,
Granite 4.0 Vision, Llama 3.2 Vision) with a one-layer vision tower, saved by transformers with
their processor files beside them, in one table (CASES); import -> the multimodal model's logits on text and its
greedy tokens through redline's engine, in both save layouts where the Hub's differs from save_pretrained's
(language_model.model., which transformers 5.24's save_pretrained writes for Gemma 3 and Mistral 3 as their Hub
folders have it, and model.language_model., Qwen3-VL's; Qwen2-VL's model. and visual.); export -> the text-only
family, loaded with no missing or unexpected keys; the head's tying as each config class settles it; the
refusals (the Inkling folders). Also Apertus1p5ForConditionalGeneration (one-stage image and audio tokenizers),
CohereCompassForConditionalGeneration (Qwen3-VL's tower), AriaForConditionalGeneration (Idefics3's tower and a
cross-attention projector), MiniMaxM3SparseForConditionalGeneration, MistralLarge4ForConditionalGeneration and
HYV4VLForConditionalGeneration and Glm5NextForConditionalGeneration (GLM-5.3-Next: import only) and
Gemma4UnifiedForConditionalGeneration (its embedders, no towers). Round 3 (part A): Kimi K2.5, GLM-4.6V and GLMGA,
GLM-OCR, ERNIE 4.5 VL, PaddleOCR-VL, LFM3-VL, MiniCPM-V 4.6/4.7 and MiniCPM-OCR, Qianfan-OCR, DeepSeek-VL (and
hybrid), Cosmos 3 Reasoner and Edge, DeepSeek-OCR 2 (import only) and Nemotron-H Omni, in their save layouts;
Step 3.7 (import only: tests/test_step3p5.py for the rest); Unlimited-OCR (import only: reference sliding
windows). Round 3 (part B):
Idefics2, PerceptionLM, FastVLM, LightOnOCR, Janus, Ovis2 and VideoLLaMA 3 (LLaVA-like), the Qwen2.5-Omni and
Qwen3-Omni-MoE thinkers (a vision tower and an audio encoder), Granite-Docling, HyperCLOVA X SEED Vision, Emu3 (a
VQ-VAE, no tower), Molmo2 (its Hub layout, a head narrower than the embedding), Chameleon (chameleon.py: per-head QK
LayerNorms, its image tokens' logits masked) and ShieldGemma2ForImageClassification (Gemma 3's model one level down,
its yes/no logits the text model's)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from redline.errors import UserError
from redline.inference import InferenceEngine, SamplingParams
from redline.training.checkpoint import load_for_inference
from tests.interop_models import FAMILIES, VOCAB, byte_level_tokenizer, causal_lm_class
from tests.test_interop import run_cli

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROCESSOR_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def _gemma3_config(config_class=None, **top):
    """Gemma 3's text model as tests/interop_models.py's gemma3 (windowed - full - windowed, the full layer's linear
    RoPE scaling, head_dim 24, query_pre_attn_scalar 20), the image tokens the vocabulary's last three; config_class
    ShieldGemma2Config: ShieldGemma 2's, `top` its own fields."""
    return (config_class or transformers.Gemma3Config)(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=20,
                         sliding_window=5, max_position_embeddings=64, rms_norm_eps=1e-5,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                             "rope_theta": 5000.0},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}}),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=VOCAB - 1, boi_token_index=VOCAB - 2, eoi_token_index=VOCAB - 3,
        **top)


def _mistral3_config(**text):
    """Mistral Small 3.1's layout: a mistral text model (untied head, a window shorter than the test sequences)
    beside a Pixtral tower; `text` overrides text_config's fields (None: left out)."""
    return transformers.Mistral3Config(
        text_config={k: v for k, v in {**dict(model_type="mistral", vocab_size=VOCAB, hidden_size=64,
                                                 intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                                 num_key_value_heads=2, head_dim=16, sliding_window=5,
                                                 max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500.0),
                                          **text}.items() if v is not None},
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           head_dim=16, image_size=28, patch_size=14),
        image_token_index=VOCAB - 1, tie_word_embeddings=False)


def _ministral3_config():
    """Ministral 3's layout: Mistral3ForConditionalGeneration around a ministral3 text model (YaRN with Llama 4's
    query scale past the original context of 32), as tests/interop_models.py's ministral3: read, as a ministral3
    folder is, up to that context, where it is Mistral's model."""
    return _mistral3_config(model_type="ministral3", rope_theta=None,
                            rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0,
                                             "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                             "llama_4_scaling_beta": 0.1})


def _mistral3_mistral4_config():
    """Mistral-Small-4's layout: Mistral3ForConditionalGeneration around a mistral4 text model (latent attention,
    grouped softmax experts after a dense first layer, YaRN with Llama 4's query scale past the original context of
    32), as tests/interop_models.py's mistral4: read, as a mistral4 folder is, up to that context."""
    text = dict(model_type="mistral4", vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                max_position_embeddings=64, rms_norm_eps=1e-5, **FAMILIES["mistral4"][2])
    return transformers.Mistral3Config(
        text_config=text, vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, head_dim=16, image_size=28, patch_size=14),
        image_token_index=VOCAB - 1, tie_word_embeddings=False)


def _mistral_large4_config():
    """Mistral Large 4's folder: its text model (no Q-LoRA; layers 1 and 3 without RoPE; layer 2 reading layer 0's
    cache and layer 3 layer 1's; a dense first layer, then top 2 of 8 softmax experts in 4 groups, the best 2 kept,
    beside a shared one; the indexer on layers 0 and 2, index_topk 32 keeping every key of the test sequences: the
    import's context stops there; YaRN with a unit attention factor; the logits capped at 30) beside a Pixtral tower.
    The perturbation moves LeRoPE's alpha and the queries' position scales off their no-op inits."""
    text = dict(model_type="mistral_large4_text", vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                num_hidden_layers=4, max_position_embeddings=64, rms_norm_eps=1e-5, num_attention_heads=4,
                num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                first_k_dense_replace=1, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
                n_shared_experts=1, moe_intermediate_size=32, routed_scaling_factor=1.5, index_topk=32,
                index_head_dim=16, index_n_heads=2, indexer_types=["full", "shared", "full", "shared"],
                no_rope_layers=[1, 0, 1, 0], kv_source_layers=[0, 1, 0, 1], pad_token_id=None,
                rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
                                 "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "attention_factor": 1.0})
    return transformers.MistralLarge4Config(
        text_config=text, vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, head_dim=16, image_size=28, patch_size=14),
        image_token_index=VOCAB - 1, tie_word_embeddings=False)


def _hy_v4_vl_config():
    """HY-V4-VL's layout: its text model (tests/interop_models.py's hy_v4, RoPE on interleaved pairs, a multimodal
    RoPE section per axis) beside a one-layer HunYuan-VL tower (vit.)."""
    text = dict(model_type="hy_v4_vl_text", vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1,
                **{**FAMILIES["hy_v4"][2], "rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                                                                "mrope_section": [2, 1, 1]}})
    return transformers.HYV4VLConfig(
        text_config=text, vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, out_hidden_size=64, patch_size=14,
                                             spatial_merge_size=2),
        image_token_id=VOCAB - 1, video_token_id=VOCAB - 2)


def _glm5_next_config(**text):
    """GLM-5.3-Next's layout: a KDA layer, two NoPE DSA latent layers (the second reusing the first's choice:
    indexer_types shared) and a KDA layer on three Sinkhorn-mixed hyper-connection streams, a dense first MLP and
    clamped experts, 19 tokens (index_topk + index_kpool - 1, the import's context) the pooled indexer keeps whole;
    beside a one-layer vision tower."""
    fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                  n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, kv_lora_rank=32, q_lora_rank=48,
                  qk_nope_head_dim=16, v_head_dim=16, index_topk=16, index_head_dim=16, index_n_heads=2,
                  index_kpool=4, linear_head_dim=16, linear_num_heads=2, hc_mult=3, hc_sinkhorn_iters=5,
                  max_position_embeddings=64, rms_norm_eps=1e-5, swiglu_limit=0.5, pad_token_id=None,
                  mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                  layer_types=["linear_attention", "indexed_attention", "indexed_attention", "linear_attention"],
                  indexer_types=["full", "full", "shared", "full"])
    return transformers.Glm5NextConfig(
        text_config={**fields, **text},
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64,
                           patch_size=14, projection_intermediate_size=32),
        image_token_id=VOCAB - 1, video_token_id=VOCAB - 2, image_start_token_id=VOCAB - 3,
        image_end_token_id=VOCAB - 4, video_start_token_id=VOCAB - 5, video_end_token_id=VOCAB - 6)


def _dots3_note_config():
    """dots.3 Note's layout: its text model (tests/interop_models.py's dots3_note_text) beside a one-layer vision
    tower and audio encoder, each with its adapter into the text width."""
    text = dict(model_type="dots3_note_text", vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1,
                **FAMILIES["dots3_note_text"][2])
    return transformers.Dots3NoteConfig(
        text_config=text, vision_config=dict(hidden_size=16, intermediate_size=32, moe_intermediate_size=16,
                                             num_hidden_layers=1, num_attention_heads=2, adapter_in_dim=16,
                                             adapter_out_dim=64, pyramid_num_routed=[-1]),
        audio_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                          adapter_input_size=16, adapter_out_dim=64, downsample_hidden_size=8, feature_size=16),
        image_token_id=VOCAB - 1, video_token_id=VOCAB - 2, audio_token_id=VOCAB - 3)


def _qwen3_vl_config(**text):
    return _qwen3_vl_config_of(transformers.Qwen3VLConfig, **text)


def _qwen3_vl_config_of(config_class, **text):
    """Qwen3-VL's layout: a Qwen3 text model (QK-norm, untied head) whose RoPE takes interleaved sections of three
    positions (mrope_section 2 + 2 + 4 = head_dim / 2), beside a one-block vision tower with one deepstack merger;
    config_class Qwen3VLMoeConfig with `text`'s experts: Qwen3-VL-MoE's."""
    return config_class(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                         rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                             "mrope_section": [2, 2, 4], "mrope_interleaved": True},
                         **text),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64,
                           patch_size=14, num_position_embeddings=16, deepstack_visual_indexes=[0]),
        image_token_id=VOCAB - 1, video_token_id=VOCAB - 2, vision_start_token_id=VOCAB - 3,
        vision_end_token_id=VOCAB - 4, tie_word_embeddings=False)


def _apertus1p5_config(**text):
    """Apertus 1.5's layout: an Apertus text model (the xIELU MLP, QK-norm, Llama 3 RoPE scaling past an original
    context shorter than the test sequences, untied) beside one-stage image and audio tokenizers, whose code ranges
    (16 ids each from 200) and placeholder ids (the vocabulary's last two) lie in the text model's vocabulary."""
    return transformers.Apertus1p5Config(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                         pad_token_id=None, rope_parameters={"rope_type": "llama3", "rope_theta": 500.0,
                                                             "factor": 8.0, "original_max_position_embeddings": 8,
                                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0},
                         **text),
        vision_config=dict(codebook_size=16, embed_dim=32, latent_channels=32, base_channels=32,
                           channel_multiplier=[1], num_res_blocks=1, attn_resolutions=[], resolution=16),
        audio_config=dict(model_type="wavtokenizer_encoder", num_filters=4, upsampling_ratios=[2], hidden_size=8,
                          codebook_size=16, codebook_dim=8, num_lstm_layers=1),
        image_token_id=VOCAB - 1, audio_token_id=VOCAB - 2, image_token_offset=200, audio_token_offset=216)


def _cohere_compass_config(**text):
    """Cohere Compass's layout (North-Micro-Vision): Qwen3-VL's one-block vision tower with one deepstack merger around
    a cohere_compass_text model (windowed layers rotating on interleaved MRoPE sections, the full one without RoPE,
    logits scaled, untied)."""
    return transformers.CohereCompassConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, layer_norm_eps=1e-5,
                         sliding_window=5, logit_scale=0.5, pad_token_id=None,
                         layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                         rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0,
                                                                "mrope_section": [2, 3, 3]},
                                          "full_attention": None}, **text),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64,
                           patch_size=14, num_position_embeddings=16, deepstack_visual_indexes=[0]),
        image_token_id=VOCAB - 1, video_token_id=VOCAB - 2, vision_start_token_id=VOCAB - 3,
        vision_end_token_id=VOCAB - 4, tie_word_embeddings=False)


def _aria_config(**text):
    """Aria's layout: an aria_text model (top 2 of 4 experts beside 2 shared ones, untied) after a one-layer Idefics3
    vision tower and the cross-attention projector into it (4 queries)."""
    return transformers.AriaConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                         moe_num_experts=4, moe_topk=2, moe_num_shared_experts=2, pad_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0}, **text),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        projector_patch_to_query_dict={4: 4}, image_token_index=VOCAB - 1)


def _minimax_m3_config(**text):
    """MiniMax-M3's layout: tests/interop_models.py's minimax_m3_vl_text model after a one-layer vision tower and its
    projector."""
    from tests.interop_models import FAMILIES

    return transformers.MiniMaxM3VLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, max_position_embeddings=64, rms_norm_eps=1e-5,
                         **FAMILIES["minimax_m3_vl_text"][2], **text),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        projector_hidden_size=64, image_token_index=VOCAB - 1, video_token_index=VOCAB - 2)


def _gemma4_unified_config(**text):
    """Gemma 4 Unified's layout: tests/interop_models.py's gemma4_unified_text model (a pad id, which its multimodal
    forward writes over image and audio tokens) beside its patch and audio embedders (no towers), tied."""
    from tests.interop_models import FAMILIES

    return transformers.Gemma4UnifiedConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, max_position_embeddings=64,
                         rms_norm_eps=1e-5, **{**FAMILIES["gemma4_unified_text"][2], "pad_token_id": 0}, **text),
        vision_config=dict(patch_size=4, pooling_kernel_size=1, mm_embed_dim=16, mm_posemb_size=8,
                           output_proj_dims=16),
        audio_config=dict(audio_embed_dim=8), image_token_id=VOCAB - 1, audio_token_id=VOCAB - 2,
        boi_token_id=VOCAB - 3, eoi_token_id=VOCAB - 4, tie_word_embeddings=True)


def _omni_thinker_config(config_class):
    """Qwen2.5-Omni's thinker (config_class Qwen2_5OmniThinkerConfig: a Qwen2 text model with q/k/v biases, MRoPE
    sections 2 + 3 + 3 in the rotate-half layout) or Qwen3-Omni-MoE's (Qwen3OmniMoeThinkerConfig: QK-norm, top 2 of 4
    experts, interleaved MRoPE sections 2 + 2 + 4), each beside a one-block vision tower and a one-layer audio
    encoder; vision_start_token_id as the Hub's thinker configs give it (the config class has no such field)."""
    qwen3 = config_class is transformers.Qwen3OmniMoeThinkerConfig
    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 500.0, "mrope_section": [2, 3, 3]})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64, patch_size=14)
    audio = dict(d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, output_dim=64,
                 num_mel_bins=16, max_source_positions=20, n_window=4)
    if qwen3:
        text.update(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                    rope_parameters={"rope_type": "default", "rope_theta": 500.0, "mrope_section": [2, 2, 4],
                                     "interleaved": True})
        vision.update(deepstack_visual_indexes=[0], num_position_embeddings=16)
        audio.update(downsample_hidden_size=8)
    return config_class(text_config=text, vision_config=vision, audio_config=audio, image_token_id=VOCAB - 1,
                        video_token_id=VOCAB - 2, audio_token_id=VOCAB - 3, audio_start_token_id=VOCAB - 4,
                        user_token_id=5, vision_start_token_id=VOCAB - 6,  # which get_rope_index reads
                        **({} if qwen3 else {"audio_end_token_id": VOCAB - 5}))


def _molmo2_config(text_config_update=(), **top):
    """Molmo2-8B's layout: a Qwen3-like text model (per-head QK-norm, GQA, untied) whose embedding has 16 rows for
    added tokens past the head's vocab_size, beside a one-layer vision tower and its pooling adapter."""
    return transformers.Molmo2Config(
        text_config=dict(dict(vocab_size=VOCAB - 16, additional_vocab_size=16, hidden_size=64, intermediate_size=96,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              max_position_embeddings=64, rms_norm_eps=1e-5,
                              rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
                         **dict(text_config_update)),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=8, image_default_input_size=[28, 28], image_patch_size=14),
        adapter_config=dict(hidden_size=16, intermediate_size=32, text_hidden_size=64, num_attention_heads=2,
                            num_key_value_heads=2, head_dim=8, vit_layers=[-1]), **top)


def _chameleon_config(**top):
    """Chameleon's layout (a flat config): Llama's block with per-head QK LayerNorms, GQA, untied, beside a one-level
    VQ-VAE; ids 200..215 its image tokens (vocabulary_map's IMGIMG names), whose logits its forward masks."""
    return transformers.ChameleonConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, pad_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=8, base_channels=32, channel_multiplier=[1],
                       num_res_blocks=1, attn_resolutions=[]),
        vocabulary_map={"<image>": VOCAB - 1, **{f"IMGIMG{chr(65 + i)}Z": 200 + i for i in range(16)}}, **top)


def _emu3_config():
    """Emu3's layout: its Llama-like text model (GQA, untied) beside a one-level VQ-VAE whose 16 codes are the visual
    tokens 200..215 of the text model's vocabulary (vocabulary_map)."""
    return transformers.Emu3Config(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                         pad_token_id=0, bos_token_id=0, eos_token_id=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
        vq_config=dict(embed_dim=8, codebook_size=16, latent_channels=8, base_channels=32, channel_multiplier=[1],
                       num_res_blocks=1, attn_resolutions=[], temporal_downsample_factor=1),
        vocabulary_map={"<|extra_200|>": VOCAB - 1, "<|image token|>": VOCAB - 2,
                        **{f"<|visual token {i:06d}|>": 200 + i for i in range(16)}})


def _hyperclovax_vision_hub(name: str) -> str:
    """A tensor's name in HyperCLOVA X SEED Vision's Hub folders (transformers' conversion mapping read backwards):
    model.language_model.model.*, model.language_model.lm_head.weight, model.vision_projector.*."""
    if name.startswith("model.language_model."):
        return "model.language_model.model." + name[len("model.language_model."):]
    if name == "lm_head.weight":
        return "model.language_model.lm_head.weight"
    return "model.vision_projector." + name[len("model.projector."):] if name.startswith("model.projector.") else name


def _shieldgemma2_hub(name: str) -> str:
    """A tensor's name in ShieldGemma 2's Hub folders: Gemma 3's Hub names (language_model.model.*,
    language_model.lm_head.weight, vision_tower.*) under model., where save_pretrained writes
    model.model.language_model.model.*, model.lm_head.weight and model.model.vision_tower.*."""
    if name == "model.lm_head.weight":
        return "model.language_model.lm_head.weight"
    return "model." + name[len("model.model."):] if name.startswith("model.model.") else name


def _other_layout(name: str) -> str:
    """A tensor's name in the other save layout: language_model.model.* / language_model.lm_head.weight / vision_tower.*
    (the Hub's Gemma 3 and Mistral 3 folders) <-> model.language_model.* / lm_head.weight / model.vision_tower.*
    (transformers 5's module names; the Hub's Qwen3-VL folders)."""
    if name.startswith("language_model.model."):
        return "model.language_model." + name[len("language_model.model."):]
    if name.startswith("model.language_model."):
        return "language_model.model." + name[len("model.language_model."):]
    if name == "language_model.lm_head.weight":
        return "lm_head.weight"
    if name == "lm_head.weight":
        return "language_model.lm_head.weight"
    return name[len("model."):] if name.startswith("model.") else "model." + name


# the text models of the LLaVA-like folders, by text_config's model_type: Llama's (GQA, untied), Qwen2's (q/k/v
# biases), Cohere2's (windowed layers and a full one without RoPE, a logit scale their ForConditionalGeneration leaves
# out), LFM2's (a short convolution and attention), Qwen2-VL's (Qwen2's, its MRoPE sections 2 + 3 + 3 = head_dim / 2
# in the rotate-half layout)
_LLAMA_TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5,
                   rope_theta=500.0, tie_word_embeddings=False)
_TEXTS = {
    "llama": dict(model_type="llama", **_LLAMA_TEXT),
    "qwen2": dict(model_type="qwen2", **_LLAMA_TEXT),
    "qwen3": dict(model_type="qwen3", **_LLAMA_TEXT),
    "mistral": dict(model_type="mistral", **_LLAMA_TEXT),
    "cohere2": dict(model_type="cohere2", **{**_LLAMA_TEXT, "rms_norm_eps": None}, layer_norm_eps=1e-5,
                    sliding_window=5, logit_scale=0.5, layer_types=["sliding_attention", "full_attention"]),
    "lfm2": dict(model_type="lfm2", **{**_LLAMA_TEXT, "rms_norm_eps": None, "head_dim": None}, norm_eps=1e-5,
                 layer_types=["conv", "full_attention"], block_multiple_of=32),
    "glm4v_text": dict(model_type="glm4v_text", **{**_LLAMA_TEXT, "head_dim": None, "rope_theta": None},
                       rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5,
                                        "mrope_section": [1, 1, 2]}),
    "glm4v_moe_text": dict(model_type="glm4v_moe_text", **{**_LLAMA_TEXT, "rope_theta": None},
                           rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5,
                                            "mrope_section": [1, 1, 2]},
                           n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, first_k_dense_replace=1,
                           routed_scaling_factor=1.5),
    "hunyuan_vl_text": dict(model_type="hunyuan_vl_text", **{**_LLAMA_TEXT, "rope_theta": None},
                            rope_parameters={"rope_type": "dynamic", "alpha": 2.0, "factor": 1.0, "rope_theta": 500.0,
                                             "mrope_section": [2, 2, 2, 2]}),
    "exaone4": dict(model_type="exaone4", **{**_LLAMA_TEXT, "rope_theta": None}, sliding_window=5,
                    layer_types=["sliding_attention", "full_attention"],
                    rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
    "granite4_vision_text": dict(model_type="granite4_vision_text", **_LLAMA_TEXT, embedding_multiplier=3.0,
                                 residual_multiplier=0.4, attention_multiplier=0.2, logits_scaling=2.5),
    "mllama_text_model": dict(model_type="mllama_text_model", **{**_LLAMA_TEXT, "head_dim": None, "rope_theta": None,
                                                                 "num_hidden_layers": 4},
                              cross_attention_layers=[1, 3], pad_token_id=0,
                              rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 16}),
    "granite_docling_text": dict(model_type="granite_docling_text", **_LLAMA_TEXT, embedding_multiplier=3.0,
                                 residual_multiplier=0.4, attention_multiplier=0.2, logits_scaling=2.5,
                                 pad_token_id=0, bos_token_id=0, eos_token_id=1),
    "hyperclovax": dict(model_type="hyperclovax", **_LLAMA_TEXT, embedding_multiplier=2.0, residual_multiplier=0.5,
                        attention_multiplier=0.2, logits_scaling=0.25, pad_token_id=None),
    "qwen2_vl_text": dict(model_type="qwen2_vl_text", **{**_LLAMA_TEXT, "rope_theta": None},
                          rope_parameters={"rope_type": "default", "rope_theta": 500.0, "mrope_section": [2, 3, 3]}),
}
# a one-layer vision tower of 28-pixel images in 14-pixel patches, in the fields every such folder's tower takes
_TOWER = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)
_SIGLIP = dict(_TOWER, model_type="siglip_vision_model")
_QWEN2_VL_TOWER = dict(depth=1, embed_dim=16, hidden_size=64, num_heads=2, patch_size=14)


def _wrapper_config(model_type: str, text: str, vision: dict = _TOWER, **top):
    """A tiny config of a multimodal `model_type` around the text model _TEXTS[text]."""
    given = {k: v for k, v in _TEXTS[text].items() if v is not None}
    return transformers.AutoConfig.for_model(model_type, text_config=given, vision_config=dict(vision), **top)


def _qwen3_vl_moe_hub(weights: dict) -> dict:
    """Qwen3-VL-MoE's Hub layout: _other_layout's names, the stacked experts transposed ((E, C, 2F), (E, F, C))."""
    return {_other_layout(k): v.transpose(1, 2).contiguous() if k.endswith(("experts.gate_up_proj",
                                                                            "experts.down_proj")) else v
            for k, v in weights.items()}


def _qwen2_vl_hub(name: str) -> str:
    """A tensor's name in Qwen2-VL's Hub folders: the text model under model., the tower under visual."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name[len("model."):] if name.startswith("model.visual.") else name


def _llava_like(model_type, architecture, text, causal, vision=_TOWER, renamed=True, **top):
    """A CASES entry for a LLaVA-like folder (its Hub layout: _other_layout's where `renamed`)."""
    return (lambda: _wrapper_config(model_type, text, vision, **top), architecture, causal,
            _other_layout if renamed is True else renamed)


# kind: (its config, its class, the class its export loads as, the other save layout's names or None)
CASES = {"gemma3": (_gemma3_config, "Gemma3ForConditionalGeneration", "Gemma3ForCausalLM", _other_layout),
         "mistral3": (_mistral3_config, "Mistral3ForConditionalGeneration", "MistralForCausalLM", _other_layout),
         "ministral3": (_ministral3_config, "Mistral3ForConditionalGeneration", "MistralForCausalLM", _other_layout),
         "dots3_note": (_dots3_note_config, "Dots3NoteForConditionalGeneration", "Dots3NoteForCausalLM", None),
         "mistral_large4": (_mistral_large4_config, "MistralLarge4ForConditionalGeneration", None,  # import only
                            None),
         "hy_v4_vl": (_hy_v4_vl_config, "HYV4VLForConditionalGeneration", None, None),  # import only
         "glm5_next": (_glm5_next_config, "Glm5NextForConditionalGeneration", None, None),  # import only
         "mistral3-mistral4": (_mistral3_mistral4_config, "Mistral3ForConditionalGeneration", "Mistral4ForCausalLM",
                               _other_layout),
         "qwen3_vl": (_qwen3_vl_config, "Qwen3VLForConditionalGeneration", "Qwen3ForCausalLM", _other_layout),
         "llava": _llava_like("llava", "LlavaForConditionalGeneration", "llama", "LlamaForCausalLM"),
         "llava-qwen2": _llava_like("llava", "LlavaForConditionalGeneration", "qwen2", "Qwen2ForCausalLM"),
         "llava_next": _llava_like("llava_next", "LlavaNextForConditionalGeneration", "llama", "LlamaForCausalLM"),
         "llava_onevision": _llava_like("llava_onevision", "LlavaOnevisionForConditionalGeneration", "qwen2",
                                        "Qwen2ForCausalLM"),
         "qwen2_vl": _llava_like("qwen2_vl", "Qwen2VLForConditionalGeneration", "qwen2_vl_text", "Qwen2ForCausalLM",
                                 _QWEN2_VL_TOWER, _qwen2_vl_hub),
         "qwen2_5_vl": _llava_like("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "qwen2_vl_text",
                                   "Qwen2ForCausalLM", dict(_QWEN2_VL_TOWER, out_hidden_size=64), _qwen2_vl_hub),
         "qwen3_vl_moe": (lambda: _qwen3_vl_config_of(transformers.Qwen3VLMoeConfig, num_experts=4,
                                                     num_experts_per_tok=2, moe_intermediate_size=24),
                          "Qwen3VLMoeForConditionalGeneration", "Qwen3MoeForCausalLM", _qwen3_vl_moe_hub),
         "glm4v": _llava_like("glm4v", "Glm4vForConditionalGeneration", "glm4v_text", "Glm4ForCausalLM",
                              dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64,
                                   patch_size=14, image_size=28), renamed=None),
         "glm4v_moe": _llava_like("glm4v_moe", "Glm4vMoeForConditionalGeneration", "glm4v_moe_text",
                                  "Glm4MoeForCausalLM", dict(depth=1, hidden_size=16, intermediate_size=32,
                                                             num_heads=2, out_hidden_size=64, patch_size=14,
                                                             image_size=28), renamed=None),
         "hunyuan_vl": _llava_like("hunyuan_vl", "HunYuanVLForConditionalGeneration", "hunyuan_vl_text",
                                   "HunYuanDenseV1ForCausalLM",
                                   dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, out_hidden_size=64,
                                        text_hidden_size=64, patch_size=14), renamed=None),
         "exaone4_5": _llava_like("exaone4_5", "Exaone4_5_ForConditionalGeneration", "exaone4", "Exaone4ForCausalLM",
                                  dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, num_key_value_heads=2,
                                       out_hidden_size=64, patch_size=14, window_size=28, fullatt_block_indexes=[0]),
                                  renamed=None),
         "granite4_vision": _llava_like("granite4_vision", "Granite4VisionForConditionalGeneration",
                                        "granite4_vision_text", "GraniteForCausalLM", dict(_TOWER, hidden_size=64),
                                        renamed=None, qformer_config=dict(intermediate_size=32),
                                        spatial_target_layers=[0, 1], deepstack_layer_map=[[-1, 0]],
                                        downsample_rate="1/2"),
         "mllama": _llava_like("mllama", "MllamaForConditionalGeneration", "mllama_text_model", "LlamaForCausalLM",
                               dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_global_layers=1,
                                    num_attention_heads=2, image_size=28, patch_size=14, max_num_tiles=4,
                                    vision_output_dim=32, intermediate_layers_indices=[0]), _other_layout),
         "internvl": _llava_like("internvl", "InternVLForConditionalGeneration", "qwen2", "Qwen2ForCausalLM",
                                 tie_word_embeddings=False),
         "smolvlm": _llava_like("smolvlm", "SmolVLMForConditionalGeneration", "llama", "LlamaForCausalLM",
                                renamed=None),
         "idefics3": _llava_like("idefics3", "Idefics3ForConditionalGeneration", "llama", "LlamaForCausalLM",
                                 renamed=None),
         "aya_vision": _llava_like("aya_vision", "AyaVisionForConditionalGeneration", "cohere2",
                                   "Cohere2ForCausalLM"),
         "cohere2_vision": _llava_like("cohere2_vision", "Cohere2VisionForConditionalGeneration", "cohere2",
                                       "Cohere2ForCausalLM", renamed=None),
         "lfm2_vl": _llava_like("lfm2_vl", "Lfm2VlForConditionalGeneration", "lfm2", "Lfm2ForCausalLM",
                                renamed=None),
         "vipllava": _llava_like("vipllava", "VipLlavaForConditionalGeneration", "llama", "LlamaForCausalLM",
                                 renamed=None),
         "video_llava": _llava_like("video_llava", "VideoLlavaForConditionalGeneration", "llama",
                                    "LlamaForCausalLM", renamed=None),
         "llava_next_video": _llava_like("llava_next_video", "LlavaNextVideoForConditionalGeneration", "llama",
                                         "LlamaForCausalLM", renamed=None),
         "apertus1p5": (_apertus1p5_config, "Apertus1p5ForConditionalGeneration", "ApertusForCausalLM", _other_layout),
         # its head pruned to the text ids below the image codes, as the released checkpoints have it: exported as
         # the text model that holds such a head
         "apertus1p5-pruned": (lambda: _apertus1p5_config(output_vocab_size=200), "Apertus1p5ForConditionalGeneration",
                               "Apertus1p5TextForCausalLM", _other_layout),
         "cohere_compass": (_cohere_compass_config, "CohereCompassForConditionalGeneration", "Cohere2ForCausalLM",
                            _other_layout),
         "aria": (_aria_config, "AriaForConditionalGeneration", "GraniteMoeSharedForCausalLM", _other_layout),
         "minimax_m3_vl": (_minimax_m3_config, "MiniMaxM3SparseForConditionalGeneration", None,  # import only
                           _other_layout),
         "gemma4_unified": (_gemma4_unified_config, "Gemma4UnifiedForConditionalGeneration", "Gemma4ForCausalLM",
                            _other_layout),
         # PerceptionLM's and FastVLM's towers are timm models (not installed here): SigLIP's stands in, unread alike
         "idefics2": _llava_like("idefics2", "Idefics2ForConditionalGeneration", "mistral", "MistralForCausalLM",
                                 renamed=None, perceiver_config=dict(hidden_size=64, resampler_n_latents=4,
                                                                     resampler_depth=1, resampler_n_heads=2,
                                                                     resampler_head_dim=8, num_key_value_heads=1)),
         "perception_lm": _llava_like("perception_lm", "PerceptionLMForConditionalGeneration", "llama",
                                      "LlamaForCausalLM", dict(_SIGLIP, model_args={"embed_dim": 16}), renamed=None),
         "fast_vlm": _llava_like("fast_vlm", "FastVlmForConditionalGeneration", "qwen2", "Qwen2ForCausalLM", _SIGLIP,
                                 renamed=None),
         "lighton_ocr": _llava_like("lighton_ocr", "LightOnOcrForConditionalGeneration", "qwen3", "Qwen3ForCausalLM",
                                    dict(_TOWER, head_dim=8), renamed=None),
         "janus": _llava_like("janus", "JanusForConditionalGeneration", "llama", "LlamaForCausalLM",
                              dict(_TOWER, projection_dim=64, depth=1), renamed=None,
                              vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=32, base_channels=32,
                                             channel_multiplier=[1], num_res_blocks=1, projection_dim=64,
                                             image_token_embed_dim=64, num_patches=2)),
         "ovis2": _llava_like("ovis2", "Ovis2ForConditionalGeneration", "qwen2", "Qwen2ForCausalLM",
                              dict(_TOWER, vocab_size=16), renamed=None, vocab_size=VOCAB, hidden_size=64),
         "video_llama_3": _llava_like("video_llama_3", "VideoLlama3ForConditionalGeneration", "qwen2",
                                      "Qwen2ForCausalLM", {k: _TOWER[k] for k in _TOWER if k != "image_size"},
                                      renamed=None),
         "qwen2_5_omni_thinker": (lambda: _omni_thinker_config(transformers.Qwen2_5OmniThinkerConfig),
                                  "Qwen2_5OmniThinkerForConditionalGeneration", "Qwen2ForCausalLM", None),
         "qwen3_omni_moe_thinker": (lambda: _omni_thinker_config(transformers.Qwen3OmniMoeThinkerConfig),
                                    "Qwen3OmniMoeThinkerForConditionalGeneration", "Qwen3MoeForCausalLM", None),
         "granite_docling": _llava_like("granite_docling", "GraniteDoclingForConditionalGeneration",
                                        "granite_docling_text", "GraniteForCausalLM",
                                        dict(_TOWER, patch_size=7, out_hidden_size=64, scale_factor=2,
                                             deepstack_visual_indexes=[0]), renamed=None, pad_token_id=0),
         "hyperclovax_vision_v2": _llava_like("hyperclovax_vision_v2", "HyperCLOVAXVisionV2ForConditionalGeneration",
                                              "hyperclovax", "HyperCLOVAXForCausalLM",
                                              dict(model_type="qwen2_5_vl_vision", **_QWEN2_VL_TOWER,
                                                   out_hidden_size=64), _hyperclovax_vision_hub),
         "molmo2": (_molmo2_config, "Molmo2ForConditionalGeneration", None, None),  # import only: head_vocab
         # a tying config: transformers leaves the head (vocab_size rows) apart from the wider embedding
         "molmo2-tied": (lambda: _molmo2_config(tie_word_embeddings=True), "Molmo2ForConditionalGeneration", None,
                         None),
         # Molmo2-O's: OLMo's QK norms over whole projections, post-norm blocks (OLMo 2's block)
         "molmo2-o": (lambda: _molmo2_config(text_config_update={"qk_norm_type": "olmo", "norm_after": True}),
                      "Molmo2ForConditionalGeneration", None, None),
         "molmo2-o-no-added": (lambda: _molmo2_config(text_config_update={
             "qk_norm_type": "olmo", "norm_after": True, "vocab_size": VOCAB, "additional_vocab_size": 0}),
             "Molmo2ForConditionalGeneration", "Olmo2ForCausalLM", None),
         # no added rows: Qwen3's model, exported as it
         "molmo2-no-added": (lambda: _molmo2_config(text_config_update={"vocab_size": VOCAB,
                                                                       "additional_vocab_size": 0}),
                             "Molmo2ForConditionalGeneration", "Qwen3ForCausalLM", None),
         "chameleon": (_chameleon_config, "ChameleonForConditionalGeneration", None, None),  # import only
         "emu3": (_emu3_config, "Emu3ForConditionalGeneration", "LlamaForCausalLM", None),
         "shieldgemma2": (lambda: _gemma3_config(transformers.ShieldGemma2Config, yes_token_index=5,
                                                 no_token_index=6),
                          "ShieldGemma2ForImageClassification", "Gemma3ForCausalLM", _shieldgemma2_hub)}


# Round 3 (part A): multimodal folders around text families redline reads


def _kimi_k25_config(**text):
    """Kimi K2.5's layout: tests/interop_models.py's deepseek_v3 text model (latent attention, grouped sigmoid
    routing, YaRN) after a one-layer MoonViT tower and its projector, the head untied."""
    return transformers.Kimi_K25Config(
        text_config=dict(model_type="deepseek_v3", vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                         **{**FAMILIES["deepseek_v3"][2], **text}),
        vision_config=dict(patch_size=14, num_attention_heads=2, num_hidden_layers=1, hidden_size=16,
                           intermediate_size=32, pos_emb_height=4, pos_emb_width=4, pos_emb_time=2),
        projection_hidden_size=16, image_token_id=VOCAB - 1, video_token_id=VOCAB - 2,
        vision_start_token_id=VOCAB - 3, vision_end_token_id=VOCAB - 4, tie_word_embeddings=False)


def _kimi_k25_hub(name: str) -> str:
    """A tensor's name in Kimi K2.5's Hub folders: the text model's layers under language_model.model.layers.
    (save_pretrained writes them under language_model.model.blocks.)."""
    return name.replace("language_model.model.blocks.", "language_model.model.layers.")


def _ernie4_5_vl_moe_config(**text):
    """ERNIE 4.5 VL's layout: a dense first layer, then 2 of 4 softmax-scored text experts (32 wide) beside 4 vision
    experts (16 wide) and a shared expert, its 3D RoPE sections 2 + 2 + 4 on interleaved pairs; a one-block tower
    and the resampler, the head tied (its default)."""
    return transformers.Ernie4_5_VLMoeConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                         moe_intermediate_size=[32, 16], moe_k=2, moe_num_experts=4, moe_num_shared_experts=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0, "mrope_section": [2, 2, 4]},
                         **text),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=14),
        image_token_id=VOCAB - 1, video_token_id=VOCAB - 2, image_start_token_id=VOCAB - 3,
        image_end_token_id=VOCAB - 4, video_start_token_id=VOCAB - 5, video_end_token_id=VOCAB - 6)


def _ernie_in_memory(weights: dict) -> dict:
    """ERNIE 4.5 VL's tensors under transformers' module names (model.language_model., mlp.text_moe. and
    mlp.vision_moe. with stacked experts, the routers (E, C), the biases (1, E)) from save_pretrained's (the Hub's)."""
    out, experts = {}, {}
    for name, t in weights.items():
        if name.startswith(("model.layers.", "model.embed_tokens.", "model.norm.")):
            name = "model.language_model." + name[len("model."):]
        if m := re.fullmatch(r"(.*\.mlp\.)experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight", name):
            experts.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = t
        elif name.endswith("mlp.gate.weight"):
            out[name.replace("mlp.gate.", "mlp.text_moe.gate.")] = t.t().contiguous()
        elif name.endswith("mlp.gate.weight_1"):
            out[name.replace("mlp.gate.weight_1", "mlp.vision_moe.gate.weight")] = t.t().contiguous()
        elif name.endswith("mlp.moe_statics.e_score_correction_bias"):
            for i, kind in enumerate(("text_moe", "vision_moe")):
                out[name.replace("mlp.moe_statics.", f"mlp.{kind}.gate.moe_statics.")] = t[i:i + 1].clone()
        else:
            out[name] = t
    for prefix, parts in experts.items():
        count = len(parts["gate_proj"]) // 2
        for kind, ids in (("text_moe", range(count)), ("vision_moe", range(count, 2 * count))):
            out[f"{prefix}{kind}.experts.gate_up_proj"] = torch.stack(
                [torch.cat([parts["gate_proj"][j], parts["up_proj"][j]]) for j in ids])
            out[f"{prefix}{kind}.experts.down_proj"] = torch.stack([parts["down_proj"][j] for j in ids])
    return out


def _paddleocr_vl_config(**text):
    """PaddleOCR-VL's layout: ERNIE 4.5's dense text model (biases on every projection, heads 24 wide, not 64 / 4)
    whose multimodal RoPE sections 2 + 2 + 8 rotate in the rotate-half layout, after a one-layer tower and its
    projector, the head tied (its default)."""
    return transformers.PaddleOCRVLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=64,
                         rms_norm_eps=1e-5, use_bias=True, pad_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0, "mrope_section": [2, 2, 8]},
                         **text),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        image_token_id=VOCAB - 1, video_token_id=VOCAB - 2, vision_start_token_id=VOCAB - 3,
        vision_end_token_id=VOCAB - 4)


def _paddleocr_in_memory(name: str) -> str:
    """A PaddleOCR-VL tensor's name in transformers' modules (model.language_model., model.visual., model.projector.)
    from save_pretrained's (the Hub's: model., visual., mlp_AR.)."""
    for theirs, ours in (("model.", "model.language_model."), ("visual.", "model.visual."),
                         ("mlp_AR.", "model.projector.")):
        if name.startswith(theirs):
            return ours + name[len(theirs):]
    return name


def _lfm3_vl_config(**text):
    """LFM3-VL's layout: tests/interop_models.py's lfm3 text model (convolutions, a proportional-RoPE full layer, a
    windowed one, gated heads) after a one-layer tower and its projector, the head untied."""
    return transformers.Lfm3VlConfig(
        text_config=dict(model_type="lfm3", vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                         max_position_embeddings=64, norm_eps=1e-5, **{**FAMILIES["lfm3"][2], **text}),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, patch_size=14),
        projector_hidden_size=32, image_token_id=VOCAB - 1, video_token_id=VOCAB - 2,
        vision_start_token_id=VOCAB - 3, vision_end_token_id=VOCAB - 4, tie_word_embeddings=False)


def _minicpm_config(config_class):
    """MiniCPM-V 4.6's layout (4.7's and MiniCPM-OCR's take its fields): tests/interop_models.py's qwen3_5_text model
    (gated delta nets, a gated full-attention layer) after a two-layer tower with its window merger and merger, the
    head untied."""
    def make(**text):
        return config_class(
            text_config=dict(model_type="qwen3_5_text", vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                             max_position_embeddings=64, rms_norm_eps=1e-5, **{**FAMILIES["qwen3_5_text"][2], **text}),
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                               image_size=28, patch_size=14, insert_layer_id=0),
            insert_layer_id=0, image_token_id=VOCAB - 1, video_token_id=VOCAB - 2, tie_word_embeddings=False)
    return make


def _cosmos3_unified(weights: dict) -> dict:
    """Cosmos 3's unified checkpoint layout from save_pretrained's: the Diffusers attention names and a Generator
    expert's and a sound tower's tensors, which transformers drops on load, beside the Reasoner's."""
    out = dict(weights)
    q = next(k for k in weights if k.endswith("layers.0.self_attn.to_q.weight"))
    out[q.replace("to_q", "add_q_proj")] = torch.zeros_like(weights[q])
    out["layers.0.mlp.moe_gen.gate_proj.weight"] = torch.zeros(8, 64)
    out["audio_modality_embed"] = torch.zeros(64)
    return out


def _cosmos3_edge_config(**text):
    """Cosmos 3 Edge's layout: Llama's attention with a ReLU² MLP (fc1, fc2) and Qwen3-VL's interleaved multimodal
    RoPE (sections 2 + 3 + 3), after a one-layer SigLIP 2 tower and its merger, untied."""
    return transformers.Cosmos3EdgeConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                         rms_norm_eps=1e-5, pad_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0, "mrope_section": [2, 3, 3]},
                         **text),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           patch_size=14, num_patches=16),
        projector_hidden_size=32, image_token_id=VOCAB - 1, video_token_id=VOCAB - 2, vision_start_token_id=VOCAB - 3,
        vision_end_token_id=VOCAB - 4)


def _cosmos3_in_memory(name: str) -> str:
    """A Cosmos 3 Edge tensor's name in transformers' modules (model.language_model.*, q_proj, mlp.fc1) from
    save_pretrained's (its folders': flat layers.*, Diffusers' to_q, mlp.up_proj)."""
    if name.startswith(("layers.", "embed_tokens.", "norm.")):
        name = "model.language_model." + name
    for theirs, ours in ((".to_q.", ".q_proj."), (".to_k.", ".k_proj."), (".to_v.", ".v_proj."),
                         (".to_out.", ".o_proj."), (".mlp.up_proj.", ".mlp.fc1."), (".mlp.down_proj.", ".mlp.fc2.")):
        name = name.replace(theirs, ours)
    return name


def _deepseek_ocr2_config(**text):
    """DeepSeek-OCR 2's layout: Llama's attention, a dense first layer, then top 2 of 4 softmax-scored experts
    (greedy, not rescaled, times 1.5) beside a shared expert; a two-layer SAM and a one-layer Qwen2 encoder."""
    return transformers.DeepseekOcr2Config(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                         n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
                         routed_scaling_factor=1.5, mlp_layer_types=["dense", "sparse", "sparse"], pad_token_id=None,
                         **text),
        vision_config=dict(sam_config=dict(hidden_size=16, output_channels=16, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=64, patch_size=16,
                                           global_attn_indexes=[1], mlp_dim=32, window_size=2,
                                           downsample_channels=[32, 64]),
                           encoder_config=dict(hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=2)),
        image_token_id=VOCAB - 1)


def _unlimited_ocr_config(**text):
    """Unlimited-OCR's layout: DeepSeek-OCR 2's text model (_deepseek_ocr2_config) whose layers see a window of 3
    tokens beside the prompt (reference_sliding_attention), its middle layer a full one; its SAM and CLIP-like
    encoders one or two layers deep."""
    return transformers.UnlimitedOcrConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                         n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
                         routed_scaling_factor=1.5, mlp_layer_types=["dense", "sparse", "sparse"], pad_token_id=None,
                         sliding_window=3, layer_types=["reference_sliding_attention", "full_attention",
                                                        "reference_sliding_attention"], **text),
        vision_config=dict(sam_config=dict(hidden_size=16, output_channels=16, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=64, patch_size=16,
                                           global_attn_indexes=[1], mlp_dim=32, window_size=2,
                                           downsample_channels=[32, 64]),
                           encoder_config=dict(hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                                               num_attention_heads=2)),
        image_token_id=VOCAB - 1)


def _nemotron_h_omni_config(**text):
    """Nemotron-H Omni's layout: tests/interop_models.py's nemotron_h text model (Mamba-2, MLP and attention
    layers) after a one-layer RADIO tower and its projector, without the audio tower."""
    return transformers.AutoConfig.for_model(
        "nemotron_h_omni", text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                                            max_position_embeddings=64, **{**FAMILIES["nemotron_h"][2], **text}),
        vision_config=dict(model_type="radio", hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           patch_size=14, image_size=28, video_temporal_patch_size=2),
        vision_hidden_size=16, projector_hidden_size=32, image_token_id=VOCAB - 1, video_token_id=VOCAB - 2)


# GLM-4.1V's one-block tower (GLM-4.6V's, GLMGA's and GLM-OCR's take its fields)
_GLM4V_TOWER = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64, patch_size=14,
                    image_size=28)
# GLM-OCR's text model: GLM-4.1V's without q/k/v biases, its heads head_dim wide where given (24 here, not 64 / 4)
_TEXTS["glm_ocr_text"] = dict(_TEXTS["glm4v_text"], model_type="glm_ocr_text", head_dim=24,
                              rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                               "partial_rotary_factor": 0.5, "mrope_section": [2, 2, 2]})

_TEXTS["qwen3"] = dict(model_type="qwen3", **_LLAMA_TEXT)  # Qwen3's QK-norm

CASES.update({
    "kimi_k25": (_kimi_k25_config, "Kimi_K25ForConditionalGeneration", "DeepseekV3ForCausalLM", _kimi_k25_hub),
    # its text model's RoPE rows interleaved (DeepseekV3Config's default, Kimi K2's)
    "kimi_k25-interleaved": (lambda: _kimi_k25_config(rope_interleave=True), "Kimi_K25ForConditionalGeneration",
                             "DeepseekV3ForCausalLM", None),
    "glm46v": _llava_like("glm46v", "Glm46VForConditionalGeneration", "glm4v_text", "Glm4ForCausalLM", _GLM4V_TOWER,
                          renamed=None),
    # GLM-4.6V's released layout: a glm4v_moe_text model (GLM-4.5V's) in Glm46VModel
    "glm46v-moe": _llava_like("glm46v", "Glm46VForConditionalGeneration", "glm4v_moe_text", "Glm4MoeForCausalLM",
                              _GLM4V_TOWER, renamed=None),
    "glmga": _llava_like("glmga", "Glm46VForConditionalGeneration", "glm4v_text", "Glm4ForCausalLM", _GLM4V_TOWER,
                         renamed=None),
    "ernie4_5_vl_moe": (_ernie4_5_vl_moe_config, "Ernie4_5_VLMoeForConditionalGeneration", "Ernie4_5_MoeForCausalLM",
                        _ernie_in_memory),
    "paddleocr_vl": (_paddleocr_vl_config, "PaddleOCRVLForConditionalGeneration", "LlamaForCausalLM",
                     _paddleocr_in_memory),
    "lfm3_vl": (_lfm3_vl_config, "Lfm3VlForConditionalGeneration", "Lfm3ForCausalLM", _other_layout),
    "minicpmv4_6": (_minicpm_config(transformers.MiniCPMV4_6Config), "MiniCPMV4_6ForConditionalGeneration",
                    "Qwen3_5ForCausalLM", _other_layout),
    "minicpmv4_7": (_minicpm_config(transformers.MiniCPMV4_7Config), "MiniCPMV4_7ForConditionalGeneration",
                    "Qwen3_5ForCausalLM", _other_layout),
    "minicpm_ocr": (_minicpm_config(transformers.MiniCPMOcrConfig), "MiniCPMOcrForConditionalGeneration",
                    "Qwen3_5ForCausalLM", _other_layout),
    # the Hub's text layers under language_model.model.layers. (save_pretrained writes language_model.model.encoder.
    # layers.)
    "qianfan_ocr": _llava_like("qianfan_ocr", "QianfanOCRForConditionalGeneration", "qwen3", "Qwen3ForCausalLM",
                               renamed=lambda name: name.replace(".model.encoder.layers.", ".model.layers.")),
    "deepseek_vl": _llava_like("deepseek_vl", "DeepseekVLForConditionalGeneration", "llama", "LlamaForCausalLM",
                               dict(_TOWER, model_type="siglip_vision_model"), renamed=None,
                               tie_word_embeddings=False),
    "deepseek_vl_hybrid": _llava_like("deepseek_vl_hybrid", "DeepseekVLHybridForConditionalGeneration", "llama",
                                      "LlamaForCausalLM", dict(_TOWER, model_type="siglip_vision_model"),
                                      renamed=None, tie_word_embeddings=False,
                                      high_res_vision_config=dict(hidden_size=16, output_channels=16,
                                                                  num_hidden_layers=2, num_attention_heads=2,
                                                                  image_size=64, patch_size=16,
                                                                  global_attn_indexes=[1], mlp_dim=32)),
    "cosmos3_omni": (lambda: _qwen3_vl_config_of(transformers.Cosmos3OmniConfig), "Cosmos3OmniForConditionalGeneration",
                     "Qwen3ForCausalLM", _cosmos3_unified),
    "cosmos3_edge": (_cosmos3_edge_config, "Cosmos3EdgeForConditionalGeneration", "ArceeForCausalLM",
                     _cosmos3_in_memory),
    "deepseek_ocr2": (_deepseek_ocr2_config, "DeepseekOcr2ForConditionalGeneration", None, None),  # import only
    "unlimited_ocr": (_unlimited_ocr_config, "UnlimitedOcrForConditionalGeneration", None, None),  # import only
    "nemotron_h_omni": (_nemotron_h_omni_config, "NemotronH_Omni_Reasoning_V3", "NemotronHForCausalLM", None),
    "glm_ocr": _llava_like("glm_ocr", "GlmOcrForConditionalGeneration", "glm_ocr_text", "Glm4ForCausalLM",
                           _GLM4V_TOWER, renamed=None),
})
# the round-3 folders whose reading has logic of its own run always (their first layout); the rest (GLM-4.6V's dense
# text model, GLMGA, LFM3-VL, MiniCPM-V 4.7 and MiniCPM-OCR, DeepSeek-VL and its hybrid), which repeat a reading
# above with another class, and the other layouts, run as slow tests
_ROUND3_FIRST = ("kimi_k25", "glm46v-moe", "glm_ocr", "ernie4_5_vl_moe", "paddleocr_vl", "minicpmv4_6", "qianfan_ocr",
                 "cosmos3_omni", "cosmos3_edge", "deepseek_ocr2", "nemotron_h_omni", "unlimited_ocr")


def _step3p7_config(top=None, **text):
    """Step 3.7's layout: Step 3.5's text model (a dense first layer, then 2 of 4 sigmoid-scored experts with a
    routing bias and a shared expert; full - windowed - full - windowed layers, the windowed ones 6 query heads to the
    full ones' 4, each type its own RoPE base and partial factor; the scores scaled by query_pre_attn_scalar; SwiGLU
    clamps on some layers' experts, shared experts and dense MLP, small enough to bite) after a one-layer tower."""
    return transformers.Step3p7Config(
        text_config={**dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                            moe_intermediate_size=24, n_routed_experts=4, num_experts_per_tok=2, share_expert_dim=32,
                            layer_types=["full_attention", "sliding_attention"] * 2, sliding_window=5,
                            num_sliding_attention_heads=6, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                            swiglu_limits=[0, 0.05, 0, 0.03], swiglu_limits_shared=[0.04, 0, 0.05, 0],
                            moe_router_scaling_factor=1.5, query_pre_attn_scalar=12, rope_theta=[500.0, 300.0] * 2,
                            partial_rotary_factors=[0.5, 1.0] * 2, pad_token_id=0), **text},
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14), image_token_id=VOCAB - 1, **(top or {}))


def _step3p7_in_memory(weights: dict) -> dict:
    """Step 3.7's tensors under transformers' module names (model.language_model.*, mlp.gate.*, mlp.experts.
    gate_up_proj, mlp.shared_experts.*) from save_pretrained's (the Hub's: model.*, moe.*, share_expert.*)."""
    out = {}
    for name, t in weights.items():
        if name.startswith(("model.layers.", "model.embed_tokens.", "model.norm.")):
            name = "model.language_model." + name[len("model."):]
        name = name.replace(".share_expert.", ".mlp.shared_experts.").replace(".moe.gate.", ".mlp.gate.")
        name = name.replace(".moe.router_bias", ".mlp.gate.e_score_correction_bias")
        name = name.replace(".moe.down_proj.weight", ".mlp.experts.down_proj")
        if name.endswith(".moe.gate_proj.weight"):
            up = weights[name.replace("model.language_model.", "model.").replace("gate_proj", "up_proj")]
            out[name.replace(".moe.gate_proj.weight", ".mlp.experts.gate_up_proj")] = torch.cat([t, up], dim=1)
        elif not name.endswith(".moe.up_proj.weight"):
            out[name] = t
    return out


CASES["step3p7"] = (_step3p7_config, "Step3p7ForConditionalGeneration", None, _step3p7_in_memory)  # import only


def _folder(kind, path, layout="saved"):
    """save_pretrained of a tiny multimodal model of `kind` (every parameter perturbed), a tokenizer without a
    chat template and the processor's files (its chat_template.json among them); layout "renamed": the tensors
    under the other save layout's names."""
    make_config, architecture, _, rename = CASES[kind]
    torch.manual_seed(0)
    hf = getattr(transformers, architecture)(make_config()).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for name, b in hf.named_buffers():  # GLM-4.5V's routing bias, which only chooses: saved, zero at init
            if name.endswith("e_score_correction_bias"):
                b.add_(torch.randn_like(b) * 0.05)
    hf.save_pretrained(path)
    byte_level_tokenizer(path, template=None)
    (path / "chat_template.json").write_text(json.dumps({"chat_template": PROCESSOR_TEMPLATE}))
    (path / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "SiglipImageProcessor",
                                                               "size": {"height": 28, "width": 28}}))
    (path / "processor_config.json").write_text(json.dumps({"processor_class": "Gemma3Processor"}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2], "bos_token_id": 0}))
    if layout == "renamed":
        weights = load_file(str(path / "model.safetensors"))
        renamed = rename(weights) if rename in (_qwen3_vl_moe_hub, _ernie_in_memory, _cosmos3_unified,
                                                _step3p7_in_memory) else {
            rename(k): v for k, v in weights.items()}
        save_file(renamed, str(path / "model.safetensors"),
                  metadata={"format": "pt"})
    return hf


def _language_model(hf):
    """The generating model of a CASES model: ShieldGemma 2's classifier wraps Gemma 3's (its .model)."""
    return hf.model if type(hf).__name__ == "ShieldGemma2ForImageClassification" else hf


# the folders whose reading has logic of its own run always (the first four in both layouts); the rest, which repeat
# a layout above with another class or text model, and the other layouts of the new ones, run as slow tests
_FIRST = ("gemma3", "mistral3", "ministral3", "qwen3_vl", "mistral3-mistral4", "llava", "qwen2_vl", "qwen3_vl_moe",
          "smolvlm", "aya_vision", "glm4v", "hunyuan_vl", "mllama", "apertus1p5", "apertus1p5-pruned", "cohere_compass",
          "aria", "minimax_m3_vl", "gemma4_unified", "dots3_note", "mistral_large4", "hy_v4_vl", "glm5_next",
          *_ROUND3_FIRST, "step3p7")
_FIRST += ("perception_lm", "janus", "ovis2", "shieldgemma2", "qwen2_5_omni_thinker", "qwen3_omni_moe_thinker",
           "granite_docling", "hyperclovax_vision_v2", "emu3", "molmo2", "molmo2-o", "chameleon")


@pytest.mark.parametrize("kind, layout", [
    pytest.param(kind, layout, marks=() if kind in _FIRST[:4] or (kind in _FIRST and layout == "saved")
                 else pytest.mark.slow)
    for kind in CASES for layout in ("saved", "renamed") if layout == "saved" or CASES[kind][3]])
def test_import_reads_the_text_model_and_exports_the_text_family(kind, layout, tmp_path, capsys):
    """The imported model's logits are the multimodal model's on text, its greedy tokens through the engine
    transformers' generate's; one stderr line says the vision tower was left out; the processor's chat template
    travels; the export loads as the text-only model with the same logits."""
    classifier = _folder(kind, tmp_path / "hf", layout)
    hf = _language_model(classifier)
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    left_out = [line for line in err.splitlines() if "vision tower" in line]
    assert len(left_out) == 1 and f"multimodal {hf.config.model_type} folder" in left_out[0], err
    model, tokenizer, _ = load_for_inference(tmp_path / "ckpt")
    assert tokenizer.chat_template == PROCESSOR_TEMPLATE
    tokens = torch.randint(0, VOCAB - 3, (2, 17), generator=torch.Generator().manual_seed(1))  # no image tokens
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        torch.testing.assert_close(model(tokens), expected, rtol=1e-5, atol=1e-5)
        if classifier is not hf:  # ShieldGemma 2's yes/no logits: the last position's at its two ids
            torch.testing.assert_close(classifier(input_ids=tokens).logits, model(tokens)[
                :, -1, [classifier.yes_token_index, classifier.no_token_index]], rtol=1e-5, atol=1e-5)
    prompt = tokens[0, :9].tolist()
    result = InferenceEngine(model, compile=False).generate([prompt], 10, SamplingParams(temperature=0))[0]
    hf.generation_config.eos_token_id = None
    reference = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert result.tokens == reference[0, len(prompt):].tolist()
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")], capsys)
    if CASES[kind][2] is None:  # import only: the export's one-line refusal
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        return
    assert code == 0, err
    back, info = causal_lm_class(CASES[kind][2]).from_pretrained(tmp_path / "out", output_loading_info=True)
    assert type(back).__name__ == CASES[kind][2] and not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(tokens).logits, expected, rtol=1e-5, atol=1e-5)


def test_head_tying_follows_transformers(tmp_path, capsys):
    """The multimodal config's tie_word_embeddings decides, else its class's default, whatever text_config says (as
    transformers' tie_weights reads it); a head the folder stores apart from the embedding under a tying config (a
    config.json that names no tying, true by default) is read untied, as transformers reads it."""
    from redline.interop import gemma4, llama4, qwen3_5
    from redline.interop.multimodal import families, text_config

    assert text_config({"text_config": {"tie_word_embeddings": False}, "tie_word_embeddings": True})[
        "tie_word_embeddings"] is True
    assert text_config({"text_config": {"tie_word_embeddings": False}})["tie_word_embeddings"] is True
    assert text_config({"text_config": {"tie_word_embeddings": True}}, tie_default=False)["tie_word_embeddings"] is False
    # PerceptionLMConfig's null (or absent) flag takes text_config's; a class with a default reads null as false
    for tie_default, expected in ((None, True), (True, False)):
        assert text_config({"text_config": {"tie_word_embeddings": True}, "tie_word_embeddings": None},
                           tie_default=tie_default)["tie_word_embeddings"] is expected
    for module, config in ((qwen3_5, transformers.Qwen3_5Config), (gemma4, transformers.Gemma4Config),
                           (llama4, transformers.Llama4Config)):  # their folders' reader follows the same rule
        for top, text in ((True, False), (False, True), (None, not config().tie_word_embeddings)):
            hf = {"text_config": {"tie_word_embeddings": text}, **({} if top is None else {"tie_word_embeddings": top})}
            expected = config().tie_word_embeddings if top is None else top
            assert module.text_config(hf)["tie_word_embeddings"] is expected, (module.__name__, top, text)
    # gemma4.py reads Gemma 4 Unified's folders, chameleon.py Chameleon's
    assert {f.name for f in families()} == {"gemma3", "mistral3", "qwen3_vl", *(CASES[kind][0]().model_type
                                                                              for kind in CASES
                                                                              if kind not in ("gemma4_unified",
                                                                                              "chameleon"))}
    hf = _folder("mistral3", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["tie_word_embeddings"]
    config["text_config"].pop("tie_word_embeddings", None)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    loaded = transformers.AutoModelForImageTextToText.from_pretrained(tmp_path / "hf").eval()
    assert loaded.config.tie_word_embeddings
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    assert not model.cfg.tie_embeddings
    tokens = torch.randint(0, VOCAB - 3, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        torch.testing.assert_close(loaded(input_ids=tokens).logits, expected)
        torch.testing.assert_close(model(tokens), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["llava", "llava_next", "llava_onevision", "qwen2_vl", "internvl", "aya_vision",
                                  "lfm2_vl", "smolvlm", "glm4v", "hunyuan_vl",
                                  "kimi_k25", "glm46v", "glm_ocr", "paddleocr_vl", "qianfan_ocr", "deepseek_vl",
                                  "idefics2", "perception_lm",
                                  "fast_vlm", "lighton_ocr", "janus", "ovis2", "video_llama_3", "shieldgemma2",
                                  "qwen2_5_omni_thinker", "qwen3_omni_moe_thinker", "granite_docling",
                                  "hyperclovax_vision_v2", "emu3", "molmo2-no-added"])
def test_head_tying_of_llava_like_configs_follows_their_class(kind):
    """Whether the head is tied, for each pair of top-level and text_config flags (either left out): as the
    multimodal config class settles it (LlavaConfig, Qwen2VLConfig, Glm4vConfig and HunYuanVLConfig take
    text_config's true where their own is false; LlavaNextConfig, InternVLConfig, AyaVisionConfig, Lfm2VlConfig and
    SmolVLMConfig their own alone; PerceptionLMConfig text_config's where its own is left out; FastVlmConfig,
    VideoLlama3Config and ShieldGemma2Config take text_config's true)."""
    from redline.interop.families import family_for

    base = CASES[kind][0]().to_dict()
    for top in (True, False, None):
        for text in (True, False, None):
            config = {**{k: v for k, v in base.items() if k != "tie_word_embeddings"},
                      "text_config": {k: v for k, v in base["text_config"].items() if k != "tie_word_embeddings"}}
            if top is not None:
                config["tie_word_embeddings"] = top
            if text is not None:
                config["text_config"]["tie_word_embeddings"] = text
            config_class = type(CASES[kind][0]())
            expected = config_class.from_dict(config).tie_word_embeddings
            assert family_for(config, "folder").model_config(config).tie_embeddings is expected, (top, text)


def test_text_configs_untying_flag_is_not_read(tmp_path, capsys):
    """A Mistral 3 folder whose config.json names no top-level tying (true by default) and whose text_config says
    false, with no head stored: transformers ties the head to the embedding; so does the import."""
    _folder("mistral3", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["tie_word_embeddings"]
    config["text_config"]["tie_word_embeddings"] = False
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if "lm_head" not in k}, str(tmp_path / "hf" / "model.safetensors"),
              metadata={"format": "pt"})
    loaded = transformers.AutoModelForImageTextToText.from_pretrained(tmp_path / "hf").eval()
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    assert model.cfg.tie_embeddings
    tokens = torch.randint(0, VOCAB - 3, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), loaded(input_ids=tokens).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind, hf, fragment", [
    ("gemma3", {"text_config": {"final_logit_softcapping": 30.0}}, "text_config.final_logit_softcapping=30.0"),
    ("gemma3", {"text_config": {"model_type": "gemma2"}}, "text_config.model_type='gemma2'.*gemma3_text"),
    ("mistral3", {"text_config": {"model_type": "llama"}}, "text_config.model_type='llama'.*ministral3 or mistral"),
    ("gemma3", {"text_config": {"attn_logit_softcapping": 50.0}}, "attn_logit_softcapping=50.0"),
    # a pruned head beyond the vocabulary
    ("apertus1p5", {"text_config": {"output_vocab_size": 400}}, "output_vocab_size=400 is outside"),
    ("aria", {"text_config": {"mlp_bias": True}}, "mlp_bias=true: Aria's shared experts then have biases"),
    ("minimax_m3_vl", {"text_config": {"swiglu_alpha": 1.5}}, "swiglu_alpha=1.5: redline's clamped SwiGLU"),
    ("minimax_m3_vl", {"text_config": {"mlp_layer_types": ["sparse", "dense", "sparse"]}},
     "dense_intermediate_size=48 != intermediate_size=32"),
    ("aria", {"text_config": {"moe_num_shared_experts": 0}}, "moe_num_shared_experts=0"),
    ("cohere_compass", {"text_config": {"rope_parameters": {"sliding_attention": None, "full_attention": None}}},
     "rope_parameters rotates no layer type"),
    ("cohere_compass", {"text_config": {"rope_parameters": {
        "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50.0}, "full_attention": None}}},
     "rope_parameters\\['sliding_attention'\\].rope_type='linear'"),
    ("llava", {"text_config": {"model_type": "gemma"}}, "text_config.model_type='gemma'.*llama or mistral or qwen2"),
    ("mllama", {"text_config": {"cross_attention_layers": [1, 9]}}, r"cross_attention_layers=\[1, 9\]: not layers"),
    ("molmo2", {"text_config": {"qk_norm_type": "olmo"}}, "qk_norm_type='olmo' with norm_after=false: .* not a mix"),
    ("molmo2", {"text_config": {"norm_after": True}}, "qk_norm_type='qwen3' with norm_after=true"),
    ("molmo2", {"text_config": {"attention_bias": True}}, "attention_bias=true: Molmo2's q/k/v biases"),
    ("molmo2", {"text_config": {"rope_scaling_layers": [1], "rope_parameters": {
        "rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}}}, r"rope_scaling_layers=\[1\]: RoPE scaling"),
    ("qwen2_vl", {"text_config": {"use_sliding_window": True, "sliding_window": 4,
                                  "layer_types": ["full_attention", "sliding_attention"]}},
     "a mix of full and sliding-window attention layers"),
])
def test_refusals_name_the_option(kind, hf, fragment):
    from redline.interop.families import family_for

    config = CASES[kind][0]().to_dict()
    config["text_config"].update(hf["text_config"])
    with pytest.raises(UserError, match=fragment):
        family_for(config, "folder").model_config(config)


def test_hub_shaped_configs():
    """The text_config fields of Gemma 3 4B's folder as the Hub holds it (sliding_window_pattern 6 without
    layer_types, linear RoPE scaling 8 on the full layers, rope_local_base_freq 10000, a tied head) and of Qwen3-VL's
    (interleaved MRoPE sections on default RoPE): the fields redline derives."""
    from redline.interop.families import family_for

    gemma = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "mm_tokens_per_image": 256,
             "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
             "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                             "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
                             "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 1024,
                             "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "vocab_size": 262208,
                             "final_logit_softcapping": None, "attn_logit_softcapping": None},
             "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}}
    cfg = family_for(gemma, "gemma-3-4b").model_config(gemma)
    cfg.validate()
    assert (cfg.n_layer, cfg.sliding_window, cfg.sliding_window_pattern, cfg.rope_scaling, cfg.rope_factor,
            cfg.rope_theta, cfg.rope_local_theta, cfg.tie_embeddings, cfg.logit_softcap, cfg.vocab_size) == (
        34, 1024, 6, "linear", 8.0, 1_000_000.0, 10_000.0, True, 0.0, 262208)
    qwen = {"model_type": "qwen3_vl", "tie_word_embeddings": True,
            "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 2048, "intermediate_size": 6144,
                            "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                            "head_dim": 128, "vocab_size": 151936, "rope_theta": 5_000_000,
                            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                             "rope_type": "default"}},
            "vision_config": {"model_type": "qwen3_vl", "depth": 24}}
    cfg = family_for(qwen, "qwen3-vl-2b").model_config(qwen)
    assert (cfg.qk_norm, cfg.rope_theta, cfg.rope_scaling, cfg.tie_embeddings, cfg.head_dim) == (
        True, 5_000_000.0, "none", True, 128)


@pytest.mark.parametrize("kind, sparse", [
    # Gemma 3 4B's text_config as its Hub folder gives it: no vocab_size, norm eps or context
    ("gemma3", {"hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34, "head_dim": 256,
                "num_attention_heads": 8, "num_key_value_heads": 4, "query_pre_attn_scalar": 256,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}),
    ("gemma3", {"hidden_size": 64, "num_hidden_layers": 2}),  # the window, heads and vocabulary by default
    ("mistral3", {"model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2}),
    ("mistral3", {"model_type": "mistral", "sliding_window": None, "vocab_size": 131072}),
    ("qwen3_vl", {"model_type": "qwen3_vl_text", "hidden_size": 64, "num_hidden_layers": 2}),
    ("apertus1p5", {"model_type": "apertus1p5_text", "hidden_size": 64, "num_hidden_layers": 2}),
    ("aria", {"model_type": "aria_text", "hidden_size": 64, "num_hidden_layers": 2}),
    ("minimax_m3_vl", {"model_type": "minimax_m3_vl_text", "hidden_size": 64, "num_hidden_layers": 2}),
    ("cohere_compass", {"model_type": "cohere_compass_text", "hidden_size": 64, "num_hidden_layers": 2,
                        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 50.0}}}),
    ("llava", {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}),
    ("llava_onevision", {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2}),
    ("internvl", {"hidden_size": 64, "num_hidden_layers": 2}),  # qwen2 by default
    ("qwen2_vl", {"hidden_size": 64, "num_attention_heads": 8, "rope_scaling": {"type": "mrope",
                                                                               "mrope_section": [1, 1, 2]}}),
    ("qwen2_5_vl", {"model_type": "qwen2_5_vl_text", "hidden_size": 64, "num_attention_heads": 8}),
    ("aya_vision", {"model_type": "cohere2", "hidden_size": 64, "num_attention_heads": 4}),
    ("lfm2_vl", {"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 2}),
    ("qwen3_vl_moe", {"model_type": "qwen3_vl_moe_text", "hidden_size": 64, "num_experts": 8}),
    ("glm4v", {"model_type": "glm4v_text", "hidden_size": 64, "num_attention_heads": 4}),
    ("exaone4_5", {"model_type": "exaone4", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 8}),
    ("glm4v_moe", {"model_type": "glm4v_moe_text", "hidden_size": 64, "num_attention_heads": 4}),
    ("hunyuan_vl", {"model_type": "hunyuan_vl_text", "hidden_size": 64, "num_attention_heads": 4,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 500.0, "mrope_section": [2, 2, 2, 2]}}),
    ("idefics2", {"hidden_size": 64, "num_attention_heads": 4}),  # mistral by default
    ("perception_lm", {"hidden_size": 64, "num_attention_heads": 4}),  # llama by default
    ("fast_vlm", {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2}),
    ("lighton_ocr", {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2}),
    ("janus", {"hidden_size": 64, "num_attention_heads": 4}),
    ("ovis2", {"hidden_size": 64, "num_hidden_layers": 2}),
    ("video_llama_3", {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2}),
    ("shieldgemma2", {"hidden_size": 64, "num_hidden_layers": 2}),
    ("qwen2_5_omni_thinker", {"hidden_size": 64, "num_attention_heads": 8,
                              "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 2]}}),
    ("qwen3_omni_moe_thinker", {"hidden_size": 64, "num_attention_heads": 8, "num_experts": 8}),
    ("granite_docling", {"num_hidden_layers": 2}),  # the width its tower's default out_hidden_size
    ("hyperclovax_vision_v2", {"model_type": "hyperclovax", "hidden_size": 64, "num_attention_heads": 4}),
    ("emu3", {"hidden_size": 64, "num_attention_heads": 4}),
    ("molmo2", {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}),
])
def test_sparse_text_config_reads_as_transformers_fills_it(kind, sparse):
    """A text_config that leaves fields out (save_pretrained writes those that differ from the class's defaults):
    the model redline reads is the one of the config transformers fills in."""
    from redline.interop.families import family_for

    config_class = transformers.AutoConfig.for_model(kind).__class__
    given = {"model_type": kind, "text_config": sparse, "vision_config": {}}
    filled = config_class.from_dict(given).to_dict()
    family = family_for(given, "folder")
    assert family.model_config(given) == family.model_config(filled)


def test_ovis2_untied_head_of_another_size_is_refused():
    """Ovis2's lm_head takes the top-level vocab_size and hidden_size: tied, it is the embedding whatever they say
    (read); untied and of other rows than text_config's, refused by name."""
    from redline.interop.families import family_for

    config = CASES["ovis2"][0]().to_dict()
    family_for(config, "folder").model_config({**config, "vocab_size": VOCAB + 8})
    with pytest.raises(UserError, match=f"vocab_size={VOCAB + 8} beside text_config.vocab_size={VOCAB}"):
        family_for(config, "folder").model_config({**config, "vocab_size": VOCAB + 8, "tie_word_embeddings": False})


@pytest.mark.parametrize("fields, fragment", [({"swin_norm": True}, "swin_norm=true"),
                                             ({"rms_norm_eps": 1e-6}, "rms_norm_eps=1e-06: Chameleon's QK LayerNorms"),
                                             ({"attention_bias": True}, "attention_bias=True with mlp_bias=False")])
def test_chameleon_refusals_name_the_option(fields, fragment):
    from redline.interop.families import family_for

    config = {**CASES["chameleon"][0]().to_dict(), **fields}
    with pytest.raises(UserError, match=fragment):
        family_for(config, "folder").model_config(config)


def test_qwen2_vl_hub_flat_config():
    """Qwen2-VL-2B-Instruct's config.json as the Hub holds it: the text model's fields at the top level beside
    vision_config, its RoPE of type mrope: read as Qwen2's (q/k/v biases, plain RoPE, a tied head)."""
    from redline.interop.families import family_for

    flat = {"model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"], "hidden_size": 1536,
            "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "vocab_size": 151936,
            "sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": True,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "vision_config": {"depth": 32, "embed_dim": 1280, "hidden_size": 1536}}
    cfg = family_for(flat, "qwen2-vl-2b").model_config(flat)
    cfg.validate()
    assert (cfg.n_layer, cfg.n_kv_head, cfg.has_qkv_bias, cfg.rope_theta, cfg.rope_scaling, cfg.sliding_window,
            cfg.tie_embeddings) == (28, 2, True, 1_000_000.0, "none", 0, True)


@pytest.mark.parametrize("model_type, fragment", [("inkling_mm_model", "relative-position bias"),
                                                   ("inkling2", "block attention residuals"),
                                                   ("inkling2_loop", "looped loop_num_passes times"),
                                                   ("idefics", "gated cross-attention blocks"),
                                                   ("muse_glimmer", "weightless QK-norm"),
                                                   ("muse_spark", "residual gates")])
def test_refused_multimodal_folders_name_why(model_type, fragment):
    """The Inkling folders (relative-position biases, short convolutions, looped layers), the Muse folders (text
    models redline does not read) and Idefics (gated cross-attention blocks) are refused by name at import."""
    from redline.interop.families import family_for

    config = transformers.AutoConfig.for_model(model_type).to_dict()
    with pytest.raises(UserError, match=f"model_type '{model_type}' is not supported: .*{fragment}"):
        family_for(config, "folder")


# Round 3 (part A): the refusals, sparse text configs and Hub layouts of the folders above


@pytest.mark.parametrize("kind, sparse", [
    ("kimi_k25", {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2}),
    ("kimi_k25", {"model_type": "kimi_k2", "hidden_size": 64, "num_hidden_layers": 2}),  # its Hub folders' name
    ("glm46v", {"model_type": "glm4v_text", "hidden_size": 64, "num_attention_heads": 4}),
    ("glm46v", {"model_type": "glm4v_moe_text", "hidden_size": 64, "num_attention_heads": 4}),
    ("glmga", {"model_type": "glm4v_text", "hidden_size": 64, "num_attention_heads": 4}),
    ("glm_ocr", {"model_type": "glm_ocr_text", "hidden_size": 64, "num_attention_heads": 4}),
    ("ernie4_5_vl_moe", {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4}),
    ("paddleocr_vl", {"hidden_size": 64, "num_attention_heads": 4, "head_dim": None}),
    ("lfm3_vl", {"model_type": "lfm3", "hidden_size": 64, "num_hidden_layers": 2,
                 "layer_types": ["conv", "full_attention"]}),
    ("qianfan_ocr", {"hidden_size": 64, "num_hidden_layers": 2}),  # qwen3 by default
    ("deepseek_vl", {"hidden_size": 64, "num_attention_heads": 4}),  # llama by default
    ("cosmos3_omni", {"model_type": "qwen3_vl_text", "hidden_size": 64, "num_hidden_layers": 2}),
    ("cosmos3_edge", {"hidden_size": 256, "num_attention_heads": 2}),  # head_dim 128 by default
    ("ernie4_5_vl_moe", {"hidden_size": 64, "num_attention_heads": 4,
                         "rope_parameters": {"rope_type": "default", "mrope_section": [22, 22, 20]}}),
])
def test_round3_sparse_text_config_reads_as_transformers_fills_it(kind, sparse):
    """A text_config that leaves fields out: the model redline reads is the one of the config transformers fills in
    (kimi_k2 read as the deepseek_v3 Kimi_K25Config makes of it)."""
    from redline.interop.families import family_for

    config_class = transformers.AutoConfig.for_model(kind).__class__
    given = {"model_type": kind, "text_config": sparse, "vision_config": {}}
    filled = config_class.from_dict(given).to_dict()
    family = family_for(given, "folder")
    assert family.model_config(given) == family.model_config(filled)


@pytest.mark.parametrize("kind, top, fragment", [
    ("kimi_k25", {"quantization_config": {"quant_method": "compressed-tensors"}},
     "quantization_config \\(quant_method='compressed-tensors'\\): redline reads a kimi_k25 folder's unquantized"),
    ("glm46v", {"text_config": {"model_type": "glm4"}}, "text_config.model_type='glm4'.*glm4v_moe_text or glm4v_text"),
    ("glm_ocr", {"text_config": {"rope_parameters": {"rope_type": "linear", "factor": 2.0}}},
     "RoPE scaling 'linear'"),
    ("ernie4_5_vl_moe", {"text_config": {"mlp_layer_types": ["sparse", "dense", "sparse"]}},
     r"mlp_layer_types=\['sparse', 'dense', 'sparse'\]: redline reads ERNIE 4.5's experts"),
    ("deepseek_ocr2", {"text_config": {"mlp_layer_types": ["dense", "sparse", "dense"]}},
     "mlp_layer_types=.*dense layers before its expert layers"),
    ("deepseek_ocr2", {"text_config": {"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1}},
     "topk_method='group_limited_greedy'"),
])
def test_round3_refusals_name_the_option(kind, top, fragment):
    from redline.interop.families import family_for

    config = CASES[kind][0]().to_dict()
    config["text_config"].update(top.pop("text_config", {}))
    config.update(top)
    with pytest.raises(UserError, match=fragment):
        family_for(config, "folder").model_config(config)


@pytest.mark.parametrize("model_type, fragment", [("unlimited_ocr_text", "reference sliding windows")])
def test_round3_refused_folders_name_why(model_type, fragment):
    """Unlimited-OCR's text model alone (no causal LM of it in transformers: an unlimited_ocr folder holds it) is
    refused by name at import."""
    from redline.interop.families import family_for

    config = transformers.AutoConfig.for_model(model_type).to_dict()
    with pytest.raises(UserError, match=f"model_type '{model_type}' is not supported: .*{fragment}"):
        family_for(config, "folder")


def test_glm_ocr_multi_token_prediction_layer_is_left_out(tmp_path, capsys):
    """GLM-OCR's Hub folders hold a multi-token-prediction layer past the last (transformers ignores it on load):
    the import leaves it out and reads the same model."""
    hf = _folder("glm_ocr", tmp_path / "hf")
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    extra = {k.replace("layers.1.", "layers.2."): v.clone() for k, v in weights.items() if ".layers.1." in k}
    save_file({**weights, **extra, "model.language_model.layers.2.eh_proj.weight": torch.zeros(64, 128)},
              str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt"), "--dtype", "fp32"],
                           capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    tokens = torch.randint(0, VOCAB - 3, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(input_ids=tokens).logits, rtol=1e-5, atol=1e-5)


def test_paddleocr_vl_hub_flat_config():
    """PaddleOCR-VL's config.json as the Hub holds it: the text model's fields at the top level beside
    vision_config, multimodal RoPE sections on default RoPE: read as Llama's (heads 128 wide, no biases, plain RoPE,
    tied), as PaddleOCRVLConfig fills it in."""
    from redline.interop.families import family_for

    flat = {"model_type": "paddleocr_vl", "architectures": ["PaddleOCRVLForConditionalGeneration"],
            "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 18, "num_attention_heads": 16,
            "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 103424, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5, "rope_theta": 500000, "use_bias": False,
            "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
            "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27}}
    cfg = family_for(flat, "paddleocr-vl").model_config(flat)
    cfg.validate()
    assert (cfg.n_layer, cfg.n_kv_head, cfg.head_dim, cfg.has_qkv_bias, cfg.bias, cfg.rope_theta, cfg.rope_scaling,
            cfg.tie_embeddings) == (18, 2, 128, False, False, 500_000.0, "none", True)
    assert transformers.PaddleOCRVLConfig.from_dict(flat).tie_word_embeddings


def test_nemotron_h_omni_legacy_llm_config_and_untied_head():
    """Nemotron-H Omni's released config.json nests its text model under llm_config (which transformers reads as
    text_config): read the same; its head is untied whatever text_config's tie_word_embeddings says, as transformers
    builds it."""
    from redline.interop.families import family_for

    for tie in (True, False):
        config = _nemotron_h_omni_config(tie_word_embeddings=tie)
        hf = transformers.NemotronH_Omni_Reasoning_V3(config)
        assert hf.language_model.lm_head.weight is not hf.language_model.get_input_embeddings().weight
        given = config.to_dict()
        legacy = {**{k: v for k, v in given.items() if k != "text_config"}, "llm_config": given["text_config"]}
        family = family_for(given, "folder")
        cfg = family.model_config(given)
        assert not cfg.tie_embeddings and family.model_config(legacy) == cfg
