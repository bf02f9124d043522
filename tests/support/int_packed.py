"""Tiny int4 / int8 compressed-tensors checkpoints written offline with compressed-tensors' own
compressors, as llm-compressor writes W4A16 (pack-quantized, group scales) and W8A16 (channel)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .tiny import build_tiny

# DeepSeek's multi-head latent attention linears too: the config targets every Linear but the ignored ones
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LINEARS += ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
# What W4A16 MoE releases leave unquantized besides lm_head (Qwen3-30B-A3B's, Qwen2-MoE's): the
# routers. Without them in ``ignore`` transformers expects a packed shared_expert_gate (an nn.Linear).
IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$"]
# name → (format, num_bits, strategy, group_size, symmetric)
SCHEMES = {
    "w4a16-g8": ("pack-quantized", 4, "group", 8, True),
    "w4a16-g16": ("pack-quantized", 4, "group", 16, True),
    "w4a16-g32": ("pack-quantized", 4, "group", 32, True),  # vLLM's CPU kernel: groups of 32 at least
    "w4a16-g8-asym": ("pack-quantized", 4, "group", 8, False),
    "w8a16-channel": ("pack-quantized", 8, "channel", None, True),
    "int8-channel": ("int-quantized", 8, "channel", None, True),
    "w4a16-tensor": ("pack-quantized", 4, "tensor", None, True),
}


def _scheme(name: str):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    fmt, bits, strategy, group, symmetric = SCHEMES[name]
    args = QuantizationArgs(num_bits=bits, type="int", strategy=strategy, group_size=group, symmetric=symmetric)
    return fmt, QuantizationScheme(targets=["Linear"], weights=args)


def _qparams(w: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and zero points of ``w`` by compressed-tensors' min/max rule, per group, row or tensor."""
    from compressed_tensors.quantization.utils import calculate_qparams

    if args.strategy == "group":
        g = w.reshape(w.shape[0], -1, args.group_size)
        lo, hi = g.amin(-1), g.amax(-1)
    elif args.strategy == "channel":
        lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    else:
        lo, hi = w.min().reshape(1), w.max().reshape(1)
    return calculate_qparams(lo, hi, args)


def compressor(fmt: str):
    from compressed_tensors.compressors.base import BaseCompressor

    return BaseCompressor.get_value_from_registry(fmt)


def build_int(folder: Path, scheme: str, dtype: torch.dtype = torch.bfloat16, arch: str = "llama", **overrides) -> Path:
    """A tiny ``arch`` at ``folder`` (``overrides``: its config's sizes) whose decoder linears are compressed
    by compressed-tensors in ``scheme``. A mixture of experts is written one tensor per expert, as W4A16
    releases are: every expert's and the shared expert's linears compressed, the routers (``mlp.gate``,
    ``mlp.shared_expert_gate``) left in float."""
    fmt, sch = _scheme(scheme)
    build_tiny(arch, folder, dtype, None, **overrides)
    tensors = load_file(folder / "model.safetensors")
    for name in [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in LINEARS]:
        w = tensors.pop(name)
        scale, zero = _qparams(w, sch.weights)
        state = {"weight": w, "weight_scale": scale.to(dtype)}
        if not sch.weights.symmetric:
            state["weight_zero_point"] = zero
        for key, value in compressor(fmt).compress(state, sch).items():
            tensors[name.removesuffix("weight") + key] = value.contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization_config(fmt, sch)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def quantization_config(fmt: str, sch) -> dict:
    """config.json's quantization_config, as compressed-tensors' QuantizationConfig writes it."""
    from compressed_tensors.quantization import QuantizationConfig

    cfg = QuantizationConfig(
        config_groups={"group_0": sch}, format=fmt, quantization_status="compressed", ignore=IGNORE
    )
    return json.loads(cfg.model_dump_json(exclude_none=True))


def dequantized(folder: Path, name: str, scheme: str) -> torch.Tensor:
    """The float32 values of integer weight ``name`` (X.weight), decompressed by compressed-tensors."""
    fmt, sch = _scheme(scheme)
    tensors = load_file(folder / "model.safetensors")
    prefix = name.removesuffix("weight")
    state = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix + "weight")}
    state["weight_scale"] = state["weight_scale"].float()
    return compressor(fmt).decompress(state, sch)["weight"].float()


def dense_copy(src: Path, folder: Path, scheme: str) -> Path:
    """``src`` decompressed: every integer weight as its float32 values (compressed-tensors'), no
    quantization_config; the reference an edit of ``src`` is compared with."""
    import shutil

    shutil.copytree(src, folder)
    tensors = load_file(src / "model.safetensors")
    dense = {}
    for name, value in tensors.items():
        if name.endswith(".weight_packed"):
            weight = name.removesuffix("_packed")
            dense[weight] = dequantized(src, weight, scheme).contiguous()
        elif not name.endswith((".weight_scale", ".weight_shape", ".weight_zero_point")):
            dense[name] = value.float()
    save_file(dense, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    config["dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder
