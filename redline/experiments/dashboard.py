"""dashboard.html: one self-contained file (inline CSS, inline JS drawing SVG, the data inline as JSON) that
works offline and makes no network request; and `serve`, a localhost server that keeps it fresh.

Charts: validation (or training) loss against tokens or time, tokens/s bars, peak-memory bars, and speed
against quality. Filters by preset, precision and variant apply to every chart and to the table; the
table sorts on any column. Served by `redline dashboard`, the page polls /data.json every few seconds
(same origin) and redraws without losing its filters, so it follows a running sweep.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from redline.durable import write_atomic
from redline.experiments.results import COMPLETED, cell_key

POLL_SECONDS = 5


def dashboard_data(report: dict[str, Any]) -> dict[str, Any]:
    """The compact data the page draws from (a subset of results.json)."""
    cells = []
    for c in report["cells"]:
        vs = c.get("vs_baseline") or {}
        speed, bpb, mem = vs.get("tokens_per_second"), vs.get("final_val_bpb"), vs.get("peak_memory_gib")
        cells.append({
            "label": c["label"], "variant": c["variant"], "preset": c["preset"], "precision": c["precision"],
            "batch": f"{c['batch_size'] or 'default'}×{c['seq_len'] or 'default'}", "key": c["key"],
            "runs": c["n_runs"], "completed": c["n_completed"], "baseline": c["is_baseline"],
            "params": c["params"]["mean"], "tokens_per_second": c["tokens_per_second"]["mean"],
            "tokens_per_second_std": c["tokens_per_second"]["std"], "mfu": c["mfu"]["mean"],
            "peak_memory_gib": c["peak_memory_gib"]["mean"], "peak_memory_gib_std": c["peak_memory_gib"]["std"],
            "final_val_bpb": c["final_val_bpb"]["mean"], "final_val_bpb_std": c["final_val_bpb"]["std"],
            "best_val_bpb": c["best_val_bpb"]["mean"], "wall_time": c["wall_time"]["mean"],
            "d_speed_pct": (speed["estimate"] - 1) * 100 if speed else None,
            "d_bpb": bpb["estimate"] if bpb else None, "d_bpb_low": bpb["low"] if bpb else None,
            "d_bpb_high": bpb["high"] if bpb else None, "p_value": bpb["p_value"] if bpb else None,
            "d_memory_pct": (mem["estimate"] - 1) * 100 if mem else None,
        })
    runs = []
    for r in report["runs"]:
        runs.append({
            "run_id": r.get("run_id"), "key": list(cell_key(r)), "variant": r.get("variant"), "preset": r.get("preset"),
            "precision": r.get("precision"), "seed": r.get("seed"), "status": r.get("status"), "error": r.get("error"),
            "eval": [[p.get("tokens"), p.get("elapsed"), p.get("loss"), p.get("bpb")] for p in r.get("eval_curve", [])],
            "train": [[p.get("tokens"), p.get("elapsed"), p.get("loss")] for p in r.get("train_curve", [])],
        })
    return {"title": report["title"], "generated": report["generated"], "kind": report["kind"],
            "status": report.get("status"), "planned": report.get("planned"), "cells": cells, "runs": runs,
            "claims": report.get("claims", []), "best": report.get("best", {}), "completed_status": COMPLETED}


def render(data: dict[str, Any], live: bool = False, poll_seconds: float = POLL_SECONDS) -> str:
    payload = json.dumps({**data, "live": live, "poll_seconds": poll_seconds}, default=str, allow_nan=False)
    payload = payload.replace("</", "<\\/")  # never close the <script> element early
    title = _escape(data["title"])
    return _PAGE.replace("__TITLE__", title).replace("__DATA__", payload)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_dashboard(data: dict[str, Any], path: Path) -> Path:
    return write_atomic(path, render(_finite(data)))


def _finite(value):
    """NaN and infinities become null (JSON has no such numbers)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# ----------------------------------------------------------------------------------------------------
