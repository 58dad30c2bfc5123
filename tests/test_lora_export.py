"""`redline export --adapter`: a LoRA run's adapters as a PEFT adapter that peft loads onto the model `redline
export` writes from the base, with redline's logits; `--merge`: the merged model; the one-line refusals."""

import json
import shutil

import pytest
import torch

from redline import cli
from redline.config import LoRAConfig, TrainConfig, to_dict
from redline.converters.lora import LoRAConverter, lora_layers
from redline.model import GPT, ModelConfig
from redline.training import adapters
from redline.training import checkpoint as ckpt_io
from tests.interop_models import VOCAB, causal_lm_class

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

ARCHS = {  # fused qkv and SwiGLU (the modern presets), Llama's separate projections, GPT-2's Conv1D layers
    "Qwen3ForCausalLM": dict(qk_norm=True, n_kv_head=2),
    "LlamaForCausalLM": dict(n_kv_head=2, fused_qkv=False, fused_mlp=False),
    "GPT2LMHeadModel": dict(pos_emb="learned", norm="layernorm", mlp="gelu", bias=True, tie_embeddings=True),
    "PhiForCausalLM": dict(norm="layernorm", mlp="gelu", bias=True, parallel_residual=True, parallel_shared_norm=True,
                           head_bias=True, rope_dims=8, n_kv_head=2),  # q/k/v split, dense, fc1, fc2
    "StableLmForCausalLM": dict(norm="layernorm", norm_bias=True, qkv_bias=True, rope_dims=4, n_kv_head=2),
    "OPTForCausalLM": dict(pos_emb="learned", norm="layernorm", mlp="relu", bias=True),  # q/k/v, out_proj, fc1, fc2
    # BioGPT: OPT's module names under biogpt.layers (q/k/v_proj, out_proj, fc1, fc2), the head output_projection
    "BioGptForCausalLM": dict(pos_emb="learned", norm="layernorm", mlp="gelu", bias=True, embed_scale=True),
    # GPT-1: GPT-2's Conv1D module names (c_attn, c_proj, c_fc), post-norm blocks
    "OpenAIGPTLMHeadModel": dict(pos_emb="learned", norm="layernorm", mlp="gelu", bias=True, norm_position="post"),
    "SmolLM3ForCausalLM": dict(nope_interval=2, n_kv_head=2),  # Llama's names, layer 1 without RoPE
    "GraniteForCausalLM": dict(embed_multiplier=2.0, residual_multiplier=0.5, logit_divisor=2.0, n_kv_head=2),
    # BitNet's sub-norms and gated ReLU² MLP (its output projections, normed on their input, are no plain Linear)
    "BitNetForCausalLM": dict(sub_norms=True, mlp="relu2_glu", fused_qkv=False, fused_mlp=False, n_kv_head=2),
    "DiffLlamaForCausalLM": dict(diff_attention=True, n_kv_head=2),  # Llama's names, differential attention
    # RecurrentGemma: an RG-LRU layer (linear_x, linear_y, linear_out adapted) and a local attention layer
    "RecurrentGemmaForCausalLM": dict(delta_layers=(0,), delta_rule="rglru", delta_heads=4, delta_key_heads=1,
                                      delta_key_dim=1, delta_value_dim=16, delta_conv_bias=True, delta_proj_bias=True,
                                      bias=True, qkv_bias=False, norm_unit_offset=True, mlp="geglu", rope_dims=8,
                                      sliding_window=6, n_kv_head=1, logit_softcap=3.0, tie_embeddings=True,
                                      embed_multiplier=8.0),
    # RWKV-4: time mixing's key, value, receptance and output, channel mixing's key, receptance and value adapted,
    # no block rescaled (tests/test_rwkv.py: the output adapters of rescaled blocks refused)
    "RwkvForCausalLM": dict(pos_emb="none", n_head=1, norm="layernorm", norm_bias=True, embed_norm=True, mlp="rwkv",
                            mlp_hidden=96, delta_layers=(0, 1), delta_rule="rwkv", delta_heads=1, delta_key_heads=1,
                            delta_key_dim=1, delta_value_dim=64),
    # xLSTM: every mLSTM projection (q, k, v, the output and both gates' preactivations, out_proj) and the SwiGLU
    # feed-forward's (proj_up_gate, proj_up, proj_down) adapted
    "xLSTMForCausalLM": dict(pos_emb="none", n_head=1, mlp_hidden=96, delta_layers=(0, 1), delta_rule="mlstm",
                             delta_heads=4, delta_key_heads=4, delta_key_dim=16, delta_value_dim=16,
                             delta_gate_softcap=15.0, logit_softcap=30.0, norm_eps=1e-6),
    # Kimi Linear: Kimi Delta Attention on layer 0, NoPE latent attention on 1
    "KimiLinearForCausalLM": dict(pos_emb="none", n_kv_head=4, kv_lora_rank=16, head_size=12, rope_dims=4,
                                  delta_layers=(0,), delta_heads=4, delta_key_heads=4, delta_key_dim=8,
                                  delta_value_dim=8, delta_decay="channel", delta_gate_rank=8),
    # Ling 3: KDA with full-rank gates and a bounded decay on layer 0, latent attention with RoPE on interleaved
    # pairs and gated heads on 1
    "BailingHybridForCausalLM": dict(n_kv_head=4, kv_lora_rank=16, head_size=12, rope_dims=4, attn_gate="head",
                                     delta_layers=(0,), delta_heads=4, delta_key_heads=4, delta_key_dim=8,
                                     delta_value_dim=8, delta_decay="bounded", delta_decay_floor=-5.0),
    # MiniMax: lightning attention on layer 0 (qkv_proj, output_gate, out_proj under its own names), Mixtral's
    # attention on 1, experts, residuals from the normed inputs
    "MiniMaxForCausalLM": dict(n_kv_head=2, delta_layers=(0,), delta_rule="lightning", delta_heads=4,
                               delta_key_heads=4, delta_key_dim=16, delta_value_dim=16, delta_norm_eps=1e-6,
                               moe_experts=4, moe_top_k=2, normed_residual=(1.0, 0.9, 1.1, 1.2, 0.8, 1.0)),
    # Doge: Llama's names with its dynamic mask's dt_proj adapted too, QK-norm, residual scales
    "DogeForCausalLM": dict(qk_norm=True, attn_key_bias=True, residual_scales=True, n_kv_head=2),
    # Dory: nGPT layers, a section of one layer run three times (its adapters the one stored layer's), the heads'
    # gate adapted too
    "DoryForCausalLM": dict(ngpt=True, norm="l2", norm_eps=1e-6, norm_position="sandwich", qk_norm=True,
                            attn_gate="element", mlp="swiglu", n_kv_head=2, n_layer=5, loop_section=(1, 1),
                            loop_passes=3),
    "ArceeForCausalLM": dict(mlp="relu2", n_kv_head=2),  # Llama's names, up_proj the ReLU² MLP's first product
    # ModernBERT-Decoder: q/k/v apart under attn, Wo, the fused GeGLU Wi as redline's fc, Wo; layer 0 without an
    # attention norm, a windowed layer 1, the prediction head before the biased decoder
    "ModernBertDecoderForCausalLM": dict(norm="layernorm", norm_bias=True, mlp="geglu", gelu_approximate="none",
                                         embed_norm=True, first_norm_free=True, head_transform=True, head_bias=True,
                                         bias=True, qkv_bias=True, sliding_window=4, window_layers=(1,),
                                         rope_local_theta=500.0, tie_embeddings=True),
    # DeepSeek-V4: its attention (q latent, one key head as value, half of each head rotated, sinks, 2 output groups)
    # on 2 mHC streams, sqrtsoftplus experts (layer 0's chosen by tid2eid) with the shared expert, a window of 6
    "DeepseekV4ForCausalLM": dict(n_kv_head=1, head_size=16, shared_kv_attention=True, q_lora_rank=24, o_groups=2,
                                  o_lora_rank=12, attn_sinks=True, sliding_window=6, rope_dims=8, mhc_streams=2,
                                  mhc_sinkhorn_iters=4, moe_experts=4, moe_top_k=2, mlp="swiglu_clipped",
                                  swiglu_limit=5.0, mlp_hidden=32, moe_shared_hidden=32, moe_shared_gate=False,
                                  moe_gating="sqrtsoftplus", moe_norm_eps=1e-20, moe_expert_bias=True,
                                  moe_hash_layers=(0,), moe_scale=1.5, norm_eps=1e-6),
    # DeepSeek-V4's compressed layers: layer 0 compressed sparse attention (windows of 2, overlapping: the
    # compressor's kv_proj and gate_proj adapted, two series of rows), layer 1 heavily compressed (windows of 3)
    "DeepseekV4ForCausalLM-compressed": dict(n_kv_head=1, head_size=16, shared_kv_attention=True, q_lora_rank=24,
                                             o_groups=2, o_lora_rank=12, attn_sinks=True, sliding_window=4,
                                             rope_dims=8, mhc_streams=2, mhc_sinkhorn_iters=4, moe_experts=4,
                                             moe_top_k=2, mlp="swiglu_clipped", mlp_hidden=32, moe_shared_hidden=32,
                                             moe_shared_gate=False, moe_gating="sqrtsoftplus", moe_norm_eps=1e-20,
                                             moe_expert_bias=True, kv_compress_rates=(2, 3),
                                             kv_compress_overlap=(0,), norm_eps=1e-6),
    # ZAYA: the CCA projections (q, k, v, v_delayed, o_proj) and the MLP router's layers adapted (the experts are bare
    # tensors)
    "ZayaForCausalLM": dict(n_kv_head=2, fused_qkv=False, cca_kernels=(2, 3), residual_affine=True, moe_experts=3,
                            moe_top_k=1, moe_norm_topk=False, moe_router_hidden=16, mlp="swiglu", mlp_hidden=32,
                            rope_dims=8),
    "NemotronForCausalLM": dict(norm="layernorm", norm_unit_offset=True, norm_bias=True, mlp="relu2", rope_dims=4,
                                n_kv_head=2),  # Llama's names, LayerNorms by 1 + weight
    # Granite SWA: sinks (not adapted), a windowed layer and a RoPE base per layer
    "GraniteSWAForCausalLM": dict(attn_sinks=True, sliding_window=4, window_layers=(1,), rope_layer_theta=(0.0, 50.0),
                                  n_kv_head=2),
    # sandwich norms: Gemma 3 with QK-norm, Gemma 2 without and with its capped scores; OLMo 2's output norms
    "Gemma3ForCausalLM": dict(norm_position="sandwich", norm_unit_offset=True, mlp="geglu", qk_norm=True,
                              embed_scale=True, n_kv_head=2, tie_embeddings=True),
    "Gemma2ForCausalLM": dict(norm_position="sandwich", norm_unit_offset=True, mlp="geglu", embed_scale=True,
                              n_kv_head=2, attn_softcap=5.0, tie_embeddings=True),
    # Gemma 4: Llama's names with the full layers' own heads (values from keys: no v_proj there), the last layer
    # reading layer 1's keys and values (no k/v_proj), the per-layer input layers adapted too
    "Gemma4ForCausalLM": dict(n_layer=4, norm_position="sandwich", mlp="geglu", mlp_hidden=64, qk_norm=True,
                              v_norm=True, layer_scalars=True, embed_scale=True, attn_scale=1.0, fused_qkv=False,
                              n_kv_head=2, sliding_window=4, window_layers=(0, 2), rope_local_theta=100.0,
                              rope_scaling="proportional", rope_proportion=0.5, global_head_size=32,
                              global_kv_head=1, global_values_from_keys=True, kv_shared_layers=1,
                              kv_shared_mlp_hidden=128, per_layer_embd=8, tie_embeddings=True),
    # Gemma 3n: Gemma 4's names inside AltUp streams, the LAuReL branch and the per-layer input layers adapted too,
    # the first layer's MLP gate sparse
    "Gemma3nForCausalLM": dict(n_layer=3, norm_position="sandwich", mlp="geglu", mlp_hidden=64, qk_norm=True,
                               v_norm=True, embed_scale=True, attn_scale=1.0, fused_qkv=False, n_kv_head=2,
                               sliding_window=4, window_layers=(0, 2), rope_local_theta=100.0, kv_shared_layers=1,
                               per_layer_embd=8, altup_streams=3, laurel_rank=4, mlp_sparsity=(0.9, 0.0, 0.0),
                               altup_coef_clip=120.0, logit_softcap=5.0, tie_embeddings=True),
    "Olmo2ForCausalLM": dict(norm_position="output", qk_norm=True, qk_norm_scope="all", n_kv_head=2),
    "Exaone4ForCausalLM": dict(norm_position="output", qk_norm=True, n_kv_head=2),
    # GraniteMoeSWA: Granite SWA's attention on experts with an ungated shared MLP
    "GraniteMoeSWAForCausalLM": dict(attn_sinks=True, sliding_window=4, window_layers=(1,),
                                     rope_layer_theta=(0.0, 50.0), n_kv_head=2, moe_experts=4, moe_top_k=2,
                                     mlp_hidden=32, moe_shared_hidden=48, moe_shared_gate=False),
    # EXAONE-MoE: EXAONE 4.0's attention on dots.llm1's experts (its attention adapted: PEFT moves MLP adapters onto
    # the experts)
    "ExaoneMoeForCausalLM": dict(qk_norm=True, n_kv_head=2, sliding_window=4, sliding_window_pattern=2,
                                 nope_interval=2, moe_experts=4, moe_top_k=2, mlp_hidden=16, moe_dense_layers=1,
                                 moe_dense_hidden=48, moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20,
                                 moe_shared_hidden=32, moe_shared_gate=False),
    # AFMoE: its attention's q/k/v and o_proj adapted (TARGETS); a dense first layer
    "AfmoeForCausalLM": dict(norm_position="sandwich", attn_gate="element", qk_norm=True, n_kv_head=2,
                             sliding_window=4, sliding_window_pattern=2, nope_interval=2, moe_experts=4, moe_top_k=2,
                             mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20,
                             moe_shared_hidden=32, moe_shared_gate=False, moe_dense_layers=1, moe_dense_hidden=48),
    # Mellum: Qwen3-MoE's attention with a windowed layer, a dense first MLP (its attention adapted: PEFT moves MLP
    # adapters onto the experts); Flint: the same with sinks (not adapted) and sigmoid-scored experts
    "MellumForCausalLM": dict(qk_norm=True, n_kv_head=2, sliding_window=4, window_layers=(0,), moe_experts=4,
                              moe_top_k=2, mlp_hidden=16, moe_dense_layers=1, moe_dense_hidden=48),
    "FlintForCausalLM": dict(qk_norm=True, attn_sinks=True, n_kv_head=2, sliding_window=4, sliding_window_pattern=2,
                             nope_interval=2, moe_experts=4, moe_top_k=2, mlp_hidden=16, moe_gating="sigmoid",
                             moe_norm_eps=0.0, moe_shared_hidden=24, moe_shared_gate=False),
    # Kolibri-1: sandwich norms, experts chosen by logits plus a bias (its attention adapted)
    "Kolibri1ForCausalLM": dict(norm_position="sandwich", qk_norm=True, n_kv_head=2, sliding_window=4,
                                sliding_window_pattern=2, nope_interval=2, moe_experts=4, moe_top_k=2, mlp_hidden=16,
                                moe_gating="sigmoid", moe_expert_bias=True, moe_bias_on_logits=True, moe_norm_eps=0.0,
                                moe_shared_hidden=24, moe_shared_gate=False),
    # Laguna: its attention adapted, the softplus head gate (self_attn.g_proj) with it
    "LagunaForCausalLM": dict(qk_norm=True, n_kv_head=2, attn_gate="head", attn_gate_fn="softplus", sliding_window=4,
                              window_layers=(0,), rope_dims=8, rope_local_theta=50.0, rope_local_dims=16,
                              moe_experts=4, moe_top_k=2, mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True,
                              moe_norm_eps=0.0, moe_shared_hidden=24, moe_shared_gate=False),
    # FlexOlmo: OLMo 2's block with OLMoE's experts (its attention adapted: a router is no Linear layer)
    "FlexOlmoForCausalLM": dict(norm_position="output", qk_norm=True, qk_norm_scope="all", n_kv_head=2, moe_experts=4,
                                moe_top_k=2, mlp_hidden=32),
    "Starcoder2ForCausalLM": dict(norm="layernorm", mlp="gelu", bias=True, n_kv_head=2, sliding_window=8),  # c_fc
    "GemmaForCausalLM": dict(norm_unit_offset=True, embed_scale=True, mlp="geglu", n_kv_head=1, tie_embeddings=True),
    "VaultGemmaForCausalLM": dict(norm_unit_offset=True, embed_scale=True, mlp="geglu", n_kv_head=2, sliding_window=8,
                                  attn_softcap=5.0),  # Gemma's pre-norm block with Gemma 2's window and cap
    "HunYuanDenseV1ForCausalLM": dict(qk_norm=True, qk_norm_after_rope=True, n_kv_head=2),  # query_layernorm
    "ApertusForCausalLM": dict(mlp="xielu", qk_norm=True, n_kv_head=2),  # up_proj the xIELU MLP's first product
    "MinistralForCausalLM": dict(sliding_window=4, window_layers=(1,), n_kv_head=2),  # Mistral's names, windowed 1
    # ERNIE 4.5 MoE: q and k rows (B's rows) in RoPE's interleaved order (its attention alone: PEFT moves adapters on
    # any gate_proj, up_proj or down_proj onto its experts), a dense first layer, experts with ungated shared ones
    "Ernie4_5_MoeForCausalLM": dict(n_kv_head=2, moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_expert_bias=True,
                                    moe_dense_layers=1, moe_dense_hidden=48, moe_shared_hidden=64,
                                    moe_shared_gate=False, tie_embeddings=True),
    # Lara Mini: Qwen3.5's delta net on layer 0 (its fused in_proj split by transformers into in_proj_qkv, z, b, a),
    # a windowed attention layer with Llama's names, experts with an ungated shared expert
    "LaraMiniForCausalLM": dict(delta_layers=(0,), delta_heads=4, delta_key_heads=2, delta_key_dim=8,
                                delta_value_dim=8, qk_norm=True, n_kv_head=2, sliding_window=4, window_layers=(1,),
                                rope_layer_theta=(0.0, 500.0), moe_experts=4, moe_top_k=2, mlp_hidden=32,
                                moe_shared_hidden=48, moe_shared_gate=False),
    # Zamba2: a Mamba-2 layer, then one calling the shared block (heads of 2·64 / 4, adapters on q, k, v, gate_up)
    "Zamba2ForCausalLM": dict(delta_layers=(0, 1), mlp_free_layers=(0, 1), delta_rule="mamba2", delta_heads=4,
                              delta_key_heads=2, delta_key_dim=8, delta_value_dim=32, delta_conv_bias=True,
                              delta_dt_min=0.001, delta_norm_eps=1e-5, shared_attn_layers=(1,),
                              shared_attn_adapter_rank=4, shared_attn_qkv_adapters=True, head_size=32,
                              attn_scale=16 ** -0.5, mlp="geglu", mlp_hidden=96, pos_emb="none"),
    # Hunyuan MoE: query_layernorm, experts with an ungated shared MLP on every layer (its attention adapted alone, as
    # ERNIE 4.5 MoE's)
    "HunYuanMoEV1ForCausalLM": dict(qk_norm=True, qk_norm_after_rope=True, n_kv_head=2, moe_experts=4, moe_top_k=2,
                                    mlp_hidden=32, moe_shared_hidden=32, moe_shared_gate=False),
    # Cohere2 MoE: Cohere's q and k rows (B's rows) in RoPE's interleaved order, its attention alone adapted as ERNIE
    # 4.5 MoE's; a windowed layer that rotates, a full one that does not
    "Cohere2MoeForCausalLM": dict(norm="layernorm", norm_bias=False, parallel_residual=True, parallel_shared_norm=True,
                                  n_kv_head=2, sliding_window=4, sliding_window_pattern=2, nope_interval=2,
                                  moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_shared_hidden=32,
                                  moe_shared_gate=False, moe_scale=0.5, logit_divisor=2.0),
    # qkv_proj and gate_up_proj fused as redline's; LongRoPE on three quarters of each head
    "Phi3ForCausalLM": dict(rope_dims=12, rope_scaling="longrope", rope_pair_factors=(1.0, 1.5, 2.0, 2.5, 3.0, 3.5),
                            rope_original_context=64, rope_factor=4.0, n_kv_head=2),
    # Cohere: Llama's names, q and k rows in RoPE's interleaved order (B's rows permuted alike), parallel sublayers
    "CohereForCausalLM": dict(norm="layernorm", norm_bias=False, parallel_residual=True, parallel_shared_norm=True,
                              logit_divisor=4.0, n_kv_head=2, tie_embeddings=True),
    # Cohere Compass: Cohere's block and names with q and k rows in redline's own RoPE order, its windowed layer
    # rotating by a base of its own
    "CohereCompassForCausalLM": dict(norm="layernorm", norm_bias=False, parallel_residual=True,
                                     parallel_shared_norm=True, logit_divisor=2.0, n_kv_head=2, sliding_window=4,
                                     sliding_window_pattern=2, rope_local_theta=50.0),
    # LFM2: a short convolution (in_proj, out_proj) on layer 0, attention (out_proj) on 1, feed_forward.w1/w3/w2
    "Lfm2ForCausalLM": dict(conv_layers=(0,), qk_norm=True, n_kv_head=2, tie_embeddings=True),
    # LFM3: LFM2's convolution, then a windowed attention layer with Qwen3's names (o_proj), gated heads, output norms
    "Lfm3ForCausalLM": dict(conv_layers=(0,), qk_norm=True, n_kv_head=2, attn_gate="head", norm_position="sandwich",
                            sliding_window=4),
    # Granite 4.0's hybrid: a Mamba-2 layer (mamba.in_proj, out_proj) on layer 0, attention without positions on 1,
    # shared_mlp's fused input_linear
    "GraniteMoeHybridForCausalLM": dict(delta_layers=(0,), delta_rule="mamba2", delta_heads=4, delta_key_heads=2,
                                        delta_key_dim=8, delta_value_dim=32, delta_conv_bias=True, pos_emb="none",
                                        residual_multiplier=0.5, n_kv_head=2),
    # GraniteMoeShared: the experts (not adapted: no Linear layers) and the ungated shared MLP (shared_mlp.*)
    "GraniteMoeSharedForCausalLM": dict(moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_shared_hidden=48,
                                        moe_shared_gate=False, embed_multiplier=2.0, n_kv_head=2),
    # Bamba: Granite 4.0's Mamba-2 layer (mamba.in_proj, out_proj) on layer 0, attention with RoPE on half of each
    # head on 1, feed_forward.gate_proj / up_proj / down_proj
    "BambaForCausalLM": dict(delta_layers=(0,), delta_rule="mamba2", delta_heads=4, delta_key_heads=2,
                             delta_key_dim=8, delta_value_dim=32, delta_conv_bias=True, rope_dims=8, n_kv_head=2),
    # Falcon-H1: attention (q/k/v, o_proj) and a Mamba-2 mixer (mamba.in_proj, out_proj) side by side on both
    # layers, feed_forward.gate_proj / up_proj / down_proj, the mixer normed before its gate, biases on every layer
    "FalconH1ForCausalLM": dict(delta_layers=(0, 1), delta_rule="mamba2", delta_parallel=True, delta_heads=4,
                                delta_key_heads=2, delta_key_dim=8, delta_value_dim=32, delta_conv_bias=True,
                                delta_proj_bias=True, delta_gate_norm="before_gate", bias=True, n_kv_head=2),
    # Nemotron-H: a Mamba-2 mixer alone (mixer.in_proj, out_proj) on layer 0, attention alone without positions
    # (mixer.q/k/v/o_proj) on 1, a ReLU² MLP alone (mixer.up_proj, down_proj) on 2
    "NemotronHForCausalLM": dict(n_layer=3, delta_layers=(0,), delta_rule="mamba2", delta_heads=4, delta_key_heads=2,
                                 delta_key_dim=8, delta_value_dim=32, delta_conv_bias=True, delta_dt_min=0.001,
                                 mlp_free_layers=(0, 1), mixer_free_layers=(2,), pos_emb="none", mlp="relu2",
                                 n_kv_head=2),
    # Mamba-2: its mixers alone (backbone.layers.i.mixer.in_proj, out_proj)
    "NemotronHForCausalLM-experts": dict(n_layer=4, delta_layers=(0,), delta_rule="mamba2", delta_heads=4,
                                         delta_key_heads=2, delta_key_dim=8, delta_value_dim=32, delta_dt_min=0.001,
                                         mlp_free_layers=(0, 1), mixer_free_layers=(2, 3), pos_emb="none",
                                         mlp="relu2", n_kv_head=2, moe_experts=4, moe_top_k=2, mlp_hidden=32,
                                         moe_layers=(3,), moe_dense_hidden=48, moe_groups=2,
                                         moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20,
                                         moe_shared_hidden=48, moe_shared_gate=False),
    # DBRX: Wqkv (redline's qkv as it is) and out_proj under norm_attn_norm.attn, the router's ffn.router.layer
    "DbrxForCausalLM": dict(norm="layernorm", norm_bias=False, qkv_clip=0.5, n_kv_head=2, moe_experts=4, moe_top_k=2,
                            mlp_hidden=16),
    # JetMoE: the routers of its attention heads and of its experts (its other weights are bare tensors)
    "JetMoeForCausalLM": dict(n_head=8, n_kv_head=2, head_size=16, attn_gate="routed", attn_experts=4, bias=True,
                              qkv_bias=False, norm_bias=False, norm_eps=1e-6, moe_experts=4, moe_top_k=2,
                              mlp_hidden=16, moe_out_bias=True),
    # PhiMoE: Llama's attention names with biases, LayerNorms, SparseMixer's experts (not adapted)
    "PhimoeForCausalLM": dict(norm="layernorm", bias=True, n_kv_head=2, moe_experts=4, moe_top_k=2, mlp_hidden=16,
                              moe_gating="sparsemixer", moe_norm_topk=False, moe_jitter_eps=0.3),
    # MiniMax-M2: Llama's attention names (q/k/v apart, o_proj) beside whole-projection QK-norm, partial RoPE and
    # sigmoid-scored experts (not adapted: no Linear layers in transformers)
    "MiniMaxM2ForCausalLM": dict(qk_norm=True, qk_norm_scope="all", rope_dims=4, n_kv_head=2, moe_experts=4,
                                 moe_top_k=2, mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True,
                                 moe_norm_eps=0.0),
    "Dots1ForCausalLM": dict(qk_norm=True, n_kv_head=2, moe_experts=4, moe_top_k=2, mlp_hidden=16, moe_dense_layers=1,
                             moe_dense_hidden=48, moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20,
                             moe_shared_hidden=32, moe_shared_gate=False),  # Llama's names, attention alone
    # HyperCLOVA X: Llama's names with Granite's scalars and norms on the sublayers' outputs (post_norm1, post_norm2)
    "HyperCLOVAXForCausalLM": dict(norm_position="sandwich", embed_multiplier=2.0, residual_multiplier=0.5,
                                   logit_divisor=2.0, n_kv_head=2),
    # Persimmon: GPT-NeoX's query_key_value (B's rows grouped by head), self_attn.dense, mlp.dense_h_to_4h / 4h_to_h
    "PersimmonForCausalLM": dict(norm="layernorm", mlp="relu2", qk_norm=True, qk_layernorm=True, rope_dims=8,
                                 bias=True),
    # Jais 2: Llama's names, LayerNorms, up_proj the ReLU² MLP's first product, biases on every Linear layer
    "Jais2ForCausalLM": dict(norm="layernorm", mlp="relu2", bias=True, n_kv_head=2),
    # Solar Open: GLM-4-MoE's experts on every layer under Llama's attention with q/k/v biases (its attention alone)
    "SolarOpenForCausalLM": dict(qkv_bias=True, n_kv_head=2, moe_experts=4, moe_top_k=2, mlp_hidden=16,
                                 moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20,
                                 moe_shared_hidden=32, moe_shared_gate=False),
    "Mamba2ForCausalLM": dict(delta_layers=(0, 1), delta_rule="mamba2", delta_heads=4, delta_key_heads=2,
                              delta_key_dim=8, delta_value_dim=32, delta_conv_bias=True, mlp_free_layers=(0, 1),
                              pos_emb="none"),
    # Mamba and Falcon-Mamba: Mamba-1 mixers alone (backbone.layers.i.mixer.in_proj, x_proj, dt_proj)
    "MambaForCausalLM": dict(delta_layers=(0, 1), delta_rule="mamba1", delta_heads=128, delta_key_heads=1,
                             delta_key_dim=8, delta_value_dim=1, delta_conv_bias=True, mlp_free_layers=(0, 1),
                             pos_emb="none", tie_embeddings=True),
    "FalconMambaForCausalLM": dict(delta_layers=(0, 1), delta_rule="mamba1", delta_heads=128, delta_key_heads=1,
                                   delta_key_dim=8, delta_value_dim=1, delta_bcdt_norm_eps=1e-6,
                                   mlp_free_layers=(0, 1), pos_emb="none"),
    # Jamba: Mamba-1 mixers (mamba.in_proj, x_proj, dt_proj, out_proj) on layers 0 and 2, attention without
    # positions on 1, a dense SwiGLU on 0 and 2 and experts on 1 (the attention, the mixers and the dense MLPs adapted)
    "JambaForCausalLM": dict(n_layer=3, delta_layers=(0, 2), delta_rule="mamba1", delta_heads=128, delta_key_heads=1,
                             delta_key_dim=8, delta_value_dim=1, delta_bcdt_norm_eps=1e-5, delta_bcdt_norm_weight=True,
                             norm_eps=1e-5, pos_emb="none", n_kv_head=2, moe_experts=4, moe_top_k=2,
                             moe_norm_topk=False, mlp_hidden=32, moe_layers=(1,)),
    # OLMo Hybrid: a gated delta net (q/k/v_proj apart, g_proj, a_proj, b_proj, o_proj) in a pre-norm block on layer
    # 0, OLMo 3's output-norm attention on 1
    "OlmoHybridForCausalLM": dict(norm_position="output", qk_norm=True, qk_norm_scope="all", delta_layers=(0,),
                                  delta_norm_position="pre", delta_heads=4, delta_key_heads=2, delta_key_dim=8,
                                  delta_value_dim=16, delta_beta_scale=2.0, delta_norm_eps=1e-5, n_kv_head=2),
    # the original OLMo: Llama's names, LayerNorms without weights
    "OlmoForCausalLM": dict(norm="layernorm", norm_affine=False, n_kv_head=2),
    # nanochat: q and k rows (B's rows) with each head's second half negated, mlp.fc1 / fc2, weightless norms
    "NanoChatForCausalLM": dict(norm_affine=False, embed_norm=True, qk_norm=True, mlp="relu2", n_kv_head=2,
                                logit_softcap=3.0),
    # GPTBigCode: c_attn (nn.Linear) with B's rows as redline's (multi-query) or regrouped by head (multi-head)
    "GPTBigCodeForCausalLM": dict(pos_emb="learned", norm="layernorm", mlp="gelu", bias=True, n_kv_head=1,
                                  tie_embeddings=True),
    "GPTBigCodeForCausalLM-mha": dict(pos_emb="learned", norm="layernorm", mlp="gelu", bias=True, attn_scale=1.0),
    # GPT-Neo: q/k/v_proj and out_proj under attn.attention, mlp.c_fc / c_proj; a windowed layer, scores unscaled
    "GPTNeoForCausalLM": dict(pos_emb="learned", norm="layernorm", mlp="gelu", bias=True, qkv_bias=False,
                              attn_scale=1.0, sliding_window=4, window_layers=(1,), tie_embeddings=True),
    # GPT-J: q/k/v_proj apart (q and k rows, B's rows, in its interleaved RoPE order), out_proj, mlp.fc_in / fc_out
    "GPTJForCausalLM": dict(norm="layernorm", mlp="gelu", bias=True, qkv_bias=False, parallel_residual=True,
                            parallel_shared_norm=True, head_bias=True, rope_dims=6),
    # query_key_value: B's rows regrouped by head
    "GPTNeoXForCausalLM": dict(norm="layernorm", mlp="gelu", bias=True, parallel_residual=True, rope_dims=4),
    # ALiBi: BLOOM's query_key_value (B's rows regrouped by head, [q_h, k_h, v_h]), dense, dense_h_to_4h / 4h_to_h;
    # MPT's Wqkv as redline's, out_proj, ffn.up_proj / down_proj
    "BloomForCausalLM": dict(pos_emb="alibi", embed_norm=True, norm="layernorm", mlp="gelu", bias=True),
    "MptForCausalLM": dict(pos_emb="alibi", norm="layernorm", mlp="gelu", gelu_approximate="none"),
    # GLM and GLM-4: q/k/v_proj apart (q and k rows, B's rows, in GLM's interleaved order on half of each head),
    # o_proj, gate_up_proj fused as redline's fc; GLM-4-MoE: its attention's q/k/v_proj (Llama's order) and o_proj
    "GlmForCausalLM": dict(rope_dims=8, qkv_bias=True, n_kv_head=2),
    "Glm4ForCausalLM": dict(norm_position="sandwich", rope_dims=8, qkv_bias=True, n_kv_head=2),
    "Glm4MoeForCausalLM": dict(rope_dims=8, qkv_bias=True, qk_norm=True, n_kv_head=2, moe_experts=4, moe_top_k=2,
                               mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20,
                               moe_shared_hidden=32, moe_shared_gate=False, moe_dense_layers=1, moe_dense_hidden=80),
    # Sarvam MoE: GLM-4-MoE's modules rotating whole heads, q/k/v biases beside QK-norm (which dots.llm1 has not)
    "Glm4MoeForCausalLM-sarvam": dict(qkv_bias=True, qk_norm=True, n_kv_head=2, moe_experts=4, moe_top_k=2,
                                      mlp_hidden=16, moe_gating="sigmoid", moe_expert_bias=True, moe_norm_eps=1e-20,
                                      moe_shared_hidden=32, moe_shared_gate=False, moe_dense_layers=1,
                                      moe_dense_hidden=80),
    # Falcon: query_key_value (B's rows regrouped by KV head, [q, q, k, v] a group), dense, dense_h_to_4h / 4h_to_h
    "FalconForCausalLM": dict(norm="layernorm", mlp="gelu", parallel_residual=True, n_kv_head=2, bias=True),
    # Llama 4: q and k rows (B's rows) in its interleaved RoPE order, chunked attention and weightless QK-norm on layer
    # 0, the temperature on layer 1 (no RoPE); a dense feed_forward on 0, input-weighted experts with a shared one
    # (feed_forward.shared_expert.*) on 1
    "Llama4ForCausalLM": dict(n_kv_head=2, nope_interval=2, attn_chunk=4, rope_qk_norm=True, nope_temperature=0.5,
                              nope_temperature_floor=3, moe_experts=4, moe_top_k=1, moe_gating="sigmoid",
                              moe_norm_topk=False, mlp_hidden=32, moe_shared_hidden=32, moe_shared_gate=False,
                              moe_weight_input=True, moe_layers=(1,), moe_dense_hidden=80),
    # DeepSeek-V3: latent attention (q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj adapted), a dense
    # first layer and experts with a shared one
    "DeepseekV3ForCausalLM": dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=16,
                                  fused_qkv=False, moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_gating="sigmoid",
                                  moe_expert_bias=True, moe_groups=2, moe_topk_groups=1, moe_norm_eps=1e-20,
                                  moe_shared_hidden=32, moe_shared_gate=False, moe_dense_layers=1,
                                  moe_dense_hidden=64, moe_scale=2.5),
    # DeepSeek-V2: one q_proj, its rotated rows and kv_a_proj_with_mqa's (B's rows) in interleaved pairs again
    "DeepseekV2ForCausalLM": dict(kv_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=12, fused_qkv=False,
                                  moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_norm_topk=False,
                                  moe_shared_hidden=64, moe_shared_gate=False, moe_dense_layers=1, moe_scale=2.0),
    # Mistral 4: DeepSeek-V3's latent attention's modules (rows as they are) on softmax experts chosen within groups
    "Mistral4ForCausalLM": dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=16,
                                fused_qkv=False, moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_groups=2,
                                moe_topk_groups=1, moe_shared_hidden=32, moe_shared_gate=False, moe_dense_layers=1,
                                moe_dense_hidden=64, moe_scale=1.5),
    # dots.3 Note: DeepSeek-V3's latent attention's modules (q_b's and kv_a's rotated rows interleaved again), the
    # heads' gate (g_proj), the RoPE key part normed, windowed layers with a base of their own
    "Dots3NoteForCausalLM": dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=16,
                                 fused_qkv=False, attn_gate="head", latent_key_norm=True, latent_norm_eps=1e-5,
                                 sliding_window=5, window_layers=(1,), rope_local_theta=300.0, moe_experts=4,
                                 moe_top_k=2, mlp_hidden=32, moe_gating="sigmoid", moe_expert_bias=True,
                                 moe_norm_eps=1e-20, moe_shared_hidden=32, moe_shared_gate=False, moe_dense_layers=1,
                                 moe_dense_hidden=64, moe_scale=1.5),
    # A.X-K1: DeepSeek-V3's latent attention's modules, its mixture's output normed
    "AXK1ForCausalLM": dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=16,
                            fused_qkv=False, moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_gating="sigmoid",
                            moe_expert_bias=True, moe_norm_eps=1e-20, moe_shared_hidden=32, moe_shared_gate=False,
                            moe_dense_layers=1, moe_dense_hidden=64, moe_post_norm=True),
    # A.X-K2: DeepSeek-V3's layers with gated norms and the latent query gate (q_gate_proj's query and gate rows)
    "AXK2ForCausalLM": dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=16,
                            fused_qkv=False, moe_experts=4, moe_top_k=2, mlp_hidden=32, moe_gating="sigmoid",
                            moe_expert_bias=True, moe_norm_eps=1e-20, moe_shared_hidden=32, moe_shared_gate=False,
                            moe_dense_layers=1, moe_dense_hidden=64, q_latent_gate=True, norm_gate_rank=8),
    # LongCat-Flash: one layer of two latent attention + dense MLP pairs (self_attn.S, mlps.S) and a shortcut MoE
    "LongcatFlashForCausalLM": dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=16,
                                    fused_qkv=False, moe_experts=4, moe_identity_experts=2, moe_top_k=3, mlp_hidden=32,
                                    moe_expert_bias=True, moe_norm_topk=False, moe_scale=2.0, moe_shortcut=True,
                                    moe_dense_hidden=48),
    # MiMo-V2-Flash: Llama's attention names (v_proj as wide as the keys), sinks on the windowed layer alone (not
    # adapted), experts after a dense first layer
    "MiMoV2FlashForCausalLM": dict(n_kv_head=4, global_kv_head=2, rope_dims=8, fused_qkv=False, sliding_window=4,
                                   window_layers=(1,), attn_sinks=True, attn_sinks_windowed=True, moe_experts=4,
                                   moe_top_k=2, mlp_hidden=32, moe_gating="sigmoid", moe_expert_bias=True,
                                   moe_norm_eps=1e-20, moe_dense_layers=1, moe_dense_hidden=64),
    # MiniCPM3: the latent attention's modules beside Llama's MLP names (gate_proj and up_proj B's halves), with its
    # µP scalars (embedding, residual, logit) and LongRoPE
    # Apertus 1.5 with its head pruned below the embedding (model.head_vocab): the head adapted too, its rows alone
    "Apertus1p5TextForCausalLM": dict(mlp="xielu", qk_norm=True, n_kv_head=2, head_vocab=300),
    "MiniCPM3ForCausalLM": dict(kv_lora_rank=16, q_lora_rank=16, head_size=24, rope_dims=8, v_head_dim=16,
                                fused_qkv=False, embed_multiplier=12.0, residual_multiplier=0.7, logit_divisor=4.0,
                                rope_scaling="longrope", rope_original_context=64, rope_factor=1.0,
                                rope_pair_factors=(1.0, 1.5, 2.0, 3.0)),
}
TOKENS = torch.tensor([[5, 17, 42, 99, 3, 64, 7, 120, 31, 8]])
# a mixture of experts' router is no Linear layer in transformers (the export refuses it): its attention and shared MLP
TARGETS = {"GraniteMoeSharedForCausalLM": ("attn.*", "mlp.shared.*"),
           "Apertus1p5TextForCausalLM": ("attn.*", "mlp.*", "lm_head"),
           "BitNetForCausalLM": ("attn.q", "attn.k", "attn.v", "mlp.fc", "mlp.up"),
           # the Mamba-2 mixer's in_proj too (PEFT refuses its out_proj: test_export_refusals_are_one_line)
           "FalconH1ForCausalLM": ("attn.*", "mlp.*", "mamba.in_proj"),
           # PEFT adapts no Mamba-2 out_proj in these two (their attn.proj; Nemotron-H's attention o_proj goes too)
           "NemotronHForCausalLM": ("attn.in_proj", "attn.qkv", "mlp.*"),
           "NemotronHForCausalLM-experts": ("attn.in_proj", "attn.qkv", "mlp.fc", "mlp.proj", "mlp.shared.*"),
           "Dots1ForCausalLM": ("attn.*",), "SolarOpenForCausalLM": ("attn.*",),
           "Mamba2ForCausalLM": ("attn.in_proj",),
           # nor a Mamba-1 out_proj (Mamba's, Falcon-Mamba's attn.proj)
           "MambaForCausalLM": ("attn.in_proj", "attn.x_proj", "attn.dt_proj"),
           "FalconMambaForCausalLM": ("attn.in_proj", "attn.x_proj", "attn.dt_proj"),
           # Jamba's out_proj too, which PEFT adapts there; never the router (mlp.fc on a mixture: no Linear)
           "JambaForCausalLM": ("attn.*", "mlp.fc", "mlp.proj"),
           # Llama 4's router's forward returns a pair, which no LoRA layer can wrap
           "Llama4ForCausalLM": ("attn.*", "mlp.fc", "mlp.proj", "mlp.shared.*"),
           # PEFT moves GLM-4-MoE's MLP adapters (dense, shared) onto its experts: its attention alone
           "Glm4MoeForCausalLM": ("attn.*",), "Glm4MoeForCausalLM-sarvam": ("attn.*",),
           # the per-layer input layers: each block's ple_gate and ple_proj, the model's ple_proj
           "Gemma4ForCausalLM": ("attn.*", "mlp.*", "ple_*"),
           "Gemma3nForCausalLM": ("attn.*", "mlp.*", "ple_*", "laurel_*"),
           "Ernie4_5_MoeForCausalLM": ("attn.*",), "HunYuanMoEV1ForCausalLM": ("attn.*",),
           "Cohere2MoeForCausalLM": ("attn.*",),
           "FlexOlmoForCausalLM": ("attn.*",), "ExaoneMoeForCausalLM": ("attn.*",),
           # AFMoE's head gate (self_attn.gate_proj) is refused: PEFT takes it for an expert's gate_proj
           "AfmoeForCausalLM": ("attn.qkv", "attn.proj"),
           "MellumForCausalLM": ("attn.*",), "FlintForCausalLM": ("attn.*",), "Kolibri1ForCausalLM": ("attn.*",),
           "LagunaForCausalLM": ("attn.*",),
           "GraniteMoeSWAForCausalLM": ("attn.*", "mlp.shared.*"),
           # Zamba2: its mixers and each caller's output projection (the shared block is one module in transformers)
           "Zamba2ForCausalLM": ("attn.in_proj", "attn.proj", "mamba.*", "attn.shared_in"),
           # Lara Mini: the delta net's projections, the attention, the shared expert (the router is no Linear layer)
           "LaraMiniForCausalLM": ("attn.*", "mlp.shared.*"),
           # DeepSeek's latent attention alone: PEFT moves gate/up/down_proj adapters onto the experts (refused)
           # Kimi Linear: every KDA projection (the forget gate's under forget_gate.), the latent attention
           "KimiLinearForCausalLM": ("attn.*",),
           # Ling 3: every KDA and latent-attention projection (the forget gate's f_proj, the heads' gate included)
           "BailingHybridForCausalLM": ("attn.*",),
           "DeepseekV3ForCausalLM": ("attn.*",), "DeepseekV2ForCausalLM": ("attn.*",),
           "Mistral4ForCausalLM": ("attn.*",), "AXK1ForCausalLM": ("attn.*",), "Dots3NoteForCausalLM": ("attn.*",),
           "MiMoV2FlashForCausalLM": ("attn.*",),
           # LongCat-Flash's latent attention alone, as DeepSeek's (PEFT moves its MLPs' adapters onto the experts)
           "LongcatFlashForCausalLM": ("attn.*",), "AXK2ForCausalLM": ("attn.*",),
           "MiniMaxM2ForCausalLM": ("attn.*",), "MiniMaxForCausalLM": ("attn.*",), "PhimoeForCausalLM": ("attn.*",),
           "DbrxForCausalLM": ("attn.*", "mlp.router"), "JetMoeForCausalLM": ("attn.gate", "mlp.router"),
           "DoryForCausalLM": ("attn.qkv", "attn.proj", "attn.gate", "mlp.fc", "mlp.proj"),
           # DeepSeek-V4: its attention's Linear layers (PEFT would move its MLPs' adapters onto the experts)
           "DeepseekV4ForCausalLM": ("attn.*",), "DeepseekV4ForCausalLM-compressed": ("attn.*",),
           "ZayaForCausalLM": ("attn.*", "mlp.router*")}


