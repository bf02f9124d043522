"""Turn a MODEL argument into a local checkpoint folder, and load it for computation.

MODEL is a local folder or a Hub id (``org/name``, optionally with ``--revision``). Hub downloads
fetch safetensors and the small text files only; pickled weights are never downloaded.
"""

from __future__ import annotations

import os
import re
import shutil
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import distributed
from ..core.checkpoint import Checkpoint
from ..core.errors import CheckpointError, require_model_path
from ..core.hub_id import HUB_ID
from ..core.options import check_options, param
from ..core.strict_files import load_json
from .placement import (
    DEVICE_MAPS,
    DTYPES,
    check_budget,
    check_budget_devices,
    check_device_name,
    check_offload_folder,
    largest_layer_bytes,
    offload_folder,
    parse_max_memory,
    resolve_device,
    resolve_dtype,
)

COMMIT = re.compile(r"^[0-9a-f]{40}$")  # a Hub-cache snapshot folder is named after its commit
# What a checkpoint needs besides its weights: configs, tokenizer, chat template, card, licence.
HUB_PATTERNS = [
    "*.safetensors",
    "*.json",
    "*.jinja",
    "*.model",
    "*.txt",
    "*.md",
    "*.tiktoken",
    "LICENSE*",
    "NOTICE*",
    "USE_POLICY*",
    "merges.txt",
    "vocab.*",
]


@dataclass(frozen=True)
class Source:
    """Where a checkpoint came from, for provenance: its folder and, for a Hub model, its id and the
    commit it was read at; a bake also records the weights' fingerprint (export-lora checks a base by it)."""

    path: Path
    hub_id: str | None = None
    revision: str | None = None
    fingerprint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"path": str(self.path), "hub_id": self.hub_id, "revision": self.revision}
        if self.fingerprint is not None:  # surgery.json's source has it; bakes before it and adapters do not
            out["fingerprint"] = self.fingerprint
        return out


def _hub_cache_snapshot(path: Path) -> tuple[str, str] | None:
    """``(org/name, commit)`` of a Hub-cache snapshot folder (``…/models--org--name/snapshots/<commit>``)."""
    parts = Path(path).parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--") and COMMIT.match(parts[-1]):
        return parts[-3][len("models--") :].replace("--", "/"), parts[-1]
    return None


def hub_cache_repo(path: Path) -> str | None:
    """``org/name`` of a Hub-cache snapshot folder, or None."""
    snapshot = _hub_cache_snapshot(path)
    return snapshot[0] if snapshot else None


def local_source(path: str | Path) -> Source:
    """The Source of a local folder: a Hub-cache snapshot is that Hub model at its commit (the
    folder's name), so provenance and card name the repo and the exact revision, not a cache path."""
    path = Path(path)
    snapshot = _hub_cache_snapshot(path.resolve())
    return Source(path, *snapshot) if snapshot else Source(path)


def same_model(named: str, source: Source) -> bool:
    """Whether a recipe's ``base_model`` names the checkpoint ``source`` (case-insensitively).

    A recipe records only a name, no fingerprint, so names are compared: an existing local path
    must be the same folder; a Hub id must equal the id MODEL was downloaded as (or the repo of a
    Hub-cache snapshot folder). Another local MODEL has no Hub id, so a Hub id or a path from another
    machine is compared by its last part with the folder's name: a local copy named after its repo
    (examples/get_models.py's smollm2-135m-instruct for HuggingFaceTB/SmolLM2-135M-Instruct), or a
    GGUF file named after it with its quantization (SmolLM2-135M-Instruct.Q4_1.gguf) or that file's
    import, is the same model, anything else is another model (surgery.bake.lineage). Findings files carry the
    model's fingerprint and are checked by it instead (surgery.find.findings.check_model).
    """
    from ..gguf.file_name import gguf_names  # SmolLM2-135M-Instruct.Q4_1.gguf (or its import) is SmolLM2-135M-Instruct

    path = Path(named).expanduser()
    if path.exists():  # the same file or folder, or a GGUF file and its import (by the file's name)
        imported = path.is_file() and source.path.is_dir() and path.name in gguf_names(source.path)
        return source.path.exists() and (os.path.samefile(path, source.path) or imported)
    ids = {i.casefold() for i in (source.hub_id, hub_cache_repo(source.path)) if i}
    if named.casefold() in ids:
        return True
    if ids and HUB_ID.match(named):
        return False  # two Hub ids: the whole id counts, not just the repo name
    last = named.rstrip("/").rsplit("/", 1)[-1].casefold()
    names = {source.path.name} | {i.rsplit("/", 1)[-1] for i in ids} | gguf_names(source.path)
    return last in {n.casefold() for n in names}


