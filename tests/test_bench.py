"""`redline bench`: the step it times, matrix handling, profile grouping, attention-backend choice, wrap order."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace

import pytest
import torch

from redline.bench import matrix
from redline.bench.profile import GROUP_NAMES, kernel_group, summarize
from redline.commands import bench
from redline.config import TrainConfig
from redline.distributed import DistInfo
from redline.errors import UserError
from redline.model import GPT
from redline.presets import get_preset
from redline.training import attention_backend as ab

SMALL = ["--preset", "tiny", "batch_size=2", "seq_len=16", "model.n_layer=2", "warmup=1", "steps=2"]


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------------
# end to end on the CPU


def test_bench_tiny_on_cpu_prints_table_then_json(capsys, tmp_path):
    out = tmp_path / "bench.jsonl"
    assert bench.main(SMALL + ["--json-out", str(out)]) == 0
    text = capsys.readouterr().out
    report = last_json(text)
    assert "redline bench tiny" in text  # the human table comes first
    assert report["schema"] == "redline.bench" and report["command"] == "bench"
    (point,) = report["points"]
    assert point["status"] == "ok" and point["device"] == "cpu" and point["timer"] == "perf_counter"
    assert point["timed_steps"] == 2 and point["warmup_steps"] == 1
    assert point["step_ms_min"] <= point["step_ms_median"] <= point["step_ms_max"]
    assert point["tokens_per_step"] == 32
    assert point["tokens_per_second"] == pytest.approx(32 / (point["step_ms_median"] / 1e3))
    assert point["mfu"] is None  # no GPU peak to compare with on a CPU
    assert point["first_step_seconds"] > 0 and point["warmup_seconds"] >= point["first_step_seconds"]
    assert point["flops_per_token"] > 0 and point["data"] == "random"
    assert json.loads(out.read_text().strip()) == report


def test_bench_step_is_the_loops_step(capsys):
    """Accumulation, the optimizer and the losses behave as in training: loss goes down on random tokens' pool."""
    assert bench.main(SMALL[:-2] + ["warmup=3", "steps=6", "tokens_per_step=64", "optim.lr=1e-2"]) == 0
    (point,) = last_json(capsys.readouterr().out)["points"]
    assert point["grad_accum"] == 2 and point["tokens_per_step"] == 64
    assert point["loss_last"] < point["loss_first"]


def test_bench_profile_on_cpu_writes_trace_and_groups(capsys, tmp_path):
    trace = tmp_path / "trace.json.gz"
    assert bench.main(SMALL + ["profile_steps=1", "--trace", str(trace), "--profile"]) == 0  # a bare flag, last
    text = capsys.readouterr().out
    (point,) = last_json(text)["points"]
    profile = point["profile"]
    assert set(profile["groups_ms_per_step"]) == set(GROUP_NAMES)
    assert profile["groups_ms_per_step"]["gemm"] > 0 and profile["groups_ms_per_step"]["optimizer"] > 0
    assert sum(profile["groups_ms_per_step"].values()) == pytest.approx(profile["total_ms_per_step"])
    assert "top operators" in text
    with gzip.open(trace, "rt") as f:
        assert "traceEvents" in json.load(f)


def test_bench_on_real_shards(capsys, tmp_path):
    from redline.data.prepare import prepare

    text = tmp_path / "corpus.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 400)
    prepare([str(text)], tmp_path / "shards", "bytes", val_fraction=0.0)
    assert bench.main(SMALL + ["--data.path", str(tmp_path / "shards")]) == 0
    (point,) = last_json(capsys.readouterr().out)["points"]
    assert point["status"] == "ok" and point["data"] == str(tmp_path / "shards")
    from redline.tokenizer import load_tokenizer

    assert point["vocab_size"] == load_tokenizer(str(tmp_path / "shards")).vocab_size  # the data's tokenizer decides


