# How far LoRA's trained weights drift between two runs: without graphs twice, and without against with
import sys, torch
sys.path.insert(0, "tests")
from test_cuda_graphs import train_a_few_steps

for scope in ("blocks", "model"):
    a = train_a_few_steps("lora", scope, False)
    b = train_a_few_steps("lora", scope, False)
    g = train_a_few_steps("lora", scope, True)
    for label, (x, y) in (("plain-vs-plain", (a, b)), ("plain-vs-graphs", (a, g))):
        dl = max(abs(p - q) for p, q in zip(x[0], y[0]))
        de = max(float((p - q).abs().max()) for p, q in zip(x[1], y[1]))
        worst = max(x[2], key=lambda n: float((x[2][n] - y[2][n]).abs().max()))
        d = (x[2][worst] - y[2][worst]).abs()
        off = sum(int(((x[2][n] - y[2][n]).abs() > 1e-4 + 1e-3 * x[2][n].abs()).sum()) for n in x[2])
        tot = sum(x[2][n].numel() for n in x[2])
        print(f"{scope} {label}: loss {dl:.2e} eval {de:.2e} worst {worst} max {float(d.max()):.2e} "
              f"mean {float(d.mean()):.2e} beyond-tol {off}/{tot}", flush=True)
