import torch
from dataclasses import replace
from redline.model import GPT
from redline.inference import InferenceEngine, SamplingParams
from tests.test_moe import CFG, GPT_OSS_STYLE
torch.manual_seed(0)
cfg = replace(CFG, **{**dict(n_embd=128, mlp_hidden=64, moe_experts=8, moe_top_k=2, qk_norm=True, vocab_size=512,
                             context_len=128, moe_aux_loss=0.01), **GPT_OSS_STYLE})
model = GPT(cfg).cuda()
prompts = [list(range(1, 20)), [5, 6, 7], list(range(30, 90))]
for dtype, compiled in ((torch.float32, False), (torch.float32, True), (torch.bfloat16, False), (torch.bfloat16, True)):
    res = InferenceEngine(model, dtype=dtype, compile=compiled, cuda_graphs=compiled).generate(prompts, 24, SamplingParams(temperature=0))
    model.eval()
    out = []
    for p, r in zip(prompts, res):
        seq = torch.tensor([p + r.tokens], device="cuda")
        with torch.no_grad():
            logits = model(seq)[0, len(p) - 1:-1].float()
        chosen = logits.gather(1, torch.tensor(r.tokens, device="cuda")[:, None])[:, 0]
        gaps = logits.max(-1).values - chosen
        top2 = logits.topk(2, -1).values
        out.append((round(float(gaps.max()), 4), int(gaps.argmax()), round(float((top2[:, 0] - top2[:, 1])[gaps.argmax()]), 4)))
    print(dtype, compiled, out, flush=True)
