"""Tiny AutoAWQ GEMM checkpoints written offline, as AutoAWQ writes them: every decoder linear quantized to
unsigned int4 codes with zero points in groups of input columns (min/max, AutoAWQ's rule), packed by this
module's own packer into ``X.qweight`` [in, out/8] / ``X.qzeros`` [in/group, out/8] (8 codes a word along
the output axis, AWQ's order) next to ``X.scales`` F16 [in/group, out].

The packer is the inverse of compressed-tensors' ``AutoAWQConverter`` (tests/formats/test_awq_bake.py checks
that the converter gives back the codes, zero points and scales packed here), and every value a test
compares is the library's: :func:`dequantized` converts with that converter and decompresses with
compressed-tensors' own pack-quantized compressor."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .int_packed import LINEARS, write_float_copy
from .tiny import build_tiny

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble k of a word holds the word's output column AWQ_ORDER[k]
# Mixtures of experts: the routers stay in float, named in modules_to_not_convert as AWQ releases do
# (substrings of the module names: "mlp.gate" would be "gate" on Mixtral, whose experts are w1 / w2 / w3)
UNCONVERTED = {
    "qwen2_moe": ["mlp.gate", "mlp.shared_expert_gate"],
    "mixtral": ["gate"],
}


def quantize(w: torch.Tensor, group: int, pow2: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(unsigned codes [out, in], zero points [out, in/group], F16 scales [out, in/group]) of ``w``:
    AutoAWQ's asymmetric min/max rule, the codes rounded against the F16 scales that are stored.
    ``pow2``: the scales rounded to powers of two, so that every weight (code − zero) × scale is exact
    in bfloat16 too (vLLM's CPU kernel casts F16 scales to the bfloat16 it computes in)."""
    out, inp = w.shape
    g = w.float().reshape(out, inp // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scales = (hi - lo).clamp(min=1e-5) / 15
    scales = (torch.exp2(torch.round(torch.log2(scales))) if pow2 else scales).to(torch.float16)
    s = scales.float()
    zeros = (-torch.round(lo / s)).clamp(0, 15)
    codes = (torch.round(g / s[..., None]) + zeros[..., None]).clamp(0, 15)
    return codes.reshape(out, inp).to(torch.int32), zeros.to(torch.int32), scales


def pack(values: torch.Tensor) -> torch.Tensor:
    """Unsigned int4 ``values`` [out, n] → AWQ's words [n, out/8]: 8 along the output axis, AWQ's order."""
    t = values.T.to(torch.int64)  # [n, out]
    nibbles = t.reshape(t.shape[0], -1, 8)[:, :, list(AWQ_ORDER)]
    words = sum(nibbles[:, :, k] << (4 * k) for k in range(8))
    return (words & 0xFFFFFFFF).to(torch.uint32).view(torch.int32).contiguous()


def awq_tensors(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor) -> dict[str, torch.Tensor]:
    """The stored tensors (suffixes of X.) of a weight with these codes, zero points and scales."""
    return {"qweight": pack(codes), "qzeros": pack(zeros), "scales": scales.T.contiguous()}


def quantization_config(group: int, unconverted: list[str] | None = None, **fields) -> dict:
    """config.json's quantization_config, as transformers writes AutoAWQ's (``fields`` override)."""
    return {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": unconverted,
        **fields,
    }


def build_awq(
    folder: Path,
    group: int = 8,
    arch: str = "llama",
    unconverted: list[str] | None = None,
    dtype: torch.dtype = torch.float16,
    pow2: bool = False,
    **overrides,
) -> Path:
    """A tiny ``arch`` at ``folder`` (``overrides``: its config's sizes) whose decoder linears are AutoAWQ
    GEMM int4 in groups of ``group``, except the modules ``unconverted`` names (substrings; default: the
    routers of a mixture of experts), left in ``dtype`` and listed in modules_to_not_convert. ``pow2``:
    scales that are powers of two (:func:`quantize`)."""
    unconverted = UNCONVERTED.get(arch) if unconverted is None else unconverted
    build_tiny(arch, folder, dtype, None, **overrides)
    tensors = load_file(folder / "model.safetensors")
    for name in [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in LINEARS]:
        module = name.removesuffix(".weight")
        if any(u in module for u in unconverted or ()):
            continue
        for suffix, value in awq_tensors(*quantize(tensors.pop(name), group, pow2)).items():
            tensors[f"{module}.{suffix}"] = value.contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization_config(group, unconverted)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def converter(folder: Path):
    """compressed-tensors' AutoAWQConverter for the checkpoint at ``folder``, from its config."""
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter

    config = json.loads((folder / "config.json").read_text())
    return AutoAWQConverter.from_autoawq_config(config["quantization_config"])


def converted(folder: Path, module: str) -> dict[str, torch.Tensor]:
    """The compressed-tensors tensors (suffixes) the converter makes of ``module``'s AWQ tensors."""
    tensors = load_file(folder / "model.safetensors")
    mine = {k: v for k, v in tensors.items() if k.rpartition(".")[0] == module}
    return {k.removeprefix(module + "."): v for k, v in converter(folder).process(mine).items()}


def dequantized(folder: Path, name: str) -> torch.Tensor:
    """The float32 values of weight ``name`` (X.weight): an AWQ one converted by compressed-tensors'
    AutoAWQConverter and decompressed by its pack-quantized compressor; a float one as stored."""
    from compressed_tensors.compressors.base import BaseCompressor

    module = name.removesuffix(".weight")
    tensors = load_file(folder / "model.safetensors")
    if name in tensors:
        return tensors[name].float()
    conv = converter(folder)
    scheme = next(iter(conv.update_config(None).config_groups.values()))
    state = converted(folder, module)
    state["weight_scale"] = state["weight_scale"].float()
    return BaseCompressor.get_value_from_registry("pack-quantized").decompress(state, scheme)["weight"].float()


def dense_copy(src: Path, folder: Path) -> Path:
    """``src`` decompressed: every AWQ weight as its float32 values (compressed-tensors'), no
    quantization_config; the reference an edit of ``src`` is compared with."""
    import shutil

    shutil.copytree(src, folder)
    tensors = load_file(src / "model.safetensors")
    dense = {}
    for name, value in tensors.items():
        if name.endswith(".qweight"):
            weight = name.removesuffix("qweight") + "weight"
            dense[weight] = dequantized(src, weight).contiguous()
        elif not name.endswith((".qzeros", ".scales")):
            dense[name] = value.float()
    return write_float_copy(folder, dense)
