"""CTRL (ctrl.py): its sinusoidal table equal to transformers' and its head bias showing in the logits, and the
one-line refusals on import and export (Hugging Face and GGUF). Parity through the engine is the FAMILIES table's."""

import pytest
import torch

from redline.errors import UserError
from redline.interop.families import _families
from tests.interop_models import hf_folder, hf_model
from tests.test_interop import run_cli
from tests.test_interop_llamalike import TOKENS, _imported

transformers = pytest.importorskip("transformers")


def test_table_and_head_bias_show_in_the_logits():
    from redline.interop.ctrl import sinusoidal_table

    hf, model = _imported("ctrl")
    torch.testing.assert_close(model.wpe.weight, hf.transformer.pos_encoding, rtol=0, atol=0)
    assert torch.equal(sinusoidal_table(64, 64), hf.transformer.pos_encoding)
    with torch.no_grad():
        expected = hf(TOKENS).logits
        torch.testing.assert_close(model(TOKENS), expected, rtol=1e-5, atol=1e-5)
        model.lm_head.bias.zero_()
        assert (model(TOKENS) - expected).abs().max() > 1e-4


def test_layer_norm_epsilon_apart_from_the_blocks_is_refused():
    hf = hf_model("ctrl").config.to_dict()
    with pytest.raises(UserError, match="layer_norm_epsilon=1e-05: CTRL's block LayerNorms take 1e-06"):
        _families()["ctrl"].model_config({**hf, "layer_norm_epsilon": 1e-5})


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_export_refused_in_one_line(fmt, tmp_path, capsys):
    hf_folder("ctrl", tmp_path / "hf")
    code, _, err = run_cli(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 0, err
    out = tmp_path / ("x.gguf" if fmt == "gguf" else "out")
    code, _, err = run_cli(["export", str(tmp_path / "ckpt"), "--format", fmt, "--out", str(out)], capsys)
    assert code == 2 and "has no model.head_bias" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_train_init_from_an_imported_ctrl(tmp_path, capsys):
    """`redline train --init-from` on an imported CTRL: the first step's loss is transformers' on the same batch, and
    training moves the head's bias and the position table the sinusoid was written into."""
    from tests.test_interop_commands import Imported, trained_two_steps

    before, after = trained_two_steps(Imported("ctrl", tmp_path / "src"), tmp_path, capsys)
    old, new = before.state_dict(), after.state_dict()
    for name in ("lm_head.bias", "wpe.weight", "blocks.0.mlp.fc.weight"):
        assert not torch.equal(old[name], new[name]), name
