"""`redline plan`: time, cost and energy to train a model to a token budget, from a measured throughput.

    redline plan --bench-json fit.jsonl --price-per-gpu-hour 2.5
    redline plan --tokens-per-second 450000 --model modern-124m --price-per-gpu-hour 2.5 --gpus 8
    redline plan --tokens-per-second 60000 --model 1.5e9 --tokens 3e10 --power-watts 700

The arithmetic, for n GPUs with scaling efficiency e (throughput of n GPUs / n × one GPU's; 1 for n = 1):
    tokens/s(n) = n · e · tokens/s(1);  hours = tokens / tokens/s(n) / 3600;  GPU-hours = n · hours
    cost = GPU-hours · price;  energy = GPU-hours · watts / 1000 kWh;  cost per 1e9 tokens = cost · 1e9 / tokens
Targets: 1×, 10× and 20× Chinchilla (20 tokens per parameter, counting every parameter), or --tokens.
Prints a table, then one JSON line.

A throughput measured on one model is applied to another `--model` only scaled by their training FLOPs per token
(tokens/s × F_measured / F_planned, i.e. the same MFU assumed), and the header says so; a throughput measured on
a CPU is planned for CPUs like it, never called a GPU's.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from redline.config import normalize_argv, parse
from redline.errors import UserError, read_text_file

DESCRIPTION = "Time, cost and energy to train to 1×/10×/20× Chinchilla or a token count, on 1 to N GPUs."
CHINCHILLA_TOKENS_PER_PARAM = 20
CHINCHILLA_MULTIPLES = (1, 10, 20)
ASSUMED_SCALING_EFFICIENCY = 0.9


@dataclass
class PlanConfig:
    tokens_per_second: float | None = None
    """Measured training throughput of one GPU, in tokens/s (None: read from --bench-json)."""
    bench_json: str | None = None
    """A JSON-lines file from `redline bench` or `redline fit` (or a run's metrics.jsonl): its last line with
    tokens_per_second gives the throughput (and the model, power and scaling efficiency where it has them)."""
    model: str | None = None
    """Model size: a preset name (e.g. modern-124m) or a parameter count (e.g. 124e6). None: from --bench-json.
    --preset NAME means the same. Another model than the one --bench-json measured gets that throughput scaled by
    FLOPs per token (the same MFU assumed), and the output says so."""
    tokens: float | None = None
    """Train to this many tokens (None: 1×, 10× and 20× Chinchilla, 20 tokens per parameter)."""
    price_per_gpu_hour: float | None = None
    """Price of one GPU-hour, in any currency (None: costs are left out)."""
    power_watts: float | None = None
    """Power draw of one GPU in watts (None: from --bench-json, else the GEMM-load draw `redline doctor` measured,
    else energy is left out)."""
    gpus: int = 8
    """Plan for 1, 2, 4, ... up to this many GPUs."""
    scaling_efficiency: float | None = None
    """Throughput of n GPUs / (n × one GPU's) for n > 1, in (0, 1] (None: from --bench-json, else an assumed 0.9)."""

    def validate(self) -> None:
        for name in ("tokens_per_second", "tokens", "price_per_gpu_hour", "power_watts"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                flag = "--" + name.replace("_", "-")
                raise UserError(f"{flag} must be a positive number, got {value:g}")
        if self.gpus < 1:
            raise UserError(f"--gpus must be at least 1, got {self.gpus}")
        if self.scaling_efficiency is not None and not 0 < self.scaling_efficiency <= 1:
            raise UserError(f"--scaling-efficiency must be in (0, 1], got {self.scaling_efficiency:g} "
                            f"(0.9 means 8 GPUs give 7.2× one GPU's throughput)")


# ----------------------------------------------------------------------------------------------------
# the arithmetic


def gpu_counts(max_gpus: int) -> list[int]:
    """1, 2, 4, ... and max_gpus itself."""
    counts, n = [], 1
    while n < max_gpus:
        counts.append(n)
        n *= 2
    return counts + [max_gpus]


def chinchilla_targets(params: float) -> list[tuple[str, float]]:
    return [(f"{m}× Chinchilla", m * CHINCHILLA_TOKENS_PER_PARAM * params) for m in CHINCHILLA_MULTIPLES]


def plan_rows(tokens_per_second: float, targets: list[tuple[str, float]], counts: list[int], efficiency: float,
              price_per_gpu_hour: float | None, power_watts: float | None) -> list[dict]:
    """One row per (target, GPU count): throughput, hours, GPU-hours, cost, energy and cost per billion tokens."""
    rows = []
    for label, tokens in targets:
        for n in counts:
            throughput = tokens_per_second * n * (efficiency if n > 1 else 1.0)
            hours = tokens / throughput / 3600
            gpu_hours = n * hours
            cost = gpu_hours * price_per_gpu_hour if price_per_gpu_hour else None
            rows.append({
                "target": label,
                "tokens": tokens,
                "gpus": n,
                "tokens_per_second": throughput,
                "hours": hours,
                "gpu_hours": gpu_hours,
                "cost": cost,
                "cost_per_billion_tokens": cost * 1e9 / tokens if cost is not None else None,
                "energy_kwh": gpu_hours * power_watts / 1000 if power_watts else None,
            })
    return rows


# ----------------------------------------------------------------------------------------------------
# inputs


def read_bench_json(path: str) -> dict:
    """The last JSON object line with a numeric tokens_per_second, with per-GPU throughput resolved."""
    p = Path(path)
    if not p.is_file():
        raise UserError(
            f"--bench-json {path}: no such file; give the JSON-lines output of `redline bench` or `redline fit`"
        )
    found = None
    for line in read_text_file(p, "--bench-json").splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        # `redline bench` writes one report a line with its measured points in "points" (one, or a matrix's)
        points = record.get("points")
        for point in points if isinstance(points, list) else []:
            if isinstance(point, dict) and isinstance(point.get("tokens_per_second"), (int, float)):
                found = {**{k: v for k, v in record.items() if k != "points"}, **point}
        if isinstance(record.get("tokens_per_second"), (int, float)):
            found = record
    if found is None:
        raise UserError(f"--bench-json {path}: no JSON line with a tokens_per_second field; "
                        f"give --tokens-per-second instead")
    per_gpu = found.get("tokens_per_second_per_gpu")
    world = found.get("world_size") or (found.get("gpus") if isinstance(found.get("gpus"), int) else 1) or 1
    found["_per_gpu"] = (
        float(per_gpu) if isinstance(per_gpu, (int, float)) else float(found["tokens_per_second"]) / world
    )
    return found


def model_params(spec: str) -> float:
    """A preset's parameter count (every parameter, embeddings included), or a number such as 124e6."""
    try:
        value = float(spec)
    except ValueError:
        value = None
    if value is not None:
        if not (value > 0 and math.isfinite(value)):
            raise UserError(f"--model {spec}: a parameter count must be a positive number, e.g. 124e6")
        return value
    import torch

    from redline.model import GPT
    from redline.presets import PRESETS, get_preset

    if spec not in PRESETS:
        get_preset(spec)  # raises with the closest names
    with torch.device("meta"):
        return float(GPT(get_preset(spec)).num_params())


def flops_per_token(spec: str, seq_len: int | None) -> tuple[float, str]:
    """(training FLOPs per token, how they were counted) of a preset (6N + 12·L·d·T at seq_len, the model's own
    count) or of a bare parameter count (6N: its layers are unknown, so attention is left out)."""
    try:
        return 6 * float(spec), "6N"
    except ValueError:
        pass
    import torch

    from redline.model import GPT
    from redline.presets import get_preset

    with torch.device("meta"):
        return float(GPT(get_preset(spec)).flops_per_token(seq_len)), "6N + 12·L·d·T"


def measured_model(bench: dict) -> str | None:
    """The model a bench/fit line measured: its preset, else its parameter count."""
    if bench.get("preset"):
        return str(bench["preset"])
    if isinstance(bench.get("params"), (int, float)):
        return str(bench["params"])
    return None


def measured_device(bench: dict) -> str:
    """"cpu" or "gpu" for a bench/fit line ("gpu" where it does not say: fit runs only on GPUs)."""
    device = str(bench.get("device") or "").lower()
    gpu = str(bench.get("gpu") or "")
    return "cpu" if device == "cpu" or (not device and gpu.lower().startswith("cpu")) else "gpu"


def scale_to_model(tokens_per_second: float, bench: dict, spec: str, params: float) -> tuple[float, str | None]:
    """The measured throughput scaled from the bench line's model to `spec` by FLOPs per token; (throughput,
    a note) where the models differ, (throughput, None) where they are the same."""
    measured = measured_model(bench)
    if measured is None:
        raise UserError("--bench-json: its line names no preset or params, so it is unknown which model it measured; "
                        "give --tokens-per-second instead")
    same = measured == spec or (isinstance(bench.get("params"), (int, float)) and float(bench["params"]) == params
                                and not bench.get("preset"))
    if same:
        return tokens_per_second, None
    seq_len = bench.get("seq_len") if isinstance(bench.get("seq_len"), int) else None
    source_flops = bench.get("flops_per_token")  # what the bench counted for the model it ran
    if not isinstance(source_flops, (int, float)) or source_flops <= 0:
        source_flops, _ = flops_per_token(measured, seq_len)
    target_flops, how = flops_per_token(spec, seq_len)
    scaled = tokens_per_second * source_flops / target_flops
    return scaled, (f"scaled from {measured}'s measured {tokens_per_second:,.0f} tokens/s by FLOPs per token "
                    f"({source_flops / 1e9:.3g} / {target_flops / 1e9:.3g} GFLOP, {how}): the same MFU is assumed; "
                    f"measure {spec} for a real number")


def doctor_power_watts() -> float | None:
    """The power draw `redline doctor` measured under GEMM load, if it has."""
    from redline.hardware import doctor_json_path

    try:
        report = json.loads(doctor_json_path().read_text())
    except (OSError, ValueError):
        return None
    for gpu in report.get("gpus", []) if isinstance(report, dict) else []:
        watts = (gpu.get("nvml_under_load") or {}).get("power_draw_w")
        if isinstance(watts, (int, float)) and watts > 0:
            return float(watts)
    return None


_NUMBERS = ("tokens_per_second", "tokens", "price_per_gpu_hour", "power_watts", "scaling_efficiency")


def _normalize(argv: list[str]) -> list[str]:
    """--preset NAME means --model NAME; a numeric option that is not a number is one clear error line."""
    out = normalize_argv(argv)
    out = ["--model" if arg == "--preset" else arg for arg in out]
    for flag, value in zip(out, out[1:]):
        if flag.startswith("--") and flag[2:].replace("-", "_") in _NUMBERS and value.lower() != "none":
            try:
                float(value)
            except ValueError:
                raise UserError(f"{flag.replace('_', '-')} must be a positive number, got {value!r}") from None
    return out


def _duration(hours: float) -> str:
    if hours < 1:
        return f"{hours * 60:.1f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} d"


def _tokens(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def main(argv: list[str]) -> int:
    from rich.console import Console
    from rich.table import Table

    cfg = parse(PlanConfig, _normalize(argv), prog="redline plan", description=DESCRIPTION)
    bench = read_bench_json(cfg.bench_json) if cfg.bench_json else {}
    if cfg.model:
        spec, params = cfg.model, model_params(cfg.model)
    elif isinstance(bench.get("params"), (int, float)):  # the measured model's own count (overrides included)
        spec, params = str(bench.get("preset") or bench["params"]), model_params(str(bench["params"]))
    elif bench.get("preset"):
        spec, params = str(bench["preset"]), model_params(str(bench["preset"]))
    else:
        raise UserError("no model size: give --model PRESET or --model PARAMS (e.g. 124e6)")

    device = "gpu"
    if cfg.tokens_per_second is not None:
        tokens_per_second, source = cfg.tokens_per_second, "given"
    elif bench:
        device = measured_device(bench)
        tokens_per_second, source = bench["_per_gpu"], f"measured ({cfg.bench_json})"
        tokens_per_second, scaled = scale_to_model(tokens_per_second, bench, spec, params)
        if scaled:
            source = f"{scaled} ({cfg.bench_json})"
    else:
        raise UserError("no throughput: give --tokens-per-second N (one GPU, measured) or --bench-json FILE "
                        "(the JSON line of `redline bench` or `redline fit`)")
    if not tokens_per_second > 0:
        raise UserError(f"the throughput must be a positive number of tokens/s, got {tokens_per_second}")
    unit = "CPU" if device == "cpu" else "GPU"

    power, power_source = cfg.power_watts, "given"
    if power is None:
        bench_power = bench.get("power_watts") or bench.get("power_draw_w")
        if isinstance(bench_power, (int, float)) and bench_power > 0:
            power, power_source = float(bench_power), f"measured ({cfg.bench_json})"
        elif device == "gpu" and (power := doctor_power_watts()) is not None:
            power_source = "measured by `redline doctor` under GEMM load"
        else:
            power_source = "unknown: give --power-watts"
    efficiency, efficiency_source = cfg.scaling_efficiency, "given"
    if efficiency is None:
        bench_eff = bench.get("scaling_efficiency")
        if isinstance(bench_eff, (int, float)) and 0 < bench_eff <= 1:
            efficiency, efficiency_source = float(bench_eff), f"measured ({cfg.bench_json})"
        else:
            efficiency, efficiency_source = ASSUMED_SCALING_EFFICIENCY, "assumed (give --scaling-efficiency)"

    targets = [("given", cfg.tokens)] if cfg.tokens else chinchilla_targets(params)
    counts = gpu_counts(cfg.gpus)
    rows = plan_rows(tokens_per_second, targets, counts, efficiency, cfg.price_per_gpu_hour, power)

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    console.print(
        f"[bold]redline plan[/bold] {spec} = {params / 1e6:,.1f}M parameters | {tokens_per_second:,.0f} "
        f"tokens/s on one {unit} ({source}) | scaling efficiency {efficiency:g} ({efficiency_source}) | "
        f"power {f'{power:.0f} W' if power else '-'} per {unit} ({power_source}) | price "
        f"{cfg.price_per_gpu_hour if cfg.price_per_gpu_hour else '- (give --price-per-gpu-hour)'} per {unit}-hour"
    )
    if unit == "CPU":
        console.print("the throughput was measured on a CPU: this plan is for CPUs like it, not for GPUs; measure on "
                      "the GPU you will train on (`redline bench` there) to plan a GPU run")
    table = Table("target", "tokens", f"{unit}s", "tokens/s", "time", f"{unit}-hours", "cost", "cost / 1B tokens",
                  "energy kWh")
    for row in rows:
        table.add_row(row["target"], _tokens(row["tokens"]), str(row["gpus"]), f"{row['tokens_per_second']:,.0f}",
                      _duration(row["hours"]), f"{row['gpu_hours']:,.1f}",
                      f"{row['cost']:,.2f}" if row["cost"] is not None else "-",
                      f"{row['cost_per_billion_tokens']:,.2f}" if row["cost_per_billion_tokens"] is not None else "-",
                      f"{row['energy_kwh']:,.1f}" if row["energy_kwh"] is not None else "-")
    console.print(table)
    record = {
        "command": "plan", "model": str(spec), "params": params, "device": unit.lower(),
        "tokens_per_second": tokens_per_second, "tokens_per_second_source": source, "price_per_gpu_hour": cfg.price_per_gpu_hour, "power_watts": power,
        "power_source": power_source, "scaling_efficiency": efficiency, "scaling_efficiency_source": efficiency_source,
        "rows": rows,
    }
    sys.stdout.flush()
    print(json.dumps(record), flush=True)
    return 0
