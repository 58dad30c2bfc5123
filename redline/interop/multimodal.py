"""The text model of multimodal folders whose language model is a family redline already reads: Gemma 3's
Gemma3ForConditionalGeneration (model_type "gemma3", its text model gemma3_text: Gemma 3 4B, 12B, 27B), Mistral 3's
Mistral3ForConditionalGeneration (model_type "mistral3", its text model mistral or ministral3: Mistral Small 3.1 and
3.2, Magistral; mistral4: Mistral-Small-4, latent attention under DeepSeek-V3's tensor names) and Qwen3-VL's
Qwen3VLForConditionalGeneration (model_type "qwen3_vl", its text model qwen3_vl_text,
read as qwen3); and the LLaVA-like folders, whose model.language_model (model.text_model for SmolVLM and Idefics3)
is transformers' AutoModel of text_config under a plain lm_head: LLaVA, LLaVA-NeXT, LLaVA-OneVision, VipLLaVA,
Video-LLaVA, LLaVA-NeXT-Video and InternVL (read as llama, mistral, qwen2 or qwen3), SmolVLM and Idefics3 (the same),
Aya Vision and Command A Vision (cohere2, their logits lm_head's without the text model's logit_scale), LFM2-VL
(lfm2); Qwen2-VL and Qwen2.5-VL (qwen2, their multimodal RoPE plain on text, as below) and Qwen3-VL-MoE (qwen3_moe,
Qwen3-VL's RoPE, its stacked experts transposed as transformers loads them); GLM-4.1V (glm4: GLM-4's interleaved
partial RoPE) and GLM-4.5V (glm4_moe), HunYuan-VL (hunyuan_v1_dense), their multimodal RoPE plain on text as
Qwen2-VL's; EXAONE 4.5 (exaone4), Granite 4.0 Vision (granite, its multipliers and logit scaling as
GraniteForCausalLM's), Llama 3.2 Vision (Mllama: llama, its self-attention layers alone, the cross-attention layers
among them skipped on text as MllamaTextModel skips them). On text alone each of their forwards is the text model's
(image and video tokens' rows, or deepstack features, are added only where pixel values are given). PaliGemma (a
prefix-LM) is paligemma.py's; Mistral Large 4 and the Inkling folders are refused by name (families.NOT_READ).
Also Apertus 1.5's Apertus1p5ForConditionalGeneration (model_type "apertus1p5", its text model apertus1p5_text:
apertus.py, whose image and audio tokens are ids of the text model's own vocabulary), Cohere Compass's
CohereCompassForConditionalGeneration (model_type "cohere_compass": North-Micro-Vision, Qwen3-VL's tower and
forward around cohere_compass_text: cohere.py, whose multimodal RoPE is plain RoPE on text as Qwen3-VL's is),
Aria's AriaForConditionalGeneration (model_type "aria", its text model aria_text: aria.py) and MiniMax-M3's
MiniMaxM3SparseForConditionalGeneration (model_type "minimax_m3_vl", its text model minimax_m3_vl_text:
minimax_m3.py, import only) and Step 3.7's Step3p7ForConditionalGeneration (model_type "step3p7", its text model
step3p5: step3p5.py, import only).
Also Kimi K2.5's Kimi_K25ForConditionalGeneration (kimi_k25: DeepSeek-V3's text model), GLM-4.6V's and GLMGA's
Glm46VForConditionalGeneration (glm46v, glmga: GLM-4.1V's or GLM-4.5V's text model) and GLM-OCR's (glm_ocr: GLM-4.1V's
text model without q/k/v biases), their multimodal RoPE plain on text as GLM-4.1V's; ERNIE 4.5 VL (ernie4_5_vl_moe:
ERNIE 4.5 MoE's text model with its text experts alone, which it runs where no token is an image's), PaddleOCR-VL
(ERNIE 4.5's dense block rotating as Qwen2-VL's, read as Llama's), LFM3-VL (lfm3), MiniCPM-V 4.6 and 4.7 and
MiniCPM-OCR (qwen3_5_text), Qianfan-OCR (InternVL's model, qwen3), DeepSeek-VL and its hybrid (llama), Cosmos 3's
Reasoner (cosmos3_omni: Qwen3-VL's model under Cosmos 3's names) and Edge (cosmos3_edge: Llama's attention with a
ReLU² MLP, read as Arcee's), DeepSeek-OCR 2 (deepseek_ocr2: Llama's attention with DeepSeek-V2's experts, import only),
Unlimited-OCR (unlimited_ocr: DeepSeek-OCR 2's text model whose windowed layers keep the prompt visible,
model.reference_window; import only),
Nemotron 3 Nano Omni (nemotron_h_omni: Nemotron-H's NemotronHForCausalLM, its config under text_config or llm_config).
minimax_m3.py, import only). Idefics2, PerceptionLM, FastVLM, LightOnOCR, Janus, Ovis2 and VideoLLaMA 3 are
LLaVA-like (_more_llava_like); Qwen2.5-Omni's and Qwen3-Omni's thinkers are Qwen2.5-VL's and Qwen3-VL-MoE's kin
beside an audio encoder; Granite-Docling's text model is Granite's, HyperCLOVA X SEED Vision's HyperCLOVA X's,
Emu3's Llama's (beside the VQ-VAE that tokenizes its images), Molmo2's Qwen3's or OLMo 2's (fused tensors in its Hub
layout, a head narrower than its embedding); ShieldGemma 2's classifier wraps Gemma 3's
ForConditionalGeneration, whose text model is read.

Qwen2-VL's multimodal RoPE gives each rotary frequency the temporal, height or width position in contiguous
mrope_section blocks of the rotate-half layout; on text alone the three are the token's one position, so it is
Qwen2's RoPE.

Qwen3-VL's text model is Qwen3's (QK-norm per head) with interleaved multimodal RoPE: each rotary frequency takes the
temporal, height or width position as mrope_section assigns it. On text alone the three are the token's one position
(transformers' Qwen3VLTextModel expands arange positions to all three where no image or video grid is given, and
recomposition_frequencies then chooses among equal frequencies), so the rotation is plain RoPE; its deepstack visual
embeddings are added to the first layers only where images are given.

Such a folder's config.json nests the text model's config under text_config, beside a vision_config; the text weights
sit under language_model.model. (Gemma 3's and Mistral 3's Hub folders, which transformers 5's save_pretrained still
writes) or model.language_model. (transformers 5's module names; Qwen3-VL's Hub folders), the head at lm_head,
language_model.lm_head or tied to the embedding. The vision tower and the projector into the text model's width are
left unread (hf.convert_source says so on stderr): a text-only prompt runs the text model alone, image tokens' rows
being replaced by image features only where pixel values are given (transformers' Gemma3Model, Mistral3Model and
Qwen3VLModel forwards). Imports export as the text-only family, which transformers loads as Gemma3ForCausalLM /
MistralForCausalLM / Qwen3ForCausalLM.

Whether the head is tied is the multimodal config's own tie_word_embeddings (true by default for Gemma 3 and Mistral
3, false for Qwen3-VL), which transformers 5 reads rather than text_config's, whatever text_config says.
transformers leaves a stored head that differs from the embedding untied whatever the config says, and so does redline
(Family.settle): a config.json that names no tying (true by default) beside a head of its own reads untied.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig

# (tried in order: ShieldGemma 2's, Gemma 3's names one level down (as save_pretrained writes them, then as its Hub
# folders have them), before transformers 5's)
_TEXT_PREFIXES = (("model.model.language_model.model.", "model."), ("model.lm_head.", "lm_head."),
                  ("model.language_model.model.", "model."), ("model.language_model.lm_head.", "lm_head."),
                  ("language_model.model.blocks.", "model.layers."),  # Kimi K2.5's layers as save_pretrained
                  # writes them (so before language_model.model.): its conversion mapping's blocks -> layers rename,
                  # meant for its vision tower, run backwards over the text model's layers too; Qianfan-OCR's
                  # encoder.layers -> layers the same way
                  ("language_model.model.encoder.layers.", "model.layers."),
                  ("language_model.backbone.", "backbone."),  # Nemotron-H Omni's NemotronHForCausalLM
                  ("model.language_model.", "model."),  # transformers 5's module names (Qwen3-VL's Hub folders)
                  # Gemma 3's and Mistral 3's Hub folders, as save_pretrained still writes them (LLaVA's too)
                  ("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                  ("model.text_model.", "model."),  # SmolVLM's and Idefics3's (Idefics2's too)
                  ("text_model.model.", "model."), ("text_model.lm_head.", "lm_head."))  # Emu3's
_TOWERS = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.", "multi_modal_projector.",
           "model.visual.", "visual.",  # Gemma 3's, Mistral 3's, LLaVA's; Qwen2-VL's and Qwen3-VL's tower and mergers
           "model.image_newline", "image_newline",  # LLaVA-NeXT's row separator between image tiles
           "model.vision_model.", "model.connector.",  # SmolVLM's and Idefics3's (Mllama's too)
           "vision_model.",  # Mllama's as its Hub folders (and save_pretrained) name it
           "model.image_tower.", "image_tower.", "model.video_tower.", "video_tower.",  # Video-LLaVA's
           "vit.",  # HunYuan-VL's tower and projector as its Hub folders (and save_pretrained) name them
           # Granite 4.0 Vision's deepstack and spatial projectors
           "model.layerwise_projectors.", "layerwise_projectors.", "model.spatial_projectors.", "spatial_projectors.",
           # Apertus 1.5's image and audio tokenizers
           "model.vision_tokenizer.", "vision_tokenizer.", "model.audio_tokenizer.", "audio_tokenizer.",
           "patch_merge_mlp.", "model.patch_merge_mlp.",  # MiniMax-M3's patch merger, as its Hub folders name it
           # dots.3 Note's towers and adapters, in memory and as save_pretrained (and its Hub folders) name them
           "model.audio_tower.", "audio_tower.", "audio_encoder.", "vision_encoder.",
           "model.mm_projector.", "mm_projector.",  # Kimi K2.5's projector
           "model.resampler_model.", "resampler_model.",  # ERNIE 4.5 VL's
           "model.projector.", "mlp_AR.",  # PaddleOCR-VL's, in memory and as its Hub folders name it
           "model.merger.", "merger.",  # MiniCPM-V 4.6's
           "mlp1.",  # Qianfan-OCR's projector as its Hub folders name it
           # DeepSeek-VL's aligner, DeepSeek-VL (hybrid)'s high-resolution SAM tower, neck, projection and mix
           "model.aligner.", "aligner.", "model.high_res_vision_", "high_res_vision_",
           # Cosmos 3's Qwen3-VL tower as its unified checkpoints (and save_pretrained) name it
           "blocks.", "patch_embed.", "pos_embed.", "deepstack_merger_list.",
           # DeepSeek-OCR 2's SAM and Qwen2 encoders and its view separator
           "model.sam_model.", "model.qwen2_model.", "model.view_seperator",
           "embed_audio.", "vision_final_layernorm.",  # Nemotron-H Omni's audio projector and its tower's last norm
           # ShieldGemma 2's Gemma 3 one level down
           "model.model.vision_tower.", "model.model.multi_modal_projector.",
           "model.vision_encoder.", "model.vision_projection.", "vision_projection.",  # LightOnOCR's
           # Janus's understanding tower and aligner, its image-generation VQ-VAE, embedding, aligner and head
           "model.vqmodel.", "model.generation_embeddings.", "model.generation_aligner.",
           "model.generation_head.", "aligner.", "vqmodel.", "generation_embeddings.", "generation_aligner.",
           "generation_head.",
           "model.visual_embeddings_table.", "visual_embeddings_table.",  # Ovis2's visual token table
           "projector.",  # VideoLLaMA 3's and HyperCLOVA X SEED Vision's projector
           "model.vision_projector.",  # HyperCLOVA X SEED Vision's as its Hub folders name it
           "model.density_router.",  # Granite-Docling's image-token router
           "model.vision_backbone.",  # Molmo2's tower and adapter, as its Hub folders (and save_pretrained) name them
           "vit_large_projector.")  # Step 3.7's projector as its Hub folders (and save_pretrained) name it


# The text config classes' defaults for the fields redline reads, which transformers fills in where a folder's
# text_config leaves them out (save_pretrained writes a nested config's fields that differ from them; Gemma 3's Hub
# folders give no vocab_size, for one): Gemma3TextConfig's, MistralConfig's, Qwen3VLTextConfig's
_TEXT_DEFAULTS = {
    "gemma3_text": dict(vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=131_072,
                        rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=4096, tie_word_embeddings=True),
    "mistral": dict(vocab_size=32_000, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131_072, rms_norm_eps=1e-6,
                    sliding_window=4096),
    # Mistral4Config's (the rest its reader's own defaults: deepseek_kin._MISTRAL4_DEFAULTS)
    "mistral4": dict(vocab_size=131_072, hidden_size=4096, intermediate_size=12_288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=1_048_576,
                     rms_norm_eps=1e-6, tie_word_embeddings=False),
    "qwen3_vl_text": dict(vocab_size=151_936, hidden_size=4096, intermediate_size=22_016, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=32, head_dim=128,
                          max_position_embeddings=128_000, rms_norm_eps=1e-6, rope_theta=500_000.0),
    # the text models of the LLaVA-like folders (LlamaConfig's and CohereConfig's heads default to the query heads;
    # Qwen2-VL's and Qwen2.5-VL's text configs share one set of defaults)
    "llama": dict(vocab_size=32_000, hidden_size=4096, intermediate_size=11_008, num_hidden_layers=32,
                  num_attention_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "qwen2": dict(vocab_size=151_936, hidden_size=4096, intermediate_size=22_016, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=32_768, rms_norm_eps=1e-6,
                  sliding_window=4096, tie_word_embeddings=False),
    "qwen3": dict(vocab_size=151_936, hidden_size=4096, intermediate_size=22_016, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, head_dim=128, max_position_embeddings=32_768,
                  rms_norm_eps=1e-6, sliding_window=4096, tie_word_embeddings=False),
    **dict.fromkeys(("qwen2_vl_text", "qwen2_5_vl_text"), dict(
        vocab_size=152_064, hidden_size=8192, intermediate_size=29_568, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, max_position_embeddings=32_768, rms_norm_eps=1e-5, rope_theta=1_000_000.0,
        sliding_window=4096, tie_word_embeddings=False)),
    "qwen3_vl_moe_text": dict(vocab_size=151_936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                              num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=128_000,
                              rms_norm_eps=1e-6, rope_theta=500_000.0, moe_intermediate_size=1408,
                              num_experts_per_tok=4, num_experts=60, tie_word_embeddings=True),
    "glm4v_text": dict(vocab_size=151_552, hidden_size=4096, intermediate_size=13_696, num_hidden_layers=40,
                       num_attention_heads=32, num_key_value_heads=2, max_position_embeddings=32_768,
                       rms_norm_eps=1e-5, tie_word_embeddings=False),
    "glm4v_moe_text": dict(vocab_size=151_424, hidden_size=4096, intermediate_size=10_944, num_hidden_layers=46,
                           num_attention_heads=96, num_key_value_heads=8, max_position_embeddings=65_536,
                           rms_norm_eps=1e-5, attention_bias=True, moe_intermediate_size=1408, num_experts_per_tok=8,
                           n_shared_experts=1, n_routed_experts=128, first_k_dense_replace=1,
                           tie_word_embeddings=False),
    "hunyuan_vl_text": dict(vocab_size=290_943, hidden_size=4096, intermediate_size=11_008, num_hidden_layers=32,
                            num_attention_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-5,
                            tie_word_embeddings=True),
    # HYV4VLTextConfig's, where they differ from HYV4Config's (the rest its reader's own defaults: hy_v4._DEFAULTS)
    "hy_v4_vl_text": dict(hidden_size=6144, intermediate_size=18_432, moe_intermediate_size=2048,
                          num_hidden_layers=78, num_attention_heads=64, q_lora_rank=2048, tie_word_embeddings=False),
    "exaone4": dict(vocab_size=102_400, hidden_size=4096, intermediate_size=16_384, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-5,
                    sliding_window=4096, sliding_window_pattern=4, tie_word_embeddings=False),
    "granite4_vision_text": dict(vocab_size=32_000, hidden_size=4096, intermediate_size=11_008, num_hidden_layers=32,
                                 num_attention_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6,
                                 tie_word_embeddings=False),
    "mllama_text_model": dict(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=40,
                              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131_072,
                              rms_norm_eps=1e-5, tie_word_embeddings=False),
    "cohere2": dict(vocab_size=256_000, hidden_size=8192, intermediate_size=22_528, num_hidden_layers=40,
                    num_attention_heads=64, max_position_embeddings=8192, layer_norm_eps=1e-5, sliding_window=4096,
                    sliding_window_pattern=4, logit_scale=0.0625, tie_word_embeddings=True),
    # GemmaConfig's and Gemma2Config's (PaliGemma's text models; its Hub configs give few fields)
    "gemma": dict(vocab_size=256_000, hidden_size=3072, intermediate_size=24_576, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=16, head_dim=256, max_position_embeddings=8192,
                  rms_norm_eps=1e-6),
    "gemma2": dict(vocab_size=256_000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=8192,
                   rms_norm_eps=1e-6, sliding_window=4096, query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0),
    # Qwen2.5-Omni's and Qwen3-Omni's thinker text configs
    "qwen2_5_omni_text": dict(vocab_size=152_064, hidden_size=3584, intermediate_size=18_944, num_hidden_layers=28,
                              num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32_768,
                              rms_norm_eps=1e-6, rope_theta=1_000_000.0, sliding_window=32_768,
                              tie_word_embeddings=True),
    "qwen3_omni_moe_text": dict(vocab_size=3584, hidden_size=2048, intermediate_size=18_944, num_hidden_layers=28,
                                num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32_768,
                                rms_norm_eps=1e-6, rope_theta=1_000_000.0, moe_intermediate_size=768,
                                num_experts_per_tok=8, num_experts=128, norm_topk_prob=True, tie_word_embeddings=False),
    "granite_docling_text": dict(vocab_size=133_800, hidden_size=1024, intermediate_size=2048, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=32_768,
                                 rms_norm_eps=1e-5, embedding_multiplier=12.0, logits_scaling=4.0,
                                 residual_multiplier=0.263, attention_multiplier=0.015625, tie_word_embeddings=True),
    # (HyperCLOVAXConfig's heads default to the query heads, its head_dim to hidden_size / num_attention_heads)
    "hyperclovax": dict(vocab_size=32_000, hidden_size=4096, intermediate_size=11_008, num_hidden_layers=32,
                        num_attention_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6,
                        tie_word_embeddings=False),
    "molmo2_text": dict(vocab_size=151_936, additional_vocab_size=128, hidden_size=4096, intermediate_size=12_288,
                        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        max_position_embeddings=36_864, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "lfm2": dict(vocab_size=65_536, hidden_size=2560, intermediate_size=12_288, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=128_000, norm_eps=1e-5,
                 rope_theta=1_000_000.0, tie_word_embeddings=True),
    # DeepseekV3Config's (Kimi K2.5's text model; its Hub folders' kimi_k2, which Kimi_K25Config reads as it)
    **dict.fromkeys(("deepseek_v3", "kimi_k2"), dict(
        vocab_size=129_280, hidden_size=7168, intermediate_size=18_432, moe_intermediate_size=2048,
        num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
        n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
        v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4, num_experts_per_tok=8, first_k_dense_replace=3,
        norm_topk_prob=True, max_position_embeddings=4096, rms_norm_eps=1e-6, rope_interleave=True,
        tie_word_embeddings=False)),
    "glm_ocr_text": dict(vocab_size=59_392, hidden_size=1024, intermediate_size=4096, num_hidden_layers=16,
                         num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=131_072,
                         rms_norm_eps=1e-5, tie_word_embeddings=False),
    "ernie4_5_vl_moe_text": dict(vocab_size=103_424, hidden_size=2560, intermediate_size=12_288, num_hidden_layers=28,
                                 num_attention_heads=20, num_key_value_heads=4, max_position_embeddings=131_072,
                                 rms_norm_eps=1e-5, rope_theta=500_000.0, moe_k=6, moe_num_experts=64,
                                 moe_num_shared_experts=2, moe_intermediate_size=[1536, 512],
                                 tie_word_embeddings=True),
    "paddleocr_vl_text": dict(vocab_size=103_424, hidden_size=1024, intermediate_size=3072, num_hidden_layers=18,
                              num_attention_heads=16, num_key_value_heads=2, head_dim=128,
                              max_position_embeddings=131_072, rms_norm_eps=1e-5, rope_theta=500_000.0,
                              tie_word_embeddings=True),
    "lfm3": dict(vocab_size=128_000, hidden_size=2048, intermediate_size=7680, num_hidden_layers=24,
                 num_attention_heads=16, num_key_value_heads=4, head_dim=128, max_position_embeddings=128_000,
                 norm_eps=1e-5, conv_L_cache=7, sliding_window=256, use_sandwich_norm=True, use_attention_gate=True,
                 rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                  "full_attention": {"rope_type": "proportional", "rope_theta": 1_000_000.0,
                                                     "partial_rotary_factor": 0.5}},
                 tie_word_embeddings=True),
    "cosmos3_edge_text": dict(vocab_size=131_072, hidden_size=2048, intermediate_size=9216, num_hidden_layers=28,
                              num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                              max_position_embeddings=131_072, rms_norm_eps=1e-5, hidden_act="relu2",
                              tie_word_embeddings=False),
}


def text_config(hf: dict, tie_default: bool | None = True, text_tie: bool = False) -> dict:
    """The text model's config: text_config, its class's defaults where it leaves a field out (_TEXT_DEFAULTS), with
    the head's tying the multimodal config's, else its class's default (tie_default): transformers' tie_weights reads
    the top-level config's flag, which text_config's does not set; or hf itself where it nests none. text_tie: the
    multimodal config takes text_config's true where its own is false (LlavaConfig's and Qwen2VLConfig's
    __post_init__), text_config's own flag its class's default where it gives none (_TEXT_DEFAULTS); a top-level
    flag that is null or left out where tie_default is None: text_config's own (PerceptionLMConfig's __post_init__)."""
    if "text_config" not in hf:
        return hf
    given = hf["text_config"]
    text = {**_TEXT_DEFAULTS.get(given.get("model_type"), {}), **given}
    own = bool(text.get("tie_word_embeddings", False))
    top = hf.get("tie_word_embeddings", tie_default)
    text["tie_word_embeddings"] = own if top is None and tie_default is None else bool(top) or (text_tie and own)
    return text


def text_view(src: TensorSource) -> TensorSource:
    """src with the text model's tensors read under the text-only names (model.*, lm_head.weight); the rest (vision
    tower, projector) keep their names and are left unread. Qwen3.5's, Gemma 4's and Llama 4's multimodal folders
    are read through it too."""
    names = {_text_name(n): n for n in src.names}
    return TensorSource(names, lambda name: src.take(names[name]), src.where)


def _text_name(name: str) -> str:
    """A folder's tensor name as text_view reads it."""
    for theirs, ours in _TEXT_PREFIXES:
        if name.startswith(theirs):
            return ours + name[len(theirs):]
    return name


