"""The KV-cache engine on a model with value embeddings (model.value_embeddings: token-indexed tables mixed into the
attention values of the first and last layers): greedy tokens and log-probabilities equal the full-recompute
forward's (GPT.generate), for one row and a batch of prompts of different lengths, with the prompt prefilled whole
or in spans, in the server's DecodeBatch too; on a GPU, redline's attention kernel over values the layer mixed in
torch; the fused decode block, which cannot mix the tables in, is refused in one line naming the option."""

import json
from dataclasses import replace

import pytest
import torch

from redline import cli
from redline.config import TrainConfig, to_dict
from redline.errors import UserError
from redline.inference import InferenceEngine
from redline.inference.batch import DecodeBatch
from redline.model import GPT, ModelConfig

# 4 layers, 2 tables: layers 0 and 2 mix in table 0, layers 1 and 3 table 1 (GPT.value_table); GQA, so a table's
# rows are KV*D wide, not C
CFG = ModelConfig(vocab_size=100, context_len=128, n_layer=4, n_embd=64, n_head=4, n_kv_head=2, value_embeddings=2)
PROMPTS = [[5, 6, 7, 8, 9], [42], list(range(10, 33)), [3, 1, 4, 1, 5, 9, 2, 6]]

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
GPU = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                      reason="needs a CUDA GPU")])


def ve_model(seed: int = 0, **overrides) -> GPT:
    """Value-embedding mixes away from their 0.5 initialisation, and tables large enough to change what the model
    predicts (test_the_tables_matter checks they do)."""
    torch.manual_seed(seed)
    model = GPT(replace(CFG, **overrides))
    with torch.no_grad():
        for block in model.blocks:
            if block.attn.ve_mix is not None:
                block.attn.ve_mix.copy_(torch.rand(2) + 0.25)
        for table in model.value_embeds:
            table.weight.normal_(0.0, 1.0)
    return model


def reference_greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt], device=next(model.parameters()).device), n, temperature=0.0)
    return out[0, len(prompt):].tolist()


def test_the_tables_matter():
    """Without this the equalities below could hold with the tables ignored."""
    model = ve_model()
    refs = [reference_greedy(model, p, 16) for p in PROMPTS]
    with torch.no_grad():
        for table in model.value_embeds:
            table.weight.zero_()
    assert [reference_greedy(model, p, 16) for p in PROMPTS] != refs


@pytest.mark.parametrize("device", ["cpu", GPU])  # on a GPU: compiled steps and CUDA graphs
@pytest.mark.parametrize("prefill_chunk_tokens", [32768, 5])
def test_greedy_batch_and_single_row_equal_generate(prefill_chunk_tokens, device):
    """fp64, so equality does not hinge on near-ties. prefill_chunk_tokens 5: prompts go through in spans of 5
    tokens, each attending to the cached spans before it (each span's tables looked up for its own tokens)."""
    model = ve_model().to(device)
    engine = InferenceEngine(model, dtype=torch.float64, prefill_chunk_tokens=prefill_chunk_tokens)
    assert engine.describe()["decode_attention"] == "matmul" and engine.describe()["decode_linear"] == "torch"
    n = 24
    results = engine.generate(PROMPTS, n)
    refs = [reference_greedy(model, p, n) for p in PROMPTS]
    assert [r.tokens for r in results] == refs
    assert len({tuple(r) for r in refs}) > 1  # rows really differ
    assert [engine.generate([p], n)[0].tokens for p in PROMPTS[1:3]] == refs[1:3]  # batch of one


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_decode_attention_takes_values_mixed_in_torch():
    """decode_attention triton: the layer mixes the tables into the values in torch and the kernel stores and
    attends over them (compiled, captured): greedy equal to the full forward, batch and single row."""
    model = ve_model(context_len=160).cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # fp32: keep near-ties out of the greedy comparison
    engine = InferenceEngine(model, dtype=torch.float32, compile=True, cuda_graphs=True, decode_attention="triton")
    assert engine.describe()["decode_attention"] == "triton" and engine.describe()["decode_linear"] == "torch"
    refs = [reference_greedy(model, p, 72) for p in PROMPTS]
    assert [r.tokens for r in engine.generate(PROMPTS, 72)] == refs
    assert engine.generate(PROMPTS[2:3], 72)[0].tokens == refs[2]


