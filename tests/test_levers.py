"""The time-to-quality levers (issue 26) on a tiny model: each option changes the math as its reference formula
says, its default leaves the model as it was, and a run with all of them resumes bit for bit."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from redline.config import OptimConfig, TrainConfig, parse
from redline.data.loader import TokenLoader
from redline.data.prepare import load_meta
from redline.data.shards import read_shard
from redline.errors import UserError
from redline.model import GPT, ModelConfig
from redline.training import checkpoint as ckpt_io
from redline.training.loop import train
from redline.training.optim import build_optimizers, lr_multiplier
from tests.test_train import config, dataset, train_losses, train_stopped_at  # noqa: F401  (the session-scoped prepared corpus)

SMALL = ModelConfig(vocab_size=101, context_len=32, n_layer=4, n_embd=32, n_head=4, n_kv_head=2)
CPU = torch.device("cpu")


def small(**kw) -> ModelConfig:
    return replace(SMALL, **kw)


def tokens(seed: int = 0, shape=(2, 11)) -> torch.Tensor:
    return torch.randint(0, 101, shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------------
# architecture


def test_relu2_mlp_is_relu_squared():
    torch.manual_seed(0)
    model = GPT(small(mlp="relu2"))
    mlp, x = model.blocks[0].mlp, torch.randn(2, 5, 32)
    torch.testing.assert_close(mlp(x), mlp.proj(F.relu(mlp.fc(x)) ** 2))
    assert mlp.fc.out_features == 4 * 32  # 4·n_embd wide, as GELU's


def test_logit_softcap_is_tanh_of_the_uncapped_logits():
    torch.manual_seed(0)
    plain = GPT(small())
    capped = GPT(small(logit_softcap=1.5))
    capped.load_state_dict(plain.state_dict())
    idx = tokens()
    torch.testing.assert_close(capped(idx), 1.5 * torch.tanh(plain(idx).float() / 1.5))
    assert capped(idx).abs().max() < 1.5


def test_zero_init_projections_make_every_block_the_identity():
    torch.manual_seed(0)
    model = GPT(small(zero_init_proj=True))
    idx = tokens()
    x, _ = model.embed(idx)
    expected = model.lm_head(model.norm_f(x))[..., :101]
    torch.testing.assert_close(model(idx), expected)  # no block changes the residual stream at step 0
    default = GPT(small())
    assert default.blocks[0].attn.proj.weight.std() > 0  # the default keeps GPT-2's scaled normal


def test_untied_head_is_its_own_matrix():
    assert GPT(small(tie_embeddings=False)).lm_head.weight is not GPT(small(tie_embeddings=False)).wte.weight
    tied = GPT(small(tie_embeddings=True))
    assert tied.lm_head.weight is tied.wte.weight


def test_value_embeddings_pair_the_first_and_last_layers():
    model = GPT(small(n_layer=5, value_embeddings=2))
    assert [model.value_table(i) for i in range(5)] == [0, 1, None, 0, 1]
    assert len(model.value_embeds) == 2 and model.value_embeds[0].weight.shape == (128, 2 * 8)  # KV·D wide
    assert [b.attn.ve_mix is not None for b in model.blocks] == [True, True, False, True, True]
    plain = GPT(small(n_layer=5))
    tables = sum(t.weight.numel() for t in model.value_embeds)
    assert model.num_params() == plain.num_params() + tables + 4 * 2  # the tables and two scalars a layer
    assert model.num_params(embeddings=False) == plain.num_params(embeddings=False) + 4 * 2
    assert GPT(small()).value_embeds is not None and len(GPT(small()).value_embeds) == 0  # off by default
    with pytest.raises(UserError, match="value_embeddings must be in"):
        GPT(small(n_layer=4, value_embeddings=3))


def test_value_embeddings_mix_into_v():
    """λ = (1, 0) is the model without them; λ = (0.5, 0.5) adds the table's row to v as the formula says."""
    torch.manual_seed(0)
    plain = GPT(small(n_layer=2))
    with_ve = GPT(small(n_layer=2, value_embeddings=1))
    missing, unexpected = with_ve.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all("value_embeds" in k or "ve_mix" in k for k in missing)
    idx = tokens()
    assert not torch.allclose(with_ve(idx), plain(idx))  # 0.5·v + 0.5·ve at initialisation
    with torch.no_grad():
        for block in with_ve.blocks:
            block.attn.ve_mix.copy_(torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(with_ve(idx), plain(idx))
    # one layer against the formula: v of the projection, mixed with the table's rows
    attn, x = with_ve.blocks[0].attn, torch.randn(2, 11, 32)
    with torch.no_grad():
        attn.ve_mix.copy_(torch.tensor([0.3, 0.7]))
    ve = with_ve.value_embeds[0](idx)
    _, _, v = attn.project_qkv(x, None, ve)
    _, _, v_raw = attn.project(x)
    torch.testing.assert_close(v, (0.3 * v_raw + 0.7 * ve).view(2, 11, 2, 8).transpose(1, 2))
    loss = with_ve(idx, idx)
    loss.backward()
    assert with_ve.value_embeds[0].weight.grad.abs().sum() > 0 and with_ve.blocks[0].attn.ve_mix.grad is not None


def test_value_embeddings_after_meta_device_init_and_in_the_engine():
    with torch.device("meta"):
        model = GPT(small(value_embeddings=2))
    model.to_empty(device="cpu")
    model.reset_parameters()
    assert all(torch.equal(b.attn.ve_mix, torch.full((2,), 0.5)) for b in model.blocks if b.attn.ve_mix is not None)
    from redline.inference.engine import InferenceEngine  # tests/test_inference_value_embeddings.py has the rest

    prompt = tokens(shape=(1, 3))
    full = model.generate(prompt, 4, temperature=0.0)
    assert InferenceEngine(model).generate(prompt.tolist(), 4)[0].tokens == full[0, 3:].tolist()


# ----------------------------------------------------------------------------------------------------
# optimizer and schedule


def test_embedding_and_head_learning_rates():
    model = GPT(small(value_embeddings=1))
    default = build_optimizers(model, OptimConfig(), CPU)
    assert len(default[0].param_groups) == 2  # the layout earlier checkpoints hold
    adam = build_optimizers(model, OptimConfig(embed_lr=0.3, head_lr=0.004, lr=1e-3), CPU)[0]
    by_id = {id(p): g["lr"] for g in adam.param_groups for p in g["params"]}
    assert by_id[id(model.lm_head.weight)] == 0.004
    assert by_id[id(model.wte.weight)] == by_id[id(model.value_embeds[0].weight)] == 0.3
    assert by_id[id(model.blocks[0].attn.qkv.weight)] == by_id[id(model.blocks[0].norm1.weight)] == 1e-3
    muon, adam = build_optimizers(model, OptimConfig(name="muon", embed_lr=0.3), CPU)
    assert {g["lr"] for g in adam.param_groups} == {0.3, 1e-3}  # the head (and gains) stay at lr
    assert all(g["initial_lr"] == g["lr"] for g in adam.param_groups)  # what the schedule scales
    tied = GPT(small(tie_embeddings=True))
    groups = build_optimizers(tied, OptimConfig(embed_lr=0.3, head_lr=0.004), CPU)[0].param_groups
    assert sum(id(tied.wte.weight) in {id(p) for p in g["params"]} for g in groups) == 1  # the tied matrix once
    with pytest.raises(UserError, match="embed_lr"):
        OptimConfig(embed_lr=0.0).validate()


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_the_embeddings_and_head_can_go_without_weight_decay(name):
    model = GPT(small(value_embeddings=1))
    optimizers = build_optimizers(model, OptimConfig(name=name, embed_weight_decay=0.0, weight_decay=0.1), CPU)
    decay = {id(p): g["weight_decay"] for opt in optimizers for g in opt.param_groups for p in g["params"]}
    assert decay[id(model.wte.weight)] == decay[id(model.lm_head.weight)] == decay[id(model.value_embeds[0].weight)] == 0
    assert decay[id(model.blocks[0].attn.qkv.weight)] == 0.1 and decay[id(model.blocks[0].norm1.weight)] == 0
    with pytest.raises(UserError, match="embed_weight_decay"):
        OptimConfig(embed_weight_decay=-1.0).validate()


def test_warmup_stable_decay_schedule():
    cfg = OptimConfig(schedule="wsd", warmup_steps=10, decay_fraction=0.4, min_lr_ratio=0.0)
    assert lr_multiplier(cfg, 0, 0.0) == pytest.approx(0.1) and lr_multiplier(cfg, 9, 0.009) == 1.0
    assert [lr_multiplier(cfg, 100, p) for p in (0.1, 0.6)] == [1.0, 1.0]  # the long constant phase
    assert lr_multiplier(cfg, 100, 0.8) == pytest.approx(0.5) and lr_multiplier(cfg, 100, 1.0) == 0.0  # linear


# ----------------------------------------------------------------------------------------------------
# rows aligned to document starts


def test_aligned_rows_start_at_each_document(dataset):  # noqa: F811
    eot = load_meta(dataset)["tokenizer"]["eot_id"]
    stream = np.concatenate([read_shard(dataset / n) for n in load_meta(dataset)["splits"]["train"]["shards"]])
    loader = TokenLoader(dataset, "train", batch_size=4, seq_len=64, seed=0, align_to_documents=True)
    separators = set(np.flatnonzero(stream == eot).tolist())
    starts = loader.starts.tolist()
    assert starts == sorted(starts) and starts[0] == 0
    # every document start (token 0 and each separator before a document) opens a window ...
    assert {0} | {s for s in separators if s + 65 <= stream.size} <= set(starts)
    # ... and the others continue a long document every 64 tokens, with no separator at their first token
    for s in set(starts) - separators - {0}:
        assert s - 64 in starts and eot not in stream[s - 64 + 1 : s + 1]
    x, y = loader.next_batch()
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        s = next(s for s in starts if stream[s : s + 64].tolist() == row_x)
        assert stream[s + 1 : s + 65].tolist() == row_y
    plain = TokenLoader(dataset, "train", batch_size=4, seq_len=64, seed=0)
    assert plain.starts is None and loader.num_windows > plain.num_windows  # documents of ~3 windows each
    with pytest.raises(UserError, match="align_rows"):
        plain.load_state_dict(loader.state_dict())


def test_a_run_with_every_lever_resumes_exactly(dataset, tmp_path, monkeypatch):  # noqa: F811
    extra = ("optim.name=muon", "optim.schedule=wsd", "optim.decay_fraction=0.5", "optim.min_lr_ratio=0.0",
             "optim.muon_momentum_warmup_steps=5", "optim.embed_lr=3e-3", "optim.head_lr=1e-3", "model.mlp=relu2",
             "model.zero_init_proj=True", "model.logit_softcap=15.0", "model.value_embeddings=1",
             "data.align_rows=True")
    straight = train(config(dataset, tmp_path / "a", *extra))
    first = train_stopped_at(config(dataset, tmp_path / "b", *extra), 6, monkeypatch)
    second = train(config(dataset, tmp_path / "b", *extra), resume_from=ckpt_io.list_checkpoints(first.run_dir)[-1])
    a, b = train_losses(straight.run_dir), train_losses(second.run_dir)
    assert second.step == 12 and a == b and all(math.isfinite(v) for v in a.values())
    assert a[12] < a[1]


def test_the_fast_recipe_combines_the_levers():
    cfg = parse(TrainConfig, ["--recipe", "fast"], prog="t", description="t")
    m, o = cfg.model, cfg.optim
    assert cfg.preset == "modern-124m" and (m.mlp, m.zero_init_proj, m.logit_softcap) == ("relu2", True, 15.0)
    assert m.tie_embeddings and m.qk_norm and m.value_embeddings == 3 and not cfg.data.align_rows
    assert (o.name, o.schedule, o.min_lr_ratio, o.muon_momentum_start, o.muon_momentum) == \
        ("muon", "wsd", 0.0, 0.85, 0.95)
    assert 0 < o.decay_fraction < 1 and o.muon_momentum_warmup_steps > 0
    assert cfg.seq_ramp_steps == 100 and not cfg.batch_ramp_steps


def test_modern_124m_trains_what_adamw_trains_beside_muon_at_ten_times_its_rate(tmp_path):
    """modern-124m's default: the tied table and the 1-D gains at AdamW 1e-2 beside Muon (optim.lr stays the size's
    1e-3, for a switch to AdamW), modern-350m's at 6e-3 (its lr 6e-4); the unmeasured larger presets keep their
    rate; the `adamw` recipe and the sweeps measured before it put both back at optim.lr (a recipe writes "None", as
    the command line does)."""
    cfg = parse(TrainConfig, ["--preset", "modern-124m"], prog="t", description="t")
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.head_lr, cfg.optim.gain_lr) == ("muon", 1e-3, 1e-2, 1e-2)
    o = parse(TrainConfig, ["--preset", "modern-350m"], prog="t", description="t").optim
    assert (o.lr, o.head_lr, o.gain_lr) == (6e-4, 6e-3, 6e-3)
    for argv in (["--preset", "modern-774m"], ["--preset", "gpt2-350m"], ["--recipe", "adamw"]):
        o = parse(TrainConfig, argv, prog="t", description="t").optim
        assert o.head_lr is None and o.gain_lr is None, argv
    tiny = ModelConfig(vocab_size=64, context_len=16, n_layer=1, n_head=2, n_embd=16, tie_embeddings=True)
    model = GPT(tiny)
    adam = build_optimizers(model, cfg.optim, CPU)[1]
    n_gains = sum(p.numel() for p in model.parameters() if p.dim() < 2)
    assert n_gains and sorted((g["lr"], sum(p.numel() for p in g["params"])) for g in adam.param_groups) == \
        sorted([(1e-2, 128 * 16), (1e-2, n_gains)])  # the (padded) table and the gains; nothing at optim.lr
    # AdamW alone (no Muon): the gains' group at gain_lr, the rest at lr
    groups = build_optimizers(model, OptimConfig(lr=1e-3, gain_lr=5e-3), CPU)[0].param_groups
    assert sorted((g["lr"], g["weight_decay"]) for g in groups) == [(1e-3, 0.1), (5e-3, 0.0)]
    # Prodigy shares one estimated step size at lr 1: rates set for AdamW beside Muon do not scale it
    prodigy = build_optimizers(model, replace(cfg.optim, name="prodigy"), CPU)[0]
    assert {g["lr"] for g in prodigy.param_groups} == {1.0}
    for name in ("quality", "ablations", "batch"):
        assert all(c.optim.head_lr is None and c.optim.gain_lr is None
                   for c in _variant_configs(name, tmp_path).values()), name


