"""A redline checkpoint of Qwen3-0.6B's shape (as `redline import` maps it), random weights, bytes tokenizer."""
import sys
from pathlib import Path
import torch
sys.path.insert(0, "scripts/gpu")
from import_bench import QWEN3_06B
from redline.config import TrainConfig, to_dict
from redline.interop.llama import model_config_for
from redline.model import GPT
from redline.tokenizer import load_tokenizer
from redline.training.checkpoint import save_checkpoint
mc = model_config_for("qwen3")(QWEN3_06B)
mc.context_len = 2048
cfg = TrainConfig(model=mc)
torch.manual_seed(0)
with torch.device("cuda"):
    m = GPT(cfg.model).to(torch.bfloat16)
print(save_checkpoint(Path(sys.argv[1]), 0, m, {}, to_dict(cfg), load_tokenizer("bytes"), keep=1))