# serving


class _Source:
    """Rebuilds the dashboard data when the result files change (checked on each request)."""

    def __init__(self, root: Path):
        self.root = root
        self.lock = threading.Lock()
        self.stamp: tuple | None = None
        self.data: dict[str, Any] | None = None

    def _stamp(self) -> tuple:
        files = [self.root / "results.jsonl", self.root / "status.json", self.root / "metrics.jsonl"]
        return tuple(f.stat().st_mtime_ns if f.exists() else 0 for f in files)

    def get(self) -> dict[str, Any]:
        from redline.experiments.report import build_report

        with self.lock:
            stamp = self._stamp()
            if self.data is None or stamp != self.stamp:
                self.data = _finite(dashboard_data(build_report(self.root)))
                self.stamp = stamp
            return self.data


def make_server(root: Path, host: str = "127.0.0.1", port: int = 8765,
                poll_seconds: float = POLL_SECONDS) -> ThreadingHTTPServer:
    source = _Source(Path(root))
    source.get()  # a bad directory fails here, before the server starts

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html", "/dashboard.html"):
                self._send(200, "text/html; charset=utf-8", render(source.get(), live=True, poll_seconds=poll_seconds).encode())
            elif path == "/data.json":
                self._send(200, "application/json", json.dumps(source.get(), default=str).encode())
            elif path == "/favicon.ico":
                self._send(204, "image/x-icon", b"")
            else:
                self._send(404, "text/plain", b"not found")

        def _send(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):  # quiet: one line per request is noise here
            pass

    return ThreadingHTTPServer((host, port), Handler)


_PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>redline · __TITLE__</title>
<style>
  :root { --fg: #1d1d1f; --muted: #6e6e73; --line: #d2d2d7; --accent: #c0392b; --base: #555; --bg: #fff; }
  * { box-sizing: border-box; }
  body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); background: var(--bg);
         margin: 0 auto; max-width: 1280px; padding: 16px 24px 48px; }
  h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 28px 0 8px; }
  .muted { color: var(--muted); } .bad { color: var(--accent); }
  #status { padding: 8px 12px; border: 1px solid var(--line); border-radius: 6px; margin: 10px 0; }
  #filters { display: flex; flex-wrap: wrap; gap: 16px; margin: 12px 0; }
  fieldset { border: 1px solid var(--line); border-radius: 6px; padding: 6px 10px; margin: 0; }
  legend { font-weight: 600; padding: 0 4px; } fieldset label { margin-right: 10px; white-space: nowrap; }
  .charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 16px; }
  .chart { border: 1px solid var(--line); border-radius: 6px; padding: 8px; }
  .chart h3 { font-size: 14px; margin: 0 0 4px; } .chart svg { width: 100%; height: auto; display: block; }
  .controls { font-size: 13px; margin-bottom: 4px; }
  table { border-collapse: collapse; width: 100%; font-size: 13px; }
  th, td { border-bottom: 1px solid var(--line); padding: 4px 8px; text-align: right; white-space: nowrap; }
  th:first-child, td:first-child { text-align: left; }
  th { cursor: pointer; user-select: none; background: #f5f5f7; position: sticky; top: 0; }
  th[aria-sort="ascending"]::after { content: " ▲"; } th[aria-sort="descending"]::after { content: " ▼"; }
  tr.baseline td { font-weight: 600; }
  td.text { text-align: left; white-space: normal; }
  .legend { font-size: 12px; display: flex; flex-wrap: wrap; gap: 4px 12px; margin-top: 4px; }
  .swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; vertical-align: middle; }
  svg text { font: 11px system-ui, sans-serif; fill: var(--fg); }
  svg .grid { stroke: #eee; } svg .axis { stroke: #999; }
</style>
</head>
<body>
<h1>redline · <span id="title"></span></h1>
<div class="muted" id="subtitle"></div>
<div id="status"></div>
<div id="best"></div>
<div id="filters"></div>
<div class="charts">
  <div class="chart"><h3>Loss</h3>
    <div class="controls">
      <label>curve <select id="loss-kind"><option value="eval">validation</option><option value="train">training</option></select></label>
      <label>against <select id="loss-x"><option value="tokens">tokens</option><option value="time">training time</option></select></label>
    </div>
    <div id="chart-loss"></div><div class="legend" id="legend-loss"></div></div>
  <div class="chart"><h3>Throughput (tokens/s, mean ± std over seeds)</h3><div id="chart-speed"></div></div>
  <div class="chart"><h3>Peak GPU memory (GiB)</h3><div id="chart-memory"></div></div>
  <div class="chart"><h3>Speed vs quality (bottom right is best)</h3><div id="chart-scatter"></div></div>
</div>
<h2>Configurations <span class="muted" id="table-count"></span></h2>
<table id="cells-table"><thead></thead><tbody></tbody></table>
<h2>Claims <span class="muted" id="claims-count"></span></h2>
<table id="claims-table"><thead></thead><tbody></tbody></table>
<h2>Runs that did not complete</h2>
<table id="failed-table"><thead></thead><tbody></tbody></table>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
let DATA = JSON.parse(document.getElementById("data").textContent);
const AXES = ["preset", "precision", "variant"];
const filters = {};  // axis -> Set of unchecked values (new values start checked)
let sortKey = null, sortDir = 1;
const SVGNS = "http://www.w3.org/2000/svg";
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
                 "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd", "#e6550d", "#31a354"];
