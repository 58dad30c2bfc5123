"""Kimi Delta Attention through `redline train --init-from`: an imported Kimi Linear (decays per key channel through
low-rank gates, NoPE latent attention, DeepSeek-V3's experts) and Ling 3 (KDA's bounded decay through full-rank gates,
latent attention with gated heads) train from their import, the first step's loss transformers' on the same batch,
every KDA gate parameter moving. The layers' parity, engine and GPU checks are tests/test_delta_net.py's (KDA, LING3)
and tests/test_interop.py's (the kimi_linear and bailing_hybrid families)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.mark.parametrize("kind, gates", [
    ("kimi_linear", ("attn.a_down.weight", "attn.a.weight", "attn.z_down.weight", "attn.z.weight")),
    ("bailing_hybrid", ("attn.a.weight", "attn.z.weight")),
])
def test_train_init_from_an_imported_kda_model_moves_its_gates(kind, gates, tmp_path, capsys):
    from tests.test_interop_commands import Imported, trained_two_steps

    before, after = trained_two_steps(Imported(kind, tmp_path / "src"), tmp_path, capsys)
    old, new = before.state_dict(), after.state_dict()
    for name in (*gates, "attn.dt_bias", "attn.A_log", "attn.in_proj.weight", "attn.conv"):
        assert not torch.equal(old[f"blocks.0.{name}"], new[f"blocks.0.{name}"]), name


@pytest.mark.parametrize("kind", ["kimi_linear", "bailing_hybrid"])
def test_imported_kda_model_serves_as_transformers_generates(kind, tmp_path, capsys):
    """The imported model through the engine: prompts prefilled in chunks of 3 tokens (each chunk starting from the
    rows' KDA states and convolution inputs) then decoded greedily give transformers' tokens; the server's
    DecodeBatch (rows parked and refilled) gives the model's own; teacher-forced scores are the full forward's."""
    from redline.inference import InferenceEngine, SamplingParams
    from tests.engine_checks import assert_decode_batch_serves_like_generate, assert_scores_equal_full_forward
    from tests.interop_models import VOCAB
    from tests.test_interop import imported

    hf, model, _, _ = imported(kind, tmp_path, capsys)
    prompts = [list(range(3, 14)), [7, 8], list(range(40, 47)), list(range(60, 72))]
    engine = InferenceEngine(model, compile=False, prefill_chunk_tokens=3)
    for prompt, result in zip(prompts, engine.generate(prompts, 8, SamplingParams(temperature=0))):
        reference = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0,
                                eos_token_id=None)
        assert result.tokens == reference[0, len(prompt):].tolist()
    assert_scores_equal_full_forward(model, VOCAB)
    assert_decode_batch_serves_like_generate(model, prompts)


def test_ling3_multi_token_prediction_layers_are_left_out(tmp_path, capsys):
    """Ling 3's files hold num_mtp_layers layers past the last, which transformers leaves out: the import does too
    (marked read, not reported as unused), with the same logits."""
    from safetensors.torch import load_file, save_file

    from tests.interop_models import hf_folder
    from tests.test_interop import TOKENS, run_cli
    from redline.training.checkpoint import load_for_inference

    hf = hf_folder("bailing_hybrid", tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    for name in [n for n in weights if n.startswith("model.layers.2.")]:  # two copies of the last layer past it
        for j in (3, 4):
            weights[name.replace("model.layers.2.", f"model.layers.{j}.")] = weights[name].clone()
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    model, _, _ = load_for_inference(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits, rtol=1e-5, atol=1e-5)