def is_tower(name: str) -> bool:
    """A tensor of the vision tower or of the projector from it into the text model, which text does not run."""
    return name.startswith(_TOWERS)


def _stored_head_differs(src: TensorSource) -> bool:
    """Whether the folder stores a head with values other than the embedding's."""
    if "lm_head.weight" not in src or "model.embed_tokens.weight" not in src:
        return False
    head, embedding = src.take("lm_head.weight"), src.take("model.embed_tokens.weight")
    return head.shape != embedding.shape or not torch.equal(head, embedding)


def _plain_view(src: TensorSource, cfg: ModelConfig) -> TensorSource:
    """The text model's tensors as text_view names them (multimodal_family's default view)."""
    return text_view(src)


def multimodal_family(name: str, architecture: str, text_families: dict[str, Family], default_text: str,
                      check: Callable[[dict], None] = lambda hf: None, tie_default: bool | None = True,
                      text_tie: bool = False, adapt: Callable[[dict], dict] = lambda text: text,
                      view: Callable[[TensorSource, ModelConfig], TensorSource] = _plain_view,
                      layout_of: Callable[[ModelConfig], str] | None = None,
                      settle_text: Callable[[dict, TensorSource], dict] | None = None) -> Family:
    """The Family of a multimodal folder (model_type `name`) whose text model is one of `text_families` (by
    text_config's model_type, `default_text` where it names none; all of them must share their tensor names);
    check(hf) raises a UserError for a multimodal config whose text model is not the text family's; tie_default and
    text_tie as text_config takes them; adapt(text config): the text config as the multimodal model
    computes it, where that differs from the text family's reading (Qwen2-VL's MRoPE, Aya Vision's logit scale);
    view(src, cfg): the text model's tensors under the text family's names and layouts; layout_of(cfg): the text
    family whose tensors a model read as cfg has, where text_families do not all share them (Mistral 3's mistral4
    text model, latent attention and experts beside mistral's and ministral3's Llama layout), else default_text's;
    settle_text(text_config, src): text_config as the folder's weights settle it (Mistral Large 4's learned RoPE
    frequencies, mistral_large4.settle_text), or None."""
    text = text_families[default_text]

    def text_for(cfg: ModelConfig) -> Family:
        return text_families[layout_of(cfg)] if layout_of is not None else text

    def text_of(hf: dict) -> dict:
        if "text_config" in hf:  # its class's defaults by the model_type it names or implies
            kind = hf["text_config"].get("model_type", default_text)
            hf = {**hf, "text_config": {"model_type": kind, **hf["text_config"]}}
        return text_config(hf, tie_default, text_tie)

    def model_config(hf: dict) -> ModelConfig:
        kind = hf.get("text_config", {}).get("model_type", default_text)
        raise_first([(kind not in text_families,
                      f"text_config.model_type={kind!r}: redline reads a {name} folder's text model as "
                      f"{' or '.join(sorted(text_families))}")])
        check(hf)
        return text_families[kind].model_config(adapt(text_of(hf)))

    def settle(hf: dict, src: TensorSource) -> dict:
        """hf untied where it ties the head but the folder stores one of other values, as transformers reads it
        (PreTrainedModel.tie_weights leaves such a pair apart); its text_config settled by settle_text."""
        if settle_text is not None:
            hf = {**hf, "text_config": settle_text(hf.get("text_config", {}), src)}
        if not (text_of(hf)["tie_word_embeddings"] and _stored_head_differs(text_view(src))):
            return hf
        if "text_config" in hf:  # text_config's own flag too, which a text_tie config would take
            hf = {**hf, "text_config": {**hf["text_config"], "tie_word_embeddings": False}}
        return {**hf, "tie_word_embeddings": False}

    def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
        text_src = view(src, cfg)
        out = text_for(cfg).to_redline(text_src, cfg)
        if view is not _plain_view:  # a view of its own renames layers: it marks what it reads in src itself
            return out
        # what the text family marked read without taking it (dots.3 Note's indexer, which it leaves out): read in
        # the folder too, under the name text_view renamed
        raw = {_text_name(n): n for n in src.names}
        src.used.update(raw[n] for n in text_src.used)
        return out

    def fold(hf: dict, cfg: ModelConfig, state: dict) -> dict:
        """The text family's fold of text_config (mistral4's: DeepSeek-V3's interleaved RoPE rows put in
        redline's order)."""
        own = text_for(cfg).fold
        return state if own is None else own(text_of(hf), cfg, state)

    def ignorable(n: str) -> bool:
        return is_tower(n) or any(f.ignorable(n) for f in text_families.values())

    return Family(name=name, architecture=architecture, model_config=model_config, hf_config=text.hf_config,
                  to_redline=to_redline, to_hf=text.to_hf, ignorable=ignorable, settle=settle, fold=fold)


