import sys, torch
from dataclasses import replace
sys.path.insert(0, ".")
import redline.model as M
import redline.inference.engine as ENG
from redline.model import GPT, ModelConfig
from redline.inference import InferenceEngine, SamplingParams

def gaps(model, prompts, **kw):
    res = InferenceEngine(model, **kw).generate(prompts, 24, SamplingParams(temperature=0))
    model.eval()
    out = []
    for p, r in zip(prompts, res):
        seq = torch.tensor([p + r.tokens], device="cuda")
        with torch.no_grad():
            lg = model(seq)[0, len(p) - 1:-1].float()
        ch = lg.gather(1, torch.tensor(r.tokens, device="cuda")[:, None])[:, 0]
        out.append(round((lg.max(-1).values - ch).max().item(), 4))
    return out

prompts = [list(range(1, 20)), [5, 6, 7], list(range(30, 90))]
def models():
    import tests.test_delta_net as T
    torch.manual_seed(0)
    yield "jamba", GPT(replace(T.JAMBA, n_embd=128, vocab_size=512, context_len=128, delta_key_dim=32, delta_value_dim=1)).cuda()
    from tests.test_interop_misc import BASE, EXPORTS, _random_model
    yield "cohere", _random_model(ModelConfig(**{**BASE, **EXPORTS["Cohere2MoeForCausalLM"]})).cuda()
    from tests.test_llama4 import LLAMA4
    torch.manual_seed(0)
    yield "llama4", GPT(replace(LLAMA4, n_embd=128, vocab_size=512, context_len=128, attn_chunk=16)).cuda()
real_opts = ENG.decode_options
def no_pdl(device, tuning):
    o = dict(real_opts(device, tuning)); o.pop("triton.enable_pdl", None); return o
for name, model in models():
    ps = prompts[:2] if name == "cohere" else prompts
    for label, patch, kw in [("default", None, {}), ("no inductor pdl", "pdl", {}),
                             ("matmul decode", None, dict(decode_attention="matmul", decode_linear="torch")),
                             ("no pdl + matmul", "pdl", dict(decode_attention="matmul", decode_linear="torch")),
                             ("default again", None, {})]:
        ENG.decode_options = no_pdl if patch == "pdl" else real_opts
        try:
            print(name, label, gaps(model, ps, dtype=torch.bfloat16, compile=True, cuda_graphs=True, **kw), flush=True)
        except Exception as e:
            print(name, label, "ERROR", type(e).__name__, str(e)[:200], flush=True)
    ENG.decode_options = real_opts
