"""Dequantize a GGUF into safetensors shards one block at a time, in bounded memory.

``from_pretrained(gguf_file=…)`` dequantizes every tensor into one dict, loads it into a model and
``save_pretrained`` writes it: about twice the float model in memory. This writes what that writes,
tensor for tensor and byte for byte, while holding one block (``blk.N``) of dequantized tensors (each
output shard is spooled to disk tensor by tensor), and it does so with transformers' own parts: the
config, the meta-device model, the GGUF→model name map and the per-architecture ``TENSOR_PROCESSORS``
(q/k un-permutation, norm offsets, fused experts), the loader's dtype rules, and
``revert_weight_conversion`` (what ``save_pretrained`` applies before writing, e.g. splitting fused
experts back into per-expert matrices).

The tensors are found with surgery's header reader (``read_gguf_header``), not ``gguf.GGUFReader``, which
builds numpy views of every vocabulary entry (~1 GB and tens of seconds on a 262k vocabulary), and each
is dequantized by gguf-py a slab of rows at a time into one float32 array, so the dequantizer's
temporaries stay a few MB where a whole-tensor call holds several copies of the largest tensor.

:func:`whole_model_reason` says, from the file and the model's conversion table, when this cannot
reproduce ``from_pretrained`` and the whole-model path must be taken instead.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.counted import counted
from ..core.errors import CheckpointError
from ..core.progress import StageProgress
from ..core.spooled_safetensors import SpooledSafetensors

if TYPE_CHECKING:
    import numpy as np

# The shard size shapes the output (its files and the index), not the memory: a shard's tensors are
# spooled to disk as they come. Finishing a shard needs its size twice on disk (spool and file).
SHARD_BYTES = 2 * 2**30
DEQUANTIZE_BYTES = 1 << 20  # stored bytes dequantized in one call: its float32 temporaries are a few times this
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
_BLOCK = re.compile(r"blk\.(\d+)\.")


@contextmanager
def transformers_errors(name: str) -> Iterator[None]:
    """transformers' failures to read the file as a causal LM become one line."""
    try:
        yield
    except NotImplementedError as exc:  # gguf has no dequantizer for one of the tensor types
        raise CheckpointError(
            f"{name}: {exc}; the installed gguf package cannot dequantize it "
            "(pip install -U gguf, or use a file with another quantization)"
        ) from None
    except ValueError as exc:  # e.g. an architecture transformers reads but has no causal LM for
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"transformers cannot load {name} as a causal LM: {first}") from None


@dataclass
class StreamPlan:
    """What streaming a GGUF's weights needs from its metadata, read before the weights are."""

    header: Any  # importing.GgufHeader
    dtype: str
    model: Any  # the meta-device causal LM
    gguf_config: dict[str, Any]  # AutoConfig's, as a dict: a bake of the file reads it (surgery/gguf/model.py)
    processor_config: dict[str, Any]  # the raw config dict load_gguf_checkpoint hands the tensor processors


def plan_streamed(header: Any, dtype: str) -> StreamPlan | None:
    """Read the config of the GGUF whose header (``importing.GgufHeader``) is ``header`` and build its
    model on the meta device; None when the file must be imported whole instead (:func:`whole_model_reason`).
    Only this reads the file's metadata, so the caller can release that reading before :func:`write_streamed`."""
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = header.path
    with transformers_errors(path.name):
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        gguf_config = config.to_dict()  # before the meta model is built from it
        model = meta_model(config, dtype)
        if whole_model_reason(header.architecture, model) is not None:
            return None
        # The processors read the raw config dict load_gguf_checkpoint gives them, not the config object.
        processor_config = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    return StreamPlan(header, dtype, model, gguf_config, processor_config)


def write_streamed(
    plan: StreamPlan, out: Path, progress: StageProgress, shard_bytes: int = SHARD_BYTES
) -> dict[str, Any]:
    """Write the weights and config ``plan`` describes into ``out`` block by block, and return the file's
    transformers config (``plan.gguf_config``)."""
    model = plan.model
    with transformers_errors(plan.header.path.name):
        stream_tensors(plan.header, plan.processor_config, model, plan.dtype, out, progress, shard_bytes)
    # The rest of what save_pretrained writes: the config as the model sees it, and the generation config.
    model.config.dtype = str(model.dtype).split(".")[1]
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out)
    if model.can_generate():
        model.generation_config.save_pretrained(out)
    return plan.gguf_config


