"""GRPO (redline/posttrain/grpo.py, rollouts.py): group advantages and pass@k against their definitions, the loss on
a tiny model against an explicit per-token computation (with the k3 KL term), rollouts from the training weights
through the KV-cache engine, a few seeded steps that raise the reward of a trivially learnable task, and a resumed
loader that continues exactly."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from redline.chat.render import RedlineTemplate
from redline.config import TrainConfig, parse
from redline.model import GPT, ModelConfig
from redline.posttrain.grpo import GRPO, group_advantages, k3_kl, pass_at_k
from redline.posttrain.rollouts import (Prompt, RolloutSettings, Rollouts, Samples, frozen_reference, refresh_copy,
                                        rollout_stats, sample_groups, task_prompts, trained_rows, training_batches)
from redline.tasks.base import Example, Task
from redline.tokenizer import ByteTokenizer
from redline.training.step import TrainStep

CPU = torch.device("cpu")


def test_group_advantages_are_normalised_within_each_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [3.0, 1.0, 2.0, 0.0]])
    adv = group_advantages(rewards, "group", eps=0.0 + 1e-12)
    for row, got in zip(rewards.tolist(), adv.tolist()):
        mean, std = statistics.mean(row), statistics.stdev(row)
        want = [(r - mean) / std if std else 0.0 for r in row]
        assert got == pytest.approx(want, abs=1e-5)
    assert group_advantages(rewards, "none").tolist()[2] == pytest.approx([1.5, -0.5, 0.5, -1.5])  # Dr. GRPO
    assert group_advantages(rewards).abs()[1].max() == 0  # all equal: nothing to learn


def test_mean_scaled_advantages_are_maxrls():
    """(r - mean) / mean within each group (MaxRL): a right sample of a group right once in four weighs 3, each
    wrong one -1; a group all wrong or all right teaches nothing."""
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    adv = group_advantages(rewards, "mean")
    assert adv.tolist()[0] == pytest.approx([3.0, -1.0, -1.0, -1.0])
    assert adv.tolist()[1] == pytest.approx([1 / 3, 1 / 3, 1 / 3, -1.0])
    assert adv[2:].abs().max() == 0
    with pytest.raises(ValueError, match="rewards must be >= 0"):
        group_advantages(torch.tensor([[1.0, -1.0]]), "mean")


def test_mean_scaled_advantages_follow_the_log_likelihood_gradient():
    """A one-token policy, right with chance p = σ(z): the expected update of the right token's logit z over rollouts
    of G samples is (G - 1) p (1 - p) = (G - 1) dp/dz under "none" (the expected reward's gradient), and
    G ((1 - p) - (1 - p)^G) = G (1 - (1 - p)^(G-1)) d log p / dz under "mean" (the log-likelihood's, but for prompts
    that G samples rarely get right). Checked by sampling 20,000 rollouts at p = 0.6 and 0.1."""
    g = torch.Generator().manual_seed(0)
    G, rollouts = 8, 20000
    for p in (0.6, 0.1):
        right = (torch.rand(rollouts, G, generator=g) < p).float()
        for scale, exact in (("none", (G - 1) * p * (1 - p)), ("mean", G * ((1 - p) - (1 - p) ** G))):
            # d log π(y) / dz = [y right] - p
            update = (group_advantages(right, scale) * (right - p)).sum(1).mean()
            assert float(update) == pytest.approx(exact, rel=0.05), (p, scale)


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    # against counting every k-subset
    from itertools import combinations
    n, c, k = 6, 2, 3
    subsets = list(combinations(range(n), k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(i < c for i in s) for s in subsets) / len(subsets))


def tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)  # vocabulary of 256: no padded rows (the loss normalises over them, see logprobs.py)
    return GPT(ModelConfig(n_layer=2, n_embd=32, n_head=4, n_kv_head=2, vocab_size=256, context_len=64))


@pytest.mark.parametrize("kl_coef", [0.0, 0.3])
def test_loss_on_a_tiny_model_matches_an_explicit_computation(kl_coef):
    model, reference = tiny_model(0), tiny_model(1)
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 256, (3, 10), generator=g)
    targets = torch.randint(0, 256, (3, 10), generator=g)
    targets[:, :4] = -1  # the prompt
    targets[1, 8:] = -1  # padding
    advantages = torch.tensor([1.0, -0.5, 0.25])
    with torch.no_grad():
        ref = -reference(inputs, targets, reduction="none")
    batch = {"inputs": inputs, "targets": targets, "advantages": advantages, "norm": torch.tensor(7.0),
             "ref_logps": ref}
    loss, metrics = GRPO(kl_coef).compute(model, batch)
    with torch.no_grad():
        logp = torch.log_softmax(model(inputs).double(), dim=-1)
        ref_logp = torch.log_softmax(reference(inputs).double(), dim=-1)
    total = 0.0
    for b in range(3):
        for t in range(10):
            y = int(targets[b, t])
            if y == -1:
                continue
            q = float(ref_logp[b, t, y] - logp[b, t, y])
            total += -float(advantages[b]) * 1.0 + kl_coef * (math.exp(q) - q - 1)
    assert float(loss.detach()) == pytest.approx(total / 7.0, rel=1e-4, abs=1e-6)
    # the gradient is that of -A log π (+ β KL): check one parameter against autograd on the explicit form
    loss.backward()
    got = model.lm_head.weight.grad.clone()
    model.zero_grad()
    logps = -model(inputs, targets, reduction="none")
    mask = targets != -1
    explicit = (-(advantages[:, None] * logps) + kl_coef * k3_kl(logps, ref)) * mask
    (explicit.sum() / 7.0).backward()
    assert torch.allclose(got, model.lm_head.weight.grad, atol=1e-6)


def test_later_updates_on_a_rollout_use_the_clipped_ratio():
    """-min(ρ A, clip(ρ, 1 ± ε) A) with ρ = π / π_old per token; with π_old = π it is the one-update loss, gradient
    included."""
    model = tiny_model(0)
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 256, (2, 8), generator=g)
    targets = torch.randint(0, 256, (2, 8), generator=g)
    targets[:, :3] = -1
    advantages = torch.tensor([1.0, -2.0])
    batch = {"inputs": inputs, "targets": targets, "advantages": advantages, "norm": torch.tensor(5.0)}
    with torch.no_grad():
        now = -model(inputs, targets, reduction="none").double()
    shift = torch.randn(2, 8, generator=g).double() * 0.3  # π_old away from π: some ratios outside 1 ± 0.2
    loss, _ = GRPO(clip_eps=0.2).compute(model, {**batch, "old_logps": (now + shift).float()})
    total = 0.0
    for b in range(2):
        for t in range(8):
            if targets[b, t] == -1:
                continue
            ratio, a = math.exp(-float(shift[b, t])), float(advantages[b])
            total += -min(ratio * a, min(max(ratio, 0.8), 1.2) * a)
    assert float(loss.detach()) == pytest.approx(total / 5.0, rel=1e-4)

    on_policy, _ = GRPO().compute(model, batch)
    on_policy.backward()
    want = model.lm_head.weight.grad.clone()
    model.zero_grad()
    same, _ = GRPO().compute(model, {**batch, "old_logps": now.float()})
    same.backward()
    assert float(same.detach()) == pytest.approx(float(on_policy.detach()), rel=1e-5)
    assert torch.allclose(model.lm_head.weight.grad, want, atol=1e-6)


def test_leaving_out_rows_whose_advantage_is_zero_changes_no_gradient():
    """A step's gradient from every sequence, cut into micro-batches of 4, equals that from the sequences with a
    non-zero advantage alone, cut into as many micro-batches: their terms are 0 and the normaliser is unchanged."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 7, 6)]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])  # one group all right
    samples = Samples([p for p in prompts for _ in range(4)],
                      [torch.randint(0, 256, (int(n),), generator=g).tolist() for n in torch.randint(1, 4, (12,))],
                      rewards, 0)
    advantages = group_advantages(rewards)
    norm = sum(map(len, samples.completions)) / 3  # three micro-batches
    rows = trained_rows(advantages, keep_all=False, at_least=3)
    assert rows == [0, 1, 2, 3, 8, 9, 10, 11]
    assert trained_rows(advantages, keep_all=True, at_least=3) == list(range(12))  # the KL term counts every token
    assert trained_rows(torch.zeros(3, 4), keep_all=False, at_least=3) == [0, 1, 2]  # one a micro-batch
    grads = []
    for batches in (training_batches(samples, advantages, list(range(12)), 3, 4, norm, CPU),
                    training_batches(samples, advantages, rows, 3, 4, norm, CPU)):
        assert len(batches) == 3 and all(len(b["inputs"]) <= 4 for b in batches)
        model = tiny_model(0)
        sum(GRPO().compute(model, b)[0] / 3 for b in batches).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-7)
    with pytest.raises(ValueError, match="do not fill"):
        training_batches(samples, advantages, rows, 3, 2, norm, CPU)


