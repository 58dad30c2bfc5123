"""Native nanochat checkpoints (model_NNNNNN.pt + meta_NNNNNN.json, redline/interop/nanochat_checkpoint.py): tiny
random checkpoint folders of the current format (smear, backout, per-layer scalars, gated value embeddings, sliding
windows) and the original one, bf16 and fp32, with and without `_orig_mod.` prefixes, imported with `redline import`
and compared with an independent reference forward written here from nanochat's semantics: fp32 logits, and greedy
tokens through redline's engine (prefill whole and in spans, decode with the smear's cache, DecodeBatch);
`train --init-from` on the import; the one-line errors; export (the original format as transformers' NanoChat, the
current refused by name); the tokenizer pickle read without running it."""

from __future__ import annotations

import json
import pickle
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from redline import cli
from redline.inference import InferenceEngine, SamplingParams
from redline.inference.batch import DecodeBatch
from redline.training.checkpoint import load_for_inference
from tests.interop_models import VOCAB, byte_level_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# 4 layers: value embeddings on layers 1 and 3 (i % 2 == (n_layer - 1) % 2), backout after layer 2, window pattern
# SSSL: layers 0-2 see a short window of ceil(520 / 4 / 128) · 128 = 256 tokens back (257 with themselves), layer 3
# the whole context
META = {"sequence_len": 520, "vocab_size": VOCAB - 3, "n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 64}
SHORT = 256


def nanochat_state(current: bool, scalars: bool = True, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors of nanochat's shapes (the vocabulary padded to a multiple of 64)."""
    g = torch.Generator().manual_seed(seed)
    C, H, KV, L = (META[k] for k in ("n_embd", "n_head", "n_kv_head", "n_layer"))
    D, V = C // H, -(-META["vocab_size"] // 64) * 64

    def r(*shape, std=0.3):
        return torch.randn(*shape, generator=g) * std

    state = {"transformer.wte.weight": r(V, C, std=1.0), "lm_head.weight": r(V, C, std=0.5)}
    for i in range(L):
        p = f"transformer.h.{i}."
        state |= {p + "attn.c_q.weight": r(H * D, C), p + "attn.c_k.weight": r(KV * D, C),
                  p + "attn.c_v.weight": r(KV * D, C), p + "attn.c_proj.weight": r(C, C),
                  p + "mlp.c_fc.weight": r(4 * C, C), p + "mlp.c_proj.weight": r(C, 4 * C, std=0.1)}
        if current and i % 2 == (L - 1) % 2:
            state[p + "attn.ve_gate.weight"] = r(KV, 12, std=1.0)
            state[f"value_embeds.{i}.weight"] = r(V, KV * D, std=1.0)
    if current:
        state |= {"smear_gate.weight": r(1, 24, std=1.0), "smear_lambda": torch.tensor([0.7]),
                  "backout_lambda": torch.tensor([0.3])}
        if scalars:
            state |= {"resid_lambdas": 1 + r(L, std=0.2), "x0_lambdas": r(L, std=0.2)}
    return state


def write_folder(folder, state, step=100, prefix="", dtype=torch.float32, meta=None):
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({prefix + k: v.to(dtype) for k, v in state.items()}, folder / f"model_{step:06d}.pt")
    config = dict(META, **({"window_pattern": "SSSL"} if "smear_gate.weight" in state else {}), **(meta or {}))
    (folder / f"meta_{step:06d}.json").write_text(json.dumps({"step": step, "model_config": config}))
    return folder


# ----------------------------------------------------------------------------------------------------
# the reference: nanochat's gpt.py forward, restated from its semantics in plain fp32 torch


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float32).eps)


def _rotate(x, cos, sin):  # x (B, T, heads, D): nanochat's rotation by -θ of the two halves
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)


