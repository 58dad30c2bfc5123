"""redline plan: the arithmetic against hand-worked examples, the inputs it reads, and bad input."""

import json

import pytest

from redline import cli
from redline.commands.plan import chinchilla_targets, gpu_counts, model_params, plan_rows, read_bench_json
from redline.errors import UserError


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_one_gpu_hand_worked():
    # 100M parameters, 1M tokens/s, $2 per GPU-hour, 700 W:
    # 1× Chinchilla = 20 × 1e8 = 2e9 tokens -> 2000 s = 0.5556 h -> $1.111, 0.3889 kWh, $0.5556 per 1e9 tokens
    (row,) = plan_rows(1e6, [("1x", 2e9)], [1], 0.5, 2.0, 700.0)  # efficiency does not apply to one GPU
    assert row["tokens_per_second"] == 1e6
    assert row["hours"] == pytest.approx(2000 / 3600)
    assert row["gpu_hours"] == pytest.approx(2000 / 3600)
    assert row["cost"] == pytest.approx(1.1111111, rel=1e-6)
    assert row["energy_kwh"] == pytest.approx(0.3888889, rel=1e-6)
    assert row["cost_per_billion_tokens"] == pytest.approx(0.5555556, rel=1e-6)


def test_several_gpus_with_scaling_efficiency_hand_worked():
    # 8 GPUs at 0.9: 8 × 0.9 × 250k = 1.8M tokens/s; 3.6e10 tokens -> 20000 s = 5.5556 h; 44.444 GPU-hours
    # at $3: $133.33; at 400 W: 17.778 kWh; $3.7037 per 1e9 tokens (= 3 × 8 / (1.8e6 × 3600) × 1e9)
    (row,) = plan_rows(250e3, [("t", 3.6e10)], [8], 0.9, 3.0, 400.0)
    assert row["tokens_per_second"] == pytest.approx(1.8e6)
    assert row["hours"] == pytest.approx(20000 / 3600)
    assert row["gpu_hours"] == pytest.approx(44.444444, rel=1e-6)
    assert row["cost"] == pytest.approx(133.33333, rel=1e-6)
    assert row["energy_kwh"] == pytest.approx(17.777778, rel=1e-6)
    assert row["cost_per_billion_tokens"] == pytest.approx(3.7037037, rel=1e-6)


def test_costs_and_energy_left_out_without_price_or_power():
    (row,) = plan_rows(1e5, [("t", 1e9)], [1], 1.0, None, None)
    assert row["cost"] is None and row["energy_kwh"] is None and row["cost_per_billion_tokens"] is None
    assert row["hours"] == pytest.approx(1e4 / 3600)


def test_targets_and_gpu_counts():
    assert [t for _, t in chinchilla_targets(124e6)] == pytest.approx([2.48e9, 2.48e10, 4.96e10])
    assert gpu_counts(8) == [1, 2, 4, 8]
    assert gpu_counts(6) == [1, 2, 4, 6]
    assert gpu_counts(1) == [1]


def test_model_params_from_preset_and_number():
    assert model_params("1.5e9") == 1.5e9
    # gpt2-124m: 124.4M with the 50304-row tied embedding and 1024 learned positions (GPT-2's own count is 124M)
    assert 124e6 < model_params("gpt2-124m") < 125e6
    with pytest.raises(UserError, match="did you mean"):
        model_params("gpt2-124")
    with pytest.raises(UserError, match="positive"):
        model_params("-5")


def test_bench_json_last_line_and_per_gpu(tmp_path):
    path = tmp_path / "bench.jsonl"
    lines = [
        {"kind": "train", "tokens_per_second": 1.0},
        "not json",
        {
            "command": "bench",
            "tokens_per_second": 800000.0,
            "world_size": 8,
            "preset": "modern-124m",
            "power_watts": 650,
        },
        {"kind": "event", "event": "end"},
    ]
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    record = read_bench_json(str(path))
    assert record["_per_gpu"] == 100000.0 and record["preset"] == "modern-124m"


def test_cli_reads_bench_json_and_prints_json_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))  # no doctor.json: power comes from the bench line
    path = tmp_path / "fit.jsonl"
    path.write_text(json.dumps({"command": "fit", "params": 2e8, "tokens_per_second": 5e5, "power_watts": 500}) + "\n")
    code, out, err = run_cli(["plan", "--bench-json", str(path), "--price-per-gpu-hour", "2", "--gpus", "4",
                              "--scaling-efficiency", "0.8"], capsys)
    assert code == 0, err
    record = json.loads(out.strip().splitlines()[-1])
    assert record["params"] == 2e8 and record["power_watts"] == 500 and record["scaling_efficiency"] == 0.8
    assert len(record["rows"]) == 3 * 3  # 3 Chinchilla targets × (1, 2, 4) GPUs
    four = next(r for r in record["rows"] if r["target"] == "1× Chinchilla" and r["gpus"] == 4)
    # 4e9 tokens at 4 × 0.8 × 5e5 = 1.6e6 tokens/s -> 2500 s; 4 GPUs -> 2.7778 GPU-hours -> $5.5556, 1.3889 kWh
    assert four["cost"] == pytest.approx(5.5555556, rel=1e-6)
    assert four["energy_kwh"] == pytest.approx(1.3888889, rel=1e-6)


