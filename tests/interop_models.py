"""Tiny random Hugging Face models and tokenizers of each family, built inside the tests (no download)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 320
FAMILIES = {
    # Llama with GQA and tied embeddings (SmolLM2's shape, small)
    "llama-gqa-tied": ("LlamaConfig", "LlamaForCausalLM",
                       dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    # Llama untied, with Llama 3.1's RoPE scaling and attention + MLP biases
    "llama-untied-rope3": ("LlamaConfig", "LlamaForCausalLM",
                           dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                                attention_bias=True, mlp_bias=True, rope_theta=50000.0,
                                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    # Qwen2: biases on q/k/v only
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                      tie_word_embeddings=True)),
    # Qwen3: QK-norm, head_dim 24 != 64 / 4
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                                      tie_word_embeddings=False)),
    # Qwen3 with YaRN RoPE scaling (Qwen's recipe for contexts past the trained one); the band of blended
    # frequencies spans pairs 0-3 of 8 at this theta and original context
    "qwen3-yarn": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                                           rope_theta=500.0, tie_word_embeddings=True,
                                                           rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                                         "original_max_position_embeddings": 32})),
    # Mistral with a sliding window shorter than the test sequences
    "mistral-window": ("MistralConfig", "MistralForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                                   sliding_window=5, head_dim=16)),
    # Ministral 3: Mistral's window with the released models' YaRN (the attention factor from mscale / mscale_all_dim)
    # and Llama 4's query scale past the original context, 32 here: the import's context stops there
    "ministral3": ("Ministral3Config", "Ministral3ForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=5, head_dim=16,
                        pad_token_id=None,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0,
                                         "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                         "llama_4_scaling_beta": 0.1})),
    # Qwen2 and Qwen3 with the window on every layer (transformers' layer_types)
    "qwen2-window": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                             use_sliding_window=True, sliding_window=5,
                                                             max_window_layers=0)),
    "qwen3-window": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                             head_dim=16, use_sliding_window=True, sliding_window=6,
                                                             max_window_layers=0)),
    # OLMo 2: norms on the sublayers' outputs, QK-norm over the whole q and k projections, GQA, untied head
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                      tie_word_embeddings=False, rope_theta=500.0)),
    # OLMo 3: OLMo 2's block with windowed layers (three in four, a window shorter than the test sequences) whose
    # RoPE base is their own, the full layer's YaRN-scaled
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM",
              dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4, sliding_window=5,
                   rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 500.0,
                                                       "original_max_position_embeddings": 32},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}})),
    # EXAONE 4.0: OLMo 2's output norms with QK-norm per head; the hybrid form (32B's: windowed layers that rotate,
    # one full layer without RoPE in every two here, a window shorter than the test sequences) and the global one
    # (1.2B's: every layer full and rotating, Llama 3 RoPE scaling, tied)
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM",
                dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4, sliding_window=5,
                     sliding_window_pattern=2, rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "exaone4-global": ("Exaone4Config", "Exaone4ForCausalLM",
                       dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=None,
                            layer_types=["full_attention"] * 2, tie_word_embeddings=True,
                            rope_parameters={"rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 16})),
    # Gemma (gemma-2b's layout: MQA, head_dim 24 != 64 / 4 here, tied) with the released configs' legacy
    # hidden_act "gelu" (the tanh GELU)
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=24,
                                                      hidden_act="gelu", pad_token_id=None,
                                                      rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # StarCoder2 (starcoder2-3b's layout: LayerNorms with biases, biases everywhere, GQA, a window shorter than the
    # test sequences, tied) and without Linear biases (use_bias false), untied, no window
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=5, pad_token_id=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "starcoder2-nobias": ("Starcoder2Config", "Starcoder2ForCausalLM",
                          dict(num_attention_heads=4, num_key_value_heads=2, use_bias=False, tie_word_embeddings=False,
                               pad_token_id=None)),
    # Hunyuan dense: Llama's block with QK-norm after RoPE, head_dim 24 != 64 / 4, tied, its "dynamic" RoPE with a
    # fixed alpha (a stretched base)
    "hunyuan": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM",
                dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24, tie_word_embeddings=True,
                     pad_token_id=None, rope_parameters={"rope_type": "dynamic", "alpha": 5.0, "factor": 1.0,
                                                         "rope_theta": 500.0})),
    # mixtures of experts: Mixtral (top 2 of 4, rescaled, a window shorter than the test sequences), Qwen2-MoE (q/k/v
    # biases, a shared expert with its sigmoid gate, top-k weights not rescaled), Qwen3-MoE (QK-norm, head_dim 24 !=
    # 64 / 4, top 2 of 6 rescaled), OLMoE (QK-norm over whole projections, top 2 of 4 not rescaled)
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                            num_local_experts=4, num_experts_per_tok=2,
                                                            sliding_window=5)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=48, shared_expert_intermediate_size=80, norm_topk_prob=False)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_experts=6, num_experts_per_tok=2,
                       moe_intermediate_size=32, norm_topk_prob=True, tie_word_embeddings=False)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                                                      num_experts_per_tok=2, norm_topk_prob=False)),
    # EXAONE-MoE: EXAONE 4.0's attention (windowed layers rotating, the last of each three full without RoPE, a window
    # shorter than the test sequences) in pre-norm blocks, a dense first layer, then DeepSeek-V3's sigmoid-scored top
    # 2 of 4 experts chosen with a bias, rescaled and scaled, beside a shared expert
    "exaone_moe": ("ExaoneMoeConfig", "ExaoneMoeForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, sliding_window=5,
                        sliding_window_pattern=3, first_k_dense_replace=1, intermediate_size=80,
                        moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, num_shared_experts=2,
                        routed_scaling_factor=1.5, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # FlexOlmo: OLMoE's attention and experts in OLMo 2's block (norms on the sublayers' outputs), top 2 of 4 rescaled
    "flex_olmo": ("FlexOlmoConfig", "FlexOlmoForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                               num_experts=4, num_experts_per_tok=2,
                                                               norm_topk_prob=True, pad_token_id=None)),
    # GPT-OSS: attention sinks (perturbed like every parameter), biases on q/k/v/o, windowed and full layers in turn
    # (a window shorter than the test sequences), YaRN without rounding its band, top 2 of 4 experts with biases,
    # gate and up interleaved, a SwiGLU clamp low enough to bite
    # DeepSeek-V3's latent attention (q through its low-rank bottleneck, values narrower than q/k heads, RoPE on
    # interleaved pairs) on dense layers alone (first_k_dense_replace covers them all)
    "deepseek_v3-dense": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                          dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                               qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, first_k_dense_replace=2,
                               pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # DeepSeek-V3 with its router (sigmoid scores, e_score_correction_bias, 2 of 4 groups, rescaled and scaled by
    # routed_scaling_factor), a dense first layer and a shared expert, YaRN with mscale_all_dim (the score scale's
    # mscale²) and RoPE on (first half, second half) pairs
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                         qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1,
                         n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, n_shared_experts=1,
                         moe_intermediate_size=32, routed_scaling_factor=2.5, norm_topk_prob=True,
                         rope_interleave=False, pad_token_id=None,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0,
                                          "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                          "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707})),
    # DeepSeek-V2(-Lite): one q_proj (no q_lora_rank), softmax routing greedy over the experts, never rescaled,
    # scaled by routed_scaling_factor, two shared experts' width, a dense first layer
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                    dict(num_attention_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16,
                         qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1, n_routed_experts=4,
                         num_experts_per_tok=2, n_shared_experts=2, moe_intermediate_size=32,
                         routed_scaling_factor=2.0, topk_method="greedy", pad_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # GLM-4.7-Flash (glm4_moe_lite): DeepSeek-V3's latent attention (RoPE on interleaved pairs, its default) with
    # GLM-4-MoE's router (sigmoid scores chosen with a bias, the best 2 of 4 groups, rescaled, times 1.8), the dense
    # first layer given as mlp_layer_types, one shared expert
    "glm4_moe_lite": ("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM",
                      dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                           qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, n_group=4,
                           topk_group=2, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
                           routed_scaling_factor=1.8, mlp_layer_types=["dense", "sparse"], pad_token_id=None,
                           rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Youtu: DeepSeek-V3's latent attention (RoPE on interleaved pairs, its default) on Llama's dense SwiGLU blocks,
    # tied embeddings (YoutuConfig's default)
    "youtu": ("YoutuConfig", "YoutuForCausalLM",
              dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=16,
                   qk_rope_head_dim=8, v_head_dim=12, pad_token_id=None,
                   rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Mistral 4: DeepSeek-V3's attention and experts with a softmax router choosing within the best 2 of 4 groups
    # (by their two best scores), rescaled, times routed_scaling_factor, no bias; a dense first layer; YaRN with
    # mscale_all_dim and Llama 4's query scale past the original context, 32 here: the import's context stops there
    "mistral4": ("Mistral4Config", "Mistral4ForCausalLM",
                 dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                      qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1,
                      n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, n_shared_experts=1,
                      moe_intermediate_size=32, routed_scaling_factor=1.5, norm_topk_prob=True, pad_token_id=None,
                      rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0,
                                       "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0,
                                       "mscale": 0.707, "mscale_all_dim": 0.707, "llama_4_scaling_beta": 0.1})),
    # DeepSeek-V3.2 and GLM-5: DeepSeek-V3 with a lightning indexer keeping each query's index_topk = 32 best keys:
    # every key of the test sequences (the import's context stops at 32); the router DeepSeek-V3's (sigmoid,
    # grouped, biased); GLM-5's second layer reusing the first one's choice (no indexer of its own)
    "deepseek_v32": ("DeepseekV32Config", "DeepseekV32ForCausalLM",
                     dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                          qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1,
                          n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, n_shared_experts=1,
                          moe_intermediate_size=32, routed_scaling_factor=2.5, index_topk=32, index_head_dim=16,
                          index_n_heads=2, pad_token_id=None,
                          rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "glm_moe_dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM",
                    dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                         qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, first_k_dense_replace=1,
                         n_routed_experts=8, n_group=1, topk_group=1, num_experts_per_tok=2, n_shared_experts=1,
                         moe_intermediate_size=32, routed_scaling_factor=1.8, index_topk=32, index_head_dim=16,
                         index_n_heads=2, indexer_types=["full", "shared"], pad_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # HY-V4: DeepSeek-V3's blocks (a dense first layer, then top 2 of 8 sigmoid experts chosen with the bias, beside
    # a shared one, their SwiGLU clamped at 0.3) on 3 independent hyper-connection streams (post gates times 1.5),
    # gated latent heads with sinks; its indexer keeps index_topk = 32 keys: every key of the test sequences (the
    # import's context stops there)
    "hy_v4": ("HYV4Config", "HYV4ForCausalLM",
              dict(num_attention_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
                   v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                   moe_intermediate_size=32, routed_scaling_factor=1.5, index_topk=32, index_head_dim=16,
                   index_n_heads=2, hc_mult=3, hc_magnitude=1.5, swiglu_limit=0.3, pad_token_id=None,
                   rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # dots.3 Note's text model: DeepSeek-V3.2's blocks with scaled latents, a norm on the RoPE key part and gated
    # heads; DSA layers (index_topk 32 keeps every key of the test sequences: the import's context stops there)
    # and windowed ones with a RoPE base of their own, their heads the others' shape (swa_*); a dense first layer
    "dots3_note_text": ("Dots3NoteTextConfig", "Dots3NoteForCausalLM",
                        dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16,
                             kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, head_dim=24,
                             swa_num_attention_heads=4, swa_num_key_value_heads=4, swa_q_lora_rank=16,
                             swa_kv_lora_rank=24, swa_head_dim=24, swa_qk_nope_head_dim=16, swa_v_head_dim=12,
                             sliding_window_size=5, first_k_dense_replace=1, n_routed_experts=8, n_group=4,
                             topk_group=2, num_experts_per_tok=2, n_shared_experts=2, moe_intermediate_size=32,
                             shared_experts_intermediate_size=16, routed_scaling_factor=1.5, index_topk=32,
                             index_head_dim=16, index_n_heads=2, pad_token_id=None, rope_theta=500.0,
                             swa_rope_theta=300.0)),
    # A.X-K1: DeepSeek-V3 (RoPE on interleaved pairs, its router with a bias, grouped) with an RMSNorm on each
    # mixture's output (post_mlp_layernorm), the dense first layer as mlp_layer_types
    "axk1": ("AXK1Config", "AXK1ForCausalLM",
             dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=16,
                  qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, n_group=4, topk_group=2,
                  num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32, routed_scaling_factor=2.5,
                  mlp_layer_types=["dense", "sparse"], pad_token_id=None,
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # A.X-K2: DeepSeek-V3.2's layers (an indexer keeping every key within index_topk) with gated norms and the
    # latent query gate; the dense first layer as mlp_layer_types, no groups (A.X-K2-Light's routing)
    "axk2": ("AXK2Config", "AXK2ForCausalLM",
             dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=16,
                  qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                  moe_intermediate_size=32, routed_scaling_factor=2.5, mlp_layer_types=["dense", "sparse"],
                  index_topk=64, index_head_dim=16, index_n_heads=2, gated_norm_rank=8, pad_token_id=None,
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # LongCat-Flash: each of 2 layers two latent attention + dense MLP pairs and a shortcut MoE of 4 MLP experts and
    # 3 identity experts (top 3, so identity ones are chosen), a routing bias; q and the latent scaled by
    # sqrt(hidden / rank)
    "longcat_flash": ("LongcatFlashConfig", "LongcatFlashForCausalLM",
                      dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16,
                           kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, head_dim=8, v_head_dim=12,
                           ffn_hidden_size=48, expert_ffn_hidden_size=32, n_routed_experts=4, zero_expert_num=3,
                           moe_topk=3, routed_scaling_factor=2.0, pad_token_id=None,
                           rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # MiMo-V2-Flash: a full layer (2 KV heads, no sinks, RoPE base 5e6) then windowed ones (4 KV heads, sinks, a
    # window shorter than the test sequences, base 1e4), q/k heads 24 wide with RoPE on 8 (int(24 · 0.334)), values
    # 16 wide times attention_value_scale; a dense first layer, DeepSeek-V3's router (2 of 4 groups) without a shared
    # expert
    "mimo_v2_flash": ("MiMoV2FlashConfig", "MiMoV2FlashForCausalLM",
                      dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                           v_head_dim=16, sliding_window=5,
                           layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                           mlp_layer_types=["dense", "sparse", "sparse"], n_routed_experts=8, n_group=4, topk_group=2,
                           num_experts_per_tok=2, moe_intermediate_size=32, routed_scaling_factor=2.0,
                           attention_value_scale=0.707, pad_token_id=None,
                           rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5e6,
                                                               "partial_rotary_factor": 0.334},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                                                                  "partial_rotary_factor": 0.334}})),
    # MiniCPM3: latent attention (RoPE on (first half, second half) pairs, values hidden / heads wide) with µP
    # scalars: embeddings times scale_emb, each sublayer's output times scale_depth / sqrt(layers), the last hidden
    # state divided by hidden_size / dim_model_base; tied; and with LongRoPE (MiniCPM3-4B's rope_scaling)
    "minicpm3": ("MiniCPM3Config", "MiniCPM3ForCausalLM",
                 dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                      qk_nope_head_dim=16, qk_rope_head_dim=8, scale_emb=12, scale_depth=1.4, dim_model_base=16,
                      pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "minicpm3-longrope": ("MiniCPM3Config", "MiniCPM3ForCausalLM",
                          dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16,
                               qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, scale_emb=2.5,
                               scale_depth=1.2, dim_model_base=32, tie_word_embeddings=False, pad_token_id=None,
                               rope_parameters={"rope_type": "longrope", "rope_theta": 500.0,
                                                "short_factor": [1.0, 1.3, 1.9, 2.7],
                                                "long_factor": [1.1, 2.0, 3.5, 5.0],
                                                "original_max_position_embeddings": 32})),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                     num_experts_per_tok=2, sliding_window=5, swiglu_limit=0.3, tie_word_embeddings=False,
                     pad_token_id=None, rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0,
                                                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                         "original_max_position_embeddings": 32})),
    # GPT-OSS with its full layer first (window_layers: no pattern of redline's puts it there), no biases
    "gpt_oss-full-first": ("GptOssConfig", "GptOssForCausalLM",
                           dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                num_experts_per_tok=2, sliding_window=5, attention_bias=False,
                                layer_types=["full_attention", "sliding_attention"], tie_word_embeddings=False,
                                pad_token_id=None)),
    # LFM2: short convolutions on layers 0 and 2, attention (QK-norm, GQA) on 1; the MLP width adjusted as its
    # configs ask (two thirds of 96, rounded up to 32: 64)
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM",
             dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3,
                  layer_types=["conv", "full_attention", "conv"], block_multiple_of=32, norm_eps=1e-5,
                  tie_word_embeddings=True, pad_token_id=None)),
    # LFM3: convolutions on layers 0, 1 and 3, full attention on 2 (proportional RoPE: 4 of 8 pairs turning, over a
    # factor), a window on 4 (its own unscaled RoPE), sigmoid gates on the heads, norms on the sublayers' outputs
    "lfm3": ("Lfm3Config", "Lfm3ForCausalLM",
             dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=5, head_dim=16, sliding_window=5,
                  conv_L_cache=3, tie_word_embeddings=False, pad_token_id=None,
                  rope_parameters={"full_attention": {"rope_type": "proportional", "rope_theta": 100.0,
                                                      "partial_rotary_factor": 0.5, "factor": 2.0},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}})),
    # LFM2-MoE: LFM2's layers, the first dense (48 wide), the others top 2 of 4 sigmoid-scored experts chosen with a
    # bias (perturbed like every tensor), rescaled, times 1.5
    "lfm2_moe": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM",
                 dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, intermediate_size=48,
                      moe_intermediate_size=32, num_dense_layers=1, num_experts=4, num_experts_per_tok=2,
                      routed_scaling_factor=1.5, layer_types=["conv", "full_attention", "conv"], norm_eps=1e-5,
                      tie_word_embeddings=True, pad_token_id=None)),
    # GLM (glm-4-9b-chat-hf's block: biases on q/k/v, half of each head rotated in interleaved pairs, gate and up
    # fused), GLM-4 (GLM-4-0414's: the same with RMSNorms on the sublayers' outputs too; head_dim 24 != 64 / 4, tied)
    "glm": ("GlmConfig", "GlmForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                                pad_token_id=None, rope_parameters={"rope_type": "default",
                                                                                    "rope_theta": 500.0,
                                                                                    "partial_rotary_factor": 0.5})),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                                   tie_word_embeddings=True, pad_token_id=None)),
    # GLM-4-MoE (GLM-4.5's layout): a dense first layer (96 wide), then top 2 of 8 sigmoid-scored experts chosen
    # with a bias (perturbed like every tensor) within the best 2 of 4 groups, rescaled, times 2.5, beside one
    # ungated shared expert; QK-norm per head, q/k/v biases, half of each head rotated; and GLM-4.5-Air's (no
    # QK-norm, every layer's experts in one group, weights not rescaled, two shared experts)
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3,
                      n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                      first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                      use_qk_norm=True, attention_bias=True, pad_token_id=None)),
    # GLM-4-MoE in the layout llama.cpp's glm4moe runs (GLM-4.5's: one group of experts, which its loader assumes),
    # with the QK-norm and q/k/v biases of the model above
    "glm4_moe-gguf": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                      dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3,
                           n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                           first_k_dense_replace=1, routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True,
                           pad_token_id=None)),
    "glm4_moe-air": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                     dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, n_routed_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=24, n_shared_experts=2,
                          first_k_dense_replace=0, norm_topk_prob=False, tie_word_embeddings=False,
                          pad_token_id=None)),
    # Cohere (Command-R's block: parallel sublayers under one LayerNorm without a bias, RoPE on interleaved pairs, a
    # logit scale, tied) and Cohere2 (Command R7B's: three windowed layers that rotate, then a full one without RoPE;
    # a window shorter than the test sequences)
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                         logit_scale=0.25, layer_norm_eps=1e-5, pad_token_id=None)),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM",
                dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4, sliding_window=5,
                     logit_scale=0.5, layer_norm_eps=1e-5, pad_token_id=None,
                     layer_types=["sliding_attention"] * 3 + ["full_attention"])),
    # Cohere Compass's text model: Cohere2's block with RoPE on half-split pairs per layer type: windowed layers that
    # rotate, the full one in three that does not (exported as Cohere2); windowed and full layers rotating by bases
    # of their own, logits scaled, untied (exported as Cohere Compass); every layer full, one base, tied (as Cohere)
    "cohere_compass_text": ("CohereCompassTextConfig", "CohereCompassForCausalLM",
                            dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, sliding_window=5,
                                 layer_norm_eps=1e-5, pad_token_id=None,
                                 layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                 rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
                                                  "full_attention": None})),
    "cohere_compass_text-bases": ("CohereCompassTextConfig", "CohereCompassForCausalLM",
                                  dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=5,
                                       logit_scale=0.5, tie_word_embeddings=False, pad_token_id=None,
                                       layer_types=["sliding_attention", "full_attention"],
                                       rope_parameters={"sliding_attention": {"rope_type": "default",
                                                                              "rope_theta": 50.0},
                                                        "full_attention": {"rope_type": "default",
                                                                           "rope_theta": 300.0}})),
    "cohere_compass_text-full": ("CohereCompassTextConfig", "CohereCompassForCausalLM",
                                 dict(num_attention_heads=4, num_key_value_heads=2, logit_scale=0.25,
                                      pad_token_id=None,
                                      rope_parameters={"full_attention": {"rope_type": "default",
                                                                          "rope_theta": 500.0}})),
    # Aria's text model: Llama's attention (GQA), every layer's MLP top 2 of 4 experts stacked transposed beside 2
    # shared ones fused into an ungated MLP, untied
    "aria_text": ("AriaTextConfig", "AriaTextForCausalLM",
                  dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=32, moe_num_experts=4,
                       moe_topk=2, moe_num_shared_experts=2, pad_token_id=None,
                       rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # MiniMax-M3's text model: a dense first layer (48 wide), then top 2 of 4 sigmoid-scored experts chosen with the
    # correction bias, scaled by 2, beside an ungated shared expert, clamped SwiGLUs, Gemma's norms and per-head
    # QK-norm, RoPE on half of each head; its middle layer sparse (blocks of 4 keys, the best 8 kept: dense within 32
    # tokens, the context read)
    "minimax_m3_vl_text": ("MiniMaxM3VLTextConfig", "MiniMaxM3VLForCausalLM",
                           dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3,
                                intermediate_size=32, dense_intermediate_size=48, shared_intermediate_size=24,
                                num_local_experts=4, num_experts_per_tok=2, index_n_heads=2, index_head_dim=8,
                                index_block_size=4, index_topk_blocks=8, mlp_layer_types=["dense", "sparse", "sparse"],
                                layer_types=["full_attention", "minimax_m3_sparse", "full_attention"],
                                rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                 "partial_rotary_factor": 0.5})),
    # GraniteMoE: Granite's four scalars, top 2 of 4 experts (softmax over the chosen logits), untied
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        intermediate_size=48, embedding_multiplier=3.0, residual_multiplier=0.4, logits_scaling=2.5,
                        attention_multiplier=0.2, tie_word_embeddings=False)),
    # GraniteMoeShared: GraniteMoE's experts with an ungated SwiGLU MLP beside them
    "granitemoeshared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM",
                         dict(num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                              intermediate_size=48, shared_intermediate_size=40, embedding_multiplier=3.0,
                              residual_multiplier=0.4, logits_scaling=2.5, attention_multiplier=0.2,
                              tie_word_embeddings=False)),
    # Gemma 3 text: three layers, windowed - full - windowed (pattern 2) with a window shorter than the test
    # sequences, the windowed layers rotating with their own base, linear RoPE scaling on the full one, head_dim
    # 24 != 64 / 4, query_pre_attn_scalar 20 != head_dim
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_hidden_layers=3,
                    query_pre_attn_scalar=20, sliding_window=5,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}})),
    # Gemma 2: three layers, windowed - full - windowed with a window shorter than the test sequences, the scores
    # and the logits soft-capped (low caps, so that the caps bite), head_dim 24 != 64 / 4
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_hidden_layers=3,
                    query_pre_attn_scalar=20, sliding_window=5, attn_logit_softcapping=2.0,
                    final_logit_softcapping=3.0, rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # VaultGemma: Gemma 2's (above) with pre-norm blocks, the MLP's input norm named pre_feedforward_layernorm
    "vaultgemma": ("VaultGemmaConfig", "VaultGemmaForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_hidden_layers=3,
                        query_pre_attn_scalar=20, sliding_window=5, attn_logit_softcapping=2.0,
                        final_logit_softcapping=3.0, pad_token_id=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Gemma 4 text, as gemma-4-E2B is: five layers sliding - full - sliding - sliding - full with a window shorter
    # than the test sequences, the full layers' heads twice as wide (global_head_dim 32 != head_dim 16) rotating
    # with proportional RoPE on a quarter of their pairs, the sliding ones with their own base; the last two layers
    # reading layers 2's and 1's keys and values (num_kv_shared_layers) with double-wide MLPs; per-layer inputs of
    # width 8; the logits soft-capped low, so that the cap bites
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM",
               dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                    num_hidden_layers=5, sliding_window=5, pad_token_id=None,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                                 "full_attention"],
                    num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=8,
                    vocab_size_per_layer_input=VOCAB, final_logit_softcapping=3.0,
                    rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                        "rope_theta": 5000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}})),
    # Gemma 4 Unified's text model: Gemma 4's above without per-layer inputs (it has none) and without shared KV
    # layers (transformers 5.24's Gemma4ForCausalLM, the export, fails on shared KV layers without per-layer inputs:
    # its _maybe_slice_kv_shared_inputs slices them)
    "gemma4_unified_text": ("Gemma4UnifiedTextConfig", "Gemma4UnifiedForCausalLM",
                            dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                                 num_hidden_layers=4, sliding_window=5, pad_token_id=None,
                                 layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                              "full_attention"],
                                 final_logit_softcapping=3.0,
                                 rope_parameters={"full_attention": {"rope_type": "proportional",
                                                                     "partial_rotary_factor": 0.25,
                                                                     "rope_theta": 5000.0},
                                                  "sliding_attention": {"rope_type": "default",
                                                                        "rope_theta": 300.0}})),
    # Gemma 4 text in a layout llama.cpp's gemma4 runs as transformers does (gemma-4-E2B's): the two layers before
    # the shared ones windowed then full, whose keys and values the shared windowed and full layers read
    # (llama.cpp's KV-cache reuse rule); per-layer inputs, double-wide shared MLPs, proportional RoPE, a soft cap
    "gemma4-gguf": ("Gemma4TextConfig", "Gemma4ForCausalLM",
                    dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                         num_hidden_layers=5, sliding_window=5, pad_token_id=None,
                         layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                      "sliding_attention", "full_attention"],
                         num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=8,
                         vocab_size_per_layer_input=VOCAB, final_logit_softcapping=3.0,
                         rope_parameters={"full_attention": {"rope_type": "proportional",
                                                             "partial_rotary_factor": 0.25, "rope_theta": 5000.0},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}})),
    # Gemma 4 text, as gemma-4-31B is: the full layers' values their keys' projection (attention_k_eq_v) with one
    # KV head of their own (num_global_key_value_heads), no per-layer inputs or shared layers, untied; bidirectional
    # attention over image tokens alone ("vision"), which leaves text causal
    "gemma4-k-eq-v": ("Gemma4TextConfig", "Gemma4ForCausalLM",
                      dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=24,
                           num_global_key_value_heads=1, attention_k_eq_v=True, num_hidden_layers=4,
                           sliding_window=5, pad_token_id=None, hidden_size_per_layer_input=0,
                           tie_word_embeddings=False, use_bidirectional_attention="vision",
                           layer_types=["sliding_attention", "sliding_attention", "full_attention", "full_attention"],
                           rope_parameters={"full_attention": {"rope_type": "proportional",
                                                               "partial_rotary_factor": 0.5, "rope_theta": 5000.0},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}})),
    # Gemma 4 text, as gemma-4-26B-A4B is: each layer's top 2 of 4 experts (moe_intermediate_size 32) beside its
    # dense MLP, the full layers' values from their keys
    "gemma4-moe": ("Gemma4TextConfig", "Gemma4ForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=24,
                        num_global_key_value_heads=1, attention_k_eq_v=True, num_hidden_layers=3, sliding_window=5,
                        pad_token_id=None, hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=4,
                        top_k_experts=2, moe_intermediate_size=32,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"])),
    # Gemma 3n text, as gemma-3n-E2B is in small: four AltUp streams, LAuReL of rank 8, per-layer inputs of width 8
    # from a table shorter than the vocabulary (the test tokens past it read row 0), five layers sliding - sliding -
    # full - sliding - full with a window shorter than the test sequences and a base of their own, the last two
    # reading layers 2's and 1's keys and values, the first two MLPs' gates sparse; the logits soft-capped low
    "gemma3n": ("Gemma3nTextConfig", "Gemma3nForCausalLM",
                dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=5,
                     sliding_window=5, pad_token_id=None, laurel_rank=8, hidden_size_per_layer_input=8,
                     vocab_size_per_layer_input=300, num_kv_shared_layers=2, final_logit_softcapping=3.0,
                     activation_sparsity_pattern=[0.95, 0.6, 0.0, 0.0, 0.0],
                     layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                                  "full_attention"],
                     rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5000.0},
                                      "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}})),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64)),
    # OPT as opt-125m is: learned positions (two rows before position 0's), pre-LayerNorm, ReLU, biases, tied
    "opt": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=96,
                                                 max_position_embeddings=64, word_embed_proj_dim=64)),
    # BLOOM: ALiBi with 6 heads (not a power of two: the interleaved extra slopes), a LayerNorm on the embeddings,
    # query_key_value grouped by head, biases, tanh-GELU, tied
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=48, n_head=6)),
    # MPT: ALiBi with 4 heads, LayerNorms without biases, no Linear biases, exact GELU, its own softmax_scale, tied
    "mpt": ("MptConfig", "MptForCausalLM", dict(n_heads=4, attn_config={"softmax_scale": 0.2})),
    # Falcon as falcon-7b is: one LayerNorm for parallel sublayers, multi-query ([q_0 .. q_3, k, v] rows), no biases,
    # exact GELU, tied; as falcon-40b/180B is (the new decoder architecture): parallel sublayers under ln_attn and
    # ln_mlp, 2 KV heads (rows in KV groups [q, q, k, v]), an untied head; Falcon2-11B's one norm with GQA
    # (num_ln_in_parallel_attn=1), with biases; and sequential blocks, plain multi-head ([q_h, k_h, v_h] rows),
    # biases, tanh-GELU
    "falcon": ("FalconConfig", "FalconForCausalLM",
               dict(num_attention_heads=4, ffn_hidden_size=96, rope_parameters={"rope_type": "default",
                                                                                "rope_theta": 500.0})),
    "falcon-new": ("FalconConfig", "FalconForCausalLM",
                   dict(num_attention_heads=4, num_kv_heads=2, new_decoder_architecture=True, ffn_hidden_size=96,
                        tie_word_embeddings=False)),
    "falcon-new-one-norm": ("FalconConfig", "FalconForCausalLM",
                            dict(num_attention_heads=4, num_kv_heads=1, new_decoder_architecture=True,
                                 num_ln_in_parallel_attn=1, ffn_hidden_size=96, bias=True)),
    "falcon-sequential": ("FalconConfig", "FalconForCausalLM",
                          dict(num_attention_heads=4, multi_query=False, parallel_attn=False, bias=True,
                               activation="gelu_pytorch_tanh")),
    # sequential blocks with multi-query attention, no biases (exported as StarCoder2)
    "falcon-sequential-mqa": ("FalconConfig", "FalconForCausalLM",
                              dict(num_attention_heads=4, parallel_attn=False, ffn_hidden_size=80)),
    # GPT-2's layout with the erf GELU (activation_function "gelu")
    "gpt2-erf": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                                       activation_function="gelu")),
    # GPT-NeoX as Pythia is: parallel attention and MLP, RoPE on a quarter of each head (4 of 16 dimensions), exact
    # GELU, LayerNorm with biases, untied head
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 dict(num_attention_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                              "partial_rotary_factor": 0.25})),
    # Phi as phi-2 is (one LayerNorm feeding attention and MLP side by side, RoPE on part of each head, a bias on the
    # head), with GQA; and with the erf GELU, a tied head and its own RoPE base
    "phi": ("PhiConfig", "PhiForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2)),
    "phi-tied": ("PhiConfig", "PhiForCausalLM",
                 dict(num_attention_heads=4, hidden_act="gelu", tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25})),
    # Phi-3 as Phi-4-mini and Phi-3.5-mini are: q/k/v and gate/up fused, RoPE on three quarters of each head, LongRoPE
    # (its short factors within original_max_position_embeddings, a table factor from the extended context), GQA,
    # tied; and as Phi-3-mini-4k is: a sliding window on every layer, whole heads rotated, untied
    "phi3-longrope": ("Phi3Config", "Phi3ForCausalLM",
                      dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, pad_token_id=None,
                           max_position_embeddings=128, original_max_position_embeddings=32,
                           rope_parameters={"rope_type": "longrope", "rope_theta": 500.0, "partial_rotary_factor": 0.75,
                                            "short_factor": [1.0, 1.4, 2.1, 2.9, 3.6, 4.8],
                                            "long_factor": [1.2, 2.5, 4.0, 6.5, 9.0, 12.0]})),
    "phi3-window": ("Phi3Config", "Phi3ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=4,
                                                          sliding_window=5, pad_token_id=None)),
    # StableLM as stablelm-2-1_6b is (LayerNorm with biases, a quarter of each head rotated, q/k/v biases, SwiGLU),
    # with GQA; and the parallel block with its one norm (stablelm-3b-4e1t's option), half of each head rotated
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                               use_qkv_bias=True)),
    "stablelm-parallel": ("StableLmConfig", "StableLmForCausalLM",
                          dict(num_attention_heads=4, num_key_value_heads=4, use_parallel_residual=True,
                               tie_word_embeddings=True,
                               rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                "partial_rotary_factor": 0.5})),
    # SmolLM3: Llama's block with RoPE left out of every second layer (its release: every fourth), GQA, tied;
    # three layers, so the NoPE layer sits between two rotating ones
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM",
                dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, no_rope_layer_interval=2,
                     tie_word_embeddings=True, pad_token_id=None)),
    # ERNIE 4.5 (0.3B's layout: RoPE on interleaved pairs, GQA, head_dim 32 != 64 / 4, tied), with biases on every
    # Linear layer and a RoPE base of its own
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM",
                 dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, use_bias=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # EXAONE 3.5: Llama's block with GPT-2-style names in the files (transformer.h.N.attn.attention...), tied, a Llama 3
    # RoPE (its 2.4B's), head_dim 32 != 64 / 4
    "exaone": ("ExaoneConfig", "LlamaForCausalLM",
               dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                    pad_token_id=None, rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 16})),
    # Arcee (AFM-4.5B's layout): Llama's block with a plain ReLU² MLP (up, down), untied, YaRN
    "arcee": ("ArceeConfig", "ArceeForCausalLM",
              dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, pad_token_id=None,
                   rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0,
                                    "original_max_position_embeddings": 32})),
    # Helium (Helium-1-2B's layout): Llama's block with RoPE on interleaved pairs, untied
    "helium": ("HeliumConfig", "HeliumForCausalLM",
               dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                    pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Seed-OSS: Llama's block with biases on q/k/v alone (its defaults), head_dim 32 != 64 / 4, untied
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM",
                 dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                      pad_token_id=None, attention_dropout=0.0, residual_dropout=0.0)),
    # Qwen3.5's text model: gated delta nets on layers 0, 1 and 3 (2 key heads shared by 4 value heads), gated
    # full attention on 2 (QK-norm, RoPE on half of each head), norms by 1 + weight, untied
    "qwen3_5_text": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
                     dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
                          layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                          linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                          linear_value_head_dim=8, linear_conv_kernel_dim=4, tie_word_embeddings=False,
                          pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                              "partial_rotary_factor": 0.5})),
    # Qwen3.5-MoE's text model: a gated delta net on layers 0 and 2, gated full attention on 1, every MLP top 2 of 4
    # experts (rescaled) plus a shared expert under its sigmoid gate, tied
    "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
                         dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3,
                              layer_types=["linear_attention", "full_attention", "linear_attention"],
                              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                              linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                              shared_expert_intermediate_size=48, tie_word_embeddings=True, pad_token_id=None,
                              rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                               "partial_rotary_factor": 0.5})),
    # Qwen4-Exp's text model: Qwen3.5-MoE's layers (delta nets on 0 and 2, gated attention with a QSA indexer on
    # 1, top 2 of 4 experts not rescaled plus the gated shared expert) on 3 hyper-connected streams (mixers of rank
    # 8); the indexer's budget of 32 keys in blocks of 4 caps the context at 35 (test_interop_commands' training
    # runs take 32)
    "qwen4_exp_text": ("Qwen4ExpTextConfig", "Qwen4ExpForCausalLM",
                       dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3,
                            layer_types=["linear_attention", "full_attention", "linear_attention"],
                            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                            linear_value_head_dim=12, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                            shared_expert_intermediate_size=48, norm_topk_prob=False, hc_count=3, hc_lowrank=8,
                            indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=32,
                            indexer_compress_ratio=4, tie_word_embeddings=False, pad_token_id=None,
                            rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                             "partial_rotary_factor": 0.5})),
    # Qwen4-Exp with Per-Layer Embeddings on both delta-net layers (ple_layer_ids one-indexed): 2 tables of each
    # n-gram length 2 and 3 (primes after 49: small tables, many ids sharing rows), a 3-tap convolution 3 tokens apart,
    # the tables in 4 shards on disk; eos_token_id 1 (common) cuts the n-grams
    "qwen4_exp_text-ple": ("Qwen4ExpTextConfig", "Qwen4ExpForCausalLM",
                           dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3,
                                layer_types=["linear_attention", "full_attention", "linear_attention"],
                                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                                linear_value_head_dim=12, num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=32, shared_expert_intermediate_size=48, hc_count=3,
                                hc_lowrank=8, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16,
                                indexer_budget=32, indexer_compress_ratio=4, tie_word_embeddings=False,
                                pad_token_id=None, ple_layer_ids=[3, 1], ple_embed_dim=24, ngram_size=3,
                                heads_per_ngram=2, ngram_vocab_size_base=50, make_ngram_vocab_size_divisible_by=8,
                                split_ngram_parts=4, ple_conv_kernel_size=3, seed=77,
                                rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # DeepSeek-V4 on its sliding layers (a window of 5, shorter than the test sequences): 3 hyper-connected streams,
    # q through a rank-24 latent, one key head that is the value too, half of each head rotated, sinks, the grouped
    # output projection (2 groups of rank 12); top 2 of 4 sqrtsoftplus-scored experts, layer 0's chosen by the token
    # id (hash_moe: its tid2eid set at random in hf_model), layer 1's by the router with its bias
    "deepseek_v4": ("DeepseekV4Config", "DeepseekV4ForCausalLM",
                    dict(num_attention_heads=4, head_dim=16, q_lora_rank=24, o_groups=2, o_lora_rank=12,
                         n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, index_n_heads=2,
                         index_head_dim=8, layer_types=["sliding_attention"] * 2, mlp_layer_types=["hash_moe", "moe"],
                         sliding_window=5, hc_mult=3, hc_sinkhorn_iters=6, partial_rotary_factor=0.5,
                         rope_theta=500.0, pad_token_id=None)),
    # DeepSeek-V4 with its compressed layers: a window of 4 (shorter than the test sequences), layer 1 compressed
    # sparse attention (overlapping windows of 2; index_topk 32 keeps every key of the 64-token context: the cap,
    # (32 + 1)·2 - 1, lies past it; tests/test_deepseek_v4.py checks a cap), layer 2 heavily compressed (windows of
    # 3) with its own RoPE base, layer 0 sliding
    "deepseek_v4-compressed": ("DeepseekV4Config", "DeepseekV4ForCausalLM",
                               dict(num_attention_heads=4, head_dim=16, q_lora_rank=24, o_groups=2, o_lora_rank=12,
                                    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    index_n_heads=2, index_head_dim=8, index_topk=32, num_hidden_layers=3,
                                    layer_types=["sliding_attention", "compressed_sparse_attention",
                                                 "heavily_compressed_attention"],
                                    mlp_layer_types=["hash_moe", "moe", "moe"],
                                    compress_rates={"compressed_sparse_attention": 2,
                                                    "heavily_compressed_attention": 3},
                                    sliding_window=4, hc_mult=2, partial_rotary_factor=0.5, rope_theta=500.0,
                                    compress_rope_theta=2000.0, pad_token_id=None)),
    # DeepSeek-V4 with YaRN on its compressed layers alone (the sliding layer 0 turning by the plain RoPE), given
    # flat as DeepSeek's configs give it: both kinds of compressed layer, windows of 4 and 2
    "deepseek_v4-yarn": ("DeepseekV4Config", "DeepseekV4ForCausalLM",
                         dict(num_attention_heads=4, head_dim=16, q_lora_rank=24, o_groups=2, o_lora_rank=12,
                              n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, index_n_heads=2,
                              index_head_dim=8, index_topk=16, num_hidden_layers=3,
                              layer_types=["sliding_attention", "heavily_compressed_attention",
                                           "compressed_sparse_attention"],
                              mlp_layer_types=["moe", "moe", "hash_moe"],
                              compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 2},
                              sliding_window=5, hc_mult=2, partial_rotary_factor=0.5, rope_theta=500.0,
                              compress_rope_theta=1000.0, pad_token_id=None,
                              rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 16, "beta_fast": 8.0,
                                               "beta_slow": 1.0})),
    # DeepSeek-V4 with sigmoid scores on 3 layers (the last two hash-routed: hash_moe anywhere), whole heads rotated,
    # tied embeddings
    "deepseek_v4-sigmoid": ("DeepseekV4Config", "DeepseekV4ForCausalLM",
                            dict(num_attention_heads=4, head_dim=16, q_lora_rank=16, o_groups=4, o_lora_rank=8,
                                 n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                 index_n_heads=2, index_head_dim=8, num_hidden_layers=3,
                                 layer_types=["sliding_attention"] * 3,
                                 mlp_layer_types=["moe", "hash_moe", "hash_moe"], sliding_window=6, hc_mult=2,
                                 scoring_func="sigmoid", partial_rotary_factor=1.0, routed_scaling_factor=2.5,
                                 swiglu_limit=0.5, tie_word_embeddings=True, pad_token_id=None)),
    # Qwen3-Next: delta nets on layers 0, 1 and 3 (in_proj_qkvz / in_proj_ba grouped by key head: 2 key heads of 2
    # value heads each, Dk != Dv), gated full attention on 2, the first layer dense (mlp_only_layers), the others top
    # 2 of 4 experts not rescaled plus the shared expert, untied
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
                        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                        linear_value_head_dim=12, mlp_only_layers=[0], num_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, shared_expert_intermediate_size=40, norm_topk_prob=False,
                        tie_word_embeddings=False, pad_token_id=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5})),
    # MiniMax-Text-01: lightning attention (4 heads of 16) on layers 0 and 2 beside Mixtral's attention (GQA) on 1,
    # Mixtral's experts (top 2 of 4), every residual scale apart from 1; blocks of 4 tokens, so that transformers'
    # lightning attention runs over several
    "minimax": ("MiniMaxConfig", "MiniMaxForCausalLM",
                dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, num_local_experts=4,
                     num_experts_per_tok=2, block_size=4,
                     layer_types=["linear_attention", "full_attention", "linear_attention"],
                     full_attn_alpha_factor=1.3, full_attn_beta_factor=0.8, linear_attn_alpha_factor=0.9,
                     linear_attn_beta_factor=1.2, mlp_alpha_factor=1.1, mlp_beta_factor=0.7,
                     tie_word_embeddings=False)),
    # MiniMax with the default layer kinds (full, then linear), heads of 12 (not 64 / 4), its default scales, a
    # window of 5 on its attention, tied
    "minimax-default": ("MiniMaxConfig", "MiniMaxForCausalLM",
                        dict(num_attention_heads=4, num_key_value_heads=4, head_dim=12, num_local_experts=4,
                             num_experts_per_tok=2, block_size=8, sliding_window=5, tie_word_embeddings=True)),
    # Kimi Linear: Kimi Delta Attention (4 heads of 8, decays per key channel, gates of rank 8) on layers 0, 1 and 3
    # as the Hub's linear_attn_config numbers them (from 1), NoPE latent attention (q through one q_proj, values
    # narrower than q/k heads) on 2, a dense first layer, then DeepSeek-V3's router (2 of 4 groups, top 2 of 8,
    # rescaled, scaled) with a shared expert
    "kimi_linear": ("KimiLinearConfig", "KimiLinearForCausalLM",
                    dict(num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=4, kv_lora_rank=16,
                         q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                         linear_attn_config={"head_dim": 8, "num_heads": 4, "short_conv_kernel_size": 4,
                                             "full_attn_layers": [3], "kda_layers": [1, 2, 4]},
                         num_experts=8, num_experts_per_token=2, n_group=4, topk_group=2, moe_intermediate_size=32,
                         routed_scaling_factor=2.5, first_k_dense_replace=1, pad_token_id=None,
                         tie_word_embeddings=False)),
    # Kimi Linear with q through its low-rank bottleneck, every MLP dense, the default layer kinds (layer 0 KDA, 1 full)
    "kimi_linear-dense": ("KimiLinearConfig", "KimiLinearForCausalLM",
                          dict(num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2, kv_lora_rank=16,
                               q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=24,
                               linear_head_dim=16, linear_num_heads=2, linear_conv_kernel_dim=3,
                               layer_types=["linear_attention", "full_attention"], first_k_dense_replace=2,
                               num_experts=4, pad_token_id=None, tie_word_embeddings=True)),
    # Ling 3 (Bailing hybrid): Kimi Delta Attention (4 heads of 8, full-rank gates, the decay bounded in (-5, 0): its
    # safe gate) on layers 0 and 1, latent attention with RoPE on interleaved pairs and a sigmoid gate a head on 2, a
    # dense first layer, then DeepSeek-V3's router (2 of 4 groups, top 2 of 8) with a shared expert
    "bailing_hybrid": ("BailingHybridConfig", "BailingHybridForCausalLM",
                       dict(num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=3, kv_lora_rank=16,
                            q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, head_dim=8,
                            layer_group_size=3, num_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
                            moe_intermediate_size=32, routed_scaling_factor=2.5, first_k_dense_replace=1,
                            num_mtp_layers=0, pad_token_id=None,
                            rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Ling 3 with q through its bottleneck, the unbounded softplus decay (kda_safe_gate false), every MLP dense
    # (head_dim = qk_rope_head_dim: transformers' config overwrites head_dim so, and reads its KDA width from it)
    "bailing_hybrid-softplus": ("BailingHybridConfig", "BailingHybridForCausalLM",
                                dict(num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
                                     kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16,
                                     v_head_dim=24, head_dim=8, layer_group_size=2, kda_safe_gate=False,
                                     first_k_dense_replace=2, num_experts=4, num_mtp_layers=0, pad_token_id=None,
                                     short_conv_kernel_size=3,
                                     rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Lara Mini: Qwen3.5's delta nets on layers 0 and 2 (in_proj fused as the Hub holds it, Dk != Dv), windowed
    # attention with RoPE on 1 and 4 (a window shorter than the test sequences), NoPE full attention on 3, plain
    # RMSNorms, every MLP top 2 of 4 experts (stacked) plus an ungated shared expert, tied
    "lara_mini": ("LaraMiniConfig", "LaraMiniForCausalLM",
                  dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=5,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                       linear_value_head_dim=12, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=40, sliding_window=5, pad_token_id=None,
                       rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Zamba2: Mamba-2 layers (4 heads of 16, 2 groups, chunks of 8), layers 1, 3 and 4 calling two shared blocks (4
    # heads of 2·32 / 4 = 16, RoPE) in turn, each call with its adapters on q, k, v and gate_up, tied; and one shared
    # block without RoPE or q/k/v adapters, with GQA and tanh-GELU, called by layers 0 and 2, untied
    "zamba2": ("Zamba2Config", "Zamba2ForCausalLM",
               dict(hidden_size=32, num_hidden_layers=5, mamba_d_state=8, n_mamba_heads=4, mamba_ngroups=2,
                    layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid", "hybrid"],
                    num_attention_heads=4, num_key_value_heads=4, intermediate_size=48, num_mem_blocks=2,
                    use_shared_attention_adapter=True, adapter_rank=4, use_mem_rope=True, chunk_size=8,
                    pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "zamba2-gqa": ("Zamba2Config", "Zamba2ForCausalLM",
                   dict(hidden_size=32, num_hidden_layers=3, mamba_d_state=8, n_mamba_heads=2, mamba_ngroups=1,
                        layers_block_type=["hybrid", "linear_attention", "hybrid"], num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=40, num_mem_blocks=1, adapter_rank=2,
                        hidden_act="gelu_pytorch_tanh", chunk_size=8, tie_word_embeddings=False, pad_token_id=None)),
    # Nemotron (Nemotron-Mini-4B's layout): LayerNorms by 1 + weight with biases, a plain ReLU² MLP, RoPE on half of
    # each head, GQA, untied
    "nemotron": ("NemotronConfig", "NemotronForCausalLM",
                 dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, pad_token_id=None,
                      norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                      "partial_rotary_factor": 0.5})),
    # Granite 3.x: Llama's block with its four scalars (embeddings, residual adds, the scores' scale, the logits)
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, embedding_multiplier=3.0,
                     residual_multiplier=0.4, attention_multiplier=0.2, logits_scaling=2.5)),
    # Granite SWA: Granite's scalars with sinks, a full layer first in each group of windowed ones (transformers'
    # default layer_types: i % 4 == 0) and a RoPE base per layer, none on layer 0, each with the linear scaling
    "granite_swa": ("GraniteSWAConfig", "GraniteSWAForCausalLM",
                    dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=5, sliding_window=5,
                         layer_rope_theta=[0, 500.0, 10000.0, 500.0, 0], embedding_multiplier=3.0,
                         residual_multiplier=0.4, attention_multiplier=0.2, logits_scaling=2.5,
                         tie_word_embeddings=False, pad_token_id=None,
                         rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    # GraniteMoeSWA: Granite SWA's attention (sinks, its default layer_types: full first in each four, a RoPE base a
    # layer, 0 for none) on GraniteMoeShared's experts, top 2 of 4, with and without the ungated shared MLP
    "granitemoe_swa": ("GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM",
                       dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=5, sliding_window=5,
                            layer_rope_theta=[0, 500.0, 10000.0, 500.0, 0], num_local_experts=4,
                            num_experts_per_tok=2, intermediate_size=32, embedding_multiplier=3.0,
                            residual_multiplier=0.4, attention_multiplier=0.2, logits_scaling=2.5,
                            tie_word_embeddings=False, pad_token_id=None)),
    "granitemoe_swa-shared": ("GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM",
                              dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, sliding_window=5,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                   num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                                   shared_intermediate_size=40, tie_word_embeddings=False, pad_token_id=None)),
    # Granite 4.0's dense layout (attention layers only, no experts): shared_mlp's fused input_linear, and the NoPE
    # form (position_embedding_type None)
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                         dict(num_attention_heads=4, num_key_value_heads=2, shared_intermediate_size=96,
                              num_local_experts=0, num_experts_per_tok=0, layer_types=["attention"] * 2,
                              position_embedding_type="rope", embedding_multiplier=3.0, residual_multiplier=0.4,
                              attention_multiplier=0.2, logits_scaling=2.5, tie_word_embeddings=True)),
    # OLMo Hybrid: gated delta nets (pre-norm blocks, q/k/v/g/a/b projections apart, 2 key heads of 8 shared by 4
    # value heads of 16, β up to 2) on layers 0, 1 and 3, OLMo 3's output-norm attention with whole-projection
    # QK-norm and RoPE on 2; and the released checkpoints' NoPE form
    "olmo_hybrid": ("OlmoHybridConfig", "OlmoHybridForCausalLM",
                    dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
                         layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                         linear_value_head_dim=16, linear_conv_kernel_dim=4, tie_word_embeddings=False,
                         pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "olmo_hybrid-nope": ("OlmoHybridConfig", "OlmoHybridForCausalLM",
                         dict(num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
                              layer_types=["linear_attention", "full_attention"], linear_allow_neg_eigval=False,
                              tie_word_embeddings=True, pad_token_id=None, rope_parameters=None)),
    # Bamba: Granite 4.0's Mamba-2 layers (8 heads of 16, 2 groups, dt floored by time_step_limit) and attention on
    # layer 1 with RoPE on half of each head, Llama's MLP and pre-norms under Bamba's names
    "bamba": ("BambaConfig", "BambaForCausalLM",
              dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, attn_layer_indices=[1],
                   mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=8, mamba_d_head=16, mamba_d_conv=4,
                   mamba_expand=2, mamba_chunk_size=8, tie_word_embeddings=False, pad_token_id=None,
                   time_step_limit=(0.01, float("inf")),
                   rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5})),
    # Falcon-H1: attention (RoPE, GQA, head_dim 24) and a Mamba-2 mixer (8 heads of 8: mamba_d_ssm 64 apart from
    # mamba_expand, 2 groups of B and C of 8, chunks of 8) side by side in each of 3 layers, the mixer's output gated
    # without a norm (the released models' mamba_rms_norm=False), every µP multiplier away from 1, untied
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM",
                  dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_hidden_layers=3,
                       mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=8,
                       mamba_d_conv=4, mamba_expand=3, mamba_chunk_size=8, tie_word_embeddings=False,
                       pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                       embedding_multiplier=2.5, lm_head_multiplier=0.6, key_multiplier=0.7,
                       attention_in_multiplier=1.3, attention_out_multiplier=0.8, ssm_in_multiplier=1.4,
                       ssm_out_multiplier=2.0, ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.9], mlp_multipliers=[1.6, 0.7])),
    # Falcon-H1 tied, a gated group RMSNorm before the gate (mamba_norm_before_gate), biases on the projections,
    # attention and MLP, a conv without bias, one group
    "falcon_h1-norm": ("FalconH1Config", "FalconH1ForCausalLM",
                       dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, mamba_d_ssm=64,
                            mamba_n_heads=4, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=3, mamba_chunk_size=8,
                            mamba_rms_norm=True, mamba_norm_before_gate=True, mamba_conv_bias=False,
                            mamba_proj_bias=True, projectors_bias=True, attention_bias=True, mlp_bias=True,
                            tie_word_embeddings=True, pad_token_id=None,
                            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                            embedding_multiplier=2.5, lm_head_multiplier=0.6, key_multiplier=0.7,
                            attention_in_multiplier=1.3, attention_out_multiplier=0.8, ssm_in_multiplier=1.4,
                            ssm_out_multiplier=2.0, ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.9],
                            mlp_multipliers=[1.6, 0.7])),
    # Granite 4.0's hybrid layout (its -h models): Mamba-2 layers on 0, 2 and 3 (8 heads of 16, 2 groups of B and C
    # of 8, chunks of 8 in transformers' scan), attention on 1 without positions, Granite's scalars
    "granitemoehybrid-mamba": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                               dict(num_attention_heads=4, num_key_value_heads=2, shared_intermediate_size=96,
                                    num_hidden_layers=4, num_local_experts=0, num_experts_per_tok=0,
                                    layer_types=["mamba", "attention", "mamba", "mamba"], mamba_n_heads=8,
                                    mamba_n_groups=2, mamba_d_state=8, mamba_d_head=16, mamba_d_conv=4,
                                    mamba_expand=2, mamba_chunk_size=8, position_embedding_type=None,
                                    embedding_multiplier=3.0, residual_multiplier=0.4, attention_multiplier=0.2,
                                    logits_scaling=2.5, tie_word_embeddings=True)),
    # Granite 4.0's hybrid MoE layout (its -h-tiny and -h-small): Mamba-2 and attention layers, each MLP top 2 of 4
    # experts and the shared MLP beside them
    "granitemoehybrid-moe": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                             dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                                  shared_intermediate_size=40, num_hidden_layers=3, num_local_experts=4,
                                  num_experts_per_tok=2, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=8,
                                  mamba_n_groups=1, mamba_d_state=8, mamba_d_head=16, mamba_d_conv=4, mamba_expand=2,
                                  mamba_chunk_size=8, position_embedding_type=None, embedding_multiplier=3.0,
                                  residual_multiplier=0.4, attention_multiplier=0.2, logits_scaling=2.5,
                                  tie_word_embeddings=False)),
    "granitemoehybrid-nope": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                              dict(num_attention_heads=4, num_key_value_heads=4, shared_intermediate_size=96,
                                   num_local_experts=0, num_experts_per_tok=0, layer_types=["attention"] * 2,
                                   position_embedding_type=None, residual_multiplier=0.5)),
    # Nemotron-H: one sublayer a layer, M-*M- as layers_block_type (Mamba-2: 8 heads of 16, 2 groups of B and C of 8,
    # chunks of 8 in transformers' scan; attention without positions, head_dim 24; a ReLU² MLP alone), dt floored
    # at time_step_min, untied
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM",
                   dict(layers_block_type=["linear_attention", "mlp", "full_attention", "linear_attention", "mlp"],
                        num_attention_heads=4, num_key_value_heads=2, head_dim=24, mamba_num_heads=8,
                        mamba_head_dim=16, n_groups=2, ssm_state_size=8, conv_kernel=4, chunk_size=8,
                        time_step_min=0.01, layer_norm_epsilon=1e-5, pad_token_id=None)),
    # dots.llm1: Qwen3's attention (QK-norm, head_dim 16), a dense first layer, then DeepSeek-V3's experts: 8 SwiGLUs
    # 16 wide in 4 groups (top 3 from the best 2 groups), routing bias, renormalised and scaled by 2.0, two shared
    # experts' width (32); untied
    "dots1": ("Dots1Config", "Dots1ForCausalLM",
              dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
                   n_shared_experts=2, first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.0,
                   tie_word_embeddings=False, pad_token_id=None)),
    # Solar Open: GLM-4-MoE's experts on every layer (8 SwiGLUs 16 wide in 4 groups, top 3 from the best 2 groups,
    # routing bias, renormalised and scaled by 2.0, two shared experts' width) under Llama's attention with biases on
    # q/k/v, whole heads rotated with YaRN; untied
    "solar_open": ("SolarOpenConfig", "SolarOpenForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=16,
                        n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=2,
                        routed_scaling_factor=2.0, attention_bias=True, tie_word_embeddings=False, pad_token_id=None,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0,
                                         "original_max_position_embeddings": 32})),
    # HY-V3: Qwen3's attention (QK-norm, head_dim 16), HYV3Config's default dense first layer, then 8 SwiGLU experts
    # 16 wide (top 3, sigmoid scores with a routing bias, rescaled, times 2.0) and two shared experts' width; untied
    "hy_v3": ("HYV3Config", "HYV3ForCausalLM",
              dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3, num_shared_experts=2,
                   router_scaling_factor=2.0, tie_word_embeddings=False, pad_token_id=None,
                   rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # dots.llm1 with windowed layers from max_window_layers on (a window shorter than the test sequences), no groups,
    # top-k scores as they are (norm_topk_prob false, its default), every layer experts, tied
    "dots1-window": ("Dots1Config", "Dots1ForCausalLM",
                     dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, moe_intermediate_size=24,
                          n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, sliding_window=5,
                          max_window_layers=1, tie_word_embeddings=True, pad_token_id=None)),
    # MiniMax-M2: QK-norm over the whole q and k projections, RoPE on 8 of each head's 16 dimensions, top 2 of 4
    # sigmoid-scored experts chosen with the routing bias and rescaled; untied
    "minimax_m2": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=32,
                        num_local_experts=4, num_experts_per_tok=2, rotary_dim=8, pad_token_id=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5})),
    # PhiMoE as Phi-3.5-MoE is laid out: LayerNorms with biases, biases on q/k/v/o and the head, LongRoPE (short
    # factors, the tables times short_mscale) up to an original context past the test sequences, SparseMixer's top 2
    # of 4 with a threshold wide enough (router_jitter_noise 0.5) that some second choices weigh several experts;
    # and unscaled RoPE, no biases, a window shorter than the test sequences, tied
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM",
               dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=32, num_local_experts=4,
                    attention_bias=True, lm_head_bias=True, router_jitter_noise=0.5, input_jitter_noise=0.01,
                    pad_token_id=None, rope_parameters={
                        "rope_type": "longrope", "rope_theta": 500.0, "short_factor": [1.0 + 0.2 * i for i in range(8)],
                        "long_factor": [2.0 + 0.1 * i for i in range(8)], "short_mscale": 1.2, "long_mscale": 1.3,
                        "original_max_position_embeddings": 32})),
    # JetMoE: 4 attention experts of 2 KV heads 16 wide and 4 SwiGLU experts 32 wide, top 2 of each, untied; and top 3
    # of 4 over one KV head 24 wide, tied (the biases perturbed with every parameter)
    "jetmoe": ("JetMoeConfig", "JetMoeForCausalLM",
               dict(num_key_value_heads=2, kv_channels=16, intermediate_size=32, num_local_experts=4,
                    num_experts_per_tok=2, rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=None,
                    rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "jetmoe-top3": ("JetMoeConfig", "JetMoeForCausalLM",
                    dict(num_key_value_heads=1, kv_channels=24, intermediate_size=32, num_local_experts=4,
                         num_experts_per_tok=3, rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=None)),
    # Zamba (v1): Mamba-1 mixers in 2 heads (own x_proj / dt_proj each), layers 1 and 3 calling one shared block
    # first (GQA, GeGLU), tied; and untied (each hybrid layer its own block), 4 heads, SwiGLU, mixer biases
    "zamba": ("ZambaConfig", "ZambaForCausalLM",
              dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=48, n_mamba_heads=2, mamba_d_state=8, mamba_dt_rank=4, pad_token_id=None,
                   layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], tie_word_embeddings=True)),
    "zamba-untied": ("ZambaConfig", "ZambaForCausalLM",
                     dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                          intermediate_size=48,
                          n_mamba_heads=4, mamba_d_state=4, hidden_act="silu", mamba_proj_bias=True,
                          pad_token_id=None, layers_block_type=["hybrid", "mamba", "hybrid"],
                          tie_word_embeddings=False)),
    "phimoe-plain": ("PhimoeConfig", "PhimoeForCausalLM",
                     dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=32, num_local_experts=4,
                          sliding_window=5, tie_word_embeddings=True, pad_token_id=None,
                          rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # DBRX: q/k/v clamped at a bound the test's projections cross, GQA, top 2 of 4 experts rescaled by their sum (p = 1);
    # and top 1 of 3 not rescaled (moe_normalize_expert_weights null), multi-head, a clamp no projection reaches
    # (transformers' DbrxAttention fails without one)
    "dbrx": ("DbrxConfig", "DbrxForCausalLM",
             dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=64,
                  attn_config={"kv_n_heads": 2, "clip_qkv": 0.15, "rope_theta": 500.0},
                  ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "dbrx-unscaled": ("DbrxConfig", "DbrxForCausalLM",
                      dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=64,
                           attn_config={"kv_n_heads": 4, "clip_qkv": 8.0, "rope_theta": 10000.0},
                           ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 3, "moe_top_k": 1,
                                       "moe_normalize_expert_weights": None, "moe_jitter_eps": 0.01})),
    # AFMoE: gated heads (an element each), sandwich norms, QK-norm; layers 0-2 windowed (a window shorter than the
    # test sequences) and rotating, layer 3 full without RoPE; a dense first layer, then top 2 of 4 sigmoid-scored
    # experts chosen with a bias, rescaled, times route_scale 1.5, beside two shared experts; µP embedding scale
    "afmoe": ("AfmoeConfig", "AfmoeForCausalLM",
              dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, num_shared_experts=2,
                   num_dense_layers=1, route_scale=1.5, global_attn_every_n_layers=4, sliding_window=5,
                   mup_enabled=True, tie_word_embeddings=False, pad_token_id=None,
                   rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # AFMoE with full layers 0 and 2 out of a repeating pattern (rope_layer_theta, window_layers), every layer
    # experts, tied, no µP scale
    "afmoe-layers": ("AfmoeConfig", "AfmoeForCausalLM",
                     dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                          moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
                          num_dense_layers=0, sliding_window=4, tie_word_embeddings=True, pad_token_id=None,
                          layer_types=["full_attention", "sliding_attention", "full_attention"])),
    # Mellum: Qwen3-MoE's block with layers 1 and 3 windowed (a window shorter than the test sequences; their own
    # RoPE base, the full layers' YaRN-scaled), layer 2's MLP dense, top 2 of 4 softmax experts rescaled
    "mellum": ("MellumConfig", "MellumForCausalLM",
               dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, sliding_window=5,
                    layer_types=["full_attention", "sliding_attention"] * 2,
                    mlp_layer_types=["sparse", "sparse", "dense", "sparse"], tie_word_embeddings=False,
                    pad_token_id=None,
                    rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0,
                                                        "original_max_position_embeddings": 32},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}})),
    # Mellum with every layer full, a dense first layer, top-k weights not rescaled, tied
    "mellum-dense-first": ("MellumConfig", "MellumForCausalLM",
                           dict(num_attention_heads=4, num_key_value_heads=4, moe_intermediate_size=24,
                                num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
                                mlp_layer_types=["dense", "sparse"], tie_word_embeddings=True, pad_token_id=None)),
    # Flint: Qwen3-MoE's attention with sinks (perturbed like every parameter), layers 0, 1 and 5 full without RoPE,
    # 2-4 windowed and rotating (a window shorter than the test sequences), layers 0 and 1 dense, top 2 of 4
    # sigmoid-scored experts rescaled beside an ungated shared expert
    "flint": ("FlintConfig", "FlintForCausalLM",
              dict(num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=4,
                   num_experts_per_tok=2, sliding_window=5, tie_word_embeddings=False, pad_token_id=None,
                   rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Kolibri-1: GLM-4's sandwich norms, EXAONE 4.0's attention (QK-norm; layers 0-2 windowed and rotating, a window
    # shorter than the test sequences, layer 3 full without RoPE), top 2 of 4 experts chosen by logits plus a bias,
    # weighted by the chosen logits' sigmoid, rescaled, beside an ungated shared expert
    "kolibri1": ("Kolibri1Config", "Kolibri1ForCausalLM",
                 dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=4,
                      num_experts_per_tok=2, norm_topk_prob=True, sliding_window=5, tie_word_embeddings=False,
                      layer_types=["sliding_attention"] * 3 + ["full_attention"], pad_token_id=None,
                      rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Kolibri-1 with layer 0 full without RoPE, layer 1 windowed and rotating, top-k weights not rescaled, tied
    "kolibri1-first-full": ("Kolibri1Config", "Kolibri1ForCausalLM",
                            dict(num_attention_heads=4, num_key_value_heads=4, moe_intermediate_size=24,
                                 shared_expert_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                                 sliding_window=4, layer_types=["full_attention", "sliding_attention"],
                                 tie_word_embeddings=True, pad_token_id=None)),
    # Laguna: a softplus gate a head, QK-norm, layers 1 and 3 windowed (a window shorter than the test sequences) with
    # their own RoPE base on whole heads, the full layers' on half of each head, YaRN-scaled; a dense first layer, then
    # top 2 of 4 sigmoid-scored experts chosen with a bias, rescaled, times 1.5, beside an ungated shared expert
    "laguna": ("LagunaConfig", "LagunaForCausalLM",
               dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=4,
                    num_experts_per_tok=2, moe_routed_scaling_factor=1.5, sliding_window=5,
                    layer_types=["full_attention", "sliding_attention"] * 2, tie_word_embeddings=False,
                    pad_token_id=None,
                    rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0,
                                                        "original_max_position_embeddings": 32,
                                                        "partial_rotary_factor": 0.5},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0,
                                                           "partial_rotary_factor": 1.0}})),
    # Laguna with a softplus gate on every element, every layer full and experts (mlp_layer_types), tied
    "laguna-element": ("LagunaConfig", "LagunaForCausalLM",
                       dict(num_attention_heads=4, num_key_value_heads=4, moe_intermediate_size=24,
                            shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                            gating="per-element", mlp_layer_types=["sparse", "sparse"], tie_word_embeddings=True,
                            pad_token_id=None)),
    # Nemotron-H with expert layers (Nemotron 3 Nano's E): ME*-E, 8 ReLU² experts 32 wide in 2 groups (top 2 from the
    # best group), routing bias, scores renormalised and scaled by 2.5, a shared expert 48 wide; the "-" layer's MLP
    # intermediate_size (96) wide
    "nemotron_h-experts": ("NemotronHConfig", "NemotronHForCausalLM",
                           dict(hybrid_override_pattern="ME*-E", num_attention_heads=4, num_key_value_heads=2,
                                head_dim=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=8,
                                conv_kernel=4, chunk_size=8, time_step_min=0.01, n_routed_experts=8,
                                num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=32,
                                moe_shared_expert_intermediate_size=48, routed_scaling_factor=2.5,
                                norm_topk_prob=True, layer_norm_epsilon=1e-5, pad_token_id=None)),
    # Nemotron-H from a config with the legacy names: hybrid_override_pattern, mamba_n_groups, mamba_d_conv, and no
    # conv bias (mamba_conv_bias false)
    "nemotron_h-legacy": ("NemotronHConfig", "NemotronHForCausalLM",
                          dict(hybrid_override_pattern="M*-", num_attention_heads=4, num_key_value_heads=4,
                               head_dim=16, mamba_num_heads=4, mamba_head_dim=32, mamba_n_groups=1, ssm_state_size=8,
                               mamba_d_conv=3, mamba_conv_bias=False, chunk_size=8, pad_token_id=None)),
    # Mamba-2: Mamba-2 mixers alone on two layers (8 heads of 16, 2 groups, chunks of 8), time_step_limit's floor,
    # untied; and tied, with biases on in_proj and out_proj and one group
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM",
               dict(num_heads=8, head_dim=16, n_groups=2, state_size=8, chunk_size=8, layer_norm_epsilon=1e-5,
                    time_step_limit=(0.01, float("inf")), tie_word_embeddings=False, pad_token_id=None)),
    "mamba2-tied": ("Mamba2Config", "Mamba2ForCausalLM",
                    dict(num_heads=4, head_dim=32, n_groups=1, state_size=8, chunk_size=8, layer_norm_epsilon=1e-5,
                         use_bias=True, tie_word_embeddings=True, pad_token_id=None)),
    # Mamba: Mamba-1 mixers alone on two layers (128 channels, a state of 8, dt of rank 4 != "auto"'s), a conv bias,
    # tied; and with biases on in_proj and out_proj, no conv bias, a kernel of 3, untied
    "mamba": ("MambaConfig", "MambaForCausalLM",
              dict(state_size=8, time_step_rank=4, layer_norm_epsilon=1e-5, pad_token_id=None)),
    "mamba-biases": ("MambaConfig", "MambaForCausalLM",
                     dict(state_size=8, conv_kernel=3, use_bias=True, use_conv_bias=False, expand=1,
                          tie_word_embeddings=False, layer_norm_epsilon=1e-5, pad_token_id=None)),
    # Falcon-Mamba: Mamba's layers with RMS norms without weights on dt, B and C (a large epsilon, so that it
    # shows), untied
    "falcon_mamba": ("FalconMambaConfig", "FalconMambaForCausalLM",
                     dict(state_size=8, mixer_rms_eps=1e-2, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
                          pad_token_id=None)),
    # Jamba: Mamba-1 mixers (128 channels, a state of 8, dt of "auto" rank 4, weighted dt/B/C norms) on layers 0, 1
    # and 3, attention without positions (GQA) on layer 2, experts (top 2 of 4, unrenormalized) on layers 1 and 3 and
    # a SwiGLU on 0 and 2, untied; and tied, attention on layers 0 and 2, experts on every layer (top 1 of 3), biases
    # on in_proj and out_proj, no conv bias, a kernel of 3, dt of rank 6
    "jamba": ("JambaConfig", "JambaForCausalLM",
              dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, attn_layer_period=4,
                   attn_layer_offset=2, expert_layer_period=2, expert_layer_offset=1, num_experts=4,
                   num_experts_per_tok=2, mamba_d_state=8, pad_token_id=None)),
    "jamba-tied": ("JambaConfig", "JambaForCausalLM",
                   dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, attn_layer_period=2,
                        attn_layer_offset=0, expert_layer_period=1, expert_layer_offset=0, num_experts=3,
                        num_experts_per_tok=1, mamba_d_state=8, mamba_d_conv=3, mamba_dt_rank=6,
                        mamba_conv_bias=False, mamba_proj_bias=True, tie_word_embeddings=True, pad_token_id=None)),
    # Llama 4 (Scout's layout, small): interleaved RoPE with Scout's Llama 3 scaling (low and high frequency factors
    # both 1: no blended band; the longest wavelengths past the original context here), layer 3 without it and
    # with the query temperature (its steps every 4 positions), chunked attention on the layers that rotate (chunks
    # of 5, shorter than the test sequences), weightless QK-norm, top-1 experts on layers 1 and 3 with a shared one
    # (Maverick's interleave step), dense SwiGLUs of intermediate_size_mlp on 0 and 2, untied; and tied, layers
    # without RoPE in no fixed pattern, no chunks or QK-norm, top-2 experts on every layer
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM",
                    dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         intermediate_size=32, intermediate_size_mlp=80, num_local_experts=4, num_experts_per_tok=1,
                         interleave_moe_layer_step=2, attention_chunk_size=5, floor_scale=4, attn_scale=0.5,
                         pad_token_id=None,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 16.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                                          "original_max_position_embeddings": 16})),
    "llama4_text-tied": ("Llama4TextConfig", "Llama4ForCausalLM",
                         dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                              intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                              no_rope_layers=[0, 1, 1], attention_chunk_size=None, use_qk_norm=False, floor_scale=2,
                              attn_scale=0.5, tie_word_embeddings=True, pad_token_id=None,
                              rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # the original OLMo: Llama's block with LayerNorms without weight or bias, untied
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2, pad_token_id=None,
                                                   rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # nanochat: weightless RMSNorms (one on the embeddings), per-head QK-norm after its reversed RoPE, ReLU², GQA, the
    # logits capped where the test's logits reach; and the multi-head form, tied, uncapped
    "nanochat": ("NanoChatConfig", "NanoChatForCausalLM",
                 dict(num_attention_heads=4, num_key_value_heads=2, final_logit_softcapping=1.5,
                      rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "nanochat-tied": ("NanoChatConfig", "NanoChatForCausalLM",
                      dict(num_attention_heads=4, final_logit_softcapping=None, tie_word_embeddings=True)),
    # GPTBigCode as SantaCoder and StarCoderBase are: multi-query attention (c_attn [q; k; v]), tanh-GELU, tied; and
    # its multi-head form (c_attn by head), untied, the erf GELU, scores left unscaled (scale_attn_weights false)
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM",
                    dict(n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=64)),
    "gpt_bigcode-mha": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM",
                        dict(n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=64, multi_query=False,
                             tie_word_embeddings=False, activation_function="gelu", scale_attn_weights=False)),
    # GPT-Neo as gpt-neo-125m is: global and local layers in turn (a window shorter than the test sequences), scores
    # unscaled, q/k/v without biases, tanh-GELU, tied; and every layer local, untied, the erf GELU
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM",
                dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=96, max_position_embeddings=64,
                     attention_types=[[["global", "local"], 1]], window_size=5)),
    "gpt_neo-local": ("GPTNeoConfig", "GPTNeoForCausalLM",
                      dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=96, max_position_embeddings=64,
                           attention_types=[[["local"], 2]], window_size=6, activation_function="gelu",
                           tie_word_embeddings=False)),
    # GPT-J as GPT-J-6B is (one LayerNorm for parallel sublayers, RoPE on the first rotary_dim of each head in
    # interleaved pairs, no q/k/v/out biases, an untied head with a bias), with 6 of 16 dimensions rotated; and whole
    # heads rotated, the erf GELU, a tied head
    "gptj": ("GPTJConfig", "GPTJForCausalLM",
             dict(n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=64, rotary_dim=6)),
    "gptj-whole": ("GPTJConfig", "GPTJForCausalLM",
                   dict(n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=64, rotary_dim=16,
                        activation_function="gelu", tie_word_embeddings=True)),
    # CodeGen as codegen-350M is: GPT-J's block with q, v, k in one qkv_proj of 4 model-parallel blocks; 8 of 16
    # dimensions rotated (exported as GPT-J)
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM",
                dict(n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=64, n_ctx=64, rotary_dim=8)),
    # the sequential block, RoPE on half of each head, tanh-GELU and a tied head
    "gpt_neox-sequential": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                            dict(num_attention_heads=4, rotary_pct=0.5, use_parallel_residual=False,
                                 hidden_act="gelu_new", tie_word_embeddings=True)),
    # Apertus: the xIELU MLP (its learned scalars perturbed with the rest), QK-norm, GQA, Llama 3 RoPE scaling past an
    # original context shorter than the test sequences, untied
    "apertus": ("ApertusConfig", "ApertusForCausalLM",
                dict(num_attention_heads=4, num_key_value_heads=2, pad_token_id=None,
                     rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                      "original_max_position_embeddings": 8, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0})),
    # Apertus 1.5's text model: Apertus's (as above), its head unpruned (output_vocab_size null)
    "apertus1p5_text": ("Apertus1p5TextConfig", "Apertus1p5TextForCausalLM",
                        dict(num_attention_heads=4, num_key_value_heads=2, pad_token_id=None,
                             rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                              "original_max_position_embeddings": 8, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0})),
    # Apertus 1.5's text model as its released checkpoints have it: the head pruned to the tokenizer's ids (logits
    # VOCAB - 8 wide), the embedding's last 8 rows input-only codes (model.head_vocab)
    "apertus1p5_text-pruned": ("Apertus1p5TextConfig", "Apertus1p5TextForCausalLM",
                               dict(num_attention_heads=4, num_key_value_heads=2, pad_token_id=None,
                                    output_vocab_size=VOCAB - 8,
                                    rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                                     "original_max_position_embeddings": 8, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0})),
    # ERNIE 4.5 MoE as ERNIE-4.5-21B-A3B is laid out: a dense first layer (96 wide), then experts (top 2 of 4, 32
    # wide, chosen with the correction bias, moved so that it chooses) and 2 shared ones on the others, tied; and
    # experts on every second layer among dense ones as wide, untied, no shared experts
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
                     dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, moe_num_experts=4,
                          moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=2, moe_layer_start_index=1,
                          pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "ernie4_5_moe-interval": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
                              dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
                                   moe_num_experts=4, moe_k=2, moe_intermediate_size=96, moe_num_shared_experts=0,
                                   moe_layer_start_index=0, moe_layer_interval=2, tie_word_embeddings=False,
                                   pad_token_id=None)),
    # Hunyuan MoE: the dense model's attention (QK-norm after RoPE, head_dim 24 != 64 / 4, its stretched RoPE base)
    # with experts on every layer (top 2 of 4, rescaled) beside an ungated shared MLP, untied
    "hunyuan_v1_moe": ("HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM",
                       dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_experts=4, moe_topk=2,
                            intermediate_size=32, pad_token_id=None,
                            rope_parameters={"rope_type": "dynamic", "alpha": 5.0, "factor": 1.0,
                                             "rope_theta": 500.0})),
    # Ministral: Mistral's block with every third layer full, the others windowed (a window shorter than the test
    # sequences), head_dim 16; and windowed layers in no fixed pattern (the first full, the others windowed)
    "ministral": ("MinistralConfig", "MinistralForCausalLM",
                  dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, sliding_window=5,
                       head_dim=16, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                       rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "ministral-layers": ("MinistralConfig", "MinistralForCausalLM",
                         dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, sliding_window=4,
                              head_dim=16, layer_types=["full_attention", "sliding_attention", "sliding_attention"])),
    # Persimmon: GPT-NeoX's query_key_value (per head q, k, v), LayerNorm QK-norm, half of each head rotated, ReLU²,
    # biases everywhere, multi-head, untied
    "persimmon": ("PersimmonConfig", "PersimmonForCausalLM",
                  dict(num_attention_heads=4, layer_norm_eps=1e-5, pad_token_id=None,
                       rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5})),
    # XGLM: sinusoidal positions (offset 2), embeddings scaled by sqrt(d_model), pre-LayerNorm, exact GELU, biases,
    # tied
    "xglm": ("XGLMConfig", "XGLMForCausalLM",
             dict(d_model=64, ffn_dim=96, num_layers=2, attention_heads=4, max_position_embeddings=64, dropout=0.0,
                  attention_dropout=0.0, pad_token_id=None)),
    # HyperCLOVA X: Granite's scalars (its logits multiplied, not divided) with RMSNorms on the sublayers' outputs
    # before the residual multiplier, GQA, untied; and without those norms (Granite's block, its logits scaled)
    "hyperclovax": ("HyperCLOVAXConfig", "HyperCLOVAXForCausalLM",
                    dict(num_attention_heads=4, num_key_value_heads=2, embedding_multiplier=2.0,
                         residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=0.25,
                         tie_word_embeddings=False, pad_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "hyperclovax-pre": ("HyperCLOVAXConfig", "HyperCLOVAXForCausalLM",
                        dict(num_attention_heads=4, num_key_value_heads=4, use_post_norm=False, logits_scaling=4.0,
                             tie_word_embeddings=True, pad_token_id=None)),
    # Jais 2: Llama's block with LayerNorms (biases), a ReLU² MLP, biases on every Linear layer (its defaults), GQA
    "jais2": ("Jais2Config", "Jais2ForCausalLM",
              dict(num_attention_heads=4, num_key_value_heads=2, layer_norm_eps=1e-5, pad_token_id=None,
                   rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # CWM: Llama's block without biases, Llama 3 RoPE scaling that bites at this theta and original context, and
    # CwmConfig's default layer kinds (every fourth layer from the first full: full, windowed, windowed) with a window
    # shorter than the test sequences
    "cwm": ("CwmConfig", "CwmForCausalLM",
            dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, sliding_window=5, head_dim=16,
                 rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    # InternLM3 (transformers runs it as Llama): biases on every Linear layer, head_dim 32 != 64 / 4, the released
    # model's dynamic NTK RoPE (plain RoPE up to max_position_embeddings, which the test sequences stay within)
    "internlm3": ("InternLM3Config", "LlamaForCausalLM",
                  dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=True, mlp_bias=True,
                       pad_token_id=None, rope_parameters={"rope_type": "dynamic", "rope_theta": 500.0,
                                                           "factor": 6.0})),
    # IQuest-Coder (transformers runs it as Llama): no biases, GQA, head_dim 16, untied (its defaults)
    "iquestcoder": ("IQuestCoderConfig", "LlamaForCausalLM",
                    dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, pad_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Emu3's text model (Emu3ForCausalLM: Llama's block, GQA, untied; exported as Llama)
    "emu3_text_model": ("Emu3TextConfig", "Emu3ForCausalLM",
                        dict(num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=0,
                             eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Sarvam MoE (transformers runs it as GLM-4-MoE): its default QK-norm and whole heads rotated, a dense first layer,
    # then top 2 of 8 experts (32 wide) chosen within the best 2 of 4 groups, a routing bias, rescaled and times 2.5,
    # one shared expert; and with q/k/v biases (the original config's use_qkv_bias), which only Sarvam MoE writes
    "sarvam_moe": ("SarvamMoEConfig", "Glm4MoeForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3,
                        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                        first_k_dense_replace=1, n_group=4, topk_group=2, pad_token_id=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "sarvam_moe-bias": ("SarvamMoEConfig", "Glm4MoeForCausalLM",
                        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3,
                             n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                             n_shared_experts=2, first_k_dense_replace=1, use_qkv_bias=True, pad_token_id=None,
                             rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Sarvam MLA (transformers runs it as DeepSeek-V3): latent attention with one q_proj (its default), RoPE on
    # interleaved pairs, a dense first layer, then top 2 of 8 experts in one group with a routing bias, times 2.5
    "sarvam_mla": ("SarvamMLAConfig", "DeepseekV3ForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, v_head_dim=12, num_hidden_layers=3, n_routed_experts=8,
                        num_experts_per_tok=2, moe_intermediate_size=32, pad_token_id=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # GPT-1: post-LayerNorm blocks without a final norm, learned positions, tanh-GELU, biases, tied
    "openai-gpt": ("OpenAIGPTConfig", "OpenAIGPTLMHeadModel",
                   dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, layer_norm_epsilon=1e-5)),
    # BioGPT: XGLM's block (embeddings times sqrt(64), pre-LayerNorm, exact GELU, biases) with a learned position
    # table two rows longer than its context, tied
    "biogpt": ("BioGptConfig", "BioGptForCausalLM",
               dict(num_attention_heads=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                    pad_token_id=None)),
    # CTRL: embeddings times sqrt(64) beside a sinusoidal table (held as a learned one), pre-LayerNorm, a ReLU MLP,
    # biases, the tied head with a bias of its own
    "ctrl": ("CTRLConfig", "CTRLLMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, dff=96)),
    # Cohere2 MoE: RMSNorms, a dense first layer (48 wide) that rotates though full (force_rope), then experts (top 2
    # of 4, 32 wide) averaged with 2 shared ones on windowed layers and a full one without RoPE (a window shorter than
    # the test sequences), the logits scaled, tied; and its LayerNorm form, sigmoid scores, the shared expert summed,
    # every second layer full without RoPE, untied
    "cohere2_moe": ("Cohere2MoeConfig", "Cohere2MoeForCausalLM",
                    dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
                         intermediate_size=32, prefix_dense_intermediate_size=48, num_experts=4,
                         num_experts_per_tok=2, num_shared_experts=2, sliding_window=5, logit_scale=0.5,
                         layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
                         mlp_layer_types=["dense", "sparse", "sparse", "sparse"], pad_token_id=None)),
    "cohere2_moe-layernorm": ("Cohere2MoeConfig", "Cohere2MoeForCausalLM",
                              dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=32,
                                   num_experts=4, num_experts_per_tok=2, num_shared_experts=1, sliding_window=5,
                                   rms_norm_eps=None, expert_selection_fn="sigmoid", norm_topk_prob=False,
                                   shared_expert_combination_strategy="sum", sliding_window_pattern=2,
                                   tie_word_embeddings=False, pad_token_id=None)),
    # BitNet without a quantization_config (transformers' plain Linear layers): sub-norms before o_proj and
    # down_proj, the gated ReLU² MLP, GQA, its default RoPE base 500000; tests/test_bitnet.py quantizes it
    "bitnet": ("BitNetConfig", "BitNetForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                         pad_token_id=None)),
    # DiffLlama: differential attention over 4 heads and 2 KV heads (each value half one head), three layers (λ_init
    # by layer), its λ vectors perturbed with the rest; and 8 heads over 4 KV heads with a head width of its own
    "diffllama": ("DiffLlamaConfig", "DiffLlamaForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                                 num_hidden_layers=3, pad_token_id=None)),
    "diffllama-gqa": ("DiffLlamaConfig", "DiffLlamaForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4,
                                                                     head_dim=16, tie_word_embeddings=True,
                                                                     pad_token_id=None)),
    # RecurrentGemma: recurrent, recurrent, attention layers (an RG-LRU in 4 gate blocks; local attention over a
    # window shorter than the test sequences, multi-query, RoPE on half of each head), its logits soft-capped, tied
    "recurrent_gemma": ("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM",
                        dict(num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=3,
                             attention_window_size=6, logits_soft_cap=3.0, pad_token_id=None)),
    # ModernBERT-Decoder (the Ettin decoders): normed embeddings, layer 0 without an attention norm, global layers 0
    # and 3 and local ones between (a window of local_attention // 2 = 4, shorter than the test sequences) with RoPE
    # bases of their own, GeGLU with exact GELU, biases everywhere (LayerNorms, attention, MLP, the prediction head's
    # dense layer, the decoder), tied
    "modernbert-decoder": ("ModernBertDecoderConfig", "ModernBertDecoderForCausalLM",
                           dict(num_attention_heads=4, num_hidden_layers=4, local_attention=8, norm_bias=True,
                                attention_bias=True, mlp_bias=True, classifier_bias=True, cls_token_id=2,
                                sep_token_id=3, pad_token_id=0,
                                rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5000.0},
                                                 "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}})),
    # Doge: dynamic mask attention (its A and dt_proj perturbed so that the keys' biases differ), QK-norm, GQA,
    # residual scales, biases on every Linear layer, a context at its keep_window_size (24, above the test sequences)
    "doge": ("DogeConfig", "DogeForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2, keep_window_size=24,
                                                   attention_bias=True, mlp_bias=True, pad_token_id=None)),
    # Dory: nGPT layers, one input layer, a recurrent section of two (one windowed, one full) run three times, one
    # output layer; a window of 5, the full layers' own RoPE base, an untied head
    "dory": ("DoryConfig", "DoryForCausalLM",
             dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4, n_input_layers=1,
                  n_recurrent_layers=2, n_output_layers=1, n_recurrent_loops=3, sliding_window=5,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention", "full_attention"],
                  rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                   "full_attention": {"rope_type": "default", "rope_theta": 5000.0}},
                  tie_word_embeddings=False, pad_token_id=None)),
    # Dory with DoryConfig's default layer kinds (every fourth full) and RoPE, one pass through its section, its head
    # tied (imported untied: the per-token logit scale folded into it)
    "dory-tied": ("DoryConfig", "DoryForCausalLM",
                  dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
                       n_input_layers=1, n_recurrent_layers=2, n_output_layers=1, n_recurrent_loops=1,
                       sliding_window=5, tie_word_embeddings=True, pad_token_id=None)),
    # RWKV-4: time mixing and channel mixing, three layers rescaled after each (transformers' eval-mode halving:
    # model.rescale_every=1, every norm's epsilon its own); and tied, at the released rescale_every 6 (no block
    # rescaled). An attention width of its own: tests/test_rwkv.py (transformers' cache takes hidden_size's)
    "rwkv": ("RwkvConfig", "RwkvForCausalLM", dict(num_hidden_layers=3, rescale_every=1)),
    "rwkv-tied": ("RwkvConfig", "RwkvForCausalLM", dict(tie_word_embeddings=True)),
    # xLSTM: mLSTM layers of 4 heads (q/k and v 64 wide: transformers' cache rounds them up to 64), chunks of 8 (its
    # chunkwise kernel on the first 16 tokens, its step loop after), gates and logits soft-capped low; and 2 heads at
    # its default caps, tie_word_embeddings set (which transformers' xLSTM ignores: its head stays its own). The fused
    # weight mode: tests/test_xlstm.py (transformers' _init_weights fails to build one)
    "xlstm": ("xLSTMConfig", "xLSTMForCausalLM", dict(num_heads=4, qk_dim_factor=1.0, chunk_size=8,
                                                      gate_soft_cap=3.0, output_logit_soft_cap=5.0, pad_token_id=None)),
    "xlstm-tied": ("xLSTMConfig", "xLSTMForCausalLM", dict(num_heads=2, qk_dim_factor=1.0, tie_word_embeddings=True,
                                                           pad_token_id=None)),
}
# multimodal folders whose text model redline reads: compared with that model alone (Llama 4's forward with its
# vision tower fails on text alone in transformers 5.24: its output class lacks image_outputs)
MULTIMODAL_FAMILIES = {
    # Llama 4's multimodal folder (Llama4ForConditionalGeneration, a one-layer vision tower): its text model, as
    # llama4_text's first, RoPE unscaled
    "llama4": ("Llama4Config", "Llama4ForConditionalGeneration",
               dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=32, intermediate_size_mlp=80, num_local_experts=4, num_experts_per_tok=1,
                    interleave_moe_layer_step=2, attention_chunk_size=5, floor_scale=4, attn_scale=0.5,
                    pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
}
# for GGUF, read back by transformers' loader too: no Llama 3 RoPE scaling (it does not read rope_freqs), and GPT-2 at
# its own context (the loader assumes it)
GGUF_FAMILIES = {
    # Llama 4 as llama.cpp's llama4 runs it: chunks of 8192 on three layers of four, the fourth without RoPE and with
    # the query temperature (0.1, floor 8192), weightless QK-norm, top-1 experts on layers 1 and 3 beside a shared one,
    # dense SwiGLUs of intermediate_size_mlp on 0 and 2, Llama 3 scaling, untied; and tied, top-2 experts everywhere
    "llama4_text-gguf": ("Llama4TextConfig", "Llama4ForCausalLM",
                         dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              intermediate_size=32, intermediate_size_mlp=80, num_local_experts=4,
                              num_experts_per_tok=1, interleave_moe_layer_step=2, pad_token_id=None,
                              rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 16.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 16})),
    # GLM-4 untied, without q/k/v biases, a quarter of each head rotated (the "glm4" model is tied with biases)
    "glm4-gguf": ("Glm4Config", "Glm4ForCausalLM",
                  dict(num_attention_heads=4, num_key_value_heads=2, attention_bias=False, tie_word_embeddings=False,
                       pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                           "partial_rotary_factor": 0.25})),
    # ERNIE 4.5 MoE with the converter's shared-expert width rule holding (intermediate_size / num_key_value_heads =
    # two experts 32 wide): a dense first layer 128 wide, then top 2 of 4 experts with the routing bias, untied
    "ernie4_5_moe-gguf": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
                          dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, intermediate_size=128,
                               moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=2,
                               moe_layer_start_index=1, tie_word_embeddings=False, pad_token_id=None,
                               rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # dots.llm1 as llama.cpp's dots1 runs it: the "dots1" model without expert groups (top 3 of 8 sigmoid-scored
    # experts chosen with the routing bias, rescaled, times 2.0, two shared experts' width, a dense first layer), untied
    "dots1-gguf": ("Dots1Config", "Dots1ForCausalLM",
                   dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=2,
                        first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.0,
                        tie_word_embeddings=False, pad_token_id=None)),
    # Jais 2 as llama.cpp's jais2 loads it: as many KV heads as heads (its attention biases all n_embd wide)
    "jais2-gguf": ("Jais2Config", "Jais2ForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=4, layer_norm_eps=1e-5, pad_token_id=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "llama4_text-gguf-tied": ("Llama4TextConfig", "Llama4ForCausalLM",
                              dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                                   intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                                   interleave_moe_layer_step=1, tie_word_embeddings=True, pad_token_id=None,
                                   rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # Granite 4.0's hybrid with a Mamba-2 time-step floor (time_step_limit's min), which llama.cpp has no key for
    "granitemoehybrid-floor": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                               dict(num_attention_heads=4, num_key_value_heads=2, shared_intermediate_size=96,
                                    num_local_experts=0, num_experts_per_tok=0, layer_types=["mamba", "attention"],
                                    mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=8, mamba_d_head=16,
                                    mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, position_embedding_type=None,
                                    time_step_limit=(0.05, float("inf")), tie_word_embeddings=True)),
    # Falcon-H1 as llama.cpp's falcon-h1 runs it: tied with its embedding and head multipliers, the gated group norm
    # after the gate (mamba_norm_before_gate false), no biases, a time-step floor
    "falcon_h1-gguf": ("FalconH1Config", "FalconH1ForCausalLM",
                       dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, mamba_d_ssm=64,
                            mamba_n_heads=4, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_chunk_size=8,
                            mamba_rms_norm=True, mamba_norm_before_gate=False, tie_word_embeddings=True,
                            pad_token_id=None, time_step_limit=(0.01, float("inf")),
                            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                            embedding_multiplier=2.5, lm_head_multiplier=0.6, key_multiplier=0.7,
                            attention_in_multiplier=1.3, attention_out_multiplier=0.8, ssm_in_multiplier=1.4,
                            ssm_out_multiplier=2.0, ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.9],
                            mlp_multipliers=[1.6, 0.7])),
    # MPT as llama.cpp's mpt runs it: scores scaled by head_dim ** -0.5 (no softmax_scale), ALiBi, tied; and untied
    "mpt-gguf": ("MptConfig", "MptForCausalLM", dict(n_heads=4)),
    "mpt-gguf-untied": ("MptConfig", "MptForCausalLM", dict(n_heads=8, tie_word_embeddings=False)),
    # mixtures of experts as llama.cpp's files hold them: Mixtral without a window (GGUF's llama has none); Qwen2-MoE
    # with the expert and shared-expert widths of Qwen2MoeConfig's defaults, which transformers' GGUF loader takes
    # (it reads neither width from the file)
    # LFM2-MoE with no weight scale (llama.cpp's lfm2moe reads none)
    "lfm2_moe-gguf": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM",
                      dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, intermediate_size=48,
                           moe_intermediate_size=32, num_dense_layers=1, num_experts=4, num_experts_per_tok=2,
                           layer_types=["conv", "full_attention", "conv"], norm_eps=1e-5, tie_word_embeddings=True,
                           pad_token_id=None)),
    "mixtral-gguf": ("MixtralConfig", "MixtralForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                                 num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe-gguf": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                       dict(num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=1408, shared_expert_intermediate_size=5632, norm_topk_prob=False)),
    "llama-untied": ("LlamaConfig", "LlamaForCausalLM",
                     dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)),
    "llama-untied-bias": ("LlamaConfig", "LlamaForCausalLM",
                          dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                               attention_bias=True, mlp_bias=True)),
    "gpt2-1024": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, n_positions=1024)),
    # Gemma 3 as transformers' loader reads a gemma3 GGUF: the values the file's keys do not give at its defaults
    # (six layers, so the default pattern of five windowed to one full shows; the windowed layers' base 10000;
    # query_pre_attn_scalar 256, which llama.cpp's gemma3 takes as the head width), a window shorter than the test
    # sequences and the full layer's own base
    # GPT-NeoX as Pythia is, at the RoPE base llama.cpp's converter leaves implicit (10000)
    "gpt_neox-pythia": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(num_attention_heads=4)),
    # EXAONE 3.5 with heads hidden / heads wide (llama.cpp's converter rotates that many dimensions), Llama 3 RoPE
    "exaone-gguf": ("ExaoneConfig", "LlamaForCausalLM",
                    dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, pad_token_id=None,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 16})),
    # Granite untied, with biases on every Linear layer (transformers' loader has no granite)
    "granite-gguf": ("GraniteConfig", "GraniteForCausalLM",
                     dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, attention_bias=True,
                          mlp_bias=True, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.3,
                          logits_scaling=4.0)),
    # Gemma 2 as transformers' GGUF loader reads a gemma2 file: at Gemma2Config's defaults where no key maps (the
    # caps 50 and 30, query_pre_attn_scalar 256 = the head width, layers alternating), a window shorter than the
    # test sequences
    "gemma2-gguf": ("Gemma2Config", "Gemma2ForCausalLM",
                    dict(num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                         sliding_window=5, rope_parameters={"rope_type": "default", "rope_theta": 5000.0})),
    # Phi-3 as transformers' GGUF loader reads a phi3 file (whole heads rotated, no scaling, no window), untied
    "phi3-gguf": ("Phi3Config", "Phi3ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                        pad_token_id=None)),
    # StarCoder2 as transformers' GGUF loader reads a starcoder2 file: its default RoPE base (it maps no
    # rope.freq_base), biases, no window
    "starcoder2-gguf": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                                          pad_token_id=None)),
    # SmolLM3 at llama.cpp's fixed step (RoPE left out of layer 3 of 4)
    "smollm3-gguf": ("SmolLM3Config", "SmolLM3ForCausalLM",
                     dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4, pad_token_id=None)),
    "gemma3-gguf": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    dict(num_attention_heads=2, num_key_value_heads=1, head_dim=256, num_hidden_layers=6,
                         query_pre_attn_scalar=256, sliding_window=5,
                         rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5000.0},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
}
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


_CLASSIC = ("GPTBigCodeConfig", "GPTNeoConfig", "GPTJConfig", "CodeGenConfig", "OpenAIGPTConfig", "CTRLConfig")  # GPT-2's names, sizes given


NOT_AUTO_LOADED = ("Mistral4ForCausalLM",)
"""Causal LMs transformers' AutoModelForCausalLM does not map (it maps mistral4 for pretraining alone)."""


