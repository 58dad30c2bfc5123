"""Random-weight redline checkpoints of real models' shapes (through the families' config translation), for
bench-infer A/Bs of the decode attention. python .exp/s60_shapes.py NAME OUT_DIR [--tiny]"""
import sys
from pathlib import Path

import torch
import transformers

from redline.config import TrainConfig, to_dict
from redline.interop.families import family_for
from redline.model import GPT
from redline.tokenizer import load_tokenizer
from redline.training.checkpoint import save_checkpoint

SHAPES = {
    "olmo2": ("Olmo2Config", dict(vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                  num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096,
                                  rms_norm_eps=1e-6, rope_theta=500_000.0, tie_word_embeddings=False)),
    "gemma3": ("Gemma3TextConfig", dict(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                        query_pre_attn_scalar=256, sliding_window=512, max_position_embeddings=32768,
                                        rms_norm_eps=1e-6, tie_word_embeddings=True,
                                        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    "pythia410m": ("GPTNeoXConfig", dict(vocab_size=50304, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                         intermediate_size=4096, rotary_pct=0.25, use_parallel_residual=True,
                                         max_position_embeddings=2048, tie_word_embeddings=False)),
    "stablelm2": ("StableLmConfig", dict(vocab_size=100352, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                                         num_attention_heads=32, num_key_value_heads=32, partial_rotary_factor=0.25,
                                         use_qkv_bias=True, max_position_embeddings=4096, tie_word_embeddings=False)),
}

name, out = sys.argv[1], Path(sys.argv[2])
cls, shape = SHAPES[name]
if "--tiny" in sys.argv:
    shape = {**shape, "num_hidden_layers": 2, "vocab_size": 1024}
hf = getattr(transformers, cls)(**shape).to_dict()
model_cfg = family_for(hf, name).model_config(hf)
cfg = TrainConfig()
cfg.model = model_cfg
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = GPT(model_cfg).to(torch.bfloat16)
print(name, model_cfg)
save_checkpoint(out, 0, model, {}, to_dict(cfg), load_tokenizer("bytes"), keep=1)