# ----------------------------------------------------------------------------------------------------
# the sweeps that measure the levers and the source design's quality claims


def _variant_configs(recipe_name: str, tmp_path) -> dict[str, TrainConfig]:
    from redline.experiments.recipes import expand, load_recipe, resolve_train_config

    runs = expand(load_recipe(recipe_name))
    return {(r.variant, r.seed): resolve_train_config(r.config_file_contents(tmp_path)) for r in runs}


def _differences(a, b, prefix="") -> set[str]:
    from redline.config import to_dict

    da, db = (to_dict(x) if not isinstance(x, dict) else x for x in (a, b))
    out = set()
    for key in da:
        if isinstance(da[key], dict):
            out |= _differences(da[key], db[key], f"{prefix}{key}.")
        elif da[key] != db[key]:
            out.add(prefix + key)
    return out


def test_the_levers_sweep_changes_one_thing_of_the_fast_recipe_at_a_time(tmp_path):
    from redline.experiments.recipes import load_recipe

    recipe = load_recipe("levers")
    configs = _variant_configs("levers", tmp_path)
    assert {seed for _, seed in configs} == {1, 2, 3} and recipe.budget == {"max_time": 1.1}
    fast = configs[("fast", 1)]
    trained = parse(TrainConfig, ["--recipe", "fast"], prog="t", description="t")
    assert fast.model == trained.model and fast.optim == trained.optim  # the sweep's [set] is the fast recipe
    assert (fast.seq_ramp_steps, fast.batch_ramp_steps) == (trained.seq_ramp_steps, trained.batch_ramp_steps)
    for (variant, seed), cfg in configs.items():
        if seed != 1 or variant == "fast":
            continue
        changed = _differences(fast, cfg) - {"run_name"}
        layout = {"model.tie_embeddings", "optim.embed_lr", "optim.head_lr", "optim.embed_weight_decay"}
        assert len(changed) == 1 or changed == {"batch_size", "seq_len"} or (
            variant == "lever-untied-nanochat" and changed == layout), (variant, changed)
    by_claim = {c.id: c for c in __import__("redline.experiments.claims", fromlist=["x"]).load_claims()}
    levers = {v.name for v in recipe.variants} - {"fast"}
    claimed = {side["variant"] for c in by_claim.values() if c.id.startswith("lever-")
               for side in (c.treatment, c.control)}
    assert levers <= claimed  # every lever has its verdict