# ----------------------------------------------------------------------------------------------------
# rollouts and steps


class FirstLetterTask(Task):
    """Reward 1 when the reply starts with a letter: about one sample in five at the start, so a few steps
    of GRPO move it clearly."""

    name = "first_letter"

    def examples(self, split):
        return [Example(f"say something {i}", "a") for i in range(8)]

    def reward(self, example, completion):
        return 1.0 if completion[:1].isascii() and completion[:1].isalpha() else 0.0


def chat_setup():
    tokenizer = ByteTokenizer()
    tokenizer.add_chat_tokens()
    return tokenizer, RedlineTemplate(tokenizer)


def grpo_config(*extra: str) -> TrainConfig:
    # 4 prompts × 4 samples = 16 sequences per step, micro-batches of 8: accum 2
    return parse(TrainConfig, ["--preset", "tiny", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
                               "model.n_kv_head=2", "model.vocab_size=261", "model.context_len=64", "seq_len=64",
                               "batch_size=8", f"tokens_per_step={16 * 64}", "compile=False", "optim.lr=2e-2",
                               "optim.warmup_steps=0", "optim.weight_decay=0", *extra], prog="t", description="t")


def build(seed: int = 0, kl_coef: float = 0.0, **settings):
    cfg = grpo_config()
    tokenizer, renderer = chat_setup()
    task = FirstLetterTask()
    torch.manual_seed(seed)
    model = GPT(cfg.model)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    objective = GRPO(kl_coef)
    step = TrainStep(cfg, CPU, model=model, objective=objective)
    prompts, _ = task_prompts(task, renderer, "train", 64 - 8)

    def starting_model():
        copy = GPT(cfg.model)
        copy.load_state_dict(start)
        return copy

    settings = RolloutSettings(**{"group_size": 4, "prompts_per_step": 4, "max_new_tokens": 6, **settings})
    loader = Rollouts(objective, prompts, task, renderer, tokenizer, settings, 8, CPU, None, seed=5,
                      reference=frozen_reference(starting_model))
    return step, loader


