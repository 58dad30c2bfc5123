"""Helpers of scripts/gpu/serve_vs_transformers.sh (`redline serve` against `transformers serve`).

    python scripts/gpu/serve_vs_transformers.py model PRESET DIR       # a random-weight checkpoint; prints its path
    python scripts/gpu/serve_vs_transformers.py wait URL PID SECONDS   # until URL/health answers (PID still alive)
    python scripts/gpu/serve_vs_transformers.py probe NAME URL MODEL OUT PROMPT NEW   # -> OUT/probe_NAME.json
    python scripts/gpu/serve_vs_transformers.py summary OUT            # the table and one JSON line

The model has random weights except that its output head can only pick printable ASCII bytes: the rows of every
other token (the other bytes, the end-of-text token, the padding up to the vocabulary size) are zero, so their
logits are 0 while the maximum of 95 random logits is above 0. Every greedy step then writes one character, so
`transformers serve`, which streams text and says nothing of tokens that decode to none, sends one chunk per token
(its time to first token and inter-token latency mean what redline's do), and no request ends early at an
end-of-text token on either server. The work per step is the whole model's, the full-vocabulary head included.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

PRINTABLE = range(32, 127)  # the byte tokens the head may pick: ' ' .. '~'
SERVERS = ("redline", "transformers")
PROBE_TEXT = "The quick brown fox jumps over the lazy dog. "


def make_model(preset: str, run_dir: str) -> Path:
    """A checkpoint of `preset` with random weights (seed 0), the bytes tokenizer and a printable-ASCII head."""
    import torch

    from redline.config import TrainConfig, to_dict
    from redline.model import GPT
    from redline.presets import get_preset
    from redline.tokenizer import load_tokenizer
    from redline.training.checkpoint import save_checkpoint

    cfg = TrainConfig(model=get_preset(preset))
    torch.manual_seed(0)
    model = GPT(cfg.model)
    with torch.no_grad():
        keep = torch.zeros(model.lm_head.weight.shape[0], dtype=torch.bool)  # (padded_vocab,)
        keep[list(PRINTABLE)] = True
        model.lm_head.weight[~keep] = 0.0  # tied embeddings too: prompts are printable ASCII, never those rows
    return save_checkpoint(Path(run_dir), 0, model, {}, to_dict(cfg), load_tokenizer("bytes"), keep=1)


def wait_for(url: str, pid: int, seconds: float) -> float:
    """Seconds until GET url/health answered 200; exits with a message if `pid` dies or time runs out."""
    t0 = time.time()
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return time.time() - t0
        except OSError:
            pass
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit(f"the server at {url} exited before it listened (see its log)")
        if time.time() - t0 > seconds:
            sys.exit(f"the server at {url} did not listen within {seconds:.0f} s (see its log)")
        time.sleep(0.5)


def probe(name: str, url: str, model: str, out: str, prompt_chars: int, new_tokens: int) -> str:
    """One non-streamed greedy completion of PROBE_TEXT (repeated or cut to the loads' prompt length, up to 32 new
    tokens), saved for the summary: the same model gives the same text on both servers (up to where bf16 rounding
    in different kernels tips a near tie)."""
    prompt = (PROBE_TEXT * (prompt_chars // len(PROBE_TEXT) + 1))[:prompt_chars]
    body = {"model": model, "prompt": prompt, "max_tokens": min(new_tokens, 32), "temperature": 0}
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            answer = json.loads(r.read())
    except OSError as e:  # urllib's HTTPError included: the comparison goes on without this probe
        body = e.read().decode(errors="replace")[:300] if hasattr(e, "read") else ""
        return f"(no probe: {e} {body})"
    text = answer["choices"][0]["text"]
    Path(out, f"probe_{name}.json").write_text(json.dumps({"prompt": prompt, "text": text}) + "\n")
    return text


def agreement(out: Path) -> dict | None:
    """How many leading characters of the two servers' probe completions agree."""
    paths = [out / f"probe_{name}.json" for name in SERVERS]
    if not all(p.is_file() for p in paths):
        return None
    texts = [json.loads(p.read_text())["text"] for p in paths]
    same = next((i for i, (a, b) in enumerate(zip(*texts)) if a != b), min(map(len, texts)))
    return {"texts": dict(zip(SERVERS, texts)), "same_leading_chars": same, "chars": min(map(len, texts))}


