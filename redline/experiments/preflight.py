"""What a sweep checks before its first run starts: the optional libraries its runs will need.

A missing one would otherwise be found by each run in turn, after its model was built (or by the report after
every run had finished). The check reads each run's resolved config: FP8 on a CUDA GPU needs torchao, the gpt2
tokenizer needs tiktoken (named, or the one a prepared data folder was made with), and .parquet or hf: data
needs pyarrow or datasets. It reads no data beyond a prepared folder's meta.json.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from redline.errors import UserError

# module -> (the extra that installs it, what in a run needs it)
OPTIONAL = {
    "torchao": ("gpu", "FP8 training on a GPU"),
    "tiktoken": ("gpt2", "the gpt2 tokenizer"),
    "prodigyopt": ("lora", "optim.name=prodigy"),
    "bitsandbytes": ("qlora-bnb", "lora.nf4_backend=bitsandbytes"),
}


def needed_modules(cfg, cuda: bool) -> set[str]:
    """The optional modules a run with this TrainConfig imports (data libraries are checked by list_files)."""
    from redline.data.prepare import check_prepared, load_meta
    from redline.data.sources import list_files

    needs = set()
    if cfg.fp8 != "off" and cuda:
        needs.add("torchao")
    if cfg.data.tokenizer == "gpt2":
        needs.add("tiktoken")
    if cfg.lora.quantize == "nf4":
        from redline.converters.lora import auto_nf4_backend

        needs.add(auto_nf4_backend() if cfg.lora.nf4_backend == "auto" else cfg.lora.nf4_backend)
    if cfg.optim.name == "prodigy":
        needs.add("prodigyopt")
    path = cfg.data.path
    if path and Path(path).exists():
        if check_prepared(path):
            if load_meta(path)["tokenizer"]["kind"] == "gpt2":
                needs.add("tiktoken")
        else:
            list_files([path])  # raises for .parquet without pyarrow, hf: without datasets
    elif path and str(path).startswith("hf:"):
        list_files([path])
    return needs


def check_requirements(configs: dict[str, object], cuda: bool | None = None) -> None:
    """UserError naming the first missing library, the run that needs it and the extra to install; `configs`
    maps run ids to their TrainConfigs."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    for run_id, cfg in configs.items():
        try:
            needs = needed_modules(cfg, cuda)
        except UserError as e:
            raise UserError(f"run {run_id}: {e}; nothing was run") from None
        for module in sorted(needs):
            if importlib.util.find_spec(module) is None:
                extra, why = OPTIONAL[module]
                raise UserError(f"run {run_id} needs {module} ({why}), which is not installed: "
                                f"`pip install 'redline[{extra}]'` (or `pip install {module}`); nothing was run")
