"""Fast generation: a static KV-cache engine (torch.compile and CUDA graphs on a GPU), sampling, and text helpers.

    engine = InferenceEngine(model)                      # runs the model in bf16 on a GPU, fp32 on a CPU
    results = engine.generate([[1, 2, 3], [4, 5]], max_new_tokens=32, sampling=SamplingParams(temperature=0.8))
    TextGenerator(engine, tokenizer).generate(["Once upon a time"], 64, stop_strings=["\\n\\n"])

Where things live: engine.py (the API: generate, score; the generation loop), plan.py (every option, decided
once), cache.py (the KV cache and the cache layers the model's attention uses), steps.py (prefill and decode
step functions), compiled.py and graphs.py (torch.compile and CUDA graphs), kernels/ (redline's Triton kernels),
baseline.py (the no-cache loop), sampling.py, text.py (strings in and out), runtime.py (command-line options).
"""

from redline.inference.baseline import naive_generate
from redline.inference.cache import KVCache
from redline.inference.engine import Generation, InferenceEngine, Timings
from redline.inference.sampling import SamplingParams, sample_next
from redline.inference.text import Completion, TextGenerator

__all__ = ["Completion", "Generation", "InferenceEngine", "KVCache", "SamplingParams", "TextGenerator", "Timings",
           "naive_generate", "sample_next"]
