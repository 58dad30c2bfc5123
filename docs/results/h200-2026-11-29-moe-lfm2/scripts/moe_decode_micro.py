"""Decode-size MoE layer: grouped_mm over all experts vs gathering the chosen experts' weights (bmm)."""
import torch, time, json
import torch.nn.functional as F
from redline.model import MoE, ModelConfig
torch.manual_seed(0)
cfg = ModelConfig(n_embd=1024, n_head=16, mlp_hidden=512, moe_experts=32, moe_top_k=8)
moe = MoE(cfg).cuda().to(torch.bfloat16).eval()
def gathered(x):
    N, C = x.shape
    probs = F.softmax(moe.router(x), dim=-1, dtype=torch.float32)
    w, e = probs.topk(8, dim=-1); w = w / w.sum(-1, keepdim=True)
    fc = moe.fc[e.flatten()]  # (N*k, 2F, C)
    h = torch.bmm(fc, x.repeat_interleave(8, 0)[:, :, None]).squeeze(-1)
    g, u = h.chunk(2, -1); h = F.silu(g) * u
    y = torch.bmm(moe.proj[e.flatten()], h[:, :, None]).squeeze(-1) * w.flatten()[:, None].to(x.dtype)
    return y.view(N, 8, C).sum(1)
res = {}
for N in (1, 4, 16, 64):
    x = torch.randn(N, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = moe(x)
        err = ((gathered(x).float() - ref.float()).norm() / ref.float().norm()).item()
        for name, fn in (("grouped", torch.compile(moe)), ("gathered", torch.compile(gathered))):
            for _ in range(3): fn(x)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g): fn(x)
            torch.cuda.synchronize(); t = time.perf_counter()
            for _ in range(200): g.replay()
            torch.cuda.synchronize()
            res[f"{name}_N{N}_us"] = (time.perf_counter() - t) / 200 * 1e6
    res[f"err_N{N}"] = err
print(json.dumps(res))
