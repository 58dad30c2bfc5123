"""What `redline import SRC` reads: a Hugging Face folder, a .gguf file, or a model name on the Hub."""

from __future__ import annotations

import re
from pathlib import Path

from redline.errors import UserError
from redline.interop.hf import ImportedModel

HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the Hub spells repositories


def read_source(src: str, tokenizer: str | None = None, revision: str | None = None,
                step: int | None = None) -> ImportedModel:
    """The model SRC names, in redline's layout. tokenizer: a tokenizer.json or folder to use instead of the one
    that comes with SRC (a nanochat checkpoint's: its tokenizer.pkl too); revision: a Hub branch, tag or commit;
    step: a nanochat checkpoint folder's step (None: the latest)."""
    path = Path(src).expanduser()
    if path.is_dir():
        from redline.interop.nanochat_checkpoint import is_checkpoint_folder, read_checkpoint

        if is_checkpoint_folder(path):
            return read_checkpoint(path, step, tokenizer)
    if step is not None:
        raise UserError(f"--step picks a step of a nanochat checkpoint folder (model_NNNNNN.pt, meta_NNNNNN.json); "
                        f"{src} is not one")
    if path.is_dir():
        from redline.interop.hf import read_folder

        return read_folder(path, tokenizer)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise UserError(f"{src} is a file but not a .gguf; give a Hugging Face model folder, a .gguf file or a "
                            f"Hub model name (owner/name)")
        from redline.interop.gguf_file import read_gguf

        return read_gguf(path, tokenizer)
    if HUB_NAME.match(src) and not src.startswith((".", "/", "~")):
        from redline.interop.hf import read_folder
        from redline.interop.hub import download

        return read_folder(download(src, revision), tokenizer)
    raise UserError(f"{src} does not exist; give a Hugging Face model folder, a .gguf file or a Hub model name "
                    f"(owner/name)")