def lora_run(tmp_path, arch: str, train_modules=(), targets=None):
    """(base checkpoint, adapter checkpoint) as a LoRA run of `arch` writes them, with non-zero adapters."""
    from redline.tokenizer import load_tokenizer
    from tests.interop_models import byte_level_tokenizer

    cfg = ModelConfig(**{"vocab_size": VOCAB - 8, "context_len": 64, "n_layer": 2, "n_embd": 64, "n_head": 4,
                         **ARCHS[arch]})
    tokenizer = load_tokenizer(byte_level_tokenizer(tmp_path / "tok"))
    torch.manual_seed(0)
    model = GPT(cfg)
    base = tmp_path / "base"
    base.mkdir()
    ckpt_io.write_weights_checkpoint(base, ckpt_io.model_weights(model), to_dict(TrainConfig(model=cfg)), tokenizer, {})
    lora = LoRAConfig(enabled=True, rank=4, alpha=8.0, train_modules=tuple(train_modules),
                      **({} if targets is None else {"targets": tuple(targets)}))
    LoRAConverter(4, 8.0, 0.0, lora.targets, train_modules=lora.train_modules, say=lambda m: None).convert(model)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.normal_(0, 0.05)
    run_cfg = TrainConfig(model=cfg, init_from=str(base), lora=lora)
    ckpt = ckpt_io.save_checkpoint(tmp_path / "run", 1, model, {}, to_dict(run_cfg), tokenizer, 1,
                                   model_state=adapters.adapter_state(model),
                                   extra_meta={adapters.META_KEY: adapters.base_reference(base, torch.float32)})
    return base, ckpt


