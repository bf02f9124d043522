"""Where and in what precision a model runs: device, compute dtype, and accelerate's big-model placement.

``--device auto`` is the first CUDA GPU when there is one (then MPS), else the CPU; ``--dtype auto``
is bfloat16 on a GPU that supports it and float32 everywhere else, every CPU included: without
AVX512-BF16 or AMX (``/proc/cpuinfo`` flags avx512_bf16, amx_bf16) torch's bfloat16 matmul is ~100×
slower than float32 (examples/machine.py measures both), and with them find-heads selects other heads
in bfloat16 than in float32 (docs/performance.md, examples/bench_bf16.py). ``--device-map auto`` hands
placement to accelerate (layers spread over GPUs, CPU memory and disk offload); this module only checks
the user's input and builds accelerate's arguments, it never places weights itself.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core import sizes
from ..core.comma_list import comma_items
from ..core.counted import counted
from ..core.errors import CheckpointError, ParameterError
from ..core.sizes import human_size

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICE_MAPS = ("auto",)
# A decoder layer's tensors are named "<prefix>.layers.<index>.<rest>" in every supported family.
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


# The devices given every day, checked without importing torch (a LoadSpec is made before any work).
_COMMON_DEVICE = re.compile(r"^(?:auto|cpu|mps|cuda(?::\d+)?)$")


def _torch_device(device: str) -> bool:
    """Whether torch reads ``device`` as a device (``xpu``, ``meta`` …): torch's own parser decides."""
    import torch

    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        return False
    return True


def check_device_name(device: object) -> None:
    """Refuse a ``device`` that names no torch device (``gpu``) where it is given, in one line naming the
    parameter as the caller spells it (``device``; ``--device`` on the command line). Whether this
    machine has the device is :func:`check_device`'s question, asked when a model runs."""
    if isinstance(device, str) and (_COMMON_DEVICE.match(device) or _torch_device(device)):
        return
    raise ParameterError(f"{{device}} {device!r} is not a torch device; give auto, cpu, cuda, cuda:N or mps", "device")


def check_device(device: str) -> None:
    """Refuse a device this machine does not have, in one line, before a model is loaded."""
    import torch

    check_device_name(device)
    dev = torch.device(device)
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise CheckpointError(
                f"{{device}} is {device!r}, but this machine has no CUDA GPU usable by torch; give 'cpu'", "device"
            )
        if dev.index is not None and dev.index >= count:
            raise CheckpointError(
                f"{{device}} is {device!r}, but there are only {counted(count, 'CUDA device')} (cuda:0"
                f"{f' … cuda:{count - 1}' if count > 1 else ''})",
                "device",
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise CheckpointError(
            f"{{device}} is {device!r}, but MPS is not available on this machine; give 'cpu'", "device"
        )


def resolve_device(device: str) -> str:
    """``auto`` → cuda:0 / mps / cpu, whichever this machine has first; anything else checked as given."""
    import torch

    if device == "auto":
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return "cuda:0"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    check_device(device)
    return device


def resolve_dtype(dtype: str, device: str):
    """The torch dtype to compute in on ``device`` (already resolved); bf16 where the device lacks it is refused."""
    import torch

    kind = torch.device(device).type
    if dtype == "auto":
        return torch.bfloat16 if kind == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    if dtype == "bfloat16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise CheckpointError(
            f"--dtype bfloat16: {device} ({torch.cuda.get_device_name(torch.device(device))}) "
            "does not support bfloat16; use --dtype float16 or float32"
        )
    return getattr(torch, dtype)


def parse_size(text: str) -> int:
    """``"70GiB"``, ``"500MB"``, ``"1e9"`` → bytes (core.sizes.parse_size, refused as --max-memory's)."""
    size = sizes.parse_size(text)
    if size is None:
        raise CheckpointError(f"--max-memory: {text!r} is not a size (e.g. 70GiB, 500MB)")
    return size


def parse_max_memory(text: str | None) -> dict[Any, int] | None:
    """``"0=70GiB,1=70GiB,cpu=100GiB"`` → accelerate's ``max_memory`` ({0: bytes, 1: bytes, "cpu": bytes})."""
    if text is None:
        return None
    budget: dict[Any, int] = {}
    given: dict[Any, str] = {}
    for part in comma_items(text, "max_memory", "0=70GiB,cpu=100GiB", CheckpointError):
        device, sep, size = part.partition("=")
        device = device.strip().lower()
        if not sep or not device:
            raise CheckpointError(f"--max-memory: {part!r} is not DEVICE=SIZE (e.g. 0=70GiB,cpu=100GiB)")
        device = device.removeprefix("cuda:")
        key: Any = int(device) if device.isdigit() else device
        if not isinstance(key, int) and key not in ("cpu", "mps", "disk"):
            raise CheckpointError(f"--max-memory: device {device!r} is not a GPU index, cpu, mps or disk")
        if key in given:  # a dict would keep the last one silently
            raise CheckpointError(
                f"--max-memory names {'GPU ' if isinstance(key, int) else ''}{key} twice "
                f"({given[key]!r} and {part!r}); give each device once"
            )
        given[key] = part
        budget[key] = parse_size(size)
    if not budget:
        raise CheckpointError("--max-memory is empty; give e.g. 0=70GiB,cpu=100GiB")
    return budget