AXES.forEach(a => filters[a] = new Set());

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
function fmt(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "—";
  if (digits === "int") return Math.round(v).toLocaleString("en-US");
  return Number(v).toFixed(digits);
}
function fmtSigned(v, digits, suffix) { return v === null || v === undefined ? "—" : (v >= 0 ? "+" : "") + Number(v).toFixed(digits) + (suffix || ""); }
function fmtCount(v) {
  if (v === null || v === undefined) return "—";
  if (v >= 1e9) return (v / 1e9).toFixed(2) + "B";
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return String(Math.round(v));
}
function visible(item) { return AXES.every(a => !filters[a].has(String(item[a]))); }
function colorFor(label) {
  const labels = DATA.cells.map(c => c.label);
  const i = labels.indexOf(label);
  return PALETTE[(i < 0 ? 0 : i) % PALETTE.length];
}
function niceTicks(lo, hi, n) {
  if (!(hi > lo)) { hi = lo + 1; }
  const step0 = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= step0) || step0;
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9 * step; t += step) ticks.push(t);
  return ticks;
}
function frame(width, height, margin, xr, yr, xlabel, ylabel, xfmt, yfmt) {
  const root = svg("svg", {viewBox: `0 0 ${width} ${height}`, role: "img"});
  const W = width - margin.l - margin.r, H = height - margin.t - margin.b;
  const sx = x => margin.l + (x - xr[0]) / (xr[1] - xr[0] || 1) * W;
  const sy = y => margin.t + H - (y - yr[0]) / (yr[1] - yr[0] || 1) * H;
  for (const t of niceTicks(yr[0], yr[1], 5)) {
    root.appendChild(svg("line", {x1: margin.l, x2: margin.l + W, y1: sy(t), y2: sy(t), class: "grid"}));
    root.appendChild(svg("text", {x: margin.l - 6, y: sy(t) + 4, "text-anchor": "end"}, yfmt(t)));
  }
  if (xr) for (const t of niceTicks(xr[0], xr[1], 6)) {
    root.appendChild(svg("text", {x: sx(t), y: margin.t + H + 16, "text-anchor": "middle"}, xfmt(t)));
  }
  root.appendChild(svg("line", {x1: margin.l, x2: margin.l, y1: margin.t, y2: margin.t + H, class: "axis"}));
  root.appendChild(svg("line", {x1: margin.l, x2: margin.l + W, y1: margin.t + H, y2: margin.t + H, class: "axis"}));
  if (xlabel) root.appendChild(svg("text", {x: margin.l + W / 2, y: height - 4, "text-anchor": "middle"}, xlabel));
  if (ylabel) root.appendChild(svg("text", {x: 12, y: margin.t + H / 2, transform: `rotate(-90 12 ${margin.t + H / 2})`, "text-anchor": "middle"}, ylabel));
  return {root, sx, sy, W, H};
}
function empty(container, message) {
  container.replaceChildren(el("p", {class: "muted empty"}, message));
}
function extent(values, pad) {
  let lo = Math.min(...values), hi = Math.max(...values);
  if (lo === hi) { lo -= Math.abs(lo) * 0.05 || 1; hi += Math.abs(hi) * 0.05 || 1; }
  const p = (hi - lo) * (pad || 0);
  return [lo - p, hi + p];
}