def _check_gemma3(hf: dict) -> None:
    """Gemma3ForConditionalGeneration computes its logits with lm_head alone: a final_logit_softcapping its text
    config gives is applied by Gemma3ForCausalLM and not by it, so such a file names no one model."""
    cap = hf.get("text_config", {}).get("final_logit_softcapping")
    raise_first([(cap is not None, f"text_config.final_logit_softcapping={cap}: transformers' "
                                   f"Gemma3ForConditionalGeneration leaves it out and its text model "
                                   f"(Gemma3ForCausalLM) applies it, so the file names no one model")])


def _plain_rope(text: dict) -> dict:
    """Qwen2-VL's and Qwen2.5-VL's text config with its multimodal RoPE read as plain RoPE: its rope type "mrope"
    (the Hub's configs; transformers 5 renames it "default") rotates each frequency by the temporal, height or width
    position as mrope_section assigns it, in the rotate-half layout. On text alone the three are the token's one
    position (Qwen2VLModel leaves position_ids to the text model, which expands arange positions to all three where
    no image or video grid is given), so the rotation is Qwen2's."""
    def plain(spec):
        if isinstance(spec, dict) and spec.get("rope_type", spec.get("type")) == "mrope":
            return {k: v for k, v in spec.items() if k != "type"} | {"rope_type": "default"}
        return spec
    return {**text, **{k: plain(text[k]) for k in ("rope_parameters", "rope_scaling") if k in text}}


