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
