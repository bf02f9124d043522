"""Tiny FP8 (e4m3) checkpoints written offline: a tiny Llama's linear weights quantized the way
DeepSeek / Qwen FP8 releases (block scales) and llm-compressor (per-tensor, per-channel) store them;
a tiny mixture of experts (Qwen2-MoE, with a shared expert) the same way."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .tiny import build_tiny

# DeepSeek's multi-head latent attention linears too, as its FP8 release quantizes them
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LINEARS += ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
E4M3_MAX = 448.0
# What FP8 MoE releases leave unquantized besides lm_head: the routers (Qwen3-30B-A3B-FP8's, Qwen2-MoE's).
IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$"]


def _scales(w: torch.Tensor, layout: str, block: tuple[int, int]) -> torch.Tensor:
    """The float32 scales of ``w`` in ``layout``: largest |w| of each group over 448."""
    if layout == "per-tensor":
        return (w.abs().max() / E4M3_MAX).reshape(1)
    if layout == "per-channel":
        return w.abs().amax(dim=1, keepdim=True) / E4M3_MAX
    out, inp = w.shape
    nb0, nb1 = math.ceil(out / block[0]), math.ceil(inp / block[1])
    padded = torch.zeros(nb0 * block[0], nb1 * block[1])
    padded[:out, :inp] = w.abs()
    return padded.reshape(nb0, block[0], nb1, block[1]).amax(dim=(1, 3)) / E4M3_MAX


def _expanded(scale: torch.Tensor, shape: torch.Size, layout: str, block: tuple[int, int]) -> torch.Tensor:
    """Each element's scale."""
    if layout == "block":
        return scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[: shape[0], : shape[1]]
    return scale.expand(shape) if layout == "per-channel" else scale.reshape(1, 1).expand(shape)


def quantization_config(layout: str, block: tuple[int, int]) -> dict:
    """config.json's quantization_config of ``layout`` ("block", "per-tensor" or "per-channel")."""
    if layout == "block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block)}
    strategy = {"per-tensor": "tensor", "per-channel": "channel"}[layout]
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "ignore": IGNORE,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False},
            }
        },
    }


# What DeepSeek-V3's FP8 release stores in float32 besides the scales (transformers keeps it float32).
RELEASE_F32 = ("e_score_correction_bias",)


def build_fp8(
    folder: Path,
    layout: str,
    block: tuple[int, int] = (8, 8),
    arch: str = "llama",
    rest: torch.dtype = torch.float32,
    **overrides,
) -> Path:
    """A tiny ``arch`` checkpoint at ``folder`` whose decoder linears are e4m3 with ``layout`` scales
    (``overrides``: config fields of the tiny model). A mixture of experts is written one tensor per
    expert, as FP8 releases are: every expert's and the shared expert's linears quantized, the
    routers (``mlp.gate``, ``mlp.shared_expert_gate``) left in float as releases leave them. ``rest``:
    the dtype of every other tensor but the scales (releases: bfloat16, but for :data:`RELEASE_F32`)."""
    build_tiny(arch, folder, torch.float32, None, **overrides)
    tensors = load_file(folder / "model.safetensors")
    suffix = "weight_scale_inv" if layout == "block" else "weight_scale"
    quantized = [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in LINEARS]
    for name, t in tensors.items():
        if name not in quantized and not name.endswith(RELEASE_F32):
            tensors[name] = t.to(rest)
    for name in quantized:
        w = tensors[name]
        scale = _scales(w, layout, block).float()
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        tensors[name] = (
            (w / _expanded(scale, w.shape, layout, block)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        )
        tensors[name.removesuffix("weight") + suffix] = scale
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization_config(layout, block)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def dequantized(folder: Path, name: str, layout: str, block: tuple[int, int] = (8, 8)) -> torch.Tensor:
    """The float32 values of FP8 weight ``name`` (e4m3 × its scales), computed with torch."""
    tensors = load_file(folder / "model.safetensors")
    suffix = "weight_scale_inv" if layout == "block" else "weight_scale"
    w = tensors[name]
    scale = tensors[name.removesuffix("weight") + suffix]
    return w.float() * _expanded(scale, w.shape, layout, block)


def dequantized_copy(src: Path, out: Path, layout: str, block: tuple[int, int] = (8, 8)) -> Path:
    """The FP8 checkpoint ``src`` as a plain float32 one at ``out``: every e4m3 weight dequantized with
    torch (:func:`dequantized`), its scale dropped, no quantization_config; other files as they are."""
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = load_file(src / "model.safetensors")
    plain = {
        name: dequantized(src, name, layout, block) if t.dtype == torch.float8_e4m3fn else t
        for name, t in tensors.items()
        if not name.endswith(("weight_scale_inv", "weight_scale"))
    }
    save_file(plain, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    del config["quantization_config"]
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out
