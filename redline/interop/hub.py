"""Model names on the Hugging Face Hub: `redline import owner/name` downloads the folder with huggingface_hub.

Only what an import reads is downloaded (configs, tokenizer files and chat templates, then the weight files a
shard index names, or model.safetensors, or else pytorch_model.bin), into huggingface_hub's own cache, so a second import of the same name needs no network. Offline, a
name already in the cache still imports; otherwise the error says how to bring the folder over and pass its path
instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlparse

from redline.errors import UserError

# what read_folder reads besides the weights: model and generation configs, shard indexes, tokenizer (older
# uploads: vocab.json + merges.txt, or a SentencePiece model), chat template
META_PATTERNS = ["*.json", "*.jinja", "merges.txt", "tokenizer.model", "spiece.model"]
# the weights, in read_folder's order: safetensors, else (older uploads) torch pickles read with weights_only=True
WEIGHTS = (("model.safetensors.index.json", "model.safetensors"), ("pytorch_model.bin.index.json", "pytorch_model.bin"))


def weight_files(folder: Path, index: str, single: str) -> list[str]:
    """The weight files to fetch: the shards a downloaded index names, else the single file. Never every
    *.safetensors: some repositories hold the same weights twice (Mistral's consolidated.safetensors)."""
    path = folder / index
    if path.is_file():
        try:
            weight_map = json.loads(path.read_text(encoding="utf-8")).get("weight_map") or {}
        except (OSError, ValueError, AttributeError):
            weight_map = {}
        shards = sorted({s for s in weight_map.values() if isinstance(s, str)}) if isinstance(weight_map, dict) else []
        if shards:
            return shards
    return [single]


def _offline_help(name: str) -> str:
    return (f"on a machine with network run `hf download {name} --local-dir DIR` (huggingface_hub's CLI), copy DIR "
            f"here, and run `redline import DIR --out ...`")


def download(name: str, revision: str | None = None) -> Path:
    """The local folder of Hub model `name` (downloaded or from the cache): configs and tokenizer first, then the
    weights they name: safetensors, or for an upload without them its pytorch_model.bin files."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise UserError("importing a model by its Hub name needs huggingface_hub: pip install 'redline[interop]' "
                        "(or give a local folder)") from None
    folder = _snapshot(name, revision, META_PATTERNS, ["config.json"])
    indexed = [(index, single) for index, single in WEIGHTS if (folder / index).is_file()]
    error = None
    for index, single in indexed[:1] or WEIGHTS:  # an index says which files; else each single file in turn
        files = weight_files(folder, index, single)
        try:
            got = _snapshot(name, revision, files, files)
        except UserError as e:  # offline and not in the cache: perhaps the other kind is
            error = error or e
            continue
        if all((got / f).is_file() for f in files):
            return got
    if error is not None:
        raise error
    return folder  # no weights: read_folder says which files it looked for


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
