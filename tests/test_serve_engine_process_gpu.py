"""`redline serve --engine-process` on a GPU (off by default): bf16, compiled, CUDA graphs, groups of decode steps
read while the next run, against the in-thread server on the same checkpoint. Plain HTTP from the standard library
(the GPU image carries the serve extra, not the openai client)."""

import json
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from redline.commands.serve import ServeConfig, build, uses_engine_process
from redline.config import TrainConfig, to_dict
from redline.model import GPT, ModelConfig
from redline.tokenizer import load_tokenizer

uvicorn = pytest.importorskip("uvicorn")

CFG = ModelConfig(vocab_size=261, context_len=160, n_layer=2, n_embd=128, n_head=4, n_kv_head=2)
MODEL = "tiny-test"

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def complete(url: str, prompt: str, max_tokens: int, stream: bool) -> str:
    """A greedy completion's text, streamed (server-sent events read to [DONE]) or not."""
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": stream}).encode()
    request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        if not stream:
            return json.loads(r.read())["choices"][0]["text"]
        text = []
        for line in r:
            line = line.decode().strip()
            if line == "data: [DONE]":
                return "".join(text)
            if line.startswith("data: "):
                text.append(json.loads(line[6:])["choices"][0]["text"])
    raise AssertionError("the stream ended without [DONE]")


def serve(cfg: ServeConfig):
    """(uvicorn's server in a thread, the Server, its URL)."""
    server, app = build(cfg)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    runner = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    threading.Thread(target=runner.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.time() + 60
    while not runner.started:
        assert time.time() < deadline, "the server did not start"
        time.sleep(0.01)
    return runner, server, f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_on_a_gpu_the_engine_process_equals_the_in_thread_server(tmp_path):
    """12 concurrent requests on 8 rows, half streamed: the same greedy text from both servers."""
    from redline.training.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = GPT(CFG)
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # logits far apart: bf16 rounding alone cannot flip an argmax
    ckpt = save_checkpoint(tmp_path / "run", 1, model, {}, to_dict(TrainConfig(model=CFG)), load_tokenizer("bytes"),
                           keep=1)
    assert uses_engine_process(ServeConfig(checkpoint=str(ckpt)))  # on by default on a GPU
    assert not uses_engine_process(ServeConfig(checkpoint=str(ckpt), engine_process=False))
    assert uses_engine_process(ServeConfig(checkpoint=str(ckpt), engine_process=True))
    prompts = [f"{i} " + "abcdefghij"[: 1 + i] * (1 + i % 3) for i in range(12)]
    lengths = [16 + 4 * i for i in range(12)]
    texts = {}
    for engine_process in (False, True):
        runner, server, url = serve(ServeConfig(checkpoint=str(ckpt), engine_process=engine_process,
                                                model_name=MODEL, max_batch=8))
        try:
            with ThreadPoolExecutor(12) as pool:
                texts[engine_process] = list(pool.map(lambda i: complete(url, prompts[i], lengths[i], i % 2 == 0),
                                                      range(12)))
            metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
            # the warm-up's prefill graphs, counted in the process that holds the engine and reported by the API's
            graphs = [line for line in metrics.splitlines() if line.startswith("redline_prefill_graphs ")]
            assert graphs and float(graphs[0].split()[1]) >= 1, graphs
        finally:
            runner.should_exit = True
            time.sleep(0.5)
            server.scheduler.close()
        if engine_process:
            assert not server.scheduler.process.is_alive()
    assert texts[True] == texts[False]
    assert all(texts[True])
