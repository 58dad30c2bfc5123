"""cuda_graphs (torch.compile's reduce-overhead) changes how kernels are launched, not what they compute: the same
losses, gradients (with gradient accumulation, whose first gradients live in the graphs' pool) and evaluation
logits as the same compiled step without CUDA graphs; per-block and whole-model compile; LoRA and QLoRA."""

import pytest
import torch

from redline.config import TrainConfig, apply_overrides, apply_preset
from redline.errors import UserError
from redline.training.wrap import cuda_graphs_enabled


LR = 3e-3


def config(**overrides) -> TrainConfig:
    cfg = TrainConfig()
    apply_preset(cfg, "tiny")
    apply_overrides(cfg, {"model.n_layer": 3, "model.n_embd": 128, "model.n_head": 4, "model.vocab_size": 512,
                          "batch_size": 4, "seq_len": 64, "attn_autotune": False, "optim.name": "adamw",
                          "optim.warmup_steps": 0, "optim.lr": LR, **overrides})
    return cfg


def test_cuda_graphs_on_for_lora_runs_on_one_gpu_only():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    lora = config(**{"lora.enabled": True, "init_from": "(test)"})
    assert cuda_graphs_enabled(lora, cuda) and not cuda_graphs_enabled(lora, cuda, distributed=True)
    assert not cuda_graphs_enabled(lora, cpu) and not cuda_graphs_enabled(config(), cuda)
    assert not cuda_graphs_enabled(config(**{"lora.enabled": True, "init_from": "(test)", "compile": False}), cuda)
    assert not cuda_graphs_enabled(lora, cuda, shapes_vary=True)  # DPO's and GRPO's batches
    assert cuda_graphs_enabled(config(cuda_graphs=True), cuda)
    assert cuda_graphs_enabled(config(cuda_graphs=True), cuda, shapes_vary=True)
    with pytest.raises(UserError, match="cuda_graphs=True"):
        cuda_graphs_enabled(config(cuda_graphs=True), cpu)
    for impossible in ({"device": "cpu"}, {"compile": False}, {"gpus": 2}):  # refused before any work
        with pytest.raises(UserError, match="cuda_graphs=True"):
            config(cuda_graphs=True, **impossible).validate()


def train_a_few_steps(mode: str, scope: str, graphs: bool):
    """Six optimizer steps of two micro-batches on a tiny model, evaluating after each: (losses, evaluation logits,
    trained parameters). mode is full, lora or qlora; scope is what is compiled (blocks or model)."""
    from redline.training.loop import new_model
    from redline.training.step import TrainStep

    device = torch.device("cuda")
    torch.manual_seed(0)
    data = [torch.randint(0, 512, (4, 65), device=device) for _ in range(12)]
    held_out = torch.randint(0, 512, (2, 64), device=device)
    torch._dynamo.reset()
    cfg = config(compile=True, compile_scope=scope, cuda_graphs=graphs, tokens_per_step=2 * 4 * 64,
                 activation_checkpointing="full" if mode != "full" else "none")
    model = None
    if mode != "full":
        apply_overrides(cfg, {"lora.enabled": True, "lora.rank": 4, "init_from": "(test: random weights)",
                              "lora.quantize": "nf4" if mode == "qlora" else "none"})
        torch.manual_seed(1)
        model = new_model(cfg, device, on_host=True)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.05)
    step = TrainStep(cfg, device, model=model, say=lambda m: None)
    assert step.cuda_graphs == graphs and step.plan.accum == 2
    batches = ((x[:, :-1], x[:, 1:]) for x in data)
    losses, evals = [], []
    for _ in range(len(data) // 2):
        losses.append(float(step.step(batches, 1.0).loss))
        with step.evaluation() as model_, torch.no_grad():  # as evaluation and DPO's reference pass do
            evals.append(model_(held_out).float().clone())
    trained = {n: p.detach().float().clone() for n, p in step.model.named_parameters() if p.requires_grad}
    return losses, evals, trained


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["full", "lora", "qlora"])
@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_cuda_graphs_train_and_evaluate_as_without(mode, scope):
    if mode == "qlora":
        pytest.importorskip("torchao", reason="QLoRA's NF4 weights need torchao")
    losses, evals, trained = train_a_few_steps(mode, scope, graphs=False)
    losses_g, evals_g, trained_g = train_a_few_steps(mode, scope, graphs=True)
    assert losses_g == pytest.approx(losses, rel=1e-4, abs=1e-4)
    assert trained.keys() == trained_g.keys()
    if mode == "full":
        # Full fine-tuning trains the token embedding, whose backward adds rows up with atomic adds in no fixed
        # order, and AdamW moves a weight by about lr whatever the size of its gradient: two runs drift apart by
        # more than rounding even without graphs. Bounds for that drift; the losses above stay tight.
        for a, b in zip(evals, evals_g):
            torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)
        for name in trained:
            diff = (trained_g[name] - trained[name]).abs()
            assert diff.max() <= 2 * LR * len(losses) and diff.mean() <= 1e-4, (name, diff.max(), diff.mean())
        return
    for a, b in zip(evals, evals_g):
        torch.testing.assert_close(b, a, rtol=2e-3, atol=2e-3)
    for name in trained:
        torch.testing.assert_close(trained_g[name], trained[name], rtol=1e-3, atol=1e-4, msg=name)
