"""scripts/serve_engine_load.py still drives the server's scheduler as it is (it wraps the scheduler's turn and
submits from its sinks): on a CPU with a tiny checkpoint, every closed loop finishes, every request gets its tokens,
and the figures add up."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from redline.config import TrainConfig, to_dict
from redline.model import GPT, ModelConfig
from redline.tokenizer import load_tokenizer
from redline.training.checkpoint import save_checkpoint

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "serve_engine_load.py"
CFG = ModelConfig(vocab_size=261, context_len=96, n_layer=2, n_embd=64, n_head=4, n_kv_head=2)


@pytest.mark.parametrize("temperature", ["0", "1"])
def test_closed_loops_run_to_the_end_on_a_cpu(tmp_path, temperature):
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "run", 1, GPT(CFG), {}, to_dict(TrainConfig(model=CFG)), load_tokenizer("bytes"),
                           keep=1)
    out_file = tmp_path / "load.jsonl"
    out = subprocess.run([sys.executable, str(SCRIPT), str(ckpt), "--rows", "4", "--prompt-tokens", "8",
                          "--max-tokens", "12", "--spread", "0", "0.5", "--requests-per-row", "3", "--repeats", "1",
                          "--no-warmup", "--device", "cpu", "--temperature", temperature, "--top-p", "0.9",
                          "--json-out", str(out_file)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out_file.read_text())
    assert result["temperature"] == float(temperature)
    equal, spread = result["loads"]
    assert equal["errors"] == spread["errors"] == 0
    assert equal["requests"] == spread["requests"] == 12
    # the stop token may end a random model's request early: at most max_tokens each, and at least one each
    assert 12 <= equal["tokens"] <= 12 * 12 and 12 <= spread["tokens"] <= 12 * 18
    for load in (equal, spread):
        assert 0 < load["occupancy"] <= 1
        assert abs(sum(load["thread_share"].values()) - 1) < 1e-3
    assert result["full_batch"][0]["steps"] == 12
    assert set(result["prefill_ms"]) == {"1", "2", "4"}
