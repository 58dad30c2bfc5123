"""The FP4 experiment: the built-in `fp4` recipe (pretraining, then LoRA and QLoRA fine-tunes of each base) and
the source design's FP4 and GQA claims with their verdicts; a tiny sweep of the same shape end to end (slow)."""

import json

import pytest

from redline.experiments.claims import evaluate_claims, load_claims
from redline.experiments.recipes import expand, load_recipe, resolve_train_config


def test_fp4_recipe_fine_tunes_start_from_pretrained_runs_of_the_same_sweep(tmp_path):
    runs = expand(load_recipe("fp4"))
    ids = {r.run_id for r in runs}
    tunes = [r for r in runs if "lora" in r.variant]
    assert {r.variant for r in tunes} == {"lora-mha", "qlora-mha", "lora-gqa", "qlora-gqa"}
    order = [r.run_id for r in runs]
    for run in tunes:
        cfg = resolve_train_config(run.config_file_contents(tmp_path))
        base = cfg.init_from.removeprefix(str(tmp_path) + "/")
        assert base in ids and order.index(base) < order.index(run.run_id)  # pretrained first, same sweep
        assert cfg.lora.enabled and cfg.lora.quantize == ("nf4" if run.variant.startswith("q") else "none")
        assert base.split("__")[1:] == run.run_id.split("__")[1:]  # its own size, precision, batch and seed
    mha = [r for r in runs if r.variant.startswith("pretrain-mha")]
    for run in mha:  # MHA: as many KV heads as query heads at each size
        cfg = resolve_train_config(run.config_file_contents(tmp_path))
        assert cfg.model.kv_heads == cfg.model.n_head


def _run(variant, seed, memory, speed, loss):
    return {"variant": variant, "preset": "modern-124m", "precision": "bf16", "batch_size": 16, "seq_len": 1024,
            "seed": seed, "status": "completed", "peak_memory_gib": memory, "tokens_per_second": speed,
            "final_val_loss": loss}


def test_fp4_claims_get_verdicts():
    claims = [c for c in load_claims() if c.id.startswith(("fp4-", "gqa-fp4-", "gqa-lora-"))]
    assert {c.id for c in claims} == {"fp4-memory", "fp4-speed", "fp4-quality", "gqa-fp4-memory", "gqa-fp4-speed",
                                      "gqa-lora-speed", "gqa-lora-quality"}
    memory = next(c for c in claims if c.id == "fp4-memory")
    lo, hi = memory.band()
    assert lo == pytest.approx(0.25, abs=0.01) and hi == pytest.approx(0.40, abs=0.01)  # a 60-75% reduction
    runs = [_run("lora-mha", s, 20.0 + s * 0.01, 1000 + s, 3.00) for s in (1, 2, 3)]
    runs += [_run("qlora-mha", s, 6.5 + s * 0.01, 800 + s, 3.06) for s in (1, 2, 3)]  # 32% memory, slower
    rows = {r["id"]: r for r in evaluate_claims(runs, claims)}
    assert rows["fp4-memory"]["verdict"] == "confirmed"
    assert rows["fp4-speed"]["verdict"] == "refuted"  # 0.8× is outside +10-20%
    assert rows["gqa-lora-speed"]["verdict"] == "not measured"


@pytest.mark.slow
def test_tiny_fp4_sweep_end_to_end(tmp_path):
    """The fp4 recipe's shape at the tiny preset on a CPU: pretraining, LoRA and QLoRA fine-tunes, claims."""
    from redline.commands import sweep

    data = load_recipe("fp4").to_dict()
    recipe = {"name": "fp4-tiny", "presets": ["tiny"], "precision": ["fp32"], "batch": [[4, 64]], "seeds": [1],
              "budget": {"max_steps": 4}, "keep_checkpoints": True, "baseline": {"variant": "lora-mha"},
              "set": {"compile": False, "eval_every": 0, "eval_batches": 2, "log_every": 2, "device": "cpu"},
              "variants": [{"name": "pretrain-mha-tiny", "set": {"model.n_kv_head": 6, "max_steps": 6}},
                           {"name": "pretrain-gqa", "set": {"max_steps": 6}}]
              + [{"name": v["name"], "set": v["set"]} for v in data["variants"] if "lora" in v["name"]]}
    import yaml

    path = tmp_path / "fp4-tiny.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert sweep.main([str(path), "--out", str(tmp_path / "s")]) == 0
    results = [json.loads(line) for line in (tmp_path / "s" / "results.jsonl").read_text().splitlines()]
    assert {r["variant"]: r["status"] for r in results} == {v["name"]: "completed" for v in recipe["variants"]}
    rows = [r for r in evaluate_claims(results) if r["id"] == "fp4-quality"]
    assert rows and rows[0]["verdict"] in ("confirmed", "refuted", "inconclusive")