def run_steps(step, loader, n):
    out = []
    for _ in range(n):
        output = step.step((loader.next_batch() for _ in range(step.plan.accum)), 1.0)
        out.append((float(output.loss), loader.last_stats["reward_mean"]))
    return out


def test_rollouts_come_from_the_training_weights_in_place():
    step, loader = build()
    loader.next_batch()
    engine = loader._engine
    assert engine.model is step.model  # no copy: the engine runs the training model itself
    trained = {p.data_ptr() for p in step.optimizers[0].param_groups[0]["params"]}
    assert trained <= {p.data_ptr() for p in engine.model.parameters()}  # what the optimizer updates, in place


def test_a_bf16_rollout_copy_is_refreshed_in_place():
    step, loader = build(rollout_weights="bf16")
    loader.next_batch()
    engine = loader._engine
    assert engine.model is not step.model and next(engine.model.parameters()).dtype == torch.bfloat16
    storage = [p.data_ptr() for p in engine.model.parameters()]
    with torch.no_grad():
        step.model.lm_head.weight.add_(1.0)
    loader.engine(step.model)
    assert [p.data_ptr() for p in engine.model.parameters()] == storage  # the same buffers (CUDA graphs stay valid)
    assert torch.equal(engine.model.lm_head.weight, step.model.lm_head.weight.to(torch.bfloat16))


