"""Model names on the Hugging Face Hub: `redline import owner/name` downloads the folder with huggingface_hub.

Only what an import reads is downloaded (configs, safetensors or else pytorch_model.bin, tokenizer files, chat
templates), into huggingface_hub's own cache, so a second import of the same name needs no network. Offline, a
name already in the cache still imports; otherwise the error says how to bring the folder over and pass its path
instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from redline.errors import UserError

# what read_folder reads: model and generation configs, weights (single or sharded), tokenizer (older uploads:
# vocab.json + merges.txt, or a SentencePiece model), chat template
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "merges.txt", "tokenizer.model", "spiece.model"]
# the weights of an upload without safetensors (torch pickles, read with weights_only=True)
BIN_PATTERNS = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]


def _offline_help(name: str) -> str:
    return (f"on a machine with network run `hf download {name} --local-dir DIR` (huggingface_hub's CLI), copy DIR "
            f"here, and run `redline import DIR --out ...`")


def download(name: str, revision: str | None = None) -> Path:
    """The local folder of Hub model `name` (downloaded or from the cache): configs, tokenizer and safetensors, or,
    for an upload without safetensors, its pytorch_model.bin files."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise UserError("importing a model by its Hub name needs huggingface_hub: pip install 'redline[interop]' "
                        "(or give a local folder)") from None
    folder = _snapshot(name, revision, ALLOW_PATTERNS, ["config.json"])
    if not any(folder.glob("*.safetensors")):  # an older upload: torch pickles only
        folder = _snapshot(name, revision, BIN_PATTERNS, ["pytorch_model*.bin"])
    return folder


def _snapshot(name: str, revision: str | None, patterns: list[str], needed: list[str]) -> Path:
    """snapshot_download of the files matching `patterns`: from the cache where it holds a file matching each of
    `needed`, else from the Hub (a UserError for no network, a gated, missing or private repo)."""
    import huggingface_hub
    from huggingface_hub import errors

    options = {"revision": revision, "allow_patterns": patterns}
    try:  # already in the cache: no network needed
        folder = Path(huggingface_hub.snapshot_download(name, local_files_only=True, **options))
        if all(any(folder.glob(p)) for p in needed):
            return folder
    except (errors.LocalEntryNotFoundError, errors.CachedRepoTreeNotFoundError, FileNotFoundError, OSError):
        pass
    from huggingface_hub import constants

    from redline.tokenizer import _can_reach

    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    if os.environ.get("HF_HUB_OFFLINE") or constants.HF_HUB_OFFLINE or not _can_reach(host):
        raise UserError(f"{name} is not a local folder and the Hugging Face Hub ({host}) cannot be reached from "
                        f"here; {_offline_help(name)}")
    print(f"redline import: downloading {name} from the Hugging Face Hub", flush=True)
    try:
        return Path(huggingface_hub.snapshot_download(name, **options))
    except errors.GatedRepoError:
        raise UserError(f"{name} is gated on the Hub: accept its license on its page, then log in with "
                        f"`hf auth login` (or set HF_TOKEN)") from None
    except errors.RepositoryNotFoundError:
        raise UserError(f"no model {name} on the Hugging Face Hub (or it is private: log in with `hf auth login`)") \
            from None
    except errors.RevisionNotFoundError:
        raise UserError(f"{name} has no revision {revision!r} on the Hub") from None
    except (errors.HfHubHTTPError, errors.LocalEntryNotFoundError, OSError) as e:
        raise UserError(f"downloading {name} failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                        f"{_offline_help(name)}") from None