def resolve(model: str, revision: str | None = None) -> Source:
    """A local folder as is; a Hub id downloaded (safetensors only) into the Hub cache."""
    local = Path(model).expanduser()
    if local.exists() or not HUB_ID.match(model) or model.startswith((".", "/", "~")):
        if not local.exists():
            raise CheckpointError(f"{model} does not exist; give a checkpoint folder or a Hub id (org/name)")
        if revision is not None:  # it would be ignored: the folder is read as it is
            raise CheckpointError(
                f"--revision {revision}: MODEL {model} is a local folder, read as it is; "
                "--revision picks a commit of a Hub id: drop it, or give the Hub id"
            )
        return local_source(local)
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
            "give a local folder"
        ) from None
    except (HfHubHTTPError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"cannot download {repo_id}: {first}") from None
    snapshot = _hub_cache_snapshot(Path(path))
    # the commit that was read (the snapshot folder's name), not the branch or tag asked for
    return Source(Path(path), repo_id, snapshot[1] if snapshot else revision)


@dataclass(frozen=True)
class LoadSpec:
    """How a command opens and loads every model it touches, carried as one object from the command
    line to the loader so that no option is dropped on the way."""

    # One option for every command, so its help names the model of each two-model command.
    revision: str | None = param(
        None,
        "Hub revision (branch, tag or commit) of MODEL.",
        kind="str",
    )
    # the checkpoint's own Python code runs only when the user asks
    trust_remote_code: bool = param(
        False, "Allow checkpoints whose config needs custom code (read that code first).", is_flag=True
    )
    device: str = param(
        "auto",
        "Torch device the model runs on: auto (the first GPU when there is one, else "
        "the CPU), cpu, cuda, cuda:N or mps.",
    )
    dtype: str = param(
        "auto",
        "Compute dtype: auto (bfloat16 on a GPU that supports it, float32 elsewhere: on a CPU "
        "bfloat16 pays only with AVX512-BF16 or AMX), float32, bfloat16 or float16. Scores and "
        "sums accumulate in float32 either way.",
        choices=DTYPES,
    )
    device_map: str | None = param(
        None,
        "auto: spread a model too big for one device over the GPUs, CPU memory "
        "and disk (accelerate's big-model loading; --device then names the devices "
        "it may use).",
        kind="str",
        choices=DEVICE_MAPS,
    )
    max_memory: str | None = param(
        None,
        "With --device-map auto: memory per device, e.g. 0=70GiB,1=70GiB,cpu=100GiB (accelerate's max_memory).",
        kind="str",
        metavar="DEVICE=SIZE,...",
    )
    offload_folder: str | None = param(
        None,
        "With --device-map auto: folder for the weights that fit no device "
        "(default: a temporary folder, removed afterwards).",
        kind="str",
        metavar="DIR",
    )

    def __post_init__(self) -> None:
        # option combinations and spelling are checked when the options are read, before any work
        check_options(self)
        check_device_name(self.device)  # "gpu" here, not when a model runs
        if self.device_map is None and (self.max_memory or self.offload_folder):
            raise CheckpointError("--max-memory and --offload-folder place a model with --device-map auto; add it")
        parse_max_memory(self.max_memory)


DEFAULT_LOAD = LoadSpec()
# The fields that matter only to commands that run a model (the others also open checkpoints).
RUN_FIELDS = ("device", "dtype", "device_map", "max_memory", "offload_folder")


def open_checkpoint(
    model: str | Path, load: LoadSpec = DEFAULT_LOAD, *, name: str = "model"
) -> tuple[Checkpoint, Source]:
    """Resolve MODEL and open it as a checked checkpoint (remote code refused unless ``load`` trusts it).
    A GGUF file opens as its cached import (surgery/gguf/imported.py); its Source is the file.
    ``name``: the parameter that gave it, named when it is no path."""
    from ..gguf import is_gguf

    require_model_path(model, name)
    model = str(model)
    if is_gguf(model) and Path(model).is_file():
        from ..gguf.imported import imported_checkpoint

        return imported_checkpoint(model, load.trust_remote_code), Source(Path(model))
    source = resolve(model, load.revision)
    return Checkpoint(source.path, allow_remote_code=load.trust_remote_code), source