function drawLoss() {
  const container = document.getElementById("chart-loss"), legend = document.getElementById("legend-loss");
  const kind = document.getElementById("loss-kind").value, xKey = document.getElementById("loss-x").value;
  const xi = xKey === "tokens" ? 0 : 1, yi = 2;
  const series = [];
  for (const run of DATA.runs) {
    if (run.status !== DATA.completed_status || !visible(run)) continue;
    const pts = (kind === "eval" ? run.eval : run.train).filter(p => p[xi] !== null && p[yi] !== null).map(p => [p[xi], p[yi]]);
    const cell = DATA.cells.find(c => JSON.stringify(c.key) === JSON.stringify(run.key));
    if (pts.length) series.push({run, pts, label: cell ? cell.label : run.run_id});
  }
  legend.replaceChildren();
  if (!series.length) { empty(container, "no completed runs match the filters"); return; }
  const xs = series.flatMap(s => s.pts.map(p => p[0])), ys = series.flatMap(s => s.pts.map(p => p[1]));
  const xr = [Math.min(0, ...xs), Math.max(...xs)], yr = extent(ys, 0.05);
  const f = frame(620, 320, {l: 56, r: 12, t: 10, b: 40}, xr, yr, xKey === "tokens" ? "tokens" : "training time (s)",
                  (kind === "eval" ? "validation" : "training") + " loss", fmtCount, t => t.toFixed(2));
  const seen = new Set();
  for (const s of series) {
    const d = s.pts.map((p, i) => (i ? "L" : "M") + f.sx(p[0]).toFixed(1) + " " + f.sy(p[1]).toFixed(1)).join(" ");
    const path = svg("path", {d, fill: "none", stroke: colorFor(s.label), "stroke-width": 1.6, class: "series", "data-run": s.run.run_id});
    path.appendChild(svg("title", {}, `${s.run.run_id}: last ${s.pts[s.pts.length - 1][1].toFixed(4)}`));
    f.root.appendChild(path);
    if (kind === "eval") for (const p of s.pts) f.root.appendChild(svg("circle", {cx: f.sx(p[0]), cy: f.sy(p[1]), r: 2.2, fill: colorFor(s.label)}));
    if (!seen.has(s.label)) {
      seen.add(s.label);
      const item = el("span"); item.appendChild(el("span", {class: "swatch", style: `background:${colorFor(s.label)}`}));
      item.appendChild(document.createTextNode(s.label)); legend.appendChild(item);
    }
  }
  container.replaceChildren(f.root);
}

