"""scripts/gpu/serve_vs_transformers.py (the comparison's model and summary) and the two serve_load.py options it
uses, against a stand-in server on loopback that streams as `transformers serve` does (text chunks, a last chunk
with the finish_reason and usage, no `data: [DONE]`)."""

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(monkeypatch, name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def helper(monkeypatch):
    return load_script(monkeypatch, "serve_vs_transformers", SCRIPTS / "gpu" / "serve_vs_transformers.py")


@pytest.fixture
def serve_load(monkeypatch):
    return load_script(monkeypatch, "serve_load", SCRIPTS / "serve_load.py")


def summary(c: int, tok_s: float, failed: int = 0) -> dict:
    return {"concurrency": c, "requests": 2 * c, "completed": 2 * c - failed, "failed": failed, "rate": None,
            "prompt_tokens": 128, "server_prompt_tokens": 128.0, "max_tokens": 256, "wall_s": 1.0,
            "output_tokens": int(tok_s), "output_tokens_per_s": tok_s, "ttft_ms": {"p50": 10.0, "p99": 20.0},
            "itl_ms": {"p50": 2.0, "p99": 3.0}, "finish_reasons": {"stop": 0, "length": 2 * c}, "errors": []}


def write_loads(out: Path, name: str, loads: list[dict]) -> None:
    (out / f"{name}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in loads))


def test_summary_ratios_and_the_check(helper, tmp_path, capsys):
    write_loads(tmp_path, "redline", [summary(1, 500.0), summary(64, 12000.0)])
    write_loads(tmp_path, "transformers", [summary(1, 50.0), summary(64, 2000.0)])
    (tmp_path / "probe_redline.json").write_text(json.dumps({"text": "abcdef"}))
    (tmp_path / "probe_transformers.json").write_text(json.dumps({"text": "abcxyz"}))
    assert helper.main(["summary", str(tmp_path), json.dumps({"device": "test"})]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert result["device"] == "test" and [r["ratio"] for r in result["rows"]] == [10.0, 6.0]
    assert result["check"]["measured"] == 6.0 and result["check"]["met"] is True
    assert result["greedy_agreement"]["same_leading_chars"] == 3
    assert any("NOT met" not in line and ": 6.0 (target >= 5): met" in line for line in out)


def test_summary_with_a_load_missing_or_failed_measures_nothing(helper, tmp_path, capsys):
    write_loads(tmp_path, "redline", [summary(1, 500.0), summary(64, 12000.0)])
    write_loads(tmp_path, "transformers", [summary(1, 50.0)])  # its 64-client load timed out
    assert helper.main(["summary", str(tmp_path)]) == 1
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["rows"][1]["transformers"] is None and result["rows"][1]["ratio"] is None
    assert result["check"] == {**result["check"], "measured": None, "met": False}
    write_loads(tmp_path, "transformers", [summary(1, 50.0), summary(64, 100.0, failed=3)])
    assert helper.compare(tmp_path)["check"]["measured"] is None


def test_the_model_head_picks_printable_ascii_only(helper, tmp_path):
    from safetensors.torch import load_file

    ckpt = helper.make_model("tiny", str(tmp_path))
    weights = load_file(str(ckpt / "model.safetensors"))
    head = next(v for k, v in weights.items() if k.endswith("lm_head.weight"))  # (padded_vocab, n_embd)
    nonzero = head.abs().sum(dim=1) > 0
    assert nonzero.nonzero().flatten().tolist() == list(range(32, 127))


class TransformersLikeServer:
    """Answers every POST with a chunked SSE stream of one text chunk a token and a last chunk with the
    finish_reason and usage, without `data: [DONE]` (as transformers serve's /v1/completions does)."""

    def __init__(self):
        self.bodies = []

    async def handle(self, reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(l for l in head.decode().split("\r\n") if l.lower().startswith("content-length"))
                     .split(":")[1])
        body = json.loads(await reader.readexactly(length))
        self.bodies.append(body)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        events = [{"choices": [{"index": 0, "text": "x"}]} for _ in range(body["max_tokens"])]
        events.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                       "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]}})
        for event in events:
            data = f"data: {json.dumps(event)}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()


def run_load(serve_load, argv: list[str]) -> tuple[dict, list[dict]]:
    server = TransformersLikeServer()

    async def go():
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        argv_all = ["--url", f"http://127.0.0.1:{port}", "--model", "m", "--concurrency", "2", "--requests", "3",
                       "--prompt-tokens", "12", "--max-tokens", "5", *argv]
        async with srv:
            args = serve_load.parse_args(argv_all)
            return await asyncio.wait_for(serve_load.run(args), 30)

    return asyncio.run(go()), server.bodies


def test_serve_load_text_prompts_and_streams_without_done(serve_load, capsys):
    strict, _ = run_load(serve_load, ["--prompt-text"])
    assert strict["failed"] == 3 and strict["errors"] == ["the stream ended without [DONE]"]
    result, bodies = run_load(serve_load, ["--prompt-text", "--done-optional"])
    assert result["completed"] == 3 and result["failed"] == 0
    assert result["output_tokens"] == 15 and result["server_prompt_tokens"] == 12.0
    assert result["ttft_ms"]["p50"] > 0 and result["finish_reasons"]["length"] == 3
    prompts = [b["prompt"] for b in bodies]
    assert all(isinstance(p, str) and len(p) == 12 and all(32 <= ord(ch) < 127 for ch in p) for p in prompts)
    ids, bodies = run_load(serve_load, ["--done-optional"])  # the default: token ids
    assert all(isinstance(b["prompt"], list) and len(b["prompt"]) == 12 for b in bodies)