def reference_logits(state: dict, idx: torch.Tensor, pattern: str | None = None) -> torch.Tensor:
    s = {k: v.float() for k, v in state.items()}
    current = "smear_gate.weight" in s
    C, H, KV, L, V = (META[k] for k in ("n_embd", "n_head", "n_kv_head", "n_layer", "vocab_size"))
    D, (B, T) = C // H, idx.shape
    base, qk_scale = (100000.0, 1.2) if current else (10000.0, 1.0)
    pattern = pattern or ("SSSL" if current else "L")
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * base ** (-torch.arange(0, D, 2).float() / D)
    cos, sin = freqs.cos()[None, :, None], freqs.sin()[None, :, None]  # (1, T, 1, D/2)
    x = _rms(s["transformer.wte.weight"][idx])
    if current:  # the smear: each token's predecessor, through a gate on the first 24 channels
        gate = s["smear_lambda"] * torch.sigmoid(x[:, 1:, :24] @ s["smear_gate.weight"].T)
        x = torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)
    x0, mid = x, None
    i_, j_ = torch.arange(T)[:, None], torch.arange(T)[None, :]
    for i in range(L):
        p = f"transformer.h.{i}."
        if current:
            x = s.get("resid_lambdas", torch.ones(L))[i] * x + s.get("x0_lambdas", torch.zeros(L))[i] * x0
        h = _rms(x)
        q = (h @ s[p + "attn.c_q.weight"].T).view(B, T, H, D)
        k = (h @ s[p + "attn.c_k.weight"].T).view(B, T, KV, D)
        v = (h @ s[p + "attn.c_v.weight"].T).view(B, T, KV, D)
        if f"value_embeds.{i}.weight" in s:
            ve = s[f"value_embeds.{i}.weight"][idx].view(B, T, KV, D)
            v = v + 3 * torch.sigmoid(h[..., :12] @ s[p + "attn.ve_gate.weight"].T)[..., None] * ve
        q, k = _rms(_rotate(q, cos, sin)) * qk_scale, _rms(_rotate(k, cos, sin)) * qk_scale
        short = pattern[i % len(pattern)] == "S" and i < L - 1
        allowed = (j_ <= i_) & ((i_ - j_ <= SHORT) if short else True)  # flash-attn's window (SHORT, 0)
        k, v = k.repeat_interleave(H // KV, dim=2), v.repeat_interleave(H // KV, dim=2)
        scores = torch.einsum("bthd,bshd->bhts", q, k) / D ** 0.5
        att = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        y = torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, C)
        x = x + y @ s[p + "attn.c_proj.weight"].T
        u = _rms(x) @ s[p + "mlp.c_fc.weight"].T
        x = x + F.relu(u).square() @ s[p + "mlp.c_proj.weight"].T
        if i == L // 2:
            mid = x
    if current:
        x = x - s["backout_lambda"] * mid
    logits = (_rms(x) @ s["lm_head.weight"].T)[..., :V]
    return 15 * torch.tanh(logits / 15)