def test_refreshing_the_rollout_copy_checks_names_and_shapes():
    small, wide = GPT(ModelConfig(vocab_size=64, context_len=32, n_layer=1, n_embd=16, n_head=2)), \
        GPT(ModelConfig(vocab_size=64, context_len=32, n_layer=1, n_embd=32, n_head=2))
    copy = GPT(small.cfg).to(torch.bfloat16)
    refresh_copy(copy, small)
    assert all(torch.equal(a, b.to(torch.bfloat16)) for a, b in zip(copy.parameters(), small.parameters()))
    with pytest.raises(RuntimeError, match="has no match in the training model"):
        refresh_copy(copy, wide)  # a positional copy_ would broadcast some of these silently


@pytest.mark.slow
def test_a_few_steps_raise_the_reward_of_a_learnable_task():
    step, loader = build(seed=0, kl_coef=0.05, max_new_tokens=2)  # the first token decides the reward
    history = run_steps(step, loader, 20)
    rewards = [r for _, r in history]
    first, last = statistics.mean(rewards[:4]), statistics.mean(rewards[-4:])
    assert last > first + 0.25, [round(r, 3) for r in rewards]


@pytest.mark.parametrize("updates", [1, 3])
def test_a_resumed_loader_and_step_continue_exactly(updates):
    """With 3 updates per rollout the cut at step 2 falls inside the first rollout: its last update's batches
    travel in the loader's state."""
    step, loader = build(seed=1, kl_coef=0.1, updates_per_rollout=updates)
    straight = run_steps(step, loader, 4)
    assert loader.rollouts == (4 if updates == 1 else 2)
    step, loader = build(seed=1, kl_coef=0.1, updates_per_rollout=updates)
    run_steps(step, loader, 2)
    model_state = {k: v.clone() for k, v in step.model.state_dict().items()}
    optim_state = [o.state_dict() for o in step.optimizers]
    loader_state, step_state = loader.state_dict(), step.state_dict()
    assert len(loader_state["queue"]) == (0 if updates == 1 else 2)  # accum 2: one step's micro-batches
    step, loader = build(seed=1, kl_coef=0.1, updates_per_rollout=updates)
    step.model.load_state_dict(model_state)
    for opt, state in zip(step.optimizers, optim_state):
        opt.load_state_dict(state)
    step.load_state_dict(step_state)
    loader.load_state_dict(loader_state)
    assert run_steps(step, loader, 2) == straight[2:]


def test_samples_and_stats():
    tokenizer, renderer = chat_setup()
    task = FirstLetterTask()
    model = GPT(grpo_config().model)
    from redline.inference import InferenceEngine

    prompts = [Prompt(e, renderer.prompt(task.messages(e))) for e in task.examples("train")[:2]]
    samples = sample_groups(InferenceEngine(model), prompts, RolloutSettings(group_size=3, max_new_tokens=4), task,
                            tokenizer, renderer.stop_ids, seed=0)
    assert samples.rewards.shape == (2, 3) and len(samples.completions) == 6
    assert all(1 <= len(c) <= 4 for c in samples.completions)
    stats = rollout_stats(samples, pass_k=2)
    assert set(stats) == {"reward_mean", "pass@1", "pass@2", "completion_tokens", "truncated"}