def export(*argv) -> int:
    with pytest.raises(SystemExit) as e:
        cli.main(["export", *argv])
    return e.value.code


def assert_peft_gives_redlines_logits(tmp_path, base, ckpt, arch: str | None = None) -> torch.Tensor:
    """`redline export` of the base and `--adapter` of the run; PEFT's model (the exported base, as `arch` if given,
    with the adapter) gives the logits redline's merged model gives, which the adapter changed. -> redline's logits."""
    assert export(str(base), "--out", str(tmp_path / "base-hf")) == 0
    assert export(str(ckpt), "--adapter", str(tmp_path / "adapter")) == 0
    loaded = json.loads((tmp_path / "base-hf" / "config.json").read_text())["architectures"][0]
    hf = causal_lm_class(loaded).from_pretrained(tmp_path / "base-hf").eval()
    assert arch is None or type(hf).__name__ == arch
    with torch.no_grad():
        base_logits = hf(TOKENS).logits
    tuned = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    merged, _, _ = ckpt_io.load_for_inference(ckpt)  # what redline's eval and generate run
    with torch.no_grad():
        ours = merged(TOKENS)
        theirs = tuned(TOKENS).logits
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    assert (theirs - base_logits).abs().max() > 1e-3  # the adapter is applied
    return ours