def test_bench_chunked_loss_point(capsys):
    """model.ce_chunk_tokens is a bench setting like any other: it runs, and the point and the table say so."""
    assert bench.main(SMALL + ["model.ce_chunk_tokens=12"]) == 0  # 32 tokens per micro-batch: chunks of 12, 12, 8
    text = capsys.readouterr().out
    (point,) = last_json(text)["points"]
    assert point["status"] == "ok" and point["ce_chunk_tokens"] == 12 and point["tokens_per_second"] > 0
    assert "CE chunk" in text
    with pytest.raises(UserError, match="model.ce_chunk_tokens must be >= 0"):  # caught before any point runs
        bench.main(SMALL + ["--matrix", "model.ce_chunk_tokens=0,-8"])


def test_bench_reports_out_of_memory(monkeypatch, capsys):
    import redline.bench.step as step

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(step, "measure", oom)
    assert bench.main(SMALL) == 1
    captured = capsys.readouterr()
    (point,) = last_json(captured.out)["points"]
    assert point["status"] == "oom" and "out of memory" in point["error"]
    assert "activation_checkpointing" in captured.err


def test_bench_rejects_bad_input():
    with pytest.raises(UserError, match="warmup and steps must be at least 1"):
        bench.main(["--preset", "tiny", "steps=0"])
    with pytest.raises(UserError, match="must look like KEY=V1,V2"):
        bench.main(["--preset", "tiny", "--matrix", "batch_size"])
    with pytest.raises(UserError, match="not a prepared shard folder|data modules"):
        bench.main(SMALL + ["--data.path", "/nonexistent/shards"])


def test_bench_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for option in ("--matrix", "--profile", "--warmup", "--steps", "--fp8", "--activation-checkpointing",
                   "--model.ce-chunk-tokens"):
        assert option in text or option.replace("-", "_") in text


def test_cli_dispatches_bench():
    from redline.cli import COMMANDS

    assert COMMANDS["bench"][0] == "bench"


@pytest.mark.slow
def test_matrix_runs_each_point_in_its_own_process(capsys):
    """Two points: one runs, one fails in its child process; the failure is reported and the run goes on."""
    code = bench.main(SMALL + ["--matrix", "data.path=none,/nonexistent/shards"])
    assert code == 0  # at least one point ran
    text = capsys.readouterr().out
    report = last_json(text)
    ok, failed = report["points"]
    assert ok["status"] == "ok" and ok["overrides"] == {"data.path": "None"} and ok["tokens_per_second"] > 0
    assert failed["status"] == "error" and failed["exit_code"] == 2
    assert "shard folder" in failed["error"] or "data modules" in failed["error"]
    assert "[2/2]" in text


# ----------------------------------------------------------------------------------------------------
# matrix arguments


def test_take_matrix_keeps_its_items_away_from_the_option_parser():
    items, rest = bench.take_matrix(["--preset", "tiny", "--matrix", "batch_size=1,2", "fp8=off,auto", "--steps", "3"])
    assert items == ["batch_size=1,2", "fp8=off,auto"]
    assert rest == ["--preset", "tiny", "--steps", "3"]


def test_parse_and_expand_matrix():
    axes = matrix.parse_matrix(["batch_size=16,32", "compile=true,False"])
    assert axes == [("batch_size", ["16", "32"]), ("compile", ["True", "False"])]
    points = matrix.expand(axes)
    assert len(points) == 4 and points[1] == [("batch_size", "16"), ("compile", "False")]
    assert matrix.expand([]) == [[]]
    with pytest.raises(UserError, match="twice"):
        matrix.parse_matrix(["fp8=off", "fp8=auto"])
    with pytest.raises(UserError, match="cannot vary"):
        matrix.parse_matrix(["matrix=a,b"])


def test_child_argv_puts_the_point_last_and_replaces_the_preset():
    base = ["--preset", "gpt2-124m", "batch_size=8", "--profile"]
    argv = matrix.child_argv(base, [("preset", "modern-124m"), ("batch_size", "32")])
    assert argv == ["batch_size=8", "--profile", "--preset", "modern-124m", "--batch_size", "32"]
    parsed = bench.parse(bench.BenchConfig, argv, prog="t", description="t", bare_flags=bench.BARE_FLAGS)
    assert parsed.preset == "modern-124m" and parsed.model.n_kv_head == 3 and parsed.batch_size == 32 and parsed.profile