function drawBars(containerId, key, stdKey, unit, emptyMessage) {
  const container = document.getElementById(containerId);
  const rows = DATA.cells.filter(c => visible(c) && c[key] !== null && c[key] !== undefined);
  if (!rows.length) { empty(container, emptyMessage); return; }
  const height = 300, margin = {l: 64, r: 12, t: 10, b: 96};
  const top = Math.max(...rows.map(c => c[key] + (c[stdKey] || 0))) * 1.08;
  const f = frame(620, height, margin, null, [0, top], null, unit, null, t => Math.abs(t) >= 1000 ? fmtCount(t) : String(+t.toPrecision(3)));
  const slot = f.W / rows.length, bw = Math.max(4, Math.min(48, slot * 0.7));
  rows.forEach((c, i) => {
    const x = margin.l + slot * i + (slot - bw) / 2, y = f.sy(c[key]);
    const rect = svg("rect", {x, y, width: bw, height: Math.max(0, f.sy(0) - y), fill: c.baseline ? "#555" : colorFor(c.label), class: "bar", "data-label": c.label});
    rect.appendChild(svg("title", {}, `${c.label}: ${fmt(c[key], 2)} ${unit}` + (c[stdKey] ? ` ± ${fmt(c[stdKey], 2)}` : "")));
    f.root.appendChild(rect);
    if (c[stdKey]) {
      const cx = x + bw / 2;
      f.root.appendChild(svg("line", {x1: cx, x2: cx, y1: f.sy(c[key] + c[stdKey]), y2: f.sy(Math.max(0, c[key] - c[stdKey])), stroke: "#222"}));
    }
    const lx = x + bw / 2, ly = f.sy(0) + 10;
    f.root.appendChild(svg("text", {x: lx, y: ly, transform: `rotate(40 ${lx} ${ly})`, "text-anchor": "start"}, c.label));
  });
  container.replaceChildren(f.root);
}

function drawScatter() {
  const container = document.getElementById("chart-scatter");
  const rows = DATA.cells.filter(c => visible(c) && c.tokens_per_second !== null && c.final_val_bpb !== null);
  if (!rows.length) { empty(container, "needs throughput and validation bits per byte"); return; }
  const xr = extent(rows.map(c => c.tokens_per_second), 0.1), yr = extent(rows.map(c => c.final_val_bpb), 0.1);
  const f = frame(620, 320, {l: 56, r: 110, t: 10, b: 40}, xr, yr, "tokens/s", "final val bits/byte", fmtCount, t => t.toFixed(3));
  for (const c of rows) {
    const cx = f.sx(c.tokens_per_second), cy = f.sy(c.final_val_bpb);
    const dot = svg(c.baseline ? "rect" : "circle", c.baseline ? {x: cx - 5, y: cy - 5, width: 10, height: 10, fill: "#555", class: "point"}
                                                         : {cx, cy, r: 5, fill: colorFor(c.label), class: "point"});
    dot.appendChild(svg("title", {}, `${c.label}: ${fmt(c.tokens_per_second, "int")} tok/s, ${fmt(c.final_val_bpb, 4)} bpb`));
    f.root.appendChild(dot);
    f.root.appendChild(svg("text", {x: cx + 7, y: cy - 6}, c.label));
  }
  container.replaceChildren(f.root);
}

const COLUMNS = [
  ["label", "configuration", c => c.label + (c.baseline ? " (baseline)" : "")],
  ["params", "params", c => fmtCount(c.params)],
  ["tokens_per_second", "tokens/s", c => fmt(c.tokens_per_second, "int")],
  ["d_speed_pct", "Δ tokens/s", c => fmtSigned(c.d_speed_pct, 1, "%")],
  ["mfu", "MFU", c => c.mfu === null ? "—" : fmt(c.mfu * 100, 1) + "%"],
  ["final_val_bpb", "val bpb", c => fmt(c.final_val_bpb, 4) + (c.final_val_bpb_std ? " ± " + fmt(c.final_val_bpb_std, 4) : "")],
  ["d_bpb", "Δ val bpb", c => fmtSigned(c.d_bpb, 4) + (c.d_bpb_low !== null && c.d_bpb_low !== undefined ? ` [${fmt(c.d_bpb_low, 4)}, ${fmt(c.d_bpb_high, 4)}]` : "")],
  ["p_value", "p (Welch)", c => fmt(c.p_value, 3)],
  ["peak_memory_gib", "peak GiB", c => fmt(c.peak_memory_gib, 2)],
  ["d_memory_pct", "Δ memory", c => fmtSigned(c.d_memory_pct, 1, "%")],
  ["completed", "seeds", c => `${c.completed}/${c.runs}`],
];