@pytest.mark.parametrize("arch", list(ARCHS))
def test_peft_loads_the_adapter_with_redlines_logits(arch, tmp_path, capsys):
    base, ckpt = lora_run(tmp_path, arch, targets=TARGETS.get(arch))
    ours = assert_peft_gives_redlines_logits(tmp_path, base, ckpt)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0
    # --merge: the merged model as a plain transformers folder, the same logits
    assert export(str(ckpt), "--merge", "--out", str(tmp_path / "merged")) == 0
    plain = causal_lm_class(arch).from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(TOKENS).logits, ours, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("targets", [None, ("attn.qkv", "attn.proj", "attn.in_proj", "mlp.*"), ("attn.gate",)])
def test_qwen3_5_adapter_with_its_query_gate_projection(targets, tmp_path, capsys):
    """Qwen3.5's q_proj holds each head's queries and output gate, which redline adapts apart (attn.qkv's first rows,
    attn.gate): the two adapters go into q_proj together, A stacked and B's rows where the weight has them, at twice
    the rank (rank_pattern, alpha_pattern keeping alpha / r); one alone at its rank, the other's rows zero. The
    delta nets' adapters go to linear_attn.*. PEFT loads every form with redline's logits."""
    arch = "Qwen3_5ForCausalLM"
    ARCHS[arch] = dict(delta_layers=(0,), delta_heads=4, delta_key_heads=2, delta_key_dim=8, delta_value_dim=8,
                       attn_gate="element", qk_norm=True, norm_unit_offset=True, rope_dims=8, n_kv_head=2)
    try:
        base, ckpt = lora_run(tmp_path, arch, targets=targets)
    finally:
        del ARCHS[arch]
    assert_peft_gives_redlines_logits(tmp_path, base, ckpt)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    both = targets is None  # the default targets (attn.*, mlp.*) adapt attn.qkv and attn.gate
    assert config["rank_pattern"] == ({r"model\.layers\.1\.self_attn\.q_proj": 8} if both else {})