def test_the_quality_sweep_measures_the_source_design_claims_at_30m_tokens(tmp_path):
    from redline.experiments.claims import evaluate_claims, load_claims
    from redline.experiments.recipes import load_recipe

    recipe = load_recipe("quality")
    configs = _variant_configs("quality", tmp_path)
    base = configs[("baseline", 1)]
    assert recipe.budget["max_steps"] * base.batch_size * base.effective_seq_len >= 30_000_000
    assert len(recipe.seeds) == 3
    # synthetic results with the sweep's variants: every quality claim finds both of its sides
    runs = [{"status": "completed", "variant": v, "preset": "modern-124m", "precision": "bf16", "batch_size": 16,
             "seq_len": 2048, "seed": s, "final_val_loss": 3.0 + 0.01 * s + (0.2 if v == "mqa" else 0.0),
             "tokens_per_second": 4e5 + s, "peak_memory_gib": 10.0} for v, s in configs]
    rows = {r["id"]: r for r in evaluate_claims(runs, load_claims())}
    for claim in ("qk-norm-perplexity", "mqa-perplexity", "gqa-quality", "swiglu-quality", "rope-quality"):
        assert rows[claim]["verdict"] in ("confirmed", "refuted", "inconclusive"), rows[claim]
        assert rows[claim]["n"] == [3, 3]
    assert rows["mqa-perplexity"]["measured_ratio"] == pytest.approx(math.exp(0.2))
    assert rows["lever-muon"]["verdict"] == "not measured"  # the levers sweep's claims need its own runs