def check_budget_devices(budget: Mapping[Any, int]) -> None:
    """Refuse, in one line, a --max-memory device this machine lacks (accelerate fails deep inside
    its placement with "Cannot access accelerator device" otherwise)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = sorted(k for k in budget if isinstance(k, int) and k >= count)
    if missing:
        have, fix = (
            ("no CUDA GPU usable by torch", "cpu and disk only")
            if count == 0
            else (f"only {counted(count, 'CUDA device')}", f"GPUs 0 to {count - 1}, cpu and disk")
        )
        raise CheckpointError(f"--max-memory gives GPU {missing[0]} a budget, but this machine has {have}; give {fix}")
    if "mps" in budget and not torch.backends.mps.is_available():
        raise CheckpointError(
            "--max-memory gives mps a budget, but MPS is not available on this machine; give cpu and disk"
        )


def largest_layer_bytes(tensors: Mapping[str, Any], itemsize: int) -> int:
    """Bytes of the biggest decoder layer when loaded at ``itemsize`` bytes per value (``tensors``:
    name → TensorInfo of the checkpoint)."""
    sizes: dict[int, int] = {}
    for name, info in tensors.items():
        match = _LAYER.search(name)
        if match:
            numel = 1
            for d in info.shape:
                numel *= d
            sizes[int(match.group(1))] = sizes.get(int(match.group(1)), 0) + numel * itemsize
    return max(sizes.values(), default=0)


def check_budget(budget: Mapping[Any, int], layer_bytes: int, dtype_name: str) -> None:
    """Every layer must fit on some device's budget: disk-offloaded layers are brought in one at a time."""
    compute = {k: v for k, v in budget.items() if k != "disk"}
    if compute and max(compute.values()) < layer_bytes:
        largest = max(compute.values())
        raise CheckpointError(
            f"--max-memory gives at most {human_size(largest)} to a device, but one decoder "
            f"layer needs {human_size(layer_bytes)} in {dtype_name}: raise it"
        )


def check_offload_folder(source: Path, given: str | None) -> None:
    """Refuse, in one line, an ``--offload-folder`` inside the checkpoint at ``source`` (surgery never
    writes there) or a file in its place."""
    if given is None:
        return
    where = Path(given).expanduser().resolve()
    model = source.resolve()
    if where == model or model in where.parents:
        raise CheckpointError(
            f"--offload-folder {given} is inside the model's folder {source}; surgery never writes into a "
            "checkpoint: give a folder outside it"
        )
    if where.exists() and not where.is_dir():
        raise CheckpointError(f"--offload-folder {given} is a file, not a folder; give a folder")


def check_offload_outside(out: Path, given: str | None) -> None:
    """Refuse, in one line, an ``--offload-folder`` inside a bake's output ``out``: the source's run made
    it there, and the bake, finding ``out`` taken, published nothing after all its work."""
    if given is None:
        return
    where, dest = Path(given).expanduser().resolve(), out.expanduser().resolve()
    if where == dest or dest in where.parents:
        raise CheckpointError(
            f"--offload-folder {given} is inside --out {out}, which the bake makes new: give a folder outside it"
        )


def offload_folder(given: str | None) -> str:
    """A new folder of this run's own for the weights accelerate writes to disk (it re-saves those it
    converts as it loads, e.g. fused experts): inside ``given`` (``--offload-folder``, checked by
    :func:`check_offload_folder`), else in the system's temporary folder. The caller removes it with the
    model, so nothing is left behind and two runs given one folder never overwrite each other's files."""
    if given is None:
        return tempfile.mkdtemp(prefix="surgery-offload-")
    where = Path(given).expanduser()
    try:
        where.mkdir(parents=True, exist_ok=True)
        return tempfile.mkdtemp(prefix="surgery-offload-", dir=where)
    except OSError as exc:  # read-only, no permission, no space: the reason is the OS's
        raise CheckpointError(
            f"--offload-folder {given}: cannot write there ({exc.strerror or exc}); give a writable folder"
        ) from None


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def input_device(model) -> Any:
    """The device to put input ids on: the model's first real device (never "meta": under accelerate's
    disk offload a parameter can live on meta, and accelerate's hooks move inputs onward anyway)."""
    import torch

    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        for where in device_map.values():
            if isinstance(where, int):
                return torch.device("cuda", where)
            if where not in ("disk", "meta"):
                return torch.device(where)
        return torch.device("cpu")
    return next(model.parameters()).device
