"""Training step time on one GPU: a 12-layer, width-768 model with attention on every layer against the same model
with gated delta nets on 9 of its 12 layers (Qwen3.5's 3:1), compiled, bf16 autocast, batch 8 x 2048."""
import time, torch, statistics
from dataclasses import replace
from redline.model import GPT, ModelConfig
base = ModelConfig(vocab_size=32768, context_len=2048, n_layer=12, n_embd=768, n_head=12, n_kv_head=4, qk_norm=True,
                   norm_unit_offset=True, head_size=64)
delta = replace(base, attn_gate="element", rope_dims=32, delta_layers=tuple(i for i in range(12) if (i + 1) % 4),
                delta_heads=12, delta_key_heads=6, delta_key_dim=64, delta_value_dim=64)
for name, cfg in (("attention", base), ("delta 3:1", delta)):
    torch.manual_seed(0)
    model = GPT(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step = torch.compile(model)
    idx = torch.randint(0, 32768, (8, 2048), device="cuda")
    t0 = time.perf_counter()
    times = []
    for i in range(8):
        torch.cuda.synchronize(); s = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step(idx, idx)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); times.append(time.perf_counter() - s)
    print(f"{name}: first step (compile) {times[0]:.1f} s, median of steps 3-8 {statistics.median(times[2:])*1e3:.1f} ms, "
          f"{8*2048/statistics.median(times[2:]):,.0f} tok/s, loss {loss.item():.3f}", flush=True)
    del model, opt, step
    torch.cuda.empty_cache()