function drawTable() {
  const table = document.getElementById("cells-table");
  const head = el("tr");
  for (const [key, title] of COLUMNS) {
    const th = el("th", {"data-key": key, scope: "col"}, title);
    if (key === sortKey) th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
    th.addEventListener("click", () => { sortDir = sortKey === key ? -sortDir : 1; sortKey = key; drawTable(); });
    head.appendChild(th);
  }
  table.tHead.replaceChildren(head);
  let rows = DATA.cells.filter(visible);
  if (sortKey) {
    rows = rows.slice().sort((a, b) => {
      const x = a[sortKey], y = b[sortKey];
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (typeof x === "string" ? x.localeCompare(y) : x - y) * sortDir;
    });
  }
  const body = table.tBodies[0];
  body.replaceChildren(...rows.map(c => {
    const tr = el("tr", {class: c.baseline ? "baseline" : "", "data-label": c.label});
    for (const [, , render] of COLUMNS) tr.appendChild(el("td", {}, render(c)));
    return tr;
  }));
  document.getElementById("table-count").textContent = `(${rows.length} of ${DATA.cells.length})`;
}

function drawClaims() {
  const table = document.getElementById("claims-table");
  const head = el("tr");
  ["claim", "measured", "95% interval", "claim band", "runs", "verdict"].forEach(t => head.appendChild(el("th", {}, t)));
  table.tHead.replaceChildren(head);
  // a claim none of whose runs is in this result set belongs to another recipe: counted, not listed
  const shown = DATA.claims.filter(row => !row.absent);
  const others = DATA.claims.length - shown.length;
  document.getElementById("claims-count").textContent = others ? `(${others} of other recipes not listed)` : "";
  table.tBodies[0].replaceChildren(...shown.map(row => {
    const tr = el("tr");
    const ctx = row.context ? Object.entries(row.context).filter(([k]) => k !== "variant").map(([k, v]) => `${k}=${v}`).join(", ") : "";
    tr.appendChild(el("td", {class: "text"}, row.claim + (ctx ? ` (${ctx})` : "")));
    if (row.measured_ratio === undefined) {
      tr.appendChild(el("td", {class: "text", colspan: 4}, row.reason || ""));
    } else {
      tr.appendChild(el("td", {}, `${row.metric}: ${fmt(row.measured_ratio, 3)}× (${fmtSigned(row.measured_change_pct, 1, "%")})`));
      tr.appendChild(el("td", {}, `${fmt(row.low, 3)}–${fmt(row.high, 3)}×`));
      tr.appendChild(el("td", {}, `${fmt(row.band[0], 3)}–${fmt(row.band[1], 3)}×`));
      tr.appendChild(el("td", {}, `${row.n[0]} vs ${row.n[1]}`));
    }
    tr.appendChild(el("td", {class: "verdict"}, row.verdict));
    return tr;
  }));
}

function drawFailed() {
  const table = document.getElementById("failed-table");
  const head = el("tr");
  ["run", "status", "error"].forEach(t => head.appendChild(el("th", {}, t)));
  table.tHead.replaceChildren(head);
  const failed = DATA.runs.filter(r => r.status !== DATA.completed_status && visible(r));
  table.tBodies[0].replaceChildren(...(failed.length ? failed.map(r => {
    const tr = el("tr");
    tr.appendChild(el("td", {}, r.run_id)); tr.appendChild(el("td", {class: "bad"}, r.status));
    tr.appendChild(el("td", {class: "text"}, r.error || ""));
    return tr;
  }) : [(() => { const tr = el("tr"); tr.appendChild(el("td", {colspan: 3, class: "muted"}, "none")); return tr; })()]));
}

