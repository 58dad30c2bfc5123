"""Preference and reinforcement post-training: the DPO objective and its pairs (dpo.py), GRPO's objective (grpo.py)
and its rollouts from the training weights through redline's KV-cache engine (rollouts.py).

Both run through the one training step (redline/training/step.py) and the one loop (redline/training/loop.py);
only the objective and the source of batches differ from pretraining.
"""