def causal_lm_class(architecture: str):
    """The transformers class that loads a folder of `architecture`: AutoModelForCausalLM, or the class itself."""
    import transformers

    return getattr(transformers, architecture if architecture in NOT_AUTO_LOADED else "AutoModelForCausalLM")


def hf_model(kind: str, seed: int = 0):
    """A transformers model of family `kind` with random weights (every parameter perturbed, norms included)."""
    import transformers

    config_name, model_name, extra = {**FAMILIES, **GGUF_FAMILIES, **MULTIMODAL_FAMILIES}[kind]
    if kind == "opt":
        common = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=1, dropout=0.0)
    elif kind.startswith("dbrx"):  # DBRX's own names (its attention and experts in sub-configs)
        common = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1)
    elif kind.startswith("mpt"):  # MPT's own names (transformers 5 maps hidden_size and the like onto them too)
        common = dict(vocab_size=VOCAB, d_model=64, n_layers=2, max_seq_len=64, bos_token_id=0, eos_token_id=1)
    elif kind.startswith("gpt2") or config_name in _CLASSIC:
        common = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0)
    else:
        common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1)
    if config_name == "Llama4Config":  # the text model's fields in text_config, beside a tiny vision tower
        vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                      vision_output_dim=32, image_size=28, patch_size=14, projector_input_dim=32,
                      projector_output_dim=64)
        config = transformers.Llama4Config(text_config={**common, **extra}, vision_config=vision,
                                           image_token_index=VOCAB - 1, boi_token_index=VOCAB - 2,
                                           eoi_token_index=VOCAB - 3)
    else:
        config = getattr(transformers, config_name)(**{**common, **extra})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        # LFM2-MoE's, GLM-4-MoE's and DeepSeek-V3's routing bias (a buffer) and ERNIE 4.5 MoE's (a frozen parameter): moved so that
        # they choose
        for name, b in [*model.named_buffers(), *model.named_parameters()]:
            if name.endswith(("expert_bias", "e_score_correction_bias")):
                b.add_(torch.randn_like(b) * 0.1)
            if name.endswith("layer_scalar"):  # Gemma 4's stored output scale of each layer
                b.add_(torch.randn_like(b) * 0.1)
            if name.endswith("tid2eid"):  # DeepSeek-V4's hash routing table (zeros at init): distinct experts
                b.copy_(torch.rand(b.shape[0], model.config.n_routed_experts).argsort(dim=-1)[:, :b.shape[1]])
    return model