def whole_model_reason(architecture: str, model) -> str | None:
    """Why the GGUF must go through ``from_pretrained`` as a whole (None: it can be streamed)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    from transformers.integrations.gguf.utils import is_gguf_arch_supported

    if is_gguf_arch_supported(architecture):
        # transformers' newer GGUF loader converts these with WeightConverter chains that run inside
        # from_pretrained (integrations/gguf), not with TENSOR_PROCESSORS. That loader reads tensors
        # lazily, so the whole-model path holds about one float model, not two.
        return f"transformers loads '{architecture}' GGUFs through its conversion pipeline"
    mapping = get_model_conversion_mapping(model)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    meta = model.state_dict()
    for key in meta:
        renamed, pattern = rename_source_key(key, renamings, converters, model.base_model_prefix, meta)
        if renamed not in meta:  # the loader then keeps the key as it is
            continue
        if renamed != key or pattern is not None:
            # from_pretrained would rename or convert this key on load: only its loader reproduces that.
            return f"transformers converts {key} on load"
    return None


def meta_model(config: Any, dtype: str):
    """The causal LM ``from_pretrained`` would build for ``config``, on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))


def _blocks(tensors: Iterable[Any]) -> list[list[Any]]:
    """The file's tensors grouped by block (``blk.N.``); every other tensor alone, in file order.

    The processors that build one model tensor from several GGUF tensors (Qwen2-MoE and MiniMax-M2
    fuse ffn_gate_exps with ffn_up_exps) or several from one (GPT-OSS splits experts) do so within
    one block, so what a block produces is complete once the block is processed.
    """
    groups: dict[str, list[Any]] = {}
    for t in tensors:
        m = _BLOCK.match(t.name)
        groups.setdefault(f"blk{m.group(1)}" if m else f"tensor {t.name}", []).append(t)
    return list(groups.values())