def test_child_argv_sets_the_chunked_loss_after_the_preset():
    argv = matrix.child_argv(["--preset", "gpt2-124m", "batch_size=8"], [("model.ce_chunk_tokens", "8192")])
    parsed = bench.parse(bench.BenchConfig, argv, prog="t", description="t", bare_flags=bench.BARE_FLAGS)
    assert parsed.model.ce_chunk_tokens == 8192 and parsed.model.vocab_size == 50304  # the preset's model, chunked
    base = bench.parse(bench.BenchConfig, ["--preset", "gpt2-124m"], prog="t", description="t")
    assert base.model.ce_chunk_tokens == 0  # off by default


def test_remove_option_spellings():
    argv = ["--json-out", "a", "json_out=b", "--json_out=c", "--steps", "2"]
    assert matrix.remove_option(matrix.remove_option(argv, "json_out"), "json-out") == ["--steps", "2"]


def test_failure_classification_and_json_pick():
    assert matrix.classify_failure("torch.OutOfMemoryError: CUDA out of memory. Tried") == "oom"
    assert matrix.classify_failure("RuntimeError: bad") == "error"
    assert matrix.last_json_line('table\n{"a": 1}\n') == {"a": 1}
    assert matrix.last_json_line("no json") is None


# ----------------------------------------------------------------------------------------------------
# profile grouping


@pytest.mark.parametrize("name, group", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "gemm"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)", "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128>>(Params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "attention"),
    ("triton_per_fused_native_layer_norm_native_layer_norm_backward_12", "norm"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_3", "norm"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor<float, 4>>", "optimizer"),
    ("triton_poi_fused_add_gelu_5", "other"),
    ("aten::mm", "gemm"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::mul_ [optimizer]", "optimizer"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("gloo:all_reduce", "communication"),
    ("aten::broadcast_tensors", "other"),
])
def test_kernel_groups(name, group):
    assert kernel_group(name) == group


def test_summarize_per_step():
    rows = [("nvjet_gemm", 6000.0, 30), ("flash_fwd_kernel", 2000.0, 6), ("triton_poi_fused_add", 2000.0, 60)]
    s = summarize(rows, n_steps=2, top=2)
    assert s["groups_ms_per_step"]["gemm"] == pytest.approx(3.0)
    assert s["total_ms_per_step"] == pytest.approx(5.0)
    assert s["groups_fraction"]["gemm"] == pytest.approx(0.6)
    assert [r["name"] for r in s["top"]] == ["nvjet_gemm", "flash_fwd_kernel"]
    assert s["top"][0]["calls_per_step"] == 15