def as_checkpoint(model: Checkpoint | str | Path, load: LoadSpec = DEFAULT_LOAD) -> Checkpoint:
    """``model`` as an opened checkpoint: library functions accept either."""
    if isinstance(model, Checkpoint):
        return model
    return Checkpoint(Path(model), allow_remote_code=load.trust_remote_code)


def compute_dtype(load: LoadSpec = DEFAULT_LOAD):
    """The torch dtype models load in under ``load`` (what ``--dtype auto`` means on this machine)."""
    return resolve_dtype(load.dtype, resolve_device(load.device))


def _placement(path: Path, load: LoadSpec, device: str, dtype) -> dict[str, Any]:
    """from_pretrained's placement arguments: none (the caller moves the model to ``device``), or
    accelerate's device_map / max_memory / offload_folder, with the budget checked against one layer."""
    if load.device_map is None:
        return {"device_map": None}
    budget = _checked_budget(path, load, device, dtype)
    device_map = _module_map(path, load, budget, dtype)
    # made last: nothing above can fail and leave it behind
    return {"device_map": device_map, "offload_folder": offload_folder(load.offload_folder)}


def check_placement(path: str | Path, load: LoadSpec) -> None:
    """Refuse, in one line, a ``--device-map auto`` that the load of ``path`` would refuse (under torchrun,
    the offload folder, the budget's devices and size): for work that loads the model later, e.g. the
    bake's run of its source, which starts after the copy."""
    if load.device_map is not None:
        device = resolve_device(distributed.rank_device(load.device))
        _checked_budget(Path(path), load, device, resolve_dtype(load.dtype, device))


def _checked_budget(path: Path, load: LoadSpec, device: str, dtype) -> dict | None:
    """accelerate's ``max_memory`` for ``load`` on ``device`` (None: what accelerate sees free), once
    ``--device-map auto``'s input is checked."""
    if distributed.under_torchrun():  # every rank would spread a copy of its own over all the devices
        raise CheckpointError(
            "--device-map auto splits one model over several devices; under torchrun each "
            "process holds a whole copy: run one process with --device-map auto instead"
        )
    check_offload_folder(path, load.offload_folder)
    budget = parse_max_memory(load.max_memory)
    if budget is not None:
        check_budget_devices(budget)
    if budget is None and load.device != "auto":  # only the device the user named (and CPU, disk) may hold layers
        import torch
        from accelerate.utils import get_max_memory

        named = torch.device(device)
        keep = {named.index or 0} if named.type == "cuda" else {named.type}
        budget = {k: v for k, v in get_max_memory().items() if k in keep | {"cpu"}}
    if budget:
        ckpt = Checkpoint(path, allow_remote_code=load.trust_remote_code)
        check_budget(budget, largest_layer_bytes(ckpt.tensors, dtype.itemsize), str(dtype).removeprefix("torch."))
    return budget


def auto_class(model_type: str):
    """The transformers auto class that loads a ``model_type`` checkpoint whole (the table says:
    AutoModelForCausalLM, or for a wrapper it does not map, e.g. Mistral-3, AutoModelForImageTextToText)."""
    import transformers

    from ..core.architectures import model_class

    return getattr(transformers, model_class(model_type))


def model_class_of(config):
    """The transformers class that :func:`auto_class` builds for ``config`` (a transformers config):
    its class attributes (e.g. what it keeps in float32) are facts about the loaded model."""
    auto = auto_class(config.model_type)
    return auto._model_mapping[type(config)] if hasattr(auto, "_model_mapping") else auto


def _module_map(path: Path, load: LoadSpec, budget: dict | None, dtype) -> dict[str, Any]:
    """accelerate's placement, one entry per module: its default map merges a run of modules on the
    same device into their parent, and a model wholly on disk (``{"": "disk"}``) is then brought
    into memory whole on every forward pass, not a layer at a time."""
    from accelerate import infer_auto_device_map, init_empty_weights
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path), trust_remote_code=load.trust_remote_code)
    with init_empty_weights():
        empty = auto_class(config.model_type).from_config(config, dtype=dtype, trust_remote_code=load.trust_remote_code)
    # Built on meta, tied embeddings (SmolLM2, Gemma) are two separate tensors until tied: accelerate
    # would then place lm_head apart from embed_tokens, e.g. on disk, where the loader never writes
    # it (the checkpoint has no lm_head.weight), and the first forward fails with a KeyError.
    empty.tie_weights()
    return dict(
        infer_auto_device_map(
            empty,
            max_memory=budget,
            dtype=dtype,
            clean_result=False,
            no_split_module_classes=getattr(empty, "_no_split_modules", None),
        )
    )