def _unscaled_logits(text: dict) -> dict:
    """Aya Vision's and Command A Vision's text config as their ForConditionalGeneration computes it: the logits are
    lm_head's alone (transformers' AyaVisionForConditionalGeneration and Cohere2VisionForConditionalGeneration), the
    text model's logit_scale, which Cohere2ForCausalLM applies, left out; the export (Cohere2ForCausalLM with
    logit_scale 1) gives the multimodal model's logits."""
    return {**text, "logit_scale": 1.0}


def _experts_rowwise(src: TensorSource, cfg: ModelConfig) -> TensorSource:
    """text_view(src) with Qwen3-VL-MoE's stacked experts as its module holds them, gate_up_proj (E, 2F, C) and
    down_proj (E, C, F), which Qwen3-MoE's reader takes: its Hub folders store their transposes, (E, C, 2F) and
    (E, F, C), and save_pretrained the module's; transformers' conversion mapping for qwen3_vl_moe transposes a
    tensor on loading unless its shape is already the module's (so a square one is read as it is), and so does this."""
    text = text_view(src)

    def take(name: str) -> torch.Tensor:
        t = text.take(name)
        if name.endswith("mlp.experts.gate_up_proj") and t.shape[2] != cfg.n_embd:
            return t.transpose(1, 2)
        if name.endswith("mlp.experts.down_proj") and t.shape[1] != cfg.n_embd:
            return t.transpose(1, 2)
        return t

    return TensorSource(text.names, take, src.where)


def _renormed_top_k(text: dict) -> dict:
    """Qwen3-VL-MoE's text config as Qwen3-MoE's reader takes it: its router always rescales the chosen top-k
    softmax weights to sum to one (Qwen3VLMoeTextTopKRouter), which Qwen3-MoE does where norm_topk_prob says so."""
    return {**text, "norm_topk_prob": True}


def _glm4v_text(text: dict) -> dict:
    """GLM-4.1V's text config as GLM-4's reader takes it, as transformers' Glm4vTextAttention and
    Glm4vTextRotaryEmbedding compute it: biases on q/k/v always, heads hidden_size / num_attention_heads wide (any
    head_dim unread), RoPE on the first partial_rotary_factor of each head, the whole head where none is given (GLM-4's
    config defaults it to half). Its multimodal RoPE takes each frequency's temporal, height or width position as
    mrope_section assigns it, each repeated for an interleaved pair as GLM-4 rotates; on text alone the three are the
    token's one position (Glm4vModel's, as Qwen2-VL's), so it is GLM-4's RoPE."""
    params = dict(text.get("rope_parameters") or {})
    fraction = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))
    return {**text, "attention_bias": True, "head_dim": text["hidden_size"] // text["num_attention_heads"],
            "partial_rotary_factor": fraction, "rope_parameters": {**params, "partial_rotary_factor": fraction}}


_LAYER = re.compile(r"model\.layers\.(\d+)\.(.*)")


def _mllama_text(text: dict) -> dict:
    """Mllama's text config as Llama's reader takes it: its self-attention layers alone (num_hidden_layers counts the
    cross-attention layers among them, which MllamaTextModel skips where no image states are given or cached, so a
    text-only prompt runs the others in order)."""
    n = int(text["num_hidden_layers"])
    cross = text.get("cross_attention_layers")
    cross = [3, 8, 13, 18, 23, 28, 33, 38] if cross is None else cross  # MllamaTextConfig's default
    raise_first([(any(not 0 <= int(i) < n for i in cross), f"text_config.cross_attention_layers={cross}: not "
                                                            f"layers of its {n}")])
    return {**text, "num_hidden_layers": n - len(set(cross))}


def _mllama_view(src: TensorSource, cfg: ModelConfig) -> TensorSource:
    """text_view(src) as a Llama of Mllama's self-attention layers: layer j the j-th layer without cross_attn
    tensors (the cross-attention layers' tensors marked read, as text alone skips them), the embedding's first
    vocab_size rows (MllamaTextModel's table has 8 more, for the image tokens, which its head (vocab_size rows) never
    predicts and a text prompt does not hold)."""
    layers: dict[int, set[str]] = {}
    for raw in src.names:
        if m := _LAYER.fullmatch(_text_name(raw)):
            layers.setdefault(int(m.group(1)), set()).add(m.group(2))
    cross = {i for i, rest in layers.items() if any(r.startswith("cross_attn") for r in rest)}
    own = sorted(set(layers) - cross)
    names = {}
    for raw in src.names:
        name = _text_name(raw)
        m = _LAYER.fullmatch(name)
        if m is None:
            names[name] = raw
        elif int(m.group(1)) in cross:
            src.used.add(raw)  # text alone skips these layers: accounted for, not read
        else:
            names[f"model.layers.{own.index(int(m.group(1)))}.{m.group(2)}"] = raw

    def take(name: str) -> torch.Tensor:
        t = src.take(names[name])
        return t[:cfg.vocab_size] if name == "model.embed_tokens.weight" else t

    return TensorSource(names, take, src.where)


