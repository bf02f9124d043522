"""AutoAWQ GEMM checkpoints: a second storage of the int4 asymmetric group layout surgery edits.

``quant_method: "awq"`` (``version``, or transformers 5's ``format``, ``"gemm"``; 4 bits; zero points)
stores a linear ``X`` [out, in] transposed, every code and zero point unsigned (0..15):

* ``X.qweight`` I32 [in, out/8]: input row i's codes, 8 to a word along the output axis in AWQ's
  order: nibble k (bits 4k..4k+3) of word j holds output column 8j + ``ORDER[k]``;
* ``X.qzeros`` I32 [in/group, out/8]: each group of input rows' zero points, packed the same way;
* ``X.scales`` (F16) [in/group, out].

A weight's value is (code − zero) × scale, its group its input column // group_size. compressed-tensors'
``AutoAWQConverter`` turns these into its own W4A16 asymmetric group layout (pack-quantized, codes and
zero points signed, both − 8): surgery reads AWQ weights through that converter, so every value it
checks is the library's, and edits them as that layout (surgery/formats/int_packed/plan.py). Going back, this
module packs codes into AWQ's words (:func:`pack`); a bake decodes what it packed through the converter
again before anything is written.

Which modules are stored as AWQ codes: every one with an ``X.qweight``; ``modules_to_not_convert``
names modules left in float, matched as substrings of the module's name (the converter's
``re:.*name.*``, vLLM's substring match), and ``lm_head`` never converts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import CheckpointError
from ..int_packed import storage as int_packed
from ..int_packed.storage import IntWeight

BITS = 4  # compressed-tensors' converter (and vLLM) read 4-bit AWQ codes only
PER_WORD = 32 // BITS
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the output column (within its word) nibble k holds
OFFSET = 2 ** (BITS - 1)  # AWQ's unsigned codes minus compressed-tensors' signed ones
ALWAYS_IGNORED = "lm_head"  # the converter never converts it


@dataclass(frozen=True)
class Scheme(int_packed.Scheme):
    """An AutoAWQ GEMM checkpoint's weights: int4, asymmetric, groups of ``group_size`` input columns,
    stored transposed (``transposed``) as ``X.qweight`` / ``X.qzeros`` / ``X.scales``."""

    unconverted: tuple[str, ...] = ()  # modules_to_not_convert
    transposed = True  # the stored codes' and scales' rows are the weight's input columns (groups)

    def describe(self) -> str:
        return f"int4 AutoAWQ GEMM, group {self.group_size}, asymmetric"

    @property
    def not_run(self) -> str | None:
        """Why transformers cannot load these weights here: it runs AutoAWQ's only through gptqmodel's
        kernels (transformers 5.24, AwqQuantizer.validate_environment), on any device."""
        if find_spec("gptqmodel") is None:
            return "transformers runs AutoAWQ weights only through the package gptqmodel, which is not installed"
        return None

    def stored_name(self, weight: str) -> str:
        return weight.removesuffix("weight") + "qweight"

    def part(self, weight: str, suffix: str) -> str:
        return weight.removesuffix("weight") + suffix

    def converted(self, module: str) -> bool:
        """Whether the converter converts ``module`` (its name without ``.qweight``)."""
        return module != ALWAYS_IGNORED and not any(m in module for m in self.unconverted)

    def weights(self, folder: Path, tensors: Mapping[str, Any]) -> dict[str, IntWeight]:
        return int_weights(self, tensors)

    def compressed(self, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray | None):
        return compressed(self, codes, scale, zero)

    def packed_codes(self, codes, n_cols: int) -> np.ndarray:
        return pack(codes[:, :n_cols])


def _field(qconfig: Mapping, *names: str, default: Any) -> Any:
    """The first of ``names`` that ``qconfig`` gives (AutoAWQ's and transformers' spellings), else ``default``."""
    return next((qconfig[n] for n in names if qconfig.get(n) is not None), default)


def refusal(qconfig: Any) -> str | None:
    """Why surgery does not edit the AutoAWQ weights ``qconfig`` describes (a clause naming the field and
    what to do), or None: it does, or ``qconfig`` is not AutoAWQ's."""
    if not isinstance(qconfig, Mapping) or qconfig.get("quant_method") != "awq":
        return None
    bits = _field(qconfig, "bits", "w_bit", default=BITS)
    version = _field(qconfig, "version", "format", default="gemm")
    group = _field(qconfig, "group_size", "q_group_size", default=128)
    skip = qconfig.get("modules_to_not_convert") or []
    if bits != BITS:
        return (
            f"quantization_config.bits is {bits!r}: compressed-tensors' AutoAWQ converter (and surgery) read "
            "4-bit AWQ codes only; use a 4-bit AWQ or the unquantized checkpoint"
        )
    if not isinstance(version, str) or version.lower() != "gemm":
        return (
            f"quantization_config.version is {version!r}: surgery edits AutoAWQ's GEMM layout only (GEMV, "
            "ExLlama and Marlin order the codes otherwise); use the GEMM release or the unquantized checkpoint"
        )
    if qconfig.get("zero_point", True) is not True:
        return (
            "quantization_config.zero_point is false: AutoAWQ's GEMM kernels still subtract the stored qzeros, "
            "compressed-tensors' converter subtracts 8 instead, so the libraries disagree on the weights; "
            "use the unquantized checkpoint"
        )
    if type(group) is not int or group <= 0:
        return (
            f"quantization_config.group_size is {group!r}: surgery edits AWQ weights in groups of a positive "
            "number of input columns only (compressed-tensors refuses the rest); use the unquantized checkpoint"
        )
    if not isinstance(skip, list) or not all(isinstance(m, str) and m for m in skip):
        return (
            f"quantization_config.modules_to_not_convert is {skip!r}, not a list of module names: "
            "correct it in config.json or re-download the checkpoint"
        )
    return None