function drawFilters() {
  const box = document.getElementById("filters");
  box.replaceChildren();
  for (const axis of AXES) {
    const values = [...new Set(DATA.cells.map(c => String(c[axis])))];
    if (values.length < 1) continue;
    const fs = el("fieldset", {"data-axis": axis});
    fs.appendChild(el("legend", {}, axis));
    for (const v of values) {
      const id = `filter-${axis}-${v}`.replace(/[^A-Za-z0-9_-]/g, "_");
      const input = el("input", {type: "checkbox", id, "data-axis": axis, "data-value": v});
      input.checked = !filters[axis].has(v);
      input.addEventListener("change", () => { if (input.checked) filters[axis].delete(v); else filters[axis].add(v); drawAll(false); });
      const label = el("label", {for: id});
      label.appendChild(input); label.appendChild(document.createTextNode(" " + v));
      fs.appendChild(label);
    }
    box.appendChild(fs);
  }
}

function drawHeader() {
  document.getElementById("title").textContent = DATA.title;
  document.getElementById("subtitle").textContent = `${DATA.kind} · generated ${DATA.generated}` + (DATA.live ? " · live" : "");
  const s = DATA.status, box = document.getElementById("status");
  const done = DATA.runs.filter(r => r.status === DATA.completed_status).length, failed = DATA.runs.length - done;
  let text = `${done} completed, ${failed} failed` + (DATA.planned ? ` of ${DATA.planned} planned` : "");
  if (s) {
    text += ` · sweep ${s.state}`;
    const running = s.children && s.children.length ? s.children : (s.running ? [{run_id: s.running, fraction: s.running_fraction}] : []);
    if (running.length) text += " · running " + running.map(c => `${c.run_id} (${Math.round((c.fraction || 0) * 100)}%)`).join(", ");
    if (s.eta_seconds !== null && s.eta_seconds !== undefined && s.state === "running") text += ` · ETA ${Math.round(s.eta_seconds / 60)} min`;
  }
  box.textContent = text;
  // a winner is named only where it leads by more than the spread the charts draw (results.leader decides)
  const best = DATA.best || {}, parts = [];
  const lead = (b, value) => b.clear ? `${b.label} (${value(b.mean)})`
    : b.runner_up ? `no clear winner (${b.label} ${value(b.mean)} vs ${b.runner_up} ${value(b.runner_up_mean)}: ${b.reason})`
    : `no clear winner (${b.label} is ${b.reason})`;
  const speed = v => fmt(v, "int") + " tok/s", bpb = v => fmt(v, 4) + " bpb";
  if (best.speed) parts.push(`fastest: ${lead(best.speed, speed)}`);
  if (best.quality) parts.push(`best quality: ${lead(best.quality, bpb)}`);
  if (best.quality_per_time) parts.push(`best quality for the time: ${lead(best.quality_per_time, bpb)} at ${fmt(best.quality_per_time.seconds, 0)} s`);
  document.getElementById("best").textContent = parts.join(" · ");
}

function drawAll(withFilters) {
  drawHeader();
  if (withFilters) drawFilters();
  drawLoss(); drawBars("chart-speed", "tokens_per_second", "tokens_per_second_std", "tokens/s", "no throughput recorded");
  drawBars("chart-memory", "peak_memory_gib", "peak_memory_gib_std", "GiB", "no peak memory recorded (CPU runs record none)");
  drawScatter(); drawTable(); drawClaims(); drawFailed();
}

document.getElementById("loss-kind").addEventListener("change", drawLoss);
document.getElementById("loss-x").addEventListener("change", drawLoss);
drawAll(true);

if (DATA.live) {
  setInterval(() => {
    fetch("data.json", {cache: "no-store"}).then(r => r.ok ? r.json() : null).then(fresh => {
      if (!fresh) return;
      DATA = Object.assign(fresh, {live: true, poll_seconds: DATA.poll_seconds});
      drawAll(true);
    }).catch(() => { document.getElementById("status").textContent += " · (server not reachable)"; });
  }, DATA.poll_seconds * 1000);
}
</script>
</body>
</html>
"""