def byte_level_tokenizer(path: Path, template: str | None = TEMPLATE) -> Path:
    """A byte-level BPE (GPT-2 style) of VOCAB tokens with <|endoftext|>, <|im_start|>, <|im_end|> as specials,
    trained in the test, saved as tokenizer.json + tokenizer_config.json (chat template, EOS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 8, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                         "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["hello world, the model reads tokens and says hi"] * 50 +
                            ["Ünïcödé café 日本 1234 tabs\tand\nnewlines"] * 20, trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
              "bos_token": None, "pad_token": "<|endoftext|>"}
    if template:
        config["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def hf_folder(kind: str, path: Path, seed: int = 0):
    """save_pretrained of a tiny model of `kind` plus a tokenizer and generation_config with EOS ids [1, 2]."""
    model = hf_model(kind, seed)
    model.save_pretrained(path)
    byte_level_tokenizer(path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2], "bos_token_id": 0}))
    return model


def sentencepiece_style_tokenizer(path):
    """A SentencePiece-style BPE (Metaspace "▁", byte fallback, <unk>/<s>/</s>), as Llama 2 / TinyLlama / Mistral
    tokenizers are, trained in the test; tokenizer_config adds BOS."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens],
                                  show_progress=False)
    tok.train_from_iterator(["hello world, the model reads tokens and says hi", "sentence piece style text"] * 40,
                            trainer)
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                            "unk_token": "<unk>", "add_bos_token": True}))
    return path
