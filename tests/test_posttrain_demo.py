"""scripts/posttrain_demo.sh's commands, with a stand-in for Python that records them: the default task and its
reply length, GRPO's learning rate (GRPO_LR, or the command's own with `default`) and MaxRL advantages."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def demo_commands(tmp_path, **env) -> list[list[str]]:
    log = tmp_path / "commands.txt"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    subprocess.run(["bash", str(ROOT / "scripts/posttrain_demo.sh")], check=True, capture_output=True,
                   env={**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": str(fake), **env})
    return [line.split() for line in log.read_text().splitlines()]


def stage(commands, name):
    return next(c for c in commands if c[2] == name)


def test_the_demo_defaults_to_worked_arithmetic_and_maxrl_grpo(tmp_path):
    commands = demo_commands(tmp_path)
    assert stage(commands, "sft")[stage(commands, "sft").index("--data") + 1] == "task:arithmetic_worked"
    grpo = stage(commands, "grpo")
    assert {"grpo.max_new_tokens=32", "grpo.scale_rewards=mean", "optim.lr=5e-5", "max_steps=60"} <= set(grpo)
    evaluations = [c for c in commands if c[2] == "evaluate"]
    assert len(evaluations) == 4 and all("arithmetic_worked,arithmetic_worked_mc" in c for c in evaluations)
    assert all(c[c.index("--max-new-tokens") + 1] == "32" for c in evaluations)


def test_the_demo_takes_grpos_default_rate_and_other_tasks_reply_lengths(tmp_path):
    grpo = stage(demo_commands(tmp_path, TASK="arithmetic", GRPO_LR="default"), "grpo")
    assert "grpo.max_new_tokens=8" in grpo and not [a for a in grpo if a.startswith("optim.lr=")]
    (tmp_path / "commands.txt").unlink()
    grpo = stage(demo_commands(tmp_path, TASK="arithmetic_multistep", GRPO_ARGS="optim.lr=1e-5"), "grpo")
    assert "grpo.max_new_tokens=40" in grpo and grpo[-1] == "optim.lr=1e-5"  # the stage's own settings win