_HYBRID = dict(delta_heads=4, delta_key_heads=2, delta_key_dim=8, delta_value_dim=8, attn_gate="element",
               qk_norm=True, norm_unit_offset=True, rope_dims=8, n_kv_head=2, moe_experts=4, moe_top_k=2,
               mlp_hidden=32, moe_shared_hidden=48)


@pytest.mark.parametrize("arch, fields, targets", [
    # every delta-net projection, the gated q_proj, the shared expert
    ("Qwen3_5MoeForCausalLM", dict(delta_layers=(0,)), ("attn.*", "mlp.shared*")),
    # the gated q_proj, the delta net's out_proj, the shared expert's gate (PEFT moves adapters on any gate_proj,
    # up_proj or down_proj of Qwen3-Next onto its experts: refused)
    ("Qwen3NextForCausalLM", dict(delta_layers=(1,), moe_dense_layers=1, moe_dense_hidden=40),
     ("attn.qkv", "attn.gate", "attn.proj", "mlp.shared_gate")),
    # Qwen3.5-MoE's adapters on Qwen4-Exp's hyper-connected layers (its indexer within the context: keeps every key),
    # and on the hyper-connection mixers (the layers' and the last one's)
    ("Qwen4ExpForCausalLM", dict(delta_layers=(0,), hc_streams=3, hc_rank=8, qsa_heads=2, qsa_head_dim=16,
                                 qsa_budget=64, qsa_block=1),
     ("attn.*", "mlp.shared*", "attn_hc.*", "mlp_hc.*", "hc_out.*")),
    # and on a Per-Layer Embedding's key and value projections (ple.key_proj, value_proj)
    ("Qwen4ExpForCausalLM", dict(delta_layers=(0,), hc_streams=3, hc_rank=8, qsa_heads=2, qsa_head_dim=16,
                                 qsa_budget=64, qsa_block=1, ngram_layers=(0,), ngram_dim=16, ngram_heads=2,
                                 ngram_vocab_base=40, ngram_vocab_multiple=8, ngram_eos=1),
     ("attn.*", "ngram.*")),
])
def test_qwen3_5_moe_and_qwen3_next_adapters(arch, fields, targets, tmp_path, capsys):
    """Qwen3.5-MoE, Qwen3-Next and Qwen4-Exp take Qwen3.5's adapters (q_proj's queries and gate together) and Qwen2-MoE's
    shared-expert ones; Qwen3-Next's in_proj_qkvz, whose rows interleave several of redline's layers, and its
    gate_proj / up_proj / down_proj, which PEFT takes for its experts', are refused by name."""
    ARCHS[arch] = {**_HYBRID, **fields}
    try:
        base, ckpt = lora_run(tmp_path, arch, targets=targets)
        _, whole = lora_run(tmp_path / "whole", arch, targets=("attn.*",))
        _, shared = lora_run(tmp_path / "shared", arch, targets=("mlp.shared.*",))
    finally:
        del ARCHS[arch]
    assert_peft_gives_redlines_logits(tmp_path, base, ckpt, arch)
    capsys.readouterr()
    for run, fragment in ((whole, "in_proj_qkvz"), (shared, "PEFT moves onto Qwen3-Next's experts")):
        code = export(str(run), "--adapter", str(tmp_path / "refused"))
        err = capsys.readouterr().err
        if arch == "Qwen3NextForCausalLM":
            assert code == 2 and fragment in err and "--merge" in err and not (tmp_path / "refused").exists(), err
        else:
            assert code == 0, err
            shutil.rmtree(tmp_path / "refused")


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Apertus1p5TextForCausalLM"])  # the latter's head pruned
def test_trained_head_goes_in_as_modules_to_save(arch, tmp_path, capsys):
    base, ckpt = lora_run(tmp_path, arch, train_modules=("lm_head",))
    with torch.no_grad():  # the head trained in full: change it in the checkpoint as training would
        from safetensors.torch import load_file, save_file

        saved = load_file(str(ckpt / "model.safetensors"))
        saved["lm_head.weight"] += 0.1
        save_file(saved, str(ckpt / "model.safetensors"))
        meta = json.loads((ckpt / "meta.json").read_text())
        meta["sha256"]["model.safetensors"] = ckpt_io._sha256(ckpt / "model.safetensors")
        (ckpt / "meta.json").write_text(json.dumps(meta))
    assert export(str(base), "--out", str(tmp_path / "base-hf")) == 0
    assert export(str(ckpt), "--adapter", str(tmp_path / "adapter")) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base-hf").eval()
    tuned = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    merged, _, _ = ckpt_io.load_for_inference(ckpt)
    with torch.no_grad():
        torch.testing.assert_close(tuned(TOKENS).logits, merged(TOKENS), rtol=1e-4, atol=1e-4)