def _layerwise_dtype(ckpt: Checkpoint, config, float32_in_place: bool):
    """The 16-bit dtype to load ``ckpt`` in for float32 compute a layer at a time, or None to load it
    whole in the compute dtype: its format's answer (a 16-bit checkpoint is upcast a layer per call,
    model/upcast.py; FP8 values and integer codes are held and dequantized the same way, surgery/formats/).
    Only for float32 compute without a device map (accelerate's has its own per-layer hooks and
    budget), and only for models whose decoder layers the table knows (the unit upcast)."""
    from ..core.architectures.table import refusal

    if not float32_in_place or refusal(ckpt.config) is not None:
        return None
    return ckpt.format.layerwise_dtype(ckpt, config)


def load_model(path: str | Path, load: LoadSpec = DEFAULT_LOAD):
    """Load a checkpoint for computation: safetensors only, no remote code unless asked, eval mode,
    on ``load``'s device in its dtype (or spread by accelerate with ``--device-map auto``). A quantized
    checkpoint loads as its format says (surgery/formats/): FP8 dequantized, on any device, as is an
    integer one transformers cannot run; float32 compute of a 16-bit checkpoint keeps the weights 16-bit
    and upcasts a layer per call (model/upcast.py), as it keeps FP8 values and integer codes,
    dequantized a layer per call."""
    import torch
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    from .upcast import attach

    device = resolve_device(distributed.rank_device(load.device))  # under torchrun: this rank's GPU
    ckpt = Checkpoint(Path(path), allow_remote_code=load.trust_remote_code)
    dtype = resolve_dtype(load.dtype, device)
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=load.trust_remote_code)
    model_class = auto_class(config.model_type)
    placement = _placement(Path(path), load, device, dtype)
    stored = _layerwise_dtype(ckpt, config, placement["device_map"] is None and dtype == torch.float32)
    hf_logging.disable_progress_bar()  # our own progress bars are the ones users should see
    own_folder = placement.get("offload_folder")  # this run's own, even inside --offload-folder

    def from_pretrained(**arguments):
        return model_class.from_pretrained(
            str(path),
            dtype=stored or dtype,
            use_safetensors=True,
            trust_remote_code=load.trust_remote_code,
            **placement,
            **arguments,
        )

    try:
        model = ckpt.format.load(ckpt, config, stored is not None, from_pretrained)
    except BaseException:
        if own_folder:
            shutil.rmtree(own_folder, ignore_errors=True)
        raise
    if placement["device_map"] is None:
        model = model.to(device)
    elif own_folder:  # our offload folder lives as long as the model
        weakref.finalize(model, shutil.rmtree, own_folder, True)
    if stored is not None:
        attach(model)
    return model.eval()


def vocab_rows(config: dict) -> int | None:
    """The rows of the model's embedding table (its text model's ``vocab_size``), where the config says."""
    from ..core.architectures import text_config

    rows = text_config(config).get("vocab_size") or config.get("vocab_size")
    return int(rows) if rows else None


def load_tokenizer(path: str | Path, load: LoadSpec = DEFAULT_LOAD):
    """The checkpoint's tokenizer; a missing one, or one with ids the embedding table has no row for,
    is a clear error (findings need it; an id past the table is an IndexError deep in the model)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=load.trust_remote_code)
    except (OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path} has no usable tokenizer ({first})") from None
    config = Path(path) / "config.json"
    rows = vocab_rows(load_json(config.read_text())) if config.is_file() else None
    # The base vocabulary is what any text encodes to. Tokens added past the table are left alone: Gemma 3's
    # text models carry their family's image token one row past theirs, met only in an image prompt.
    if rows is not None and tok.vocab_size > rows:
        raise CheckpointError(
            f"the tokenizer in {path} has token ids up to {tok.vocab_size - 1} ({tok.vocab_size} tokens) but "
            f"the model's embedding table has {rows} rows (config.json vocab_size): it is not this model's "
            "tokenizer; put the model's own tokenizer files next to its weights"
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
