"""redline: pretrain small modern GPT language models fast, and measure what pays."""

__version__ = "0.1.0"