def families() -> tuple[Family, ...]:
    """The multimodal families: gemma3 (text model gemma3_text), mistral3 (mistral, ministral3 or mistral4), qwen3_vl
    (qwen3); the LLaVA-like folders, whose text model is transformers' AutoModel of text_config under a plain
    lm_head: llava, llava_next, vipllava, video_llava, llava_next_video (llama by default), llava_onevision and
    internvl (qwen2), each read where text_config is llama, mistral, qwen2 or qwen3; smolvlm and idefics3 (llama,
    under model.text_model.), aya_vision and cohere2_vision (cohere2), lfm2_vl (lfm2); qwen2_vl and qwen2_5_vl
    (qwen2, their multimodal RoPE plain on text); qwen3_vl_moe (qwen3_moe, its experts transposed); glm4v (glm4),
    glm4v_moe (glm4_moe), hunyuan_vl (hunyuan_v1_dense), granite4_vision (granite), exaone4_5 (exaone4), mllama
    (llama); apertus1p5 (apertus1p5_text: apertus.py), cohere_compass (cohere_compass_text: cohere.py),
    aria (aria_text: aria.py), minimax_m3_vl (minimax_m3_vl_text: minimax_m3.py), mistral_large4
    (mistral_large4_text: mistral_large4.py), hy_v4_vl (hy_v4_vl_text: hy_v4.py); idefics2, perception_lm, fast_vlm,
    lighton_ocr, janus, ovis2, video_llama_3 (_more_llava_like), qwen2_5_omni_thinker (qwen2, its multimodal RoPE
    plain on text), qwen3_omni_moe_thinker (qwen3_moe), granite_docling (granite), hyperclovax_vision_v2
    (hyperclovax), emu3 (emu3_text_model: llama_kin.py), molmo2 (qwen3 or olmo2, its Hub layout: _molmo2_view),
    shieldgemma2 (gemma3_text), glm5_next (glm5_next_text: glm5_next.py), step3p7
    (step3p5: step3p5.py)."""
    from redline.interop import (apertus, aria, cohere, deepseek_kin, dots3, exaone4, gemma3, glm, glm5_next, granite,
                                 hunyuan, hy_v4, lfm2, llama, llama_kin, minimax_m3, mistral_large4, moe, olmo2,
                                 step3p5)

    llamas = {f.name: f for f in llama.FAMILIES}
    kin = {f.name: f for f in llama_kin.FAMILIES}
    moes = {f.name: f for f in moe.FAMILIES}
    llama_layout = {name: llamas[name] for name in ("llama", "mistral", "qwen2", "qwen3")}
    cohere2 = {f.name: f for f in cohere.FAMILIES}["cohere2"]
    # (model_type, default text model, whether its config takes text_config's tying where its own is false,
    # its class's tying default): the LlavaConfig-like classes' __post_init__ and fields
    llava_like = (("llava", "llama", True, False), ("llava_next", "llama", False, False),
                  ("vipllava", "llama", False, False), ("video_llava", "llama", False, False),
                  ("llava_next_video", "llama", True, False), ("llava_onevision", "qwen2", True, False),
                  ("internvl", "qwen2", False, True))
    return (multimodal_family("gemma3", "Gemma3ForCausalLM", {"gemma3_text": gemma3.FAMILY}, "gemma3_text",
                              _check_gemma3),
            # Mistral-Small-4's folder: a mistral4 text model (latent attention), DeepSeek-V3's tensor names
            multimodal_family("mistral3", "MistralForCausalLM",
                              {"mistral": llamas["mistral"], "ministral3": llama.MINISTRAL3_FAMILY,
                               "mistral4": deepseek_kin.MISTRAL4_FAMILY}, "mistral",
                              layout_of=lambda cfg: "mistral4" if cfg.kv_lora_rank else "mistral"),
            multimodal_family("qwen3_vl", "Qwen3ForCausalLM", {"qwen3_vl_text": llamas["qwen3"]}, "qwen3_vl_text",
                              tie_default=False),
            *(multimodal_family(name, llama_layout[text].architecture, llama_layout, text, tie_default=tie,
                                text_tie=text_tie) for name, text, text_tie, tie in llava_like),
            *(multimodal_family(name, "LlamaForCausalLM", llama_layout, "llama", tie_default=False)
              for name in ("smolvlm", "idefics3")),
            *(multimodal_family(name, "Cohere2ForCausalLM", {"cohere2": cohere2}, "cohere2",
                                adapt=_unscaled_logits) for name in ("aya_vision", "cohere2_vision")),
            multimodal_family("lfm2_vl", "Lfm2ForCausalLM", {"lfm2": lfm2.FAMILY}, "lfm2"),
            # Granite 4.0 Vision: Granite's text model (its embedding, residual and attention multipliers; the logits
            # divided by logits_scaling in Granite4VisionForConditionalGeneration as GraniteForCausalLM divides them),
            # its deepstack features added only where images are given
            multimodal_family("granite4_vision", "GraniteForCausalLM", {"granite4_vision_text": granite.FAMILY},
                              "granite4_vision_text", tie_default=False),
            # Llama 3.2 Vision: Llama's self-attention layers, its cross-attention layers skipped on text
            multimodal_family("mllama", "LlamaForCausalLM", {"mllama_text_model": llamas["llama"]},
                              "mllama_text_model", tie_default=False, adapt=_mllama_text, view=_mllama_view),
            # EXAONE 4.5: AutoModel of an exaone4 text_config under a plain lm_head, on arange positions
            multimodal_family("exaone4_5", "Exaone4ForCausalLM", {"exaone4": exaone4.FAMILY}, "exaone4",
                              tie_default=False),
            multimodal_family("qwen3_vl_moe", "Qwen3MoeForCausalLM", {"qwen3_vl_moe_text": moes["qwen3_moe"]},
                              "qwen3_vl_moe_text", tie_default=False, adapt=_renormed_top_k, view=_experts_rowwise),
            multimodal_family("glm4v", "Glm4ForCausalLM", {"glm4v_text": glm.GLM4_FAMILY}, "glm4v_text",
                              tie_default=False, text_tie=True, adapt=_glm4v_text),
            # GLM-4.5V: GLM-4-MoE's text model, its multimodal RoPE in the rotate-half layout plain on text (as
            # Qwen2-VL's)
            multimodal_family("glm4v_moe", "Glm4MoeForCausalLM", {"glm4v_moe_text": glm.GLM4_MOE_FAMILY},
                              "glm4v_moe_text", tie_default=False, text_tie=True),
            # HunYuan-VL: Hunyuan's dense text model (QK-norm after RoPE, its NTK alpha), its multimodal RoPE over
            # len(mrope_section) axes in the rotate-half layout plain on text: HunYuanVLTextModel expands arange
            # positions to every axis where none are given
            multimodal_family("hunyuan_vl", "HunYuanDenseV1ForCausalLM", {"hunyuan_vl_text": hunyuan.FAMILY},
                              "hunyuan_vl_text", text_tie=True),
            *(multimodal_family(name, "Qwen2ForCausalLM", {text: llamas["qwen2"]}, text, tie_default=False,
                                text_tie=True, adapt=_plain_rope)
              for name, text in (("qwen2_vl", "qwen2_vl_text"), ("qwen2_5_vl", "qwen2_5_vl_text"))),
            multimodal_family("apertus1p5", "Apertus1p5TextForCausalLM",
                              {"apertus1p5_text": apertus.TEXT_1P5_FAMILY}, "apertus1p5_text", tie_default=False),
            multimodal_family("cohere_compass", "CohereCompassForCausalLM",
                              {"cohere_compass_text": cohere.COMPASS_FAMILY}, "cohere_compass_text",
                              tie_default=False),
            multimodal_family("aria", "AriaTextForCausalLM", {"aria_text": aria.FAMILY}, "aria_text",
                              tie_default=False),
            multimodal_family("minimax_m3_vl", "MiniMaxM3VLForCausalLM", {"minimax_m3_vl_text": minimax_m3.FAMILY},
                              "minimax_m3_vl_text", tie_default=False),
            # Mistral Large 4: its text model (latent attention without RoPE on some layers, shared caches, DSA
            # indexers left out within index_topk) beside a Pixtral tower; import only
            multimodal_family("mistral_large4", "MistralLarge4ForConditionalGeneration",
                              {"mistral_large4_text": mistral_large4.FAMILY}, "mistral_large4_text",
                              tie_default=False, view=mistral_large4.view, settle_text=mistral_large4.settle_text),
            # HY-V4-VL: HY-V4's text model (RoPE on interleaved pairs, its multimodal RoPE plain on text) under
            # model., beside HunYuan-VL's tower under vit.; import only
            multimodal_family("hy_v4_vl", "HYV4ForCausalLM", {"hy_v4_vl_text": hy_v4.VL_TEXT_FAMILY},
                              "hy_v4_vl_text", tie_default=False),
            # GLM-5.3-Next: its text model (glm5_next.py) under model.language_model., beside its vision tower;
            # a text-only folder's text fields at the top level (Glm5NextConfig forwards them to text_config); import
            # only
            multimodal_family("glm5_next", "Glm5NextForConditionalGeneration",
                              {"glm5_next_text": glm5_next.FAMILY}, "glm5_next_text", tie_default=False),
            # dots.3 Note: its text model under model.language_model., beside a vision and an audio tower
            multimodal_family("dots3_note", "Dots3NoteForCausalLM", {"dots3_note_text": dots3.FAMILY},
                              "dots3_note_text", tie_default=False),
            # Step 3.7: Step 3.5's text model (step3p5.py) under model. (the Hub's and save_pretrained's) or
            # model.language_model., beside its tower under vision_model. and vit_large_projector.; no head tying
            # unless the top-level config asks (Step3p7Config has no tie_word_embeddings of its own); import only
            multimodal_family("step3p7", "Step3p7ForConditionalGeneration", {"step3p5": step3p5.TEXT_FAMILY},
                              "step3p5", tie_default=False),
            *_round3_families(),
            *_more_llava_like(llama_layout),
            # Qwen2.5-Omni's thinker: Qwen2.5-VL's text model (its multimodal RoPE plain on text: the thinker's
            # get_rope_index gives text tokens one arange position on all three axes) beside a vision and an audio
            # tower; Qwen3-Omni-MoE's: Qwen3-MoE's (per-expert tensors as its folders store them), its interleaved
            # multimodal RoPE plain on text as Qwen3-VL's, its router's top-k renormalized where norm_topk_prob says
            multimodal_family("qwen2_5_omni_thinker", "Qwen2ForCausalLM", {"qwen2_5_omni_text": llamas["qwen2"]},
                              "qwen2_5_omni_text", tie_default=False, adapt=_plain_rope),
            multimodal_family("qwen3_omni_moe_thinker", "Qwen3MoeForCausalLM",
                              {"qwen3_omni_moe_text": moes["qwen3_moe"]}, "qwen3_omni_moe_text", tie_default=False),
            # Granite-Docling: Granite's text model (its multipliers, the logits divided by logits_scaling in
            # GraniteDoclingForConditionalGeneration as GraniteForCausalLM divides them) under model.text_model., its
            # deepstack features added only where images are given
            multimodal_family("granite_docling", "GraniteForCausalLM", {"granite_docling_text": granite.FAMILY},
                              "granite_docling_text"),
            # HyperCLOVA X SEED Vision: HyperCLOVA X's text model (its logits multiplied by logits_scaling in
            # HyperCLOVAXVisionV2ForConditionalGeneration as HyperCLOVAXForCausalLM multiplies them)
            multimodal_family("hyperclovax_vision_v2", "HyperCLOVAXForCausalLM",
                              {"hyperclovax": granite.HYPERCLOVAX_FAMILY}, "hyperclovax"),
            # Emu3: its text model (Llama's block: llama_kin.py) beside the VQ-VAE that turns images into its
            # vocabulary's visual tokens
            multimodal_family("emu3", "LlamaForCausalLM", {"emu3_text_model": kin["emu3_text_model"]},
                              "emu3_text_model", tie_default=False),
            # Molmo2: Qwen3's text model (Molmo2-8B's) or OLMo 2's (Molmo2-O's) with added tokens' embedding rows its
            # head does not predict
            multimodal_family("molmo2", "Qwen3ForCausalLM",
                              {"molmo2_text": _molmo2_family(llamas["qwen3"], olmo2.FAMILY)}, "molmo2_text",
                              tie_default=False, view=_molmo2_view),
            # ShieldGemma 2: Gemma 3's ForConditionalGeneration one level down; its classifier's two logits are the
            # text model's last-position logits at yes_token_index and no_token_index
            multimodal_family("shieldgemma2", "Gemma3ForCausalLM", {"gemma3_text": gemma3.FAMILY}, "gemma3_text",
                              _check_gemma3, tie_default=False, text_tie=True))