def test_bucketed_prefill_equals_generate():
    """The GPU path's shapes on the CPU, eagerly: prompts padded to a length bucket (the padding's tables looked up
    too, never attended to), rows in chunks, widths rounded to 64 (decoding crosses one)."""
    model = ve_model()
    engine = InferenceEngine(model, dtype=torch.float64, prefill_chunk_tokens=40)
    engine.plan = replace(engine.plan, compile=True)
    assert [r.tokens for r in engine.generate(PROMPTS, 48)] == [reference_greedy(model, p, 48) for p in PROMPTS]


def test_teacher_forced_log_probabilities_equal_the_full_forward():
    """engine.score feeds each token to a decode step after the prefill: its log-probabilities are the full
    forward's, position by position (the logits of every decode step, not only their argmax)."""
    model = ve_model()
    torch.manual_seed(1)
    tokens = torch.randint(0, CFG.vocab_size, (3, 40))
    logps, _ = InferenceEngine(model, dtype=torch.float64).score(tokens, prefill=7)
    with torch.no_grad():
        full = torch.log_softmax(model.double()(tokens), dim=-1)
    expected = full[:, 6:-1].gather(2, tokens[:, 7:, None])[..., 0]
    torch.testing.assert_close(logps, expected.float(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("device", ["cpu", GPU])  # on a GPU: compiled steps and CUDA graphs
def test_decode_batch_greedy_equals_generate(device):
    """The server's DecodeBatch: one row prefilled whole, one in spans, two together with prefill_many; steps that
    take the argmax inside and sampled steps fed back with advance(), rows freed and refilled."""
    model = ve_model().to(device)
    n = 12
    refs = [reference_greedy(model, p, n) for p in PROMPTS]
    batch = DecodeBatch(InferenceEngine(model, dtype=torch.float64), rows=4, capacity=64)
    got = {}

    def started(rows, prompts_at, logits):
        for row, i, t in zip(rows, prompts_at, logits.argmax(-1).tolist()):
            batch.start(row, t, len(PROMPTS[i]))
            got[row] = (i, [t])

    started([0], [0], batch.prefill(0, PROMPTS[0])[None])
    for s in range(0, len(PROMPTS[2]), 5):
        logits = batch.prefill(3, PROMPTS[2][s:s + 5], start=s)
    started([3], [2], logits[None])
    done = {}
    for step in range(40):
        if step == 2:
            started([2, 1], [3, 1], batch.prefill_many([2, 1], [PROMPTS[3], PROMPTS[1]]))
        greedy = step % 2 == 0
        out = batch.step() if greedy else batch.step(greedy=False).argmax(-1)
        if not greedy:
            batch.advance(out)
        for row, (i, tokens) in list(got.items()):
            tokens.append(int(out[row]))
            if len(tokens) == n:
                batch.free(row)
                done[i] = tokens
                del got[row]
        if not got:
            break
    assert [done[i] for i in range(len(PROMPTS))] == refs


def test_fused_decode_block_is_refused_in_one_line():
    """The fused block hands the attention kernel the raw projection, before the tables are mixed in: refused by
    name, whatever the machine (the attention kernel alone takes values mixed in torch, on a GPU)."""
    model = ve_model()
    with pytest.raises(UserError, match="decode_linear triton hands the attention kernel the raw qkv projection, "
                                        "which cannot give it value embeddings"):
        InferenceEngine(model, decode_linear="triton")
    with pytest.raises(UserError, match="decode_attention triton runs on CUDA GPUs only"):
        InferenceEngine(model, decode_attention="triton")
    assert InferenceEngine(model, compile=True).describe()["decode_attention"] == "matmul"


@pytest.mark.slow
def test_compiled_engine_on_cpu_equals_generate():
    """torch.compile'd steps (the GPU code path without graphs): the one compiled block serves the layers with a
    value embedding and those without (a second compilation), for every batch size and width."""
    from torch._dynamo.utils import counters

    model = ve_model(n_layer=5, context_len=160)  # layer 2 mixes in no table
    engine = InferenceEngine(model, dtype=torch.float64, compile=True)
    first = engine.generate(PROMPTS, 72)  # widths 64 and 128
    compiled = counters["stats"]["unique_graphs"]
    again = engine.generate(PROMPTS[:3], 30)  # another batch size and capacity: no new compilation
    assert [r.tokens for r in first] == [reference_greedy(model, p, 72) for p in PROMPTS]
    assert [r.tokens for r in again] == [r.tokens[:30] for r in first[:3]]
    assert counters["stats"]["unique_graphs"] == compiled



def test_server_scheduler_greedy_equals_generate():
    """The server's scheduler on two rows for four requests: rows freed and refilled, prompts prefilled in spans of
    7 tokens and several at once, as `redline serve` runs them."""
    import queue

    from redline.inference import SamplingParams
    from redline.serve.scheduler import Scheduler, Sequence
    from redline.tokenizer import load_tokenizer

    eot = 256
    model = ve_model(vocab_size=257)
    sched = Scheduler(DecodeBatch(InferenceEngine(model, dtype=torch.float64), rows=2, capacity=64),
                      load_tokenizer("bytes"), [eot], prefill_tokens=7)
    prompts, lengths = PROMPTS, [12, 20, 6, 15]
    sinks = [queue.Queue() for _ in prompts]
    seqs = [Sequence(list(p), n, SamplingParams(), (), q.put) for p, n, q in zip(prompts, lengths, sinks)]
    try:
        sched.submit(seqs)
        for q in sinks:
            while q.get(timeout=30)[0] == "text":
                pass
    finally:
        sched.close()
    for p, n, seq in zip(prompts, lengths, seqs):
        ref = reference_greedy(model, p, n)
        assert seq.tokens == (ref[:ref.index(eot)] if eot in ref else ref)


# ----------------------------------------------------------------------------------------------------
# the commands


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from redline.tokenizer import load_tokenizer
    from redline.training.checkpoint import save_checkpoint

    cfg = TrainConfig(model=replace(CFG, vocab_size=257, context_len=64))
    model = ve_model(vocab_size=257, context_len=64)
    run = tmp_path_factory.mktemp("run")
    return str(save_checkpoint(run, 1, model, {}, to_dict(cfg), load_tokenizer("bytes"), keep=1))


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_generate_and_bench_infer_commands(checkpoint, capsys):
    from redline.training.checkpoint import load_for_inference

    code, out, err = run_cli(["generate", "--checkpoint", checkpoint, "--prompt", "Hello", "a b", "--temperature", "0",
                              "--max-new-tokens", "10", "--jsonl", "-", "--no-stop-at-eot"], capsys)
    assert code == 0, err
    model, tok, _ = load_for_inference(checkpoint)
    for record in map(json.loads, out.strip().splitlines()):
        ids = tok.encode(record["prompt"])
        assert record["completion"] == tok.decode(reference_greedy(model, ids, 10))
    code, out, err = run_cli(["bench-infer", "--checkpoint", checkpoint, "--batch-sizes", "2", "--prompt-lens", "8",
                              "--max-new-tokens", "4", "--repeats", "1", "--methods", "eager"], capsys)
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["results"][0]["status"] == "ok"


def test_export_names_value_embeddings(checkpoint, capsys, tmp_path):
    """No architecture redline exports to has them: a one-line error, nothing written."""
    code, _, err = run_cli(["export", checkpoint, "--out", str(tmp_path / "hf")], capsys)
    assert code != 0 and "model.value_embeddings=2" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "hf").exists()