def dequantized(fd: int, t: Any) -> np.ndarray:
    """``t``'s (a ``header.GgufTensor``) values as gguf-py's ``dequantize`` gives them for the data ``gguf.GGUFReader`` hands it
    (float32, shaped as ``t``), computed ``DEQUANTIZE_BYTES`` of stored rows at a time into one array;
    ``fd``: the GGUF file, open for reading.

    Each slab of stored rows is read with ``pread`` into a buffer of its own: the pages of a memory map
    would stay mapped, and counted in the process's memory, until the whole tensor is done (178 MB
    beside Gemma-3's 640 MiB float32 embedding)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize

    qtype = GGMLQuantizationType[t.type]
    values, nbytes = GGML_QUANT_SIZES[qtype]
    cols = t.shape[-1] if t.shape else 1
    rows = int(np.prod(t.shape[:-1], dtype=np.int64)) if len(t.shape) > 1 else 1
    row_bytes = (cols // values) * nbytes
    typed = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
    out = np.empty(t.shape, dtype=np.float32)
    flat = out.reshape(rows, cols)
    step = max(1, DEQUANTIZE_BYTES // max(1, row_bytes))
    for a in range(0, rows, step):
        n = min(step, rows - a)
        raw = os.pread(fd, n * row_bytes, t.offset + a * row_bytes)
        if len(raw) != n * row_bytes:  # the header check ran before; the file changed since
            raise CheckpointError(f"{t.name}: the GGUF file ended inside this tensor's data")
        stored = np.frombuffer(raw, dtype=np.uint8).reshape(n, row_bytes)
        if qtype in typed:  # GGUFReader types these; every other type is handed over as bytes
            stored = stored.view(typed[qtype])
        flat[a : a + n] = dequantize(stored, qtype)
    return out


class _Shards:
    """safetensors shards filled in the order tensors come, each finished when the next would overflow.

    A tensor's bytes go to its shard's spool file as it comes (``core/spooled_safetensors.py``), so
    memory holds one block of tensors, not a shard; the files are byte for byte what safetensors'
    ``save_file`` writes for the same tensors."""

    def __init__(self, folder: Path, limit: int):
        self.folder, self.limit = folder, limit
        self.current = self._next(0)
        self.written: list[Path] = []
        self.where: dict[str, int] = {}  # tensor name -> shard number
        self.total = 0

    def _next(self, number: int) -> SpooledSafetensors:
        return SpooledSafetensors(self.folder / f".shard-{number}.spool")

    def add(self, name: str, tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.current.tensors and self.current.nbytes + nbytes > self.limit:
            self._flush()
        self.current.add(name, tensor.contiguous())  # as save_pretrained does before writing
        self.total += nbytes

    def _flush(self) -> None:
        path = self.folder / f".shard-{len(self.written)}.partial"
        self.current.finish(path, metadata={"format": "pt"})  # save_pretrained's metadata
        path.chmod(0o644)  # a checkpoint is meant to be shared
        self.where.update(dict.fromkeys(self.current.tensors, len(self.written)))
        self.written.append(path)
        self.current = self._next(len(self.written))

    def close(self, total_parameters: int) -> None:
        """Name the shards as save_pretrained does (one file, or numbered ones and an index)."""
        if self.current.tensors or not self.written:
            self._flush()
        n = len(self.written)
        names = [WEIGHTS] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        for path, name in zip(self.written, names):
            path.rename(self.folder / name)
        if n == 1:
            return
        index = {
            "metadata": {"total_parameters": total_parameters, "total_size": self.total},
            "weight_map": {t: names[i] for t, i in self.where.items()},
        }
        (self.folder / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _dtype_of(model, dtype) -> dict[str, Any]:
    """The dtype from_pretrained gives each model tensor: the model's ``_keep_in_fp32`` plan first,
    then the dtype the model was built with (core_model_loading.convert_and_load_state_dict_in_model)."""
    from transformers.core_model_loading import build_glob_alternation

    plan = model._get_dtype_plan(dtype)
    alternation, group_glob, _ = build_glob_alternation(list(plan)) if plan else (None, {}, {})
    out = {}
    for name, empty in model.state_dict().items():
        match = alternation.search(name) if alternation is not None else None
        out[name] = plan[group_glob[match.lastgroup]] if match else empty.dtype
    return out


def stream_tensors(
    header: Any,
    processor_config: dict[str, Any],
    model,
    dtype: str,
    out: Path,
    progress: StageProgress,
    shard_bytes: int = SHARD_BYTES,
) -> None:
    """Write ``model``'s weights, dequantized from the GGUF whose header is ``header``, as safetensors in ``out``."""
    import numpy as np
    import torch
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    torch_dtype = getattr(torch, dtype)
    # The same processor, with the same config dict, as load_gguf_checkpoint builds.
    processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=processor_config)
    key_mapping = get_gguf_hf_weights_map(model, processor)
    final_dtype = _dtype_of(model, torch_dtype)
    # A tied tensor (lm_head on embed_tokens) is not written, as save_pretrained writes it once.
    kept = set(remove_tied_weights_from_state_dict(model.state_dict(), model))
    total, done = len(header.tensors), 0
    progress("dequantize", 0, total)
    shards, loaded = _Shards(out, shard_bytes), set()
    with open(header.path, "rb") as source:
        for block in _blocks(header.tensors.values()):
            parsed: dict[str, dict[str, Any]] = {"tensors": {}}  # where processors put what they assemble
            for tensor in block:
                result = processor.process(
                    weights=dequantized(source.fileno(), tensor),
                    name=tensor.name,
                    tensor_key_mapping=key_mapping,
                    parsed_parameters=parsed,
                )
                if result.name in key_mapping:  # as load_gguf_checkpoint: cast to the dtype asked for
                    weights = result.weights  # our own array unless a processor returned a view of something
                    owned = weights.flags.owndata and weights.flags.writeable and weights.flags.c_contiguous
                    value = torch.from_numpy(weights if owned else np.copy(weights)).to(torch_dtype)
                    parsed["tensors"][key_mapping[result.name]] = value
                done += 1
                progress("dequantize", done, total)
            # What save_pretrained writes: the original layout (e.g. per-expert matrices of fused experts).
            converted = revert_weight_conversion(model, _as_loaded(parsed.pop("tensors"), final_dtype, kept, loaded))
            result = weights = value = None  # nothing of this block is held while the next is dequantized
            for name in list(converted):
                shards.add(name, converted.pop(name))
    missing = sorted(kept - loaded)
    if missing:
        raise CheckpointError(
            f"{header.path.name} holds no tensor for {counted(len(missing), 'weight')} of the "
            f"{type(model).__name__} it describes ({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}); "
            "the file is incomplete or not a real model of its architecture"
        )
    shards.close(model.num_parameters())


def _as_loaded(
    tensors: dict[str, Any], final_dtype: dict[str, Any], kept: set[str], loaded: set[str]
) -> dict[str, Any]:
    """A block's tensors as from_pretrained loads them, each in its parameter's dtype (a name the model
    has no place for is ignored, as the loader ignores it), less the tied copies save_pretrained drops."""
    out = {}
    for name, value in tensors.items():
        if name not in final_dtype:
            continue
        if name in loaded:  # blocks are independent (see _blocks): a second copy would be a broken assumption
            raise CheckpointError(f"transformers produced {name} twice from the GGUF; please report this")
        loaded.add(name)
        if name in kept:
            out[name] = value.to(final_dtype[name])
    return out