def read_loads(path: Path) -> dict[int, dict]:
    """serve_load.py summaries by concurrency (the last one where a concurrency ran twice)."""
    loads = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                loads[rec["concurrency"]] = rec
    return loads


def compare(out: Path, target: float = 5.0) -> dict:
    """Both servers' figures per concurrency and the ratio redline / transformers of aggregate output tokens/s."""
    loads = {name: read_loads(out / f"{name}.jsonl") for name in SERVERS}
    rows = []
    for c in sorted(set().union(*loads.values())):
        row = {"concurrency": c}
        for name in SERVERS:
            rec = loads[name].get(c)
            row[name] = None if rec is None else {
                k: rec[k] for k in ("completed", "failed", "output_tokens", "output_tokens_per_s", "ttft_ms",
                                    "itl_ms", "server_prompt_tokens", "finish_reasons", "errors")}
        ours, theirs = (row[n] and row[n]["output_tokens_per_s"] for n in SERVERS)
        row["ratio"] = round(ours / theirs, 2) if ours and theirs else None
        rows.append(row)
    ratios = [r["ratio"] for r in rows]
    complete = bool(rows) and all(r is not None for r in ratios) and all(
        r[n]["failed"] == 0 for r in rows for n in SERVERS)
    check = {"metric": "redline serve / transformers serve aggregate output tokens/s, every concurrency",
             "target": f">= {target:g}", "measured": min(ratios) if complete else None,
             "met": complete and min(ratios) >= target}
    return {"rows": rows, "check": check, "greedy_agreement": agreement(out)}


def print_table(result: dict) -> None:
    print(f"\n{'server':<14} {'C':>4} {'done':>5} {'failed':>6} {'prompt':>6} {'tok/s':>10} {'TTFT p50':>9} "
          f"{'p99':>8} {'ITL p50':>8} {'p99':>7} {'ratio':>6}")
    for row in result["rows"]:
        for name in SERVERS:
            rec = row[name]
            ratio = f"{row['ratio']:>5.2f}x" if name == "redline" and row["ratio"] else ""
            if rec is None:
                print(f"{name:<14} {row['concurrency']:>4}  (no result: the load did not finish)")
                continue
            t, i = rec["ttft_ms"], rec["itl_ms"]
            print(f"{name:<14} {row['concurrency']:>4} {rec['completed']:>5} {rec['failed']:>6} "
                  f"{rec['server_prompt_tokens'] or 0:>6g} {rec['output_tokens_per_s'] or 0:>10,.0f} "
                  f"{t.get('p50', 0):>9.1f} {t.get('p99', 0):>8.1f} {i.get('p50', 0):>8.2f} {i.get('p99', 0):>7.2f} "
                  f"{ratio:>6}")
    if (agree := result["greedy_agreement"]) is not None:
        print(f"greedy probe: the servers' first {agree['same_leading_chars']} of {agree['chars']} characters agree "
              f"(redline {agree['texts']['redline']!r}, transformers {agree['texts']['transformers']!r})")
    c = result["check"]
    print(f"{c['metric']}: {c['measured']} (target {c['target']}): {'met' if c['met'] else 'NOT met'}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["model"] and len(argv) == 3:
        print(make_model(argv[1], argv[2]))
    elif argv[:1] == ["wait"] and len(argv) == 4:
        print(f"{argv[1]} up after {wait_for(argv[1], int(argv[2]), float(argv[3])):.0f} s")
    elif argv[:1] == ["probe"] and len(argv) == 7:
        print(f"{argv[1]} greedy probe: {probe(*argv[1:5], int(argv[5]), int(argv[6]))!r}")
    elif argv[:1] == ["summary"] and len(argv) in (2, 3):
        out = Path(argv[1])
        result = compare(out)
        print_table(result)
        info = json.loads(argv[2]) if len(argv) == 3 else {}
        print(json.dumps({"script": "serve_vs_transformers.sh", **info, **result}))
        return 0 if result["check"]["measured"] is not None else 1
    else:
        sys.exit(__doc__.split("\n\n")[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
