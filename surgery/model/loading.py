"""Turn a MODEL argument into a local checkpoint folder, and load it for computation.

MODEL is a local folder or a Hub id (``org/name``, optionally with ``--revision``). Hub downloads
fetch safetensors and the small text files only; pickled weights are never downloaded.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.checkpoint import Checkpoint
from ..core.errors import CheckpointError
from ..core.options import param

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a checkpoint needs besides its weights: configs, tokenizer, chat template, card, licence.
HUB_PATTERNS = ["*.safetensors", "*.json", "*.jinja", "*.model", "*.txt", "*.md", "*.tiktoken",
                "LICENSE*", "NOTICE*", "USE_POLICY*", "merges.txt", "vocab.*"]


@dataclass(frozen=True)
class Source:
    """Where a checkpoint came from, for provenance."""

    path: Path
    hub_id: str | None = None
    revision: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "hub_id": self.hub_id, "revision": self.revision}


def _hub_cache_repo(path: Path) -> str | None:
    """``org/name`` of a Hub-cache snapshot folder (``…/models--org--name/snapshots/<commit>``)."""
    parts = path.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--"):].replace("--", "/")
    return None


def same_model(named: str, source: Source) -> bool:
    """Whether a recipe's ``base_model`` names the checkpoint ``source`` (case-insensitively).

    A recipe records only a name, no fingerprint, so names are compared: an existing local path
    must be the same folder; a Hub id must equal the id MODEL was downloaded as (or the repo of a
    Hub-cache snapshot folder). A local MODEL has no Hub id, so a Hub id or a path from another
    machine is compared by its last part with the folder's name: a local copy named after its repo
    (examples/get_models.py's smollm2-135m-instruct for HuggingFaceTB/SmolLM2-135M-Instruct) is
    the same model, anything else gets the note. Findings files carry the model's fingerprint and
    are checked by it instead (surgery.find.findings.check_model).
    """
    path = Path(named).expanduser()
    if path.exists():
        return source.path.exists() and os.path.samefile(path, source.path)
    ids = {i.casefold() for i in (source.hub_id, _hub_cache_repo(source.path)) if i}
    if named.casefold() in ids:
        return True
    if ids and HUB_ID.match(named):
        return False  # two Hub ids: the whole id counts, not just the repo name
    last = named.rstrip("/").rsplit("/", 1)[-1].casefold()
    return last in {source.path.name.casefold()} | {i.rsplit("/", 1)[-1] for i in ids}


def resolve(model: str, revision: str | None = None) -> Source:
    """A local folder as is; a Hub id downloaded (safetensors only) into the Hub cache."""
    local = Path(model).expanduser()
    if local.exists() or not HUB_ID.match(model) or model.startswith((".", "/", "~")):
        if not local.exists():
            raise CheckpointError(f"{model} does not exist; give a checkpoint folder or a Hub id (org/name)")
        return Source(local)
    return _download(model, revision)


def _download(repo_id: str, revision: str | None) -> Source:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        path = snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS)
    except RepositoryNotFoundError:
        raise CheckpointError(f"{repo_id} is not on the Hub (or is private: log in with `hf auth login`)") from None
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"{repo_id} is not a local folder and cannot be downloaded: no network access to the Hub and it "
            f"is not in the local cache "
            f"({os.environ.get('HF_HUB_CACHE', '~/.cache/huggingface/hub')}); download it elsewhere or "
            "give a local folder") from None
    except (HfHubHTTPError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"cannot download {repo_id}: {first}") from None
    return Source(Path(path), repo_id, revision)


@dataclass(frozen=True)
class LoadSpec:
    """How a command opens and loads every model it touches, carried as one object from the command
    line to the loader so that no option is dropped on the way."""

    revision: str | None = param(None, "Hub revision (branch, tag or commit) of MODEL.", kind="str")
    # the checkpoint's own Python code runs only when the user asks
    trust_remote_code: bool = param(False, "Allow checkpoints whose config needs custom code (read that code "
                                    "first).", is_flag=True)
    device: str = param("cpu", "Torch device the model runs on: cpu, cuda, cuda:N or mps.")
    dtype: str = "float32"  # compute dtype: every command computes in float32 today


DEFAULT_LOAD = LoadSpec()


def open_checkpoint(model: str, load: LoadSpec = DEFAULT_LOAD) -> tuple[Checkpoint, Source]:
    """Resolve MODEL and open it as a checked checkpoint (remote code refused unless ``load`` trusts it)."""
    source = resolve(model, load.revision)
    return Checkpoint(source.path, allow_remote_code=load.trust_remote_code), source


def as_checkpoint(model: Checkpoint | str | Path, load: LoadSpec = DEFAULT_LOAD) -> Checkpoint:
    """``model`` as an opened checkpoint: library functions accept either."""
    if isinstance(model, Checkpoint):
        return model
    return Checkpoint(Path(model), allow_remote_code=load.trust_remote_code)


def check_device(device: str) -> None:
    """Refuse a device this machine does not have, in one line, before a model is loaded."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise CheckpointError(f"--device {device!r} is not a torch device; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise CheckpointError(f"--device {device}: this machine has no CUDA GPU usable by torch; use --device cpu")
        if dev.index is not None and dev.index >= count:
            raise CheckpointError(f"--device {device}: there are only {count} CUDA device(s) (cuda:0"
                                  f"{f' … cuda:{count - 1}' if count > 1 else ''})")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise CheckpointError(f"--device {device}: MPS is not available on this machine; use --device cpu")


def load_model(path: str | Path, load: LoadSpec = DEFAULT_LOAD):
    """Load a checkpoint for computation: safetensors only, no remote code unless asked, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    check_device(load.device)
    hf_logging.disable_progress_bar()  # our own progress bars are the ones users should see
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=getattr(torch, load.dtype), use_safetensors=True,
        trust_remote_code=load.trust_remote_code, device_map=None,
    )
    return model.to(load.device).eval()


def load_tokenizer(path: str | Path, load: LoadSpec = DEFAULT_LOAD):
    """The checkpoint's tokenizer; a missing one is a clear error (findings need it)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=load.trust_remote_code)
    except (OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path} has no usable tokenizer ({first})") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