def test_gpu_rows_leave_out_the_step_and_optimizer_ranges():
    """The record_function ranges around each step and the optimizer show up on the GPU timeline as user
    annotations spanning the kernels inside them; counting them would double the total (it did on an H100)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from redline.bench.profile import _rows

    def evt(key, us, annotation=False, device=DeviceType.CUDA):
        return SimpleNamespace(key=key, self_device_time_total=us, count=1, device_type=device,
                               is_user_annotation=annotation)

    prof = SimpleNamespace(key_averages=lambda: [
        evt("train_step_0", 900.0, annotation=True), evt("Optimizer.step#AdamW.step", 80.0, annotation=True),
        evt("nvjet_gemm", 600.0), evt("multi_tensor_apply_kernel", 80.0), evt("aten::mm", 5.0, device=DeviceType.CPU),
        evt("train_step_1", 300.0),  # an older torch without the annotation flag: left out by its name
    ])
    rows = _rows(prof, torch.device("cuda"))
    assert sorted(name for name, _, _ in rows) == ["multi_tensor_apply_kernel", "nvjet_gemm"]
    assert summarize(rows, n_steps=1)["total_ms_per_step"] == pytest.approx(0.68)


# ----------------------------------------------------------------------------------------------------
# attention backend choice and the wrap order


def test_pick_backend_prefers_pytorch_unless_clearly_beaten():
    assert ab.pick_backend({"auto": 0.67, "cudnn": 0.51, "flash": 0.67, "efficient": 1.18}) == "cudnn"
    assert ab.pick_backend({"auto": 0.67, "cudnn": 0.665, "flash": 0.67}) == "auto"  # within noise
    assert ab.pick_backend({"auto": None, "cudnn": None, "flash": 0.7, "efficient": 0.9}) == "flash"
    assert ab.pick_backend({"auto": None, "cudnn": None}) == "auto"


def test_measured_backend_does_not_leak_into_the_saved_config():
    cfg = TrainConfig(model=replace(get_preset("tiny"), n_layer=2))
    model = GPT(cfg.model)
    ab.set_model_backend(model, "cudnn")
    assert all(block.attn.cfg.attn_backend == "cudnn" for block in model.blocks)
    assert cfg.model.attn_backend == "auto"  # config.json and checkpoints keep auto


def test_backend_resolution_off_cuda_and_when_forced():
    model = GPT(replace(get_preset("tiny"), n_layer=1))
    assert ab.resolve_attention_backend(model, 2, 16, torch.device("cpu"), None) == {"backend": "auto",
                                                                                     "source": "pytorch"}
    forced = GPT(replace(get_preset("tiny"), n_layer=1, attn_backend="math"))
    assert ab.resolve_attention_backend(forced, 2, 16, torch.device("cpu"), None)["source"] == "config"


def test_a_failed_backend_measurement_leaves_the_choice_to_pytorch(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")

    monkeypatch.setattr(ab, "choose_backend", broken)
    model = GPT(replace(get_preset("tiny"), n_layer=1))
    result = ab.resolve_attention_backend(model, 2, 16, torch.device("cuda", 0), torch.bfloat16)
    assert result["backend"] == "auto" and result["source"] == "failed" and "CUDNN_STATUS" in result["error"]
    assert model.cfg.attn_backend == "auto"


def test_backend_cache_round_trip(tmp_path, monkeypatch):
    from redline.measurement_cache import read_cache, write_cache_entry

    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    path = ab.cache_path()
    assert path.parent == tmp_path
    write_cache_entry(path, "k1", {"backend": "cudnn"})
    write_cache_entry(path, "k2", {"backend": "flash"})
    assert read_cache(path) == {"k1": {"backend": "cudnn"}, "k2": {"backend": "flash"}}
    path.write_text("not json")
    assert read_cache(path) == {}


def test_wrap_returns_its_decisions_and_compile_scope():
    from redline.converters import build_converters
    from redline.training.wrap import compile_scope, wrap_model

    cfg = TrainConfig(model=replace(get_preset("tiny"), n_layer=2), batch_size=2, seq_len=16, compile=False)
    model = GPT(cfg.model)
    wrapped = wrap_model(model, cfg, torch.device("cpu"), DistInfo(), build_converters(cfg, torch.device("cpu")))
    assert wrapped.module is model and not hasattr(model, "redline_wrap")  # nothing hung on the model
    report = wrapped.decisions
    assert report["converters"] == {} and report["attention"]["source"] == "pytorch"  # fp8=off: no converter
    assert report["compile"] == {"enabled": False, "scope": None, "mode": "default", "cuda_graphs": False}
    assert compile_scope(cfg) == "model"
    assert compile_scope(replace(cfg, model=get_preset("gpt2-1.5b"))) == "blocks"
    assert compile_scope(replace(cfg, compile_scope="blocks")) == "blocks"


def test_expandable_segments_default(monkeypatch):
    from redline.training.wrap import set_cuda_allocator_defaults

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    set_cuda_allocator_defaults()
    import os

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    set_cuda_allocator_defaults()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"  # the user's setting wins


# ----------------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_attention_backends_measured_on_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    cfg = replace(get_preset("tiny"), n_layer=1)
    backend, timings, cached = ab.choose_backend(cfg, 4, 256, torch.device("cuda"))
    assert backend in ab.CANDIDATES and not cached
    assert any(v is not None for v in timings.values())
    assert ab.choose_backend(cfg, 4, 256, torch.device("cuda"))[2]  # second time: from the cache


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bench_on_gpu(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path))
    assert bench.main(["--preset", "tiny", "batch_size=4", "warmup=2", "steps=3", "compile=False"]) == 0
    (point,) = last_json(capsys.readouterr().out)["points"]
    assert point["timer"] == "cuda_events" and point["peak_memory_gib"] > 0