def _check_ovis2(hf: dict) -> None:
    """Ovis2ForConditionalGeneration's head is the top-level hidden_size x vocab_size, not text_config's: untied, a
    head of other rows than the embedding's is one redline's single vocabulary cannot hold."""
    text = text_config(hf)
    if text.get("tie_word_embeddings"):  # tied, the head is the embedding, whatever its declared size
        return
    raise_first([(hf.get(k, text.get(k)) != text.get(k),
                  f"{k}={hf.get(k)} beside text_config.{k}={text.get(k)}: Ovis2's untied lm_head is the top-level "
                  f"size, the embedding text_config's, which redline's one vocabulary and width cannot both hold")
                 for k in ("vocab_size", "hidden_size")])


def _more_llava_like(llama_layout: dict[str, Family]) -> tuple[Family, ...]:
    """More folders whose text model is transformers' AutoModel of text_config (llama, mistral, qwen2 or qwen3) under
    a plain lm_head, each forward the text model's on text (image and video features replace their tokens' rows only
    where pixel values are given): Idefics2 (mistral by default, under model.text_model.; its perceiver resampler in
    the connector), PerceptionLM (llama), FastVLM (qwen2), LightOnOCR (qwen3), Janus (llama; its image-generation
    VQ-VAE and head left unread with the understanding tower), Ovis2 (qwen2; its visual indicator tokens' rows
    replaced only where images are given, its head the top-level size: _check_ovis2) and VideoLLaMA 3 (qwen2)."""
    # (model_type, default text model, its class's tying default (None: text_config's own, PerceptionLMConfig's
    # __post_init__), whether it takes text_config's true where its own is false (FastVlmConfig's and
    # VideoLlama3Config's __post_init__), its check)
    rows = (("idefics2", "mistral", False, False, None), ("perception_lm", "llama", None, False, None),
            ("fast_vlm", "qwen2", False, True, None), ("lighton_ocr", "qwen3", True, False, None),
            ("janus", "llama", True, False, None), ("ovis2", "qwen2", True, False, _check_ovis2),
            ("video_llama_3", "qwen2", False, True, None))
    return tuple(multimodal_family(name, llama_layout[text].architecture, llama_layout, text, tie_default=tie,
                                   text_tie=text_tie, **({} if check is None else {"check": check}))
                 for name, text, tie, text_tie, check in rows)


_BLOCK = re.compile(r"model\.transformer\.blocks\.(\d+)\.(.*)")
# Molmo2's Hub names (transformers' conversion mapping for molmo2 read backwards) -> Qwen3's, within a block
_MOLMO2_NAMES = {"attn_norm.weight": "input_layernorm.weight", "ff_norm.weight": "post_attention_layernorm.weight",
                 "self_attn.attn_out.weight": "self_attn.o_proj.weight", "mlp.ff_out.weight": "mlp.down_proj.weight",
                 "self_attn.q_norm.weight": "self_attn.q_norm.weight",
                 "self_attn.k_norm.weight": "self_attn.k_norm.weight"}
# norm_after's: the same norms on the sublayers' outputs, under OLMo 2's names
_MOLMO2_OUTPUT_NORMS = {**_MOLMO2_NAMES, "attn_norm.weight": "post_attention_layernorm.weight",
                        "ff_norm.weight": "post_feedforward_layernorm.weight"}


def _molmo2_text(text: dict) -> dict:
    """Molmo2's text config as Qwen3's or OLMo 2's reader takes it, where it is one of their models: per-head
    QK-norm (qk_norm_type qwen3) in pre-norm blocks (Molmo2-8B's: Qwen3's), or QK-norm over the whole q and k
    projections (qk_norm_type olmo) with each sublayer's output normalized (norm_after: Molmo2-O's, OLMo 2's block);
    no q/k/v biases, its RoPE scaling (if any) on every layer; the vocabulary the embedding's vocab_size +
    additional_vocab_size rows (the head's vocab_size rows: _molmo2_family)."""
    n = int(text["num_hidden_layers"])
    scaled = text.get("rope_scaling_layers")
    params = text.get("rope_parameters") or {}
    rope = params.get("rope_type", params.get("type", "default"))
    kind, after = text.get("qk_norm_type", "qwen3"), bool(text.get("norm_after"))
    raise_first([
        (kind not in ("qwen3", "olmo"), f"text_config.qk_norm_type={kind!r}: Molmo2's are qwen3 and olmo"),
        (after != (kind == "olmo"),
         f"text_config.qk_norm_type={kind!r} with norm_after={str(after).lower()}: redline reads Molmo2's text model "
         f"as Qwen3's (qwen3, pre-norm) or OLMo 2's (olmo, norm_after), not a mix"),
        (bool(text.get("attention_bias")), "text_config.attention_bias=true: Molmo2's q/k/v biases beside an "
                                           "o_proj without one are not Qwen3's or OLMo 2's"),
        (rope != "default" and scaled is not None and sorted({int(i) for i in scaled}) != list(range(n)),
         f"text_config.rope_scaling_layers={scaled}: RoPE scaling ({rope}) on some layers alone, the others "
         f"unscaled; redline's RoPE is one for every layer"),
    ])
    return {**text, "vocab_size": int(text["vocab_size"]) + int(text.get("additional_vocab_size", 0))}


def _molmo2_family(qwen3: Family, olmo2: Family) -> Family:
    """Molmo2's text model as Qwen3's or OLMo 2's (by qk_norm_type): its embedding vocab_size + additional_vocab_size
    rows (the added tokens' rows in a table of their own in its Hub folders), its head vocab_size rows alone
    (model.head_vocab: the added tokens are inputs the model never predicts). Such a head is never tied, whatever
    tie_word_embeddings says: transformers leaves a head and an embedding of different shapes apart (and saves the
    head); without added rows the flag decides."""
    def model_config(hf: dict) -> ModelConfig:
        text = qwen3 if hf.get("qk_norm_type", "qwen3") == "qwen3" else olmo2
        if not int(hf.get("additional_vocab_size", 0)):
            return text.model_config(_molmo2_text(hf))
        cfg = text.model_config(_molmo2_text({**hf, "tie_word_embeddings": False}))
        return replace(cfg, head_vocab=int(hf["vocab_size"]))

    return replace(qwen3, name="molmo2_text", model_config=model_config)


def _molmo2_view(src: TensorSource, cfg: ModelConfig) -> TensorSource:
    """src under Qwen3's (OLMo 2's) names, from Molmo2's Hub layout (which save_pretrained writes too: transformers' conversion
    mapping for molmo2 read backwards): model.transformer.wte.embedding and .new_embedding stacked into the embedding
    (vocab_size, then additional_vocab_size rows), each block's att_proj (q, k, v rows stacked) split, its ff_proj
    (up_proj's rows, then gate_proj's) split, ln_f the final norm, attn_norm and ff_norm on the sublayers' inputs or,
    norm_after, outputs; other names as text_view reads them (transformers 5's module names)."""
    q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim  # (rows of att_proj's q and of its k and v)
    parts: dict[str, Callable[[], torch.Tensor]] = {}
    for raw in src.names:
        if raw == "model.transformer.wte.embedding":
            parts["model.embed_tokens.weight"] = lambda: torch.cat(
                [src.take("model.transformer.wte.embedding"), src.take("model.transformer.wte.new_embedding")])
        elif raw == "model.transformer.ln_f.weight":
            parts["model.norm.weight"] = lambda raw=raw: src.take(raw)
        elif m := _BLOCK.fullmatch(raw):
            layer, rest = f"model.layers.{m.group(1)}.", m.group(2)
            if rest == "self_attn.att_proj.weight":
                for i, part in enumerate(("q_proj", "k_proj", "v_proj")):
                    parts[f"{layer}self_attn.{part}.weight"] = (
                        lambda raw=raw, i=i: src.take(raw).split([q, kv, kv])[i])
            elif rest == "mlp.ff_proj.weight":
                for i, part in enumerate(("up_proj", "gate_proj")):
                    parts[f"{layer}mlp.{part}.weight"] = lambda raw=raw, i=i: src.take(raw).chunk(2)[i]
            else:
                names = _MOLMO2_OUTPUT_NORMS if cfg.norm_position == "output" else _MOLMO2_NAMES
                parts[layer + names.get(rest, rest)] = lambda raw=raw: src.take(raw)
        elif raw != "model.transformer.wte.new_embedding":
            parts[_text_name(raw)] = lambda raw=raw: src.take(raw)
    return TensorSource(parts, lambda name: parts[name](), src.where)


def _check_kimi_k25(hf: dict) -> None:
    """Kimi K2.5's Hub folders quantize the experts (compressed-tensors int4) under a top-level
    quantization_config, which the text config redline reads does not carry."""
    quant = hf.get("quantization_config")
    raise_first([(quant is not None, f"quantization_config (quant_method={(quant or {}).get('quant_method')!r}): "
                                     f"redline reads a kimi_k25 folder's unquantized weights; import a bf16 "
                                     f"checkpoint of the model")])


def _glm46v_text(text: dict) -> dict:
    """GLM-4.6V's (and GLMGA's) text config as its text family reads it: a glm4v_text model as GLM-4.1V's
    (_glm4v_text), a glm4v_moe_text model (GLM-4.6V's released one) as GLM-4.5V's."""
    return _glm4v_text(text) if text.get("model_type", "glm4v_text") == "glm4v_text" else text


def _glm_ocr_text(text: dict) -> dict:
    """GLM-OCR's text config as GLM-4's reader takes it, as transformers' GlmOcrTextAttention computes it: GLM-4.1V's
    (_glm4v_text) without q/k/v biases, and its heads head_dim wide where the config gives one (else hidden_size /
    num_attention_heads), RoPE on partial_rotary_factor of that width."""
    heads = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    return {**_glm4v_text(text), "attention_bias": False, "head_dim": heads}


