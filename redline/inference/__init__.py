"""Fast generation: a static KV-cache engine (torch.compile and CUDA graphs on a GPU), sampling, and text helpers.

    engine = InferenceEngine(model)                      # casts the model to bf16 on a GPU, fp32 on a CPU
    results = engine.generate([[1, 2, 3], [4, 5]], max_new_tokens=32, sampling=SamplingParams(temperature=0.8))
    TextGenerator(engine, tokenizer).generate(["Once upon a time"], 64, stop_strings=["\\n\\n"])
"""

from redline.inference.engine import Generation, InferenceEngine, KVCache, Timings, naive_generate
from redline.inference.sampling import SamplingParams, sample_next
from redline.inference.text import Completion, TextGenerator

__all__ = ["Completion", "Generation", "InferenceEngine", "KVCache", "SamplingParams", "TextGenerator", "Timings",
           "naive_generate", "sample_next"]
