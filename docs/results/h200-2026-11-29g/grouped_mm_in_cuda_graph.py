"""grouped_mm eager vs captured in a CUDA graph (and compiled+captured), replayed with new row counts."""
import torch
torch.manual_seed(0)
F = torch.nn.functional
grouped = getattr(F, "grouped_mm", None) or torch._grouped_mm

def ref(x, w, counts):
    return torch.cat([r.float() @ w[e].float().T for e, r in enumerate(x.split(counts))])

def f(x, w, ends):
    return grouped(x, w.transpose(1, 2), offs=ends)

cf = torch.compile(f, dynamic=False)
gen = torch.Generator().manual_seed(1)
for (E, M, K) in [(4, 64, 64), (4, 64, 32), (4, 128, 128), (4, 256, 128), (8, 128, 64), (16, 1024, 512)]:
    for N in (2, 6, 16, 64):
        w = torch.randn(E, M, K, device="cuda", dtype=torch.bfloat16)
        sx = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        sends = torch.full((E,), N, device="cuda", dtype=torch.int32)  # all rows in the last expert at capture
        sends[: E - 1] = 0
        for name, fn in (("graph", f), ("compiled+graph", cf)):
            fn(sx, w, sends); torch.cuda.synchronize()
            s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2): fn(sx, w, sends)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = fn(sx, w, sends)
            worst_g, worst_e = 0.0, 0.0
            for trial in range(20):
                counts = torch.multinomial(torch.ones(E), N, replacement=True, generator=gen).bincount(minlength=E).tolist()
                x = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
                ends = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
                sx.copy_(x); sends.copy_(ends); g.replay(); torch.cuda.synchronize()
                r = ref(x, w, counts)
                worst_g = max(worst_g, ((out.float() - r).norm() / r.norm()).item())
                worst_e = max(worst_e, ((f(x, w, ends).float() - r).norm() / r.norm()).item())
            print(f"E{E} M{M} K{K} N{N} {name}: replay err {worst_g:.4f}  eager err {worst_e:.4f}", flush=True)