def scheme(qconfig: Any) -> Scheme | None:
    """The AutoAWQ scheme ``qconfig`` describes, or None when it is not one surgery edits (:func:`refusal`)."""
    if not isinstance(qconfig, Mapping) or qconfig.get("quant_method") != "awq" or refusal(qconfig):
        return None
    group = _field(qconfig, "group_size", "q_group_size", default=128)
    # the weight arguments compressed-tensors' converter writes for these weights
    args = (("group_size", group), ("num_bits", BITS), ("strategy", "group"), ("symmetric", False), ("type", "int"))
    skip = tuple(qconfig.get("modules_to_not_convert") or ())
    return Scheme("pack-quantized", BITS, "group", group, False, args, unconverted=skip)


def _mismatch(name: str, info, want: str, codes) -> CheckpointError:
    return CheckpointError(
        f"tensor '{name}' is {info.dtype} {list(info.shape)} but AWQ codes '{codes.name}' {list(codes.shape)} need "
        f"{want}: the tensors do not fit each other; re-download the checkpoint"
    )


def int_weight(s: Scheme, tensors: Mapping[str, Any], module: str) -> IntWeight:
    """The AWQ weight of ``module`` (its ``.qweight``), its tensors' shapes and dtypes checked against each
    other and the config (one line naming the tensor that does not fit)."""
    codes = tensors[module + ".qweight"]
    if not s.converted(module):
        raise CheckpointError(
            f"tensor '{codes.name}' holds AWQ codes, but compressed-tensors' converter leaves '{module}' in float "
            "(quantization_config.modules_to_not_convert, or lm_head): the config does not describe these "
            "weights; correct modules_to_not_convert or re-download the checkpoint"
        )
    if module + ".weight" in tensors:
        raise CheckpointError(
            f"'{module}' is stored twice, as '{module}.weight' and as AWQ codes '{codes.name}': which one is the "
            "weight is unclear; re-download the checkpoint"
        )
    if codes.dtype != "I32" or len(codes.shape) != 2:
        raise CheckpointError(
            f"tensor '{codes.name}' is {codes.dtype} {list(codes.shape)}; AWQ codes are I32 [in, out/8]: "
            "re-download the checkpoint"
        )
    inp, out = codes.shape[0], codes.shape[1] * PER_WORD
    if inp % s.group_size:
        raise CheckpointError(
            f"AWQ weight '{codes.name}' has {inp} input rows, not a multiple of quantization_config.group_size "
            f"{s.group_size}: the config does not describe these weights; re-download the checkpoint"
        )
    groups = inp // s.group_size
    found = {}
    for suffix, shape, dtypes in (
        ("scales", (groups, out), int_packed.SCALE_DTYPES),
        ("qzeros", (groups, codes.shape[1]), ("I32",)),
    ):
        info = tensors.get(f"{module}.{suffix}")
        if info is None:
            raise CheckpointError(
                f"AWQ weight '{codes.name}' has no '{module}.{suffix}'; the checkpoint is incomplete: re-download it"
            )
        if info.shape != shape or info.dtype not in dtypes:
            raise _mismatch(info.name, info, f"{'/'.join(dtypes)} {list(shape)} (group {s.group_size})", codes)
        found[suffix] = info
    return IntWeight(module + ".weight", (out, inp), codes, found["scales"], found["qzeros"], s.group_size)


def int_weights(s: Scheme, tensors: Mapping[str, Any]) -> dict[str, IntWeight]:
    """Every AWQ weight of a checkpoint, by its plain name X.weight (shapes checked)."""
    modules = sorted(n.removesuffix(".qweight") for n in tensors if n.endswith(".qweight"))
    return {m + ".weight": int_weight(s, tensors, m) for m in modules}


def converter(s: Scheme):
    """compressed-tensors' AutoAWQConverter for ``s`` (imported on demand: the ``quant`` extra)."""
    from ...core.optional import require

    autoawq = require("compressed_tensors.entrypoints.convert.converters.autoawq")
    return autoawq.AutoAWQConverter(bits=BITS, group_size=s.group_size, zero_point=True, version="gemm", ignore=())


def compressed(s: Scheme, qweight: np.ndarray, scales: np.ndarray, qzeros: np.ndarray):
    """One AWQ weight's stored ``qweight``, float32 ``scales`` and ``qzeros`` as compressed-tensors'
    pack-quantized tensors, converted by its AutoAWQConverter: (codes I32 [out, in/8], float32 scales
    [out, groups], zero points I32 [out/8, groups])."""
    import torch

    out = converter(s).process(
        {
            "w.qweight": torch.from_numpy(np.ascontiguousarray(qweight)),
            "w.scales": torch.from_numpy(np.ascontiguousarray(scales, dtype=np.float32)),
            "w.qzeros": torch.from_numpy(np.ascontiguousarray(qzeros)),
        }
    )
    return out["w.weight_packed"].numpy(), out["w.weight_scale"].numpy(), out["w.weight_zero_point"].numpy()


def pack(codes) -> np.ndarray:
    """compressed-tensors' signed int4 codes [out, in] (a torch tensor; out a multiple of 8) → AWQ's
    ``qweight`` words [in, out/8] (or zero points [out, groups] → ``qzeros`` [groups, out/8])."""
    unsigned = (codes.numpy().astype(np.int64) + OFFSET).T  # [in, out], 0..15
    nibbles = unsigned.reshape(unsigned.shape[0], -1, PER_WORD)[:, :, list(ORDER)]
    words = (nibbles << (BITS * np.arange(PER_WORD))).sum(axis=-1)
    return words.astype(np.uint32).view(np.int32)