def test_export_refusals_are_one_line(tmp_path, capsys):
    base, ckpt = lora_run(tmp_path, "Qwen3ForCausalLM")
    assert export(str(ckpt), "--out", str(tmp_path / "x")) == 2
    err = capsys.readouterr().err
    assert "give --merge" in err and not (tmp_path / "x").exists()
    export(str(base), "--adapter", str(tmp_path / "y"))
    assert "not a LoRA run's checkpoint" in capsys.readouterr().err and not (tmp_path / "y").exists()
    export(str(base), "--merge", "--out", str(tmp_path / "z"))
    assert "nothing to merge" in capsys.readouterr().err and not (tmp_path / "z").exists()
    # a head with a bias trained in full: the adapter would not carry the bias
    _, ckpt = lora_run(tmp_path / "phi", "PhiForCausalLM", train_modules=("lm_head",))
    assert export(str(ckpt), "--adapter", str(tmp_path / "b")) == 2
    assert "whose head has a bias" in capsys.readouterr().err and not (tmp_path / "b").exists()
    # Falcon-H1's Mamba-2 out_proj, which PEFT will not adapt: refused by name (the merged model carries it)
    _, ckpt = lora_run(tmp_path / "falcon", "FalconH1ForCausalLM", targets=("mamba.*",))
    assert export(str(ckpt), "--adapter", str(tmp_path / "f")) == 2
    assert "blocks.0.mamba.proj would be the Mamba-2 mixer's out_proj" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()
    assert export(str(ckpt), "--merge", "--out", str(tmp_path / "fm")) == 0
    # a Mamba-2 layer's out_proj, which PEFT will not adapt in Nemotron-H or Mamba2
    _, ckpt = lora_run(tmp_path / "mamba2", "Mamba2ForCausalLM", targets=("attn.*",))
    assert export(str(ckpt), "--adapter", str(tmp_path / "m")) == 2
    err = capsys.readouterr().err
    assert "is on a Mamba-2 layer's out_proj, which PEFT refuses to adapt in Mamba2ForCausalLM" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "m").exists()
    # and a Mamba-1 layer's, in Mamba
    _, ckpt = lora_run(tmp_path / "mamba1", "MambaForCausalLM", targets=("attn.*",))
    assert export(str(ckpt), "--adapter", str(tmp_path / "m1")) == 2
    err = capsys.readouterr().err
    assert "blocks.0.attn.proj is on a Mamba-1 layer's out_proj, which PEFT refuses to adapt in MambaForCausalLM" \
        in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "m1").exists()
    # Jamba's router, a bare weight in transformers
    _, ckpt = lora_run(tmp_path / "jamba", "JambaForCausalLM", targets=("attn.*", "mlp.*"))
    assert export(str(ckpt), "--adapter", str(tmp_path / "j")) == 2
    err = capsys.readouterr().err
    assert "blocks.1.mlp.router adapts a mixture of experts' router, which is no Linear layer in transformers' " \
           "JambaForCausalLM" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "j").exists()
    # AFMoE's head gate: self_attn.gate_proj, which PEFT takes for an expert's gate_proj
    _, ckpt = lora_run(tmp_path / "afmoe", "AfmoeForCausalLM", targets=("attn.*",))
    assert export(str(ckpt), "--adapter", str(tmp_path / "a")) == 2
    err = capsys.readouterr().err
    assert "blocks.0.attn.gate adapts AFMoE's head gate, self_attn.gate_proj" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "a").exists()
    # Kimi Linear's MLPs (PEFT would move their adapters onto the experts)
    _, ckpt = lora_run(tmp_path / "kimi", "KimiLinearForCausalLM", targets=("mlp.*",))
    assert export(str(ckpt), "--adapter", str(tmp_path / "k")) == 2
    err = capsys.readouterr().err
    assert "the adapter on blocks.0.mlp.fc has no counterpart PEFT loads onto KimiLinearForCausalLM" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "k").exists()
    # Ling 3's MLPs (PEFT would move their adapters onto the experts)
    _, ckpt = lora_run(tmp_path / "ling3", "BailingHybridForCausalLM", targets=("mlp.*",))
    assert export(str(ckpt), "--adapter", str(tmp_path / "l")) == 2
    err = capsys.readouterr().err
    assert "the adapter on blocks.0.mlp.fc has no counterpart PEFT loads onto BailingHybridForCausalLM" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "l").exists()