def test_lever_claims_get_verdicts_from_the_levers_sweep(tmp_path):
    from redline.experiments.claims import evaluate_claims, load_claims

    configs = _variant_configs("levers", tmp_path)
    worse = {"lever-adamw": 0.3, "lever-no-softcap": 0.0}  # what each variant adds to the validation loss

    def run(variant, seed, cfg):
        return {"status": "completed", "variant": variant, "preset": "modern-124m", "precision": "bf16",
                "batch_size": cfg.batch_size, "seq_len": cfg.effective_seq_len, "seed": seed,
                "final_val_loss": 3.0 + 0.001 * seed + worse.get(variant, 0.01), "tokens_per_second": 4e5,
                "peak_memory_gib": 10.0}

    rows = {r["id"]: r for r in evaluate_claims([run(v, s, c) for (v, s), c in configs.items()], load_claims())}
    assert rows["lever-muon"]["verdict"] == "confirmed" and rows["lever-muon"]["measured_ratio"] < 1
    assert rows["lever-softcap"]["verdict"] == "refuted"  # the same loss with it as without: it does not pay
    assert rows["lever-seq-2048"]["n"] == [3, 3]  # its sides differ in batch shape and still meet
    assert rows["qk-norm-perplexity"]["verdict"] == "not measured" and rows["qk-norm-perplexity"]["absent"]
    # every lever claim is the levers sweep's own: none is counted among other recipes' claims
    assert not any(r.get("absent") for i, r in rows.items() if i.startswith("lever-"))