def _past_last_layer_read(src: TensorSource, cfg: ModelConfig) -> TensorSource:
    """text_view(src), the layers past the last (GLM-OCR's multi-token-prediction layer, which transformers' GlmOcr
    model ignores on load) marked read."""
    for raw in src.names:
        if (m := _LAYER.fullmatch(_text_name(raw))) and int(m.group(1)) >= cfg.n_layer:
            src.used.add(raw)
    return text_view(src)


def _ernie_vl_text(text: dict) -> dict:
    """ERNIE 4.5 VL's text config as ERNIE 4.5 MoE's reader takes it: its text experts' width (moe_intermediate_size
    [text, vision]) and the expert layers mlp_layer_types names as moe_layer_start_index / end / interval (a
    UserError where no such span names them). Its 3D RoPE gives each frequency the height, width or temporal position
    (the first two sections interleaved, as inv_freq_3d orders them, so that they recompose into the original order);
    on text alone the three are the token's one position, ERNIE 4.5's RoPE on interleaved pairs."""
    from redline.interop.ernie import _expert_layers

    n = int(text["num_hidden_layers"])
    kinds = text.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)  # its config's default
    layers = [i for i, kind in enumerate(kinds) if kind == "sparse"]
    interval = layers[1] - layers[0] if len(layers) > 1 else 1
    start = layers[0] if layers and interval == 1 else 0
    span = dict(moe_layer_start_index=start, moe_layer_end_index=layers[-1] if layers else -1,
                moe_layer_interval=interval)
    raise_first([(not layers or _expert_layers({"num_hidden_layers": n, **span}) != layers,
                  f"text_config.mlp_layer_types={kinds}: redline reads ERNIE 4.5's experts on every "
                  f"moe_layer_interval-th layer of one span of layers")])
    widths = text.get("moe_intermediate_size") or [1536, 512]
    return {**text, **span, "moe_intermediate_size": widths[0] if isinstance(widths, list) else widths}


_ERNIE_EXPERT = re.compile(r"(model\.layers\.\d+\.mlp\.experts\.)(\d+)(\..*)")


def _ernie_vl_text_experts(src: TensorSource, cfg: ModelConfig) -> TensorSource:
    """text_view(src) as ERNIE 4.5 MoE's tensors: each expert layer's text experts, router and routing bias (its
    vision experts and router, which text alone never runs, marked read). transformers' modules hold them under
    mlp.text_moe. / mlp.vision_moe. (stacked experts; the router (E, C), the bias (1, E)); the Hub's folders, and
    save_pretrained, under mlp.: experts 0..E-1 the text ones and E..2E-1 the vision ones, the text router
    mlp.gate.weight (C, E) transposed, the vision one mlp.gate.weight_1, both biases in one (2, E)
    moe_statics.e_score_correction_bias."""
    names, how = {}, {}
    for raw in src.names:
        name = _text_name(raw)
        expert = _ERNIE_EXPERT.fullmatch(name)
        if ".mlp.vision_moe." in name or name.endswith(".mlp.gate.weight_1") or (
                expert and int(expert.group(2)) >= cfg.moe_experts):
            src.used.add(raw)  # the vision experts and router
            continue
        if name.endswith(".mlp.gate.weight"):
            how[name] = "transposed"
        elif name.endswith(".mlp.moe_statics.e_score_correction_bias"):
            how[name] = "first row"
        names[name.replace(".mlp.text_moe.gate.moe_statics.", ".mlp.moe_statics.")
              .replace(".mlp.text_moe.", ".mlp.")] = raw

    def take(name: str) -> torch.Tensor:
        t = src.take(names[name])
        if how.get(_text_name(names[name])) == "transposed":
            return t.t()  # (C, E) -> (E, C)
        return t[:1] if how.get(_text_name(names[name])) == "first row" else t

    return TensorSource(names, take, src.where)


def _paddleocr_text(text: dict) -> dict:
    """PaddleOCR-VL's text config as Llama's reader takes it: ERNIE 4.5's dense block (use_bias on every projection,
    the MLP's too) whose attention rotates as Qwen2-VL's (PaddleOCRAttention: multimodal RoPE sections in the
    rotate-half layout, not ERNIE 4.5's interleaved pairs), plain RoPE on text as Qwen2-VL's (_plain_rope); tied by
    default where the Hub's flat config names no tying."""
    bias = bool(text.get("use_bias", False))
    return {**_plain_rope(text), "attention_bias": bias, "mlp_bias": bias,
            "tie_word_embeddings": text.get("tie_word_embeddings", True)}


# Cosmos 3's unified checkpoints: the Reasoner's text model flat (layers.*, embed_tokens.*, norm.*) under Diffusers'
# attention names, beside the Generator's experts and projections and the sound and action towers, which
# transformers' Cosmos3Omni model drops on load (_COSMOS3_DROPPED_UNIFIED_CHECKPOINT_KEYS) and so does the import
_COSMOS3_FLAT = ("layers.", "embed_tokens.", "norm.")
_COSMOS3_NAMES = ((".self_attn.to_q.", ".self_attn.q_proj."), (".self_attn.to_k.", ".self_attn.k_proj."),
                  (".self_attn.to_v.", ".self_attn.v_proj."), (".self_attn.to_out.", ".self_attn.o_proj."),
                  (".self_attn.norm_q.", ".self_attn.q_norm."), (".self_attn.norm_k.", ".self_attn.k_norm."))
_COSMOS3_DROPPED = re.compile(r"\.add_[qkv]_proj\.|\.to_add_out\.|\.norm_added_[qk]\.|moe_gen|^proj_(out|in)\.|"
                              r"^time_embedder\.|^(audio|action)_proj_(out|in)\.|^(audio|action)_modality_embed$")


def _cosmos3_view(src: TensorSource, cfg: ModelConfig, edge: bool = False) -> TensorSource:
    """text_view(src) with Cosmos 3's flat text model (layers.*, embed_tokens.*, norm.*, as its unified checkpoints
    and save_pretrained write it) under model.*, Diffusers' attention names (to_q, to_out, norm_q, ...) as Qwen3's,
    and the Generator's and the sound and action towers' tensors marked read (_COSMOS3_DROPPED); `edge`: Cosmos 3
    Edge's, whose ReLU² MLP transformers holds as mlp.fc1 / mlp.fc2 (its folders' mlp.up_proj / down_proj, Arcee's
    names) and which drops nothing."""
    renames = _COSMOS3_NAMES + (((".mlp.fc1.", ".mlp.up_proj."), (".mlp.fc2.", ".mlp.down_proj.")) if edge else ())
    names = {}
    for raw in src.names:
        if not edge and _COSMOS3_DROPPED.search(raw):
            src.used.add(raw)
            continue
        name = "model." + raw if raw.startswith(_COSMOS3_FLAT) else _text_name(raw)
        for theirs, ours in renames:
            name = name.replace(theirs, ours)
        names[name] = raw
    return TensorSource(names, lambda name: src.take(names[name]), src.where)


def _cosmos3_edge_text(text: dict) -> dict:
    """Cosmos 3 Edge's text config as Arcee's reader takes it: Llama's attention and a ReLU² MLP (fc1, fc2), its
    Qwen3-VL interleaved multimodal RoPE plain on text (Cosmos3EdgeTextModel expands arange positions to all three
    axes where none are given), CosmosEdgeTextConfig's base 1e8 where it gives none."""
    params = {"rope_type": "default", "rope_theta": 100_000_000.0, **(text.get("rope_parameters") or {})}
    return {**text, "rope_parameters": params}


def _deepseek_ocr2_config(hf: dict) -> ModelConfig:
    """DeepSeek-OCR 2's text model (deepseek_ocr2_text), as transformers' DeepseekOcr2TextModel computes it: Llama's
    attention and RMSNorm blocks, dense SwiGLU layers and DeepSeek-V2's mixture (softmax scores, top k greedy or
    over every group, never rescaled, times routed_scaling_factor, an ungated shared expert
    moe_intermediate_size · n_shared_experts wide) where mlp_layer_types says sparse: the dense layers first."""
    from redline.interop import llama
    from redline.interop.deepseek import _expert_fields

    kinds = hf.get("mlp_layer_types")
    dense = next((i for i, kind in enumerate(kinds or ()) if kind != "dense"), len(kinds or ()))
    raise_first([
        (kinds is None, "text_config.mlp_layer_types is not given: transformers' DeepseekOcr2TextModel builds no "
                        "layer without it"),
        (kinds is not None and any(kind != "sparse" for kind in kinds[dense:]),
         f"text_config.mlp_layer_types={kinds}: redline reads DeepSeek-OCR 2's dense layers before its expert "
         f"layers"),
    ])
    base = llama.model_config_for("llama")(hf)
    return replace(base, **_expert_fields({**hf, "first_k_dense_replace": dense}, "deepseek_v2"))


