"""The same engine and shapes as mla_speed.py with plain attention (16 heads of 128, 16 KV heads) instead of MLA."""
import statistics, sys, torch
from redline.model import GPT, ModelConfig
from redline.inference.engine import InferenceEngine
cfg = ModelConfig(vocab_size=32768, context_len=8192, n_layer=27, n_embd=2048, n_head=16, n_kv_head=16, head_size=128,
                  mlp_hidden=10944)
torch.manual_seed(0)
model = GPT(cfg).to("cuda", torch.bfloat16).eval()
eng = InferenceEngine(model, dtype=torch.bfloat16)
print("dense", eng.describe(), flush=True)
for B, P, N in ((1, 512, 256), (16, 2048, 128)):
    prompts = torch.randint(0, 32768, (B, P), generator=torch.Generator().manual_seed(1)).tolist()
    eng.generate(prompts, N)
    rates = []
    for _ in range(3):
        eng.generate(prompts, N); rates.append(eng.last.decode_tokens_per_s)
    r = statistics.median(rates)
    print(f"dense B={B} prompt={P} new={N}: {r:,.0f} tok/s per row, {r*B:,.0f} tok/s in all", flush=True)
    eng.release(); torch.cuda.empty_cache()