def reference_greedy(state, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(reference_logits(state, torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


# ----------------------------------------------------------------------------------------------------


def run_cli(argv, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    return byte_level_tokenizer(tmp_path_factory.mktemp("tok")) / "tokenizer.json"


def imported(tmp_path, state, tokenizer_json, capsys, **kw):
    folder = write_folder(tmp_path / "d4", state, **kw)
    code, out, err = run_cli(["import", folder, "--out", tmp_path / "ckpt", "--tokenizer", tokenizer_json], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    return model.float().eval()


IDX = torch.randint(0, META["vocab_size"], (2, 300), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("variant,dtype,prefix", [
    ("current", torch.float32, ""), ("current", torch.bfloat16, "_orig_mod."),
    ("current-without-scalars", torch.float32, "_orig_mod."), ("original", torch.bfloat16, ""),
])
def test_import_logits_equal_the_reference(variant, dtype, prefix, tmp_path, tokenizer_json, capsys):
    """300 tokens: past the short window (257), so the windowed layers differ from full attention."""
    state = nanochat_state(variant != "original", scalars=variant == "current")
    state = {k: v.to(dtype) for k, v in state.items()}  # the reference reads what the file holds
    model = imported(tmp_path, state, tokenizer_json, capsys, prefix=prefix, dtype=dtype)
    with torch.no_grad():
        got = model(IDX)
    expected = reference_logits(state, IDX)
    assert got.shape == expected.shape == (2, 300, META["vocab_size"])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_each_current_feature_changes_the_logits():
    """Without this the parity above could hold with a feature ignored on both sides."""
    state = nanochat_state(True)
    base = reference_logits(state, IDX[:, :280])
    for key, value in (("smear_lambda", 0.0), ("backout_lambda", 0.0), ("x0_lambdas", 0.0),
                       ("value_embeds.3.weight", 0.0)):
        changed = dict(state, **{key: state[key] * value})
        assert not torch.allclose(reference_logits(changed, IDX[:, :280]), base, atol=1e-3), key
    assert not torch.allclose(reference_logits(state, IDX[:, :280], pattern="L"), base, atol=1e-3)


@pytest.mark.parametrize("chunk", [32768, 7])
def test_engine_greedy_equals_the_reference(chunk, tmp_path, tokenizer_json, capsys):
    """Prefill whole or in spans of 7 tokens (each span's first token smeared with the cached one before it), then
    decode steps that read the previous token from the cache; a batch of prompts of different lengths, one of them
    past the short window, and DecodeBatch's rows."""
    state = nanochat_state(True)
    model = imported(tmp_path, state, tokenizer_json, capsys)
    prompts = [IDX[0, :270].tolist(), IDX[1, :5].tolist(), [7]]
    n = 6
    refs = [reference_greedy(state, p, n) for p in prompts]
    engine = InferenceEngine(model, dtype=torch.float64, compile=False, prefill_chunk_tokens=chunk)
    results = engine.generate(prompts, n, SamplingParams(temperature=0))
    assert [r.tokens for r in results] == refs
    batch = DecodeBatch(engine, rows=2, capacity=300)
    tokens = []
    for row, prompt in enumerate(prompts[1:]):
        if chunk < 32768 and len(prompt) > 2:  # a server's prompt in two spans: the second reads the cached id
            batch.prefill(row, prompt[:2])
        logits = batch.prefill(row, prompt[2:], start=2) if chunk < 32768 and len(prompt) > 2 else \
            batch.prefill(row, prompt)
        tokens.append([int(logits.argmax())])
        batch.start(row, tokens[-1][0], len(prompt))
    for _ in range(n - 1):
        step = batch.step()
        for row in range(2):
            tokens[row].append(int(step[row]))
    assert tokens == refs[1:]


def test_train_init_from_runs(tmp_path, tokenizer_json, capsys):
    """The smear, scalars, gates and tables are trained: each moves in two steps (AdamW for the 0-/1-D scalars)."""
    state = nanochat_state(True)
    imported(tmp_path, state, tokenizer_json, capsys)
    text = tmp_path / "text.txt"
    text.write_text("hello world, the model reads tokens and says hi\n\n" * 200)
    assert run_cli(["data", "prepare", "--inputs", text, "--out", tmp_path / "data", "--tokenizer",
                    tmp_path / "ckpt" / "tokenizer"], capsys)[0] == 0
    code, _, err = run_cli(["train", "--init-from", tmp_path / "ckpt", "--data.path", tmp_path / "data",
                            "max_steps=2", "seq_len=32", "batch_size=2", "eval_every=0", "eval_batches=1",
                            "sample_tokens=0", "device=cpu", "optim.warmup_steps=0", "optim.lr=1e-2",
                            f"out_dir={tmp_path}", "run_name=run"], capsys)
    assert code == 0, err
    from redline.training.checkpoint import list_checkpoints

    trained, _, _ = load_for_inference(list_checkpoints(tmp_path / "run")[-1])
    before, _, _ = load_for_inference(tmp_path / "ckpt")
    after, start = trained.state_dict(), before.state_dict()
    for name in ("smear_lambda", "smear_gate.weight", "resid_lambdas", "x0_lambdas", "backout_lambda",
                 "blocks.1.attn.ve_gate.weight", "value_embeds.0.weight"):
        assert not torch.equal(after[name], start[name]), name


# ----------------------------------------------------------------------------------------------------
# errors: one line, nothing written


def expect_error(argv, out, capsys, fragment):
    code, _, err = run_cli(argv, capsys)
    assert code == 2, err
    errors = [line for line in err.strip().splitlines() if "error:" in line]  # beside notices such as the pickle's
    assert len(errors) == 1 and fragment in errors[0], err
    assert not out.exists()


def test_errors(tmp_path, tokenizer_json, capsys):
    out = tmp_path / "ckpt"
    base = ["--out", out, "--tokenizer", tokenizer_json]
    folder = write_folder(tmp_path / "a", nanochat_state(True))
    (folder / "meta_000100.json").unlink()
    expect_error(["import", folder, *base], out, capsys, "has no meta_000100.json")
    folder = write_folder(tmp_path / "b", dict(nanochat_state(True), extra_thing=torch.zeros(3)))
    expect_error(["import", folder, *base], out, capsys, "tensors extra_thing have no place")
    state = nanochat_state(True)
    state["transformer.h.1.mlp.c_fc.weight"] = state["transformer.h.1.mlp.c_fc.weight"][:100]
    folder = write_folder(tmp_path / "c", state)
    expect_error(["import", folder, *base], out, capsys, "blocks.1.mlp.fc.weight has shape (100, 64)")
    folder = write_folder(tmp_path / "d", nanochat_state(True))
    expect_error(["import", folder, "--step", "5", *base], out, capsys,
                 "has no step 5 (model_000005.pt); its steps: 100")
    state = nanochat_state(True)
    del state["smear_gate.weight"]
    folder = write_folder(tmp_path / "e", state)
    expect_error(["import", folder, *base], out, capsys, "without smear_gate.weight")
    expect_error(["import", tmp_path / "d", "--out", out], out, capsys, "give --tokenizer PATH")


def test_several_steps_take_the_latest_and_say_so(tmp_path, tokenizer_json, capsys):
    folder = write_folder(tmp_path / "d4", nanochat_state(True, seed=1), step=100)
    write_folder(folder, nanochat_state(True, seed=2), step=200)
    code, _, err = run_cli(["import", folder, "--out", tmp_path / "latest", "--tokenizer", tokenizer_json], capsys)
    assert code == 0 and "holds steps 100, 200; importing the latest, 200" in err, err
    code, _, err = run_cli(["import", folder, "--step", "100", "--out", tmp_path / "first", "--tokenizer",
                            tokenizer_json], capsys)
    assert code == 0, err
    for name, seed in (("latest", 2), ("first", 1)):
        model = load_for_inference(tmp_path / name)[0].float()
        with torch.no_grad():
            torch.testing.assert_close(model(IDX[:, :20]), reference_logits(nanochat_state(True, seed=seed),
                                                                             IDX[:, :20]), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------------
# export


def test_export_refuses_the_current_format_by_name(tmp_path, tokenizer_json, capsys):
    imported(tmp_path, nanochat_state(True), tokenizer_json, capsys)
    code, _, err = run_cli(["export", tmp_path / "ckpt", "--out", tmp_path / "hf"], capsys)
    assert code == 2 and "model.value_embed_layers" in err and len(err.strip().splitlines()) == 1, err


def test_original_format_exports_as_transformers_nanochat(tmp_path, tokenizer_json, capsys):
    transformers = pytest.importorskip("transformers")
    state = nanochat_state(False)
    imported(tmp_path, state, tokenizer_json, capsys)
    code, _, err = run_cli(["export", tmp_path / "ckpt", "--out", tmp_path / "hf", "--dtype", "fp32"], capsys)
    assert code == 0, err
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(hf).__name__ == "NanoChatForCausalLM"
    with torch.no_grad():
        got = hf.eval()(IDX[:, :40]).logits[..., :META["vocab_size"]]
    torch.testing.assert_close(got, reference_logits(state, IDX[:, :40]), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------------
# the tokenizer pickle


def test_tokenizer_pickle_read_as_its_state_alone(tmp_path, tokenizer_json, capsys, monkeypatch):
    """nanochat's tokenizer.pkl is a pickled tiktoken.Encoding; tiktoken pickles its state (name, pattern, ranks,
    special tokens). A stand-in class of that name writes such a pickle here (tiktoken need not be installed): the
    import reads the state without the class, and a pickle naming anything else is refused."""
    from tokenizers import Tokenizer

    from redline.interop.tokenizer_files import _GPT2_PATTERNS, _byte_alphabet

    data = json.loads(tokenizer_json.read_text())
    unspell = {c: b for b, c in enumerate(_byte_alphabet())}
    specials = {t["content"]: t["id"] for t in data["added_tokens"]}
    ranks = {bytes(unspell[c] for c in t): i - len(specials) for t, i in data["model"]["vocab"].items()
             if t not in specials}
    names = ("<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>")
    moved = {name: len(ranks) + k for k, name in enumerate(names)}  # nanochat's specials (some of them)

    module = types.ModuleType("tiktoken.core")

    class Encoding:
        def __getstate__(self):
            return {"name": "nanochat", "pat_str": _GPT2_PATTERNS[1], "mergeable_ranks": ranks,
                    "special_tokens": moved}

    Encoding.__module__, Encoding.__qualname__ = "tiktoken.core", "Encoding"
    module.Encoding = Encoding
    package = types.ModuleType("tiktoken")
    package.core = module
    monkeypatch.setitem(sys.modules, "tiktoken", package)
    monkeypatch.setitem(sys.modules, "tiktoken.core", module)
    base = tmp_path / "cache"
    (base / "tokenizer").mkdir(parents=True)
    (base / "tokenizer" / "tokenizer.pkl").write_bytes(pickle.dumps(Encoding()))
    monkeypatch.delitem(sys.modules, "tiktoken.core")  # the import must not need it
    monkeypatch.delitem(sys.modules, "tiktoken")

    folder = write_folder(base / "base_checkpoints" / "d4", nanochat_state(True))  # nanochat's layout
    code, _, err = run_cli(["import", folder, "--out", tmp_path / "ckpt"], capsys)
    assert code == 0, err
    assert "loading the tokenizer pickle" in err and "tokenizer.pkl" in err
    _, tok, _ = load_for_inference(tmp_path / "ckpt")
    original = Tokenizer.from_file(str(tokenizer_json))
    text = "hello world, the model says hi"
    assert tok.encode(text) == [i - len(specials) for i in original.encode(text, add_special_tokens=False).ids]
    assert tok.encode_prompt(text) == [moved["<|bos|>"], *tok.encode(text)]  # nanochat's prompts begin so
    assert tok.stop_ids == [moved["<|assistant_end|>"], moved["<|bos|>"]]
    from redline.chat.template import template_for

    text = template_for(tok).render([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}],
                                    add_generation_prompt=True)
    assert text == ("<|bos|><|user_start|>be brief\n\nhi<|user_end|><|assistant_start|>hello<|assistant_end|>"
                    "<|user_start|>bye<|user_end|><|assistant_start|>")  # nanochat's render_conversation

    code, out, err = run_cli(["generate", "--checkpoint", tmp_path / "ckpt", "--prompt", "hello world",
                              "--temperature", "0", "--max-new-tokens", "4", "--jsonl", "-", "--device", "cpu"],
                             capsys)
    assert code == 0, err
    row = json.loads(out.strip().splitlines()[-1])
    prompt = [moved["<|bos|>"], *tok.encode("hello world")]
    assert row["prompt_tokens"] == len(prompt)
    reference = reference_greedy(nanochat_state(True), prompt, 4)
    stop = next((k for k, t in enumerate(reference) if t in tok.stop_ids), len(reference))
    assert row["completion_tokens"] == stop and row["completion"] == tok.decode(reference[:stop])

    (base / "tokenizer" / "evil.pkl").write_bytes(pickle.dumps(types.SimpleNamespace(a=1)))
    expect_error(["import", folder, "--out", tmp_path / "no", "--tokenizer", base / "tokenizer" / "evil.pkl"],
                 tmp_path / "no", capsys, "names types.SimpleNamespace")


# ----------------------------------------------------------------------------------------------------
# the config fields


@pytest.mark.parametrize("fields,fragment", [
    (dict(value_embed_layers=(3, 1)), "model.value_embed_layers=(3, 1) must name distinct layers"),
    (dict(value_embed_layers=(1,), value_embeddings=1), "without model.value_embeddings"),
    (dict(value_embed_gate=12), "model.value_embed_gate gates value embeddings"),
    (dict(smear_gate=100), "each in [0, n_embd=64]"),
    (dict(smear_gate=24, pos_emb="learned"), "model.smear_gate with model.pos_emb=learned"),
])
def test_config_refuses_inconsistent_fields(fields, fragment):
    from redline.errors import UserError
    from redline.model import ModelConfig

    with pytest.raises(UserError, match=None) as exc:
        ModelConfig(vocab_size=64, context_len=32, n_layer=4, n_embd=64, n_head=4, **fields).validate()
    assert fragment in str(exc.value)


def test_copied_prefix_carries_the_smears_token(tmp_path, tokenizer_json, capsys):
    """A server reusing a cached prefix (DecodeBatch.copy_prefix) copies each slot's token id with the keys and
    values: the first token prefilled after the copy smears in the copied prefix's last token."""
    state = nanochat_state(True)
    model = imported(tmp_path, state, tokenizer_json, capsys)
    first, second = IDX[0, :12].tolist(), IDX[0, :8].tolist() + IDX[1, :5].tolist()
    batch = DecodeBatch(InferenceEngine(model, dtype=torch.float64, compile=False), rows=2, capacity=64)
    batch.prefill(0, first)
    batch.hold(0, first)
    batch.copy_prefix(0, 1, 8)
    logits = batch.prefill(1, second[8:], start=8)
    assert int(logits.argmax()) == reference_greedy(state, second, 1)[0]
    expected = reference_logits(state, torch.tensor([second]))[0, -1].double()
    torch.testing.assert_close(logits.double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_engine_and_training_step(tmp_path, tokenizer_json, capsys):
    """On a GPU: the compiled, graph-captured engine (the smear's token read from the cache inside the captured
    decode, the stream scalars and backout between its blocks) decodes the reference's greedy tokens in fp32, at
    batch 3 and 1 and on a replay; the compiled training step's loss and gradients match eager ones."""
    state = nanochat_state(True)
    model = imported(tmp_path, state, tokenizer_json, capsys).cuda()
    prompts = [IDX[0, :270].tolist(), IDX[1, :5].tolist(), [7]]
    refs = [reference_greedy(state, p, 12) for p in prompts]
    engine = InferenceEngine(model, dtype=torch.float32, compile=True, cuda_graphs=True)
    for _ in range(2):  # the second call replays the captured graphs
        assert [r.tokens for r in engine.generate(prompts, 12, SamplingParams(temperature=0))] == refs
    assert engine.generate(prompts[1:2], 12, SamplingParams(temperature=0))[0].tokens == refs[1]
    model.train()
    idx = IDX[:, :64].cuda()
    params = [model.smear_lambda, model.backout_lambda, model.blocks[3].attn.ve_gate.weight]
    loss = model(idx, idx)
    grads = torch.autograd.grad(loss, params)
    loss_c = torch.compile(lambda: model(idx, idx))()
    grads_c = torch.autograd.grad(loss_c, params)
    torch.testing.assert_close(loss_c, loss, rtol=1e-4, atol=1e-4)
    for g, gc in zip(grads, grads_c):
        torch.testing.assert_close(gc, g, rtol=1e-3, atol=1e-5)