def _unlimited_ocr_config(hf: dict) -> ModelConfig:
    """Unlimited-OCR's text model (unlimited_ocr_text), as transformers' UnlimitedOcrTextModel computes it:
    DeepSeek-OCR 2's blocks (_deepseek_ocr2_config) whose reference_sliding_attention layers see the last
    sliding_window tokens and every token of the reference, which is what the first forward of a cache holds (the
    prompt, as UnlimitedOcrGenerationMixin declares it; the whole input of a forward without one):
    model.reference_window, the prompt the engine's reference."""
    from redline.interop import llama

    kinds = hf.get("layer_types") or ["reference_sliding_attention"] * hf["num_hidden_layers"]
    raise_first([(not set(kinds) <= {"reference_sliding_attention", "full_attention"},
                  f"text_config.layer_types={kinds}: redline reads Unlimited-OCR's reference_sliding_attention and "
                  f"full_attention layers")])
    windows = llama.layer_windows({**hf, "layer_types": ["sliding_attention" if k != "full_attention" else k
                                                         for k in kinds]}, hf["num_hidden_layers"], [])
    return replace(_deepseek_ocr2_config(hf), **windows, reference_window=bool(windows["sliding_window"]))


def _deepseek_ocr2_to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
    """Llama's tensors with DeepSeek's experts (mlp.gate, mlp.experts.j.*, mlp.shared_experts.*) read as Qwen-MoE's
    names, as llama.to_redline reads them (ERNIE 4.5 MoE's reader does the same)."""
    from redline.interop import llama

    theirs = {n.replace(".mlp.shared_experts.", ".mlp.shared_expert."): n for n in src.names}
    return llama.to_redline(TensorSource(theirs, lambda name: src.take(theirs[name]), src.where), cfg)


def _legacy_text_config(family: Family, legacy: str) -> Family:
    """family reading a config whose text model is nested under `legacy` (Nemotron-H Omni's released configs:
    llm_config, which NemotronH_Omni_Reasoning_V3_Config reads as text_config) as under text_config."""
    def renamed(hf: dict) -> dict:
        if legacy in hf and "text_config" not in hf:
            hf = {**{k: v for k, v in hf.items() if k != legacy}, "text_config": hf[legacy]}
        return hf

    return replace(family, model_config=lambda hf: family.model_config(renamed(hf)),
                   settle=lambda hf, src: family.settle(renamed(hf), src),
                   fold=lambda hf, cfg, state: family.fold(renamed(hf), cfg, state))


def _round3_families() -> tuple[Family, ...]:
    """kimi_k25 (deepseek_v3, or kimi_k2 as its Hub folders name it); glm46v and glmga (glm4v_text as GLM-4.1V's,
    glm4v_moe_text as GLM-4.5V's), glm_ocr (glm_ocr_text: GLM-4.1V's without q/k/v biases); ernie4_5_vl_moe
    (ernie4_5_moe, its text experts), paddleocr_vl (llama), lfm3_vl (lfm3), minicpmv4_6, minicpmv4_7 and minicpm_ocr
    (qwen3_5_text), qianfan_ocr (qwen3 by default), deepseek_vl and deepseek_vl_hybrid (llama by default),
    cosmos3_omni (qwen3_vl_text, read as qwen3), cosmos3_edge (arcee), deepseek_ocr2 (its own reading, import only),
    nemotron_h_omni (nemotron_h), unlimited_ocr (its own reading, import only)."""
    from redline.interop import deepseek, ernie, glm, lfm2, llama, nemotron_h, qwen3_5

    deepseeks = {f.name: f for f in deepseek.FAMILIES}
    llamas = {f.name: f for f in llama.FAMILIES}
    glm4v_texts = {"glm4v_text": glm.GLM4_FAMILY, "glm4v_moe_text": glm.GLM4_MOE_FAMILY}
    return (
        # GLM-4.6V and GLMGA: Glm4vModel's forward (its multimodal RoPE one position on text, as GLM-4.1V's) around
        # either GLM-4V text model; GLMGA is GLM-4.6V's model under its own config
        *(multimodal_family(name, "Glm4ForCausalLM", glm4v_texts, "glm4v_text", tie_default=False,
                            adapt=_glm46v_text,
                            layout_of=lambda cfg: "glm4v_text" if cfg.norm_position == "sandwich" else "glm4v_moe_text")
          for name in ("glm46v", "glmga")),
        # ERNIE 4.5 VL: ERNIE 4.5 MoE's text model with its text experts alone, which Ernie4_5_VLMoeMoeBlock runs on
        # every token where no token is an image's or video's
        multimodal_family("ernie4_5_vl_moe", "Ernie4_5_MoeForCausalLM",
                          {"ernie4_5_vl_moe_text": ernie.MOE_FAMILY}, "ernie4_5_vl_moe_text", adapt=_ernie_vl_text,
                          view=_ernie_vl_text_experts),
        # PaddleOCR-VL: Qwen2-VL's forward around ERNIE 4.5's dense text model, as Llama's (_paddleocr_text); its
        # text model under model.* (the Hub's, and save_pretrained's) or model.language_model.*
        multimodal_family("paddleocr_vl", "LlamaForCausalLM", {"paddleocr_vl_text": llamas["llama"]},
                          "paddleocr_vl_text", text_tie=True, adapt=_paddleocr_text),
        # LFM3-VL: AutoModel of an lfm3 text_config under a plain lm_head, on the positions it is given
        multimodal_family("lfm3_vl", "Lfm3ForCausalLM", {"lfm3": lfm2.LFM3_FAMILY}, "lfm3"),
        # MiniCPM-V 4.6 and 4.7, MiniCPM-OCR: a Qwen3.5 text model under a plain lm_head; MiniCPM-V 4.7's canvas
        # M-RoPE positions are computed only where image or video sizes are given, arange positions otherwise
        *(multimodal_family(name, "Qwen3_5ForCausalLM", {"qwen3_5_text": qwen3_5.TEXT_FAMILY}, "qwen3_5_text",
                            tie_default=tie) for name, tie in (("minicpmv4_6", False), ("minicpmv4_7", False),
                                                               ("minicpm_ocr", True))),
        # Qianfan-OCR: InternVL's model around a qwen3 text model by default
        multimodal_family("qianfan_ocr", "Qwen3ForCausalLM",
                          {name: llamas[name] for name in ("llama", "mistral", "qwen2", "qwen3")}, "qwen3",
                          tie_default=False),
        # DeepSeek-VL and DeepSeek-VL (hybrid): AutoModel of a llama text_config under a plain lm_head
        *(multimodal_family(name, "LlamaForCausalLM",
                            {name: llamas[name] for name in ("llama", "mistral", "qwen2", "qwen3")}, "llama")
          for name in ("deepseek_vl", "deepseek_vl_hybrid")),
        # Cosmos 3 (Reasoner): Qwen3-VL's model (its interleaved MRoPE plain on text) under Cosmos 3's names
        multimodal_family("cosmos3_omni", "Qwen3ForCausalLM", {"qwen3_vl_text": llamas["qwen3"]}, "qwen3_vl_text",
                          tie_default=False, view=_cosmos3_view),
        multimodal_family("cosmos3_edge", "ArceeForCausalLM", {"cosmos3_edge_text": llama.ARCEE_FAMILY},
                          "cosmos3_edge_text", tie_default=False, adapt=_cosmos3_edge_text,
                          view=lambda src, cfg: _cosmos3_view(src, cfg, edge=True)),
        # DeepSeek-OCR 2: Llama's attention with DeepSeek-V2's experts (import only: no architecture redline writes
        # has them after Llama's attention)
        multimodal_family("deepseek_ocr2", "DeepseekOcr2ForCausalLM", {"deepseek_ocr2_text": Family(
            name="deepseek_ocr2_text", architecture="DeepseekOcr2ForCausalLM", model_config=_deepseek_ocr2_config,
            hf_config=llamas["llama"].hf_config, to_redline=_deepseek_ocr2_to_redline, to_hf=llamas["llama"].to_hf,
            ignorable=llamas["llama"].ignorable)}, "deepseek_ocr2_text", tie_default=False),
        # Unlimited-OCR: DeepSeek-OCR 2's text model with reference sliding windows (model.reference_window; import
        # only: no architecture redline writes keeps a prompt visible beside the window)
        multimodal_family("unlimited_ocr", "UnlimitedOcrForCausalLM", {"unlimited_ocr_text": Family(
            name="unlimited_ocr_text", architecture="UnlimitedOcrForCausalLM", model_config=_unlimited_ocr_config,
            hf_config=llamas["llama"].hf_config, to_redline=_deepseek_ocr2_to_redline, to_hf=llamas["llama"].to_hf,
            ignorable=llamas["llama"].ignorable)}, "unlimited_ocr_text", tie_default=False),
        # Nemotron-H Omni (Nemotron 3 Nano Omni): Nemotron-H's NemotronHForCausalLM under language_model., its
        # config under text_config or (its released folders) llm_config; its head never tied (its config has no
        # tie_word_embeddings, and transformers ties no head of it whatever text_config says)
        _legacy_text_config(multimodal_family("nemotron_h_omni", "NemotronHForCausalLM",
                                              {"nemotron_h": nemotron_h.FAMILY}, "nemotron_h", tie_default=False),
                            "llm_config"),
        multimodal_family("glm_ocr", "Glm4ForCausalLM", {"glm_ocr_text": glm.GLM4_FAMILY}, "glm_ocr_text",
                          tie_default=False, text_tie=True, adapt=_glm_ocr_text, view=_past_last_layer_read),
        # Kimi K2.5 / K2.6: DeepSeek-V3's text model under a lm_head; its image and video placeholder ids embedded as
        # id 0 (Kimi_K25Model's forward), which a text prompt does not hold
        multimodal_family("kimi_k25", "DeepseekV3ForCausalLM", {"deepseek_v3": deepseeks["deepseek_v3"],
                                                                "kimi_k2": deepseeks["deepseek_v3"]},
                          "deepseek_v3", _check_kimi_k25),
    )
