"""PNG plots of a result set (matplotlib, Agg backend: no display needed).

    loss_vs_tokens.png     training and validation loss against tokens seen, one colour per configuration
    loss_vs_time.png       the same against training wall time
    tokens_per_second.png  throughput bars (mean over seeds, error bar = std)
    peak_memory.png        peak GPU memory bars (left out when no run recorded memory, e.g. on a CPU)
    speed_vs_quality.png   tokens/s against final validation bits per byte
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from redline.durable import write_atomic
from redline.experiments.results import COMPLETED, cell_key


def _pyplot():
    import matplotlib  # imported here: it takes a second, and only the report draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    """The PNG written whole or not at all (durable.write_atomic), and the figure freed."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    return write_atomic(path, png.getvalue())


def _colors(n: int) -> list:
    plt = _pyplot()
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _runs_of(cell: dict[str, Any], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if r.get("status") == COMPLETED and cell_key(r) == tuple(cell["key"])]


def plot_loss(cells: list[dict], runs: list[dict], x: str, path: Path) -> Path | None:
    """Two panels, training loss and validation loss, against x = "tokens" or "elapsed"."""
    plt = _pyplot()
    done = [c for c in cells if c["n_completed"]]
    if not done:
        return None
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(12, 4.5))
    for cell, color in zip(done, _colors(len(done))):
        for i, run in enumerate(_runs_of(cell, runs)):
            label = cell["label"] if i == 0 else None
            train = [(p[x], p["loss"]) for p in run.get("train_curve", []) if p.get(x) is not None and p.get("loss") is not None]
            val = [(p[x], p["loss"]) for p in run.get("eval_curve", []) if p.get(x) is not None and p.get("loss") is not None]
            if train:
                ax_train.plot(*zip(*train), color=color, alpha=0.8, linewidth=1, label=label)
            if val:
                ax_val.plot(*zip(*val), color=color, alpha=0.8, linewidth=1.2, marker="o", markersize=3, label=label)
    xlabel = "tokens" if x == "tokens" else "training time (s)"
    for ax, title in ((ax_train, "training loss"), (ax_val, "validation loss")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax_val.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return _save(plt, fig, path)


def plot_bars(cells: list[dict], metric: str, ylabel: str, title: str, path: Path) -> Path | None:
    plt = _pyplot()
    rows = [c for c in cells if c[metric]["mean"] is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(rows) + 2), 4.5))
    colors = ["#444444" if c.get("is_baseline") else "#d62728" for c in rows]
    ax.bar(range(len(rows)), [c[metric]["mean"] for c in rows], yerr=[c[metric]["std"] or 0 for c in rows],
           color=colors, capsize=3)
    ax.set_xticks(range(len(rows)), [c["label"] for c in rows], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} (mean over seeds ± std; grey = baseline)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(plt, fig, path)


def plot_speed_quality(cells: list[dict], path: Path) -> Path | None:
    plt = _pyplot()
    rows = [c for c in cells if c["tokens_per_second"]["mean"] is not None and c["final_val_bpb"]["mean"] is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 5))
    for cell, color in zip(rows, _colors(len(rows))):
        ax.errorbar(cell["tokens_per_second"]["mean"], cell["final_val_bpb"]["mean"],
                    xerr=cell["tokens_per_second"]["std"] or 0, yerr=cell["final_val_bpb"]["std"] or 0,
                    fmt="s" if cell.get("is_baseline") else "o", color=color, capsize=2, label=cell["label"])
    ax.set_xlabel("tokens/s (higher is faster)")
    ax.set_ylabel("final validation bits per byte (lower is better)")
    ax.set_title("speed vs quality (best: bottom right)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(plt, fig, path)


def write_plots(cells: list[dict], runs: list[dict], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    made = {
        "loss_vs_tokens": plot_loss(cells, runs, "tokens", out_dir / "loss_vs_tokens.png"),
        "loss_vs_time": plot_loss(cells, runs, "elapsed", out_dir / "loss_vs_time.png"),
        "tokens_per_second": plot_bars(cells, "tokens_per_second", "tokens/s", "throughput", out_dir / "tokens_per_second.png"),
        "peak_memory": plot_bars(cells, "peak_memory_gib", "GiB", "peak GPU memory", out_dir / "peak_memory.png"),
        "speed_vs_quality": plot_speed_quality(cells, out_dir / "speed_vs_quality.png"),
    }
    return {name: path for name, path in made.items() if path is not None}