def test_claims_of_other_recipes_are_counted_not_listed(tmp_path, capsys, monkeypatch):
    """`redline claims DIR` on a sweep with half a claim (one side ran) lists it; claims none of whose runs is
    there are counted in one line, and listed with --all. The report's table does the same."""
    from redline.commands import claims
    from redline.experiments.claims import claims_markdown, evaluate_claims, load_claims

    records = [{"run_id": f"fast-{seed}", "status": "completed", "variant": "fast", "preset": "modern-124m",
                "precision": "bf16", "batch_size": 32, "seq_len": 1024, "seed": seed, "final_val_loss": 3.0,
                "tokens_per_second": 4e5, "peak_memory_gib": 10.0} for seed in (1, 2)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setenv("COLUMNS", "300")  # one line a row

    def table(argv):  # the printed table (the JSON line after it holds every claim)
        assert claims.main(argv) == 0
        return "".join(line for line in capsys.readouterr().out.splitlines(True) if not line.startswith("{"))

    shown = table([str(tmp_path)])
    assert "vs AdamW" in shown and "QK-norm gives 4" not in shown  # lever-muon: its fast side ran
    assert re.search(r"\d+ claim\(s\) of other recipes not listed", shown)
    assert "QK-norm gives 4" in table([str(tmp_path), "--all"])
    table = claims_markdown(evaluate_claims(records, load_claims()))
    assert "vs AdamW" in table and "QK-norm gives 4" not in table and "of other recipes are not listed" in table
