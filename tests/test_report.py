"""Statistics against hand-computed values, claim verdicts, and the report files of stored result sets."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from redline.errors import UserError
from redline.experiments import stats
from redline.experiments.claims import Claim, evaluate_claims, load_claims, verdict
from redline.experiments.report import build_report, write_report
from redline.experiments.results import load_result_set, summarize_run

FIXTURES = Path(__file__).parent / "fixtures"


# ----------------------------------------------------------------------------------------------------
# statistics


def test_welch_matches_hand_computation():
    # a = [1, 2, 3]: mean 2, s² = 1;  b = [4, 5, 6, 7]: mean 5.5, s² = 5/3
    # se² = 1/3 + (5/3)/4 = 0.75 → se = 0.8660254;  t = −3.5 / se = −4.0414519
    # df = 0.75² / ((1/3)²/2 + (5/12)²/3) = 0.5625 / 0.11342593 = 4.9591837
    # t_{0.975, 4.9592} = 2.5769584 → interval −3.5 ± 2.2317115;  p = 2·P(T > 4.0415) = 0.0100769
    d = stats.welch([1, 2, 3], [4, 5, 6, 7])
    assert d.estimate == pytest.approx(-3.5)
    assert d.t == pytest.approx(-4.0414519, abs=1e-6)
    assert d.df == pytest.approx(4.9591837, abs=1e-6)
    assert d.low == pytest.approx(-3.5 - 2.5769584 * 0.8660254, abs=1e-5)
    assert d.high == pytest.approx(-3.5 + 2.5769584 * 0.8660254, abs=1e-5)
    assert d.p_value == pytest.approx(0.0100769, abs=1e-6)
    assert d.tested and d.method == "welch"


def test_welch_single_run_has_no_interval_and_identical_values_are_exact():
    d = stats.welch([1.0], [2.0, 2.2])
    assert d.estimate == pytest.approx(-1.1) and not d.tested and d.p_value is None and d.method == "single-run"
    same = stats.welch([3.0, 3.0], [1.0, 1.0])
    assert (same.estimate, same.low, same.high, same.p_value) == (2.0, 2.0, 2.0, 0.0)
    assert stats.welch([], [1.0]) is None


def test_ratio_is_ratio_of_geometric_means_with_log_interval():
    # a = [2, 8]: geometric mean 4;  b = [4, 4]: geometric mean 4 → ratio 1
    # logs: a = [ln 2, ln 8], s² = (ln 4)²/2 = 0.9609060;  b has no spread → se = sqrt(0.9609060/2) = ln 2
    # df = 1 → t_{0.975,1} = 12.7062047 → interval exp(±12.7062047 · ln 2)
    d = stats.ratio([2, 8], [4, 4])
    assert d.estimate == pytest.approx(1.0)
    assert d.df == pytest.approx(1.0)
    assert d.low == pytest.approx(math.exp(-12.7062047 * math.log(2)), rel=1e-6)
    assert d.high == pytest.approx(math.exp(12.7062047 * math.log(2)), rel=1e-6)


def test_perplexity_ratio_is_exp_of_loss_difference():
    d = stats.exp_difference(stats.welch([2.1, 2.3], [2.0, 2.0]))
    assert d.estimate == pytest.approx(math.exp(0.2))  # e^(mean 2.2 − 2.0)


def test_permutation_test_enumerates_every_split():
    # [1,2,3] vs [4,5,6]: of the C(6,3) = 20 splits only the two extreme ones reach |Δ| = 3 → p = 2/20
    assert stats.permutation_test([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)
    # [1,2] vs [3,4]: |Δ| over the 6 splits = 2, 2, 1, 1, 0, 0 → p = 2/6
    assert stats.permutation_test([1, 2], [3, 4]) == pytest.approx(1 / 3)
    assert stats.permutation_test([1], [3, 4]) is None


def test_summary_and_interpolation():
    s = stats.summarize([1.0, 2.0, 4.0, None, float("nan")])
    assert s.n == 3 and s.mean == pytest.approx(7 / 3)
    assert s.std == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))
    assert stats.interpolate([0, 10], [4.0, 2.0], 2.5) == pytest.approx(3.5)
    assert stats.interpolate([0, 10], [4.0, 2.0], 11) is None


# ----------------------------------------------------------------------------------------------------
# claims


def _runs(variant: str, speeds: list[float], losses: list[float] | None = None) -> list[dict]:
    losses = losses or [2.0] * len(speeds)
    return [{"variant": variant, "preset": "p", "precision": "bf16", "batch_size": 4, "seq_len": 64, "seed": i,
             "status": "completed", "tokens_per_second": s, "final_val_loss": l}
            for i, (s, l) in enumerate(zip(speeds, losses))]


SPEED_CLAIM = Claim("c", "B is 5% faster than A", "tokens_per_second", 1.05, {"variant": "B"}, {"variant": "A"})


def test_claim_band_is_a_factor_of_two_of_the_claimed_change():
    lo, hi = SPEED_CLAIM.band()
    assert lo == pytest.approx(math.sqrt(1.05)) and hi == pytest.approx(1.05**2)


def test_claim_confirmed_refuted_inconclusive():
    a = _runs("A", [1000, 1001, 999])
    confirmed = evaluate_claims(a + _runs("B", [1050, 1052, 1048]), [SPEED_CLAIM])[0]
    assert confirmed["verdict"] == "confirmed" and confirmed["measured_ratio"] == pytest.approx(1.05, rel=1e-3)
    refuted = evaluate_claims(a + _runs("B", [1000, 1002, 998]), [SPEED_CLAIM])[0]
    assert refuted["verdict"] == "refuted" and refuted["high"] < SPEED_CLAIM.band()[0]
    noisy = evaluate_claims(a + _runs("B", [900, 1200, 1050]), [SPEED_CLAIM])[0]
    assert noisy["verdict"] == "inconclusive"


def test_one_seed_never_confirms_but_can_refute_a_far_claim():
    one = evaluate_claims(_runs("A", [1000]) + _runs("B", [1050]), [SPEED_CLAIM])[0]
    assert one["verdict"] == "inconclusive" and one["n"] == [1, 1] and "assumed" in one["interval"]
    perplexity = Claim("q", "B has 4× better perplexity", "perplexity", 0.25, {"variant": "B"}, {"variant": "A"})
    far = evaluate_claims(_runs("A", [1], [3.00]) + _runs("B", [1], [2.98]), [perplexity])[0]
    assert far["verdict"] == "refuted" and far["measured_ratio"] == pytest.approx(math.exp(-0.02))


def test_claims_not_measured_say_why(tmp_path):
    path = tmp_path / "claims.toml"
    path.write_text('[[claim]]\nid = "x"\ntext = "fused kernels: 2x"\nmetric = "tokens_per_second"\n'
                    'measurable = false\nreason = "no option to compare against"\n')
    rows = evaluate_claims(_runs("A", [1000, 1001]), [SPEED_CLAIM] + load_claims(path))
    assert [r["verdict"] for r in rows] == ["not measured", "not measured"]
    assert "treatment" in rows[0]["reason"] and rows[1]["reason"] == "no option to compare against"


def test_builtin_claims_load_and_verdict_uses_assumed_noise_only_without_spread():
    claims = load_claims()
    assert {c.id for c in claims} >= {"qk-norm-perplexity", "mqa-perplexity", "fused-qkv-speed", "fp8-accumulation"}
    d = stats.ratio([1050.0], [1000.0])
    result, low, high, how = verdict(SPEED_CLAIM, d)
    assert result == "inconclusive" and low < 1.05 < high and "never confirm" in how


def test_bad_claims_file_is_a_user_error(tmp_path):
    path = tmp_path / "claims.toml"
    path.write_text('[[claim]]\nid = "x"\ntext = "x"\nmetric = "speed"\nratio = 2.0\n')
    with pytest.raises(UserError, match="metric must be one of"):
        load_claims(path)


# ----------------------------------------------------------------------------------------------------
# report files from stored result sets


@pytest.fixture()
def sweep_dir(tmp_path) -> Path:
    dest = tmp_path / "sweep_small"
    shutil.copytree(FIXTURES / "sweep_small", dest)
    return dest


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "results.jsonl").read_text().splitlines() if line.strip()]


def test_report_files_from_stored_sweep(sweep_dir):
    files = write_report(sweep_dir)
    for name in ("report", "results_json", "results_csv", "dashboard"):
        assert files[name].is_file() and files[name].stat().st_size > 0
    for name in ("loss_vs_tokens", "loss_vs_time", "tokens_per_second", "peak_memory", "speed_vs_quality"):
        assert files[f"plot_{name}"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    records = _records(sweep_dir)
    rows = list(csv.DictReader(files["results_csv"].open()))
    assert len(rows) == len(records) == 13
    assert {r["status"] for r in rows} == {"completed", "failed"}

    # Δ tokens/s of mqa at bf16, computed here from the stored records: ratio of geometric means
    def speeds(variant):
        return [r["tokens_per_second"] for r in records if r["variant"] == variant and r["precision"] == "bf16"]

    expected = math.exp(sum(map(math.log, speeds("mqa"))) / 2 - sum(map(math.log, speeds("baseline"))) / 2)
    report = json.loads(files["results_json"].read_text())
    mqa = next(c for c in report["cells"] if c["variant"] == "mqa" and c["precision"] == "bf16")
    assert mqa["vs_baseline"]["baseline"] == "baseline · bf16"
    assert mqa["vs_baseline"]["tokens_per_second"]["estimate"] == pytest.approx(expected)
    bpb = lambda v: [r["final_val_bpb"] for r in records if r["variant"] == v and r["precision"] == "bf16"]
    assert mqa["vs_baseline"]["final_val_bpb"]["estimate"] == pytest.approx(sum(bpb("mqa")) / 2 - sum(bpb("baseline")) / 2)
    # the fp32 cells are compared with the fp32 baseline (the least different one)
    gelu32 = next(c for c in report["cells"] if c["variant"] == "gelu" and c["precision"] == "fp32")
    assert gelu32["vs_baseline"]["baseline"] == "baseline · fp32"

    text = files["report"].read_text()
    assert "| mqa · bf16 | " in text and f"{(expected - 1) * 100:+.1f}%" in text
    assert "oom__tiny__bf16__4x64__s1 | failed | torch.OutOfMemoryError: CUDA out of memory" in text
    fastest = max((c for c in report["cells"] if c["n_completed"]), key=lambda c: c["tokens_per_second"]["mean"])
    assert f"**fastest**: {fastest['label']}" in text
    assert "## The source design's claims" in text and "![Throughput](plots/tokens_per_second.png)" in text

    html = files["dashboard"].read_text()
    for remote in ("http://", "https://", "<link", "src=", "@import", "url("):
        assert remote not in html.replace('xmlns="http://www.w3.org/2000/svg"', "").replace('"http://www.w3.org/2000/svg"', "")


def test_report_of_one_run_directory(tmp_path):
    run = tmp_path / "run_small"
    shutil.copytree(FIXTURES / "run_small", run)
    summary = summarize_run(run)
    assert summary["status"] == "completed" and summary["steps"] == 30
    assert summary["final_val_bpb"] == pytest.approx(summary["eval_curve"][-1]["bpb"])
    assert summary["best_val_bpb"] == min(p["bpb"] for p in summary["eval_curve"])
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    windows = sorted(r["tokens_per_second"] for r in logged if r.get("tokens_per_second"))[1:]
    assert summary["tokens_per_second"] is not None
    assert min(windows) <= summary["tokens_per_second"] <= max(windows)
    assert summary["params"] > 0  # built from config.json's model on the meta device
    files = write_report(run, out=tmp_path / "out")
    assert "No baseline" in files["report"].read_text()
    assert (tmp_path / "out" / "dashboard.html").is_file()


def test_report_of_a_folder_of_runs_and_a_torn_results_line(tmp_path, sweep_dir):
    folder = tmp_path / "runs"
    for name in ("a", "b"):
        shutil.copytree(FIXTURES / "run_small", folder / name)
    assert [r["variant"] for r in load_result_set(folder).runs] == ["a", "b"]
    with open(sweep_dir / "results.jsonl", "a") as f:
        f.write('{"run_id": "torn", "stat')  # a crash in the middle of a write
    assert len(load_result_set(sweep_dir).runs) == 13


def test_report_of_nothing_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="holds no runs"):
        build_report(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        build_report(tmp_path / "missing")


def test_report_and_claims_commands_end_with_a_json_line(sweep_dir, capsys):
    from redline.commands import claims, report

    assert report.main([str(sweep_dir)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["runs"] == 13 and Path(out["files"]["dashboard"]).is_file()
    assert claims.main([str(sweep_dir)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sum(out["claims"].values()) == len(out["rows"]) >= len(load_claims())


def test_sweep_records_are_refreshed_from_run_directories_but_keep_the_sweep_verdict(tmp_path):
    root = tmp_path / "sweep"
    shutil.copytree(FIXTURES / "run_small", root / "runs" / "r1")
    stored = {"run_id": "r1", "variant": "v", "preset": "tiny", "precision": "bf16", "batch_size": 4, "seq_len": 64,
              "seed": 1, "status": "failed", "error": "timed out after 1.0 min", "wall_time": 60.0, "eval_curve": []}
    (root / "results.jsonl").write_text(json.dumps(stored) + "\n")
    run = load_result_set(root).runs[0]
    assert run["eval_curve"] and run["final_val_bpb"] is not None  # read again from runs/r1/metrics.jsonl
    assert (run["status"], run["error"], run["wall_time"], run["variant"]) == ("failed", "timed out after 1.0 min", 60.0, "v")


# ----------------------------------------------------------------------------------------------------
# naming a winner


def test_a_winner_is_named_only_beyond_the_noise_the_plots_draw():
    from redline.experiments.results import leader

    clear = leader({"a": [100, 101, 99], "b": [90, 91, 89]}, higher_is_better=True)
    assert (clear["label"], clear["clear"], clear["runner_up"]) == ("a", True, "b")
    # a leads on the mean, but its mean ± std band reaches the runner-up's
    noisy = leader({"a": [100, 112, 94], "b": [99, 100, 101]}, higher_is_better=True)
    assert (noisy["label"], noisy["clear"]) == ("a", False) and "spread over seeds" in noisy["reason"]
    lower = leader({"a": [0.80, 0.81], "b": [0.70, 0.71]}, higher_is_better=False)
    assert (lower["label"], lower["clear"]) == ("b", True)
    one_seed = leader({"a": [100.0], "b": [50.0]}, higher_is_better=True)
    assert not one_seed["clear"] and "one seed" in one_seed["reason"]
    alone = leader({"a": [100.0, 101.0]}, higher_is_better=True)
    assert not alone["clear"] and alone["runner_up"] is None


def test_report_and_dashboard_say_no_clear_winner(tmp_path):
    root = tmp_path / "sweep"
    shutil.copytree(FIXTURES / "sweep_small", root)
    records = _records(root)
    # every bf16 baseline and mqa run: speeds whose spreads overlap (mqa leads on the mean only)
    noisy = {("baseline", 1): 1000.0, ("baseline", 2): 1040.0, ("mqa", 1): 990.0, ("mqa", 2): 1060.0}
    kept = [r for r in records if r["precision"] == "bf16" and r["variant"] in ("baseline", "mqa")
            and r["status"] == "completed"]
    for r in kept:
        r["tokens_per_second"] = noisy[(r["variant"], r["seed"])]
    (root / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    files = write_report(root)
    report = json.loads(files["results_json"].read_text())
    speed = report["best"]["speed"]
    assert (speed["label"], speed["clear"], speed["runner_up"]) == ("mqa", False, "baseline")
    text = files["report"].read_text()
    assert "**fastest**: no clear winner (mqa 1,025 tokens/s vs baseline 1,020 tokens/s: within the spread" in text
    html = files["dashboard"].read_text()
    assert '"clear": false' in html and "no clear winner" in html


def test_published_report_gets_its_plots_and_dashboard_drawn_again(tmp_path, sweep_dir):
    # docs/results/ keeps only report.md and results.json/csv; the plots and dashboard come back from results.json
    written = write_report(sweep_dir, out=tmp_path / "first")
    published = tmp_path / "published"
    published.mkdir()
    for name in ("report.md", "results.json", "results.csv"):
        shutil.copy(tmp_path / "first" / name, published / name)
    report_md = (published / "report.md").read_bytes()
    files = write_report(published)
    assert (published / "report.md").read_bytes() == report_md  # the record is not rewritten
    assert files["dashboard"].read_text() == written["dashboard"].read_text()
    for name in ("loss_vs_tokens", "loss_vs_time", "tokens_per_second", "peak_memory", "speed_vs_quality"):
        assert files[f"plot_{name}"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    (published / "results.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="results.json is not a report's results.json"):
        write_report(published)


def test_claims_read_a_published_report_as_they_read_its_sweep(tmp_path, sweep_dir):
    write_report(sweep_dir, out=tmp_path / "published")  # report.md, results.json, ...: no runs beside them
    published, swept = load_result_set(tmp_path / "published"), load_result_set(sweep_dir)
    assert published.runs and len(published.runs) == len(swept.runs)
    claims = load_claims()
    assert json.dumps(evaluate_claims(published.runs, claims), default=str) == \
        json.dumps(evaluate_claims(swept.runs, claims), default=str)


def test_every_report_under_docs_results_loads():
    reports = sorted((Path(__file__).parent.parent / "docs" / "results").glob("*/results.json"))
    assert reports
    for path in reports:
        assert load_result_set(path.parent).runs, path
