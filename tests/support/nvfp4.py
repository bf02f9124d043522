"""Tiny NVFP4 compressed-tensors checkpoints (``nvfp4-pack-quantized``) written offline with
compressed-tensors' own NVFP4 compressor, as llm-compressor writes its NVFP4A16 preset: every decoder
linear's e2m1 codes two to a byte, an e4m3 scale per 16 input columns and a float32 global scale."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .int_packed import IGNORE, LINEARS, write_float_copy
from .tiny import build_tiny

FORMAT = "nvfp4-pack-quantized"


def scheme():
    """compressed-tensors' NVFP4A16 preset scheme, on every Linear."""
    from compressed_tensors.quantization import QuantizationScheme, preset_name_to_scheme

    return QuantizationScheme(targets=["Linear"], weights=preset_name_to_scheme("NVFP4A16", ["Linear"]).weights)


def compressor():
    from compressed_tensors.compressors.base import BaseCompressor

    return BaseCompressor.get_value_from_registry(FORMAT)


def _compress(w: torch.Tensor, sch) -> dict:
    """The stored tensors of weight ``w`` (X.weight's suffixes), with llm-compressor's min/max observer's
    global and group scales (compressed-tensors' ``generate_gparam`` and ``calculate_qparams``)."""
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    w = w.float()
    g = generate_gparam(w.min(), w.max())
    groups = w.reshape(w.shape[0], -1, sch.weights.group_size)
    scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), sch.weights, global_scale=g)
    state = {"weight": w, "weight_scale": scale, "weight_global_scale": g}
    return compressor().compress(state, sch)


def build_nvfp4(folder: Path, arch: str = "llama", dtype: torch.dtype = torch.bfloat16, **overrides) -> Path:
    """A tiny ``arch`` at ``folder`` (``overrides``: its config's sizes) whose decoder linears (experts one
    tensor each, the routers left in float) are compressed by compressed-tensors to NVFP4."""
    from compressed_tensors.quantization import QuantizationConfig

    build_tiny(arch, folder, dtype, None, **overrides)
    sch = scheme()
    tensors = load_file(folder / "model.safetensors")
    names = [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in LINEARS]
    for name in names:
        for key, value in _compress(tensors.pop(name), sch).items():
            tensors[name.removesuffix("weight") + key] = value.contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    cfg = QuantizationConfig(
        config_groups={"group_0": sch}, format=FORMAT, quantization_status="compressed", ignore=IGNORE
    )
    config["quantization_config"] = json.loads(cfg.model_dump_json(exclude_none=True))
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def dequantized(folder: Path, name: str) -> torch.Tensor:
    """The float32 values of NVFP4 weight ``name`` (X.weight), decompressed by compressed-tensors."""
    tensors = load_file(folder / "model.safetensors")
    prefix = name.removesuffix("weight")
    state = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix + "weight")}
    packed = state.pop("weight_packed")
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

    codes = unpack_fp4_from_uint8(packed, packed.shape[0], packed.shape[1] * 2, dtype=torch.float32)
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    return dequantize(
        codes,
        state["weight_scale"].float(),
        args=scheme().weights,
        global_scale=state["weight_global_scale"],
        dtype=torch.float32,
    )


def dense_copy(src: Path, folder: Path) -> Path:
    """``src`` decompressed (every NVFP4 weight as its float32 values, no quantization_config)."""
    import shutil

    shutil.copytree(src, folder)
    dense = {}
    for name, value in load_file(src / "model.safetensors").items():
        if name.endswith(".weight_packed"):
            dense[name.removesuffix("_packed")] = dequantized(src, name.removesuffix("_packed")).contiguous()
        elif not name.endswith((".weight_scale", ".weight_global_scale")):
            dense[name] = value.float()
    return write_float_copy(folder, dense)