def test_cli_given_token_count(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    code, out, err = run_cli(["plan", "tokens_per_second=1e6", "--preset", "tiny", "tokens=3.6e9", "gpus=1"], capsys)
    assert code == 0, err
    (row,) = json.loads(out.strip().splitlines()[-1])["rows"]
    assert row["target"] == "given" and row["hours"] == pytest.approx(1.0)


GIVEN = ["--tokens-per-second", "1e6", "--model", "1e8"]


@pytest.mark.parametrize("argv, message", [
    (GIVEN + ["--price-per-gpu-hour", "0"], "--price-per-gpu-hour must be a positive number"),
    (GIVEN + ["price_per_gpu_hour=-3"], "--price-per-gpu-hour must be a positive number"),
    (GIVEN + ["price_per_gpu_hour=cheap"], "--price-per-gpu-hour must be a positive number, got 'cheap'"),
    (GIVEN + ["--tokens", "-1e9"], "--tokens must be a positive number"),
    (GIVEN + ["--tokens", "lots"], "--tokens must be a positive number, got 'lots'"),
    (GIVEN + ["--scaling-efficiency", "1.5"], "must be in (0, 1]"),
    (["--tokens-per-second", "0", "--model", "1e8"], "--tokens-per-second must be a positive number"),
    (["--model", "1e8"], "no throughput"),
    (["--tokens-per-second", "1e6"], "no model size"),
    (["--bench-json", "/nonexistent/bench.jsonl"], "no such file"),
])
def test_bad_input_is_one_clear_line(argv, message, capsys):
    code, _, err = run_cli(["plan", *argv], capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def bench_line(tmp_path, **fields) -> str:
    path = tmp_path / "bench.jsonl"
    path.write_text(json.dumps({"command": "bench", "tokens_per_second": 1e5, "seq_len": 1024, **fields}) + "\n")
    return str(path)


def test_another_model_gets_the_throughput_scaled_by_flops_per_token(tmp_path, capsys, monkeypatch):
    """A throughput measured on gpt2-124m is not gpt2-350m's: it is scaled by FLOPs per token, and said so."""
    from redline.commands.plan import flops_per_token

    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    path = bench_line(tmp_path, preset="gpt2-124m", device="cuda", gpu="NVIDIA H100")
    code, out, err = run_cli(["plan", "--bench-json", path, "--model", "gpt2-350m", "--gpus", "1"], capsys)
    assert code == 0, err
    record = json.loads(out.strip().splitlines()[-1])
    small, _ = flops_per_token("gpt2-124m", 1024)
    large, _ = flops_per_token("gpt2-350m", 1024)
    assert large > 2.5 * small
    assert record["tokens_per_second"] == pytest.approx(1e5 * small / large)
    assert "scaled from gpt2-124m" in record["tokens_per_second_source"] and "same MFU" in out
    # the same model as measured: the measured number as it is
    code, out, _ = run_cli(["plan", "--bench-json", path, "--model", "gpt2-124m", "--gpus", "1"], capsys)
    assert json.loads(out.strip().splitlines()[-1])["tokens_per_second"] == 1e5
    # a bench line that names no model cannot be applied to one
    nameless = bench_line(tmp_path, device="cuda")
    code, _, err = run_cli(["plan", "--bench-json", nameless, "--model", "gpt2-124m"], capsys)
    assert code == 2 and "unknown which model it measured" in err


def test_cpu_numbers_are_never_called_a_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    path = bench_line(tmp_path, preset="tiny", device="cpu", gpu="cpu")
    code, out, err = run_cli(["plan", "--bench-json", path, "--gpus", "2"], capsys)
    assert code == 0, err
    text = " ".join(out.split())  # the header may wrap
    assert "tokens/s on one CPU" in text and "one GPU" not in text and "per GPU" not in text
    assert "CPU-hours" in out and "GPU-hours" not in out and "not for GPUs" in out
    assert json.loads(out.strip().splitlines()[-1])["device"] == "cpu"


def test_bench_json_that_is_not_text_is_one_line(tmp_path, capsys):
    path = tmp_path / "bench.jsonl"
    path.write_bytes(b'{"tokens_per_second": 1e5}\n\xff\xfe\x00binary\n')
    code, _, err = run_cli(["plan", "--bench-json", str(path), "--model", "1e8"], capsys)
    assert code == 2 and "is not UTF-8 text" in err and len(err.strip().splitlines()) == 1, err


def test_bench_json_reads_the_points_of_a_bench_report(tmp_path):
    """`redline bench --json-out` writes one report a line, its measured points under "points"."""
    path = tmp_path / "bench.jsonl"
    report = {"schema": "redline-bench", "command": "bench", "gpu": "H100",
              "points": [{"preset": "modern-124m", "tokens_per_second": 480000.0, "status": "ok"},
                         {"preset": "modern-124m", "tokens_per_second": None, "status": "oom"}]}
    path.write_text(json.dumps(report) + "\n")
    record = read_bench_json(str(path))
    assert record["_per_gpu"] == 480000.0 and record["preset"] == "modern-124m" and record["gpu"] == "H100"