def test_llama4_adapter_on_the_router_is_refused(tmp_path, capsys):
    """Llama4Router's forward returns (scores, logits): PEFT cannot wrap it, so an adapter on mlp.router is refused by
    name at export (PEFT parity of the other adapters: ARCHS' Llama4ForCausalLM)."""
    _, ckpt = lora_run(tmp_path, "Llama4ForCausalLM", targets=("mlp.router",))
    capsys.readouterr()
    assert export(str(ckpt), "--adapter", str(tmp_path / "adapter")) == 2
    err = capsys.readouterr().err
    assert "adapts Llama 4's router" in err and "--merge" in err and not (tmp_path / "adapter").exists(), err


def test_phimoe_adapter_on_the_router_is_refused(tmp_path, capsys):
    """PhimoeTopKRouter is an nn.Linear whose forward returns (logits, weights, experts): PEFT cannot wrap it, so an
    adapter on mlp.router is refused by name at export."""
    _, ckpt = lora_run(tmp_path, "PhimoeForCausalLM", targets=("mlp.router",))
    capsys.readouterr()
    assert export(str(ckpt), "--adapter", str(tmp_path / "adapter")) == 2
    err = capsys.readouterr().err
    assert "adapts PhiMoE's router" in err and "--merge" in err and not (tmp_path / "adapter").exists(), err
