"""Tiny gpt-oss checkpoints with MXFP4 experts, stored as transformers stores gpt-oss (``quant_method: mxfp4``):
each fused expert tensor ``mlp.experts.{gate_up,down}_proj`` [experts, in, out] as ``X_blocks`` U8
[experts, out, in/32, 16] (e2m1 codes, two a byte, the even column in the low nibble) and ``X_scales`` U8
[experts, out, in/32] (E8M0: 2^(s − 127)). The codes and scales are compressed-tensors' MXFP4 quantizer's
(its ``mxfp4-pack-quantized`` compressor writes that nibble order and that E8M0 bias); the decoder the
tests compare with is transformers' (``convert_moe_packed_tensors``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .tiny import build_tiny

FORMAT = "mxfp4-pack-quantized"
EXPERTS = ("gate_up_proj", "down_proj")
# gpt-oss's release config: what stays in bfloat16
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
SIZES = {"intermediate_size": 64}  # every expert matrix's inputs whole blocks of 32 (hidden 32, experts 64)


def _compress(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks [out, in/32, 16], E8M0 scales [out, in/32]) of one expert's matrix ``w`` [out, in], by
    compressed-tensors' MXFP4 observer rule (``calculate_qparams``) and compressor."""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    sch = QuantizationScheme(targets=["Linear"], weights=preset_name_to_scheme("MXFP4A16", ["Linear"]).weights)
    w = w.float()
    groups = w.reshape(w.shape[0], -1, 32)
    scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), sch.weights)
    out = BaseCompressor.get_value_from_registry(FORMAT).compress({"weight": w, "weight_scale": scale}, sch)
    return out["weight_packed"].reshape(w.shape[0], -1, 16), out["weight_scale"].to(torch.uint8)


def build_mxfp4(folder: Path, dtype: torch.dtype = torch.bfloat16, **overrides) -> Path:
    """A tiny gpt-oss at ``folder`` whose experts are MXFP4 as the gpt-oss release stores them."""
    build_tiny("gpt_oss", folder, dtype, None, **{**SIZES, **overrides})
    tensors = load_file(folder / "model.safetensors")
    for name in [n for n in tensors if n.endswith(tuple(f"mlp.experts.{e}" for e in EXPERTS))]:
        fused = tensors.pop(name)  # [experts, in, out]
        parts = [_compress(matrix.T) for matrix in fused]
        tensors[name + "_blocks"] = torch.stack([b for b, _ in parts]).contiguous()
        tensors[name + "_scales"] = torch.stack([s for _, s in parts]).contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def dequantized(folder: Path, name: str) -> torch.Tensor:
    """The float32 values [experts, in, out] of MXFP4 tensor ``name`` (X, without _blocks), by transformers."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    tensors = load_file(folder / "model.safetensors")
    return convert_moe_packed_tensors(tensors[name + "_blocks"], tensors[name + "_scales"], dtype=torch.float32)


def dense_copy(src: Path, folder: Path) -> Path:
    """``src`` with every MXFP4 tensor as its float32 values (transformers'), no quantization_config."""
    import shutil

    from .int_packed import write_float_copy

    shutil.copytree(src, folder)
    dense = {}
    for name, value in load_file(src / "model.safetensors").items():
        if name.endswith("_blocks"):
            dense[name.removesuffix("_blocks")] = dequantized(src, name.removesuffix("_blocks")).contiguous()
        elif not name.endswith("_scales"):
            dense[name] = value.float()
    return write_float_copy(folder, dense)
