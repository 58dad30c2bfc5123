"""Decode speed of MLA (DeepSeek-V2-Lite's attention shape, dense MLP, random bf16 weights) through redline's
engine: run once with the current tree (latent cache) and once with PYTHONPATH at the tree before it (expanded
heads). Prints decode tokens/s per sequence and in all, and the cache bytes per token."""
import os, statistics, sys, torch
from redline.model import GPT, ModelConfig
from redline.inference.engine import InferenceEngine
tag = sys.argv[1]
cfg = ModelConfig(vocab_size=32768, context_len=8192, n_layer=27, n_embd=2048, n_head=16, head_size=192, rope_dims=64,
                  kv_lora_rank=512, q_lora_rank=0, v_head_dim=128, fused_qkv=False, mlp_hidden=10944)
torch.manual_seed(0)
model = GPT(cfg).to("cuda", torch.bfloat16).eval()
eng = InferenceEngine(model, dtype=torch.bfloat16)
print(tag, "kv bytes/token", eng.kv_bytes_per_token(), eng.describe(), flush=True)
for B, P, N in ((1, 512, 256), (16, 2048, 128), (64, 1024, 128), (64, 4096, 64)):
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 32768, (B, P), generator=g).tolist()
    try:
        eng.generate(prompts, N)  # warm (compile, capture)
        rates = []
        for _ in range(3):
            eng.generate(prompts, N)
            rates.append(eng.last.decode_tokens_per_s)
        r = statistics.median(rates)
        print(f"{tag} B={B} prompt={P} new={N}: {r:,.0f} tok/s per row, {r*B:,.0f} tok/s in all "
              f"(runs {', '.join(f'{x:,.0f}' for x in rates)}), cache {eng.kv_cache_bytes/2**30:.2f} GiB", flush=True)
    except torch.OutOfMemoryError as e:
        print(tag, B, P, "OOM", flush=True)
    eng.release(); torch.cuda.empty_cache()
