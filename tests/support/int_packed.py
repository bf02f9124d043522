"""Tiny int4 / int8 compressed-tensors checkpoints written offline with compressed-tensors' own
compressors, as llm-compressor writes W4A16 (pack-quantized, group scales) and W8A16 (channel), also
as its GPTQ writes them with activation ordering (``actorder``).

compressed-tensors 0.20 removed actorder "group" (``X.weight_g_idx``: each input column's scale group,
codes in column order); up to 0.18 it quantized and decoded such a weight by sorting its columns by
group, working on contiguous groups and sorting back. These builders do that sort around 0.20's own
compressor and decompressor."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .tiny import build_tiny

# DeepSeek's multi-head latent attention linears too: the config targets every Linear but the ignored ones
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LINEARS += ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
LINEARS += ("w1", "w2", "w3")  # Mixtral's experts (gate, down, up)
# What W4A16 MoE releases leave unquantized besides lm_head (Qwen3-30B-A3B's, Qwen2-MoE's, Mixtral's):
# the routers. Without them in ``ignore`` transformers expects a packed shared_expert_gate (an nn.Linear).
IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$", "re:.*block_sparse_moe.gate$"]
# name → (format, num_bits, strategy, group_size, symmetric)
SCHEMES = {
    "w4a16-g4": ("pack-quantized", 4, "group", 4, True),  # a head of 8 is two groups
    "w4a16-g8": ("pack-quantized", 4, "group", 8, True),
    "w4a16-g16": ("pack-quantized", 4, "group", 16, True),
    "w4a16-g32": ("pack-quantized", 4, "group", 32, True),  # vLLM's CPU kernel: groups of 32 at least
    "w4a16-g64": ("pack-quantized", 4, "group", 64, True),  # examples/bench_upcast.py: 128 does not divide 960
    "w4a16-g8-asym": ("pack-quantized", 4, "group", 8, False),
    "w4a16-g4-asym": ("pack-quantized", 4, "group", 4, False),
    "int8-g8": ("int-quantized", 8, "group", 8, True),
    "w8a16-channel": ("pack-quantized", 8, "channel", None, True),
    "int8-channel": ("int-quantized", 8, "channel", None, True),
    "w4a16-tensor": ("pack-quantized", 4, "tensor", None, True),
}


def _scheme(name: str, actorder: str | None = None):
    """(format, QuantizationScheme) of ``name``; ``actorder`` "weight" is in the arguments, "group" is not
    (compressed-tensors 0.20 refuses it: the config gets it written in by ``quantization_config``)."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    fmt, bits, strategy, group, symmetric = SCHEMES[name]
    order = {"actorder": actorder} if actorder == "weight" else {}
    args = QuantizationArgs(
        num_bits=bits, type="int", strategy=strategy, group_size=group, symmetric=symmetric, **order
    )
    return fmt, QuantizationScheme(targets=["Linear"], weights=args)


def g_idx(n_cols: int, group: int, seed: int, within: int | None = None) -> torch.Tensor:
    """GPTQ's actorder-group assignment of ``n_cols`` columns: the contiguous groups of ``group`` in a
    seeded random (activation) order, over the whole row or ``within`` blocks of columns (a head's)."""
    gen = torch.Generator().manual_seed(seed)
    block = within or n_cols
    perm = torch.cat([b + torch.randperm(block, generator=gen) for b in range(0, n_cols, block)])
    return (torch.arange(n_cols) // group)[perm].to(torch.int32)


def _columns(state: dict, fmt: str, bits: int, order: torch.Tensor) -> dict:
    """``state`` with its codes' columns taken in ``order`` (unpacked and packed again by compressed-tensors)."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    if fmt == "int-quantized":
        return {**state, "weight": state["weight"][:, order].contiguous()}
    shape = torch.Size(state["weight_shape"].tolist())
    codes = unpack_from_int32(state["weight_packed"], bits, shape)[:, order]
    return {**state, "weight_packed": pack_to_int32(codes.contiguous(), bits)}


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


def _compress(w: torch.Tensor, fmt: str, sch, dtype: torch.dtype, groups: torch.Tensor | None) -> dict:
    """The stored tensors of weight ``w`` (X.weight's suffixes), compressed by compressed-tensors; ``groups``:
    each column's group (actorder group), quantized as compressed-tensors did: columns sorted by group."""
    order = None if groups is None else torch.argsort(groups, stable=True)
    grouped = w if order is None else w[:, order]
    scale, zero = _qparams(grouped, sch.weights)
    state = {"weight": grouped, "weight_scale": scale.to(dtype)}
    if not sch.weights.symmetric:
        state["weight_zero_point"] = zero
    out = compressor(fmt).compress(state, sch)
    if order is None:
        return out
    return {**_columns(out, fmt, sch.weights.num_bits, torch.argsort(order)), "weight_g_idx": groups}


def build_int(
    folder: Path,
    scheme: str,
    dtype: torch.dtype = torch.bfloat16,
    arch: str = "llama",
    actorder: str | None = None,
    within: int | None = None,
    **overrides,
) -> Path:
    """A tiny ``arch`` at ``folder`` (``overrides``: its config's sizes) whose decoder linears are compressed
    by compressed-tensors in ``scheme``. A mixture of experts is written one tensor per expert, as W4A16
    releases are: every expert's and the shared expert's linears compressed, the routers (``mlp.gate``,
    ``mlp.shared_expert_gate``, Mixtral's ``block_sparse_moe.gate``) left in float. ``actorder``: as GPTQ
    writes it; "group" stores each weight's ``g_idx`` (seeded, over the row or ``within`` blocks)."""
    build_tiny(arch, folder, dtype, None, **overrides)
    return compress_folder(folder, scheme, dtype, actorder, within)


def compress_folder(
    folder: Path, scheme: str, dtype: torch.dtype, actorder: str | None = None, within: int | None = None
) -> Path:
    """The one-file checkpoint at ``folder`` with its decoder linears compressed in ``scheme`` (scales in
    ``dtype``), in place: :func:`build_int`'s work on a model it did not build."""
    fmt, sch = _scheme(scheme, actorder)
    tensors = load_file(folder / "model.safetensors")
    group = sch.weights.group_size if actorder == "group" else None
    names = [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in LINEARS]
    for seed, name in enumerate(names):
        w = tensors.pop(name)
        groups = None if group is None else g_idx(w.shape[1], group, seed, within)
        for key, value in _compress(w, fmt, sch, dtype, groups).items():
            tensors[name.removesuffix("weight") + key] = value.contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization_config(fmt, sch, actorder)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def quantization_config(fmt: str, sch, actorder: str | None = None) -> dict:
    """config.json's quantization_config, as compressed-tensors' QuantizationConfig writes it (``actorder``
    "group" written in as compressed-tensors up to 0.18 wrote it)."""
    from compressed_tensors.quantization import QuantizationConfig

    cfg = QuantizationConfig(
        config_groups={"group_0": sch}, format=fmt, quantization_status="compressed", ignore=IGNORE
    )
    out = json.loads(cfg.model_dump_json(exclude_none=True))
    if actorder == "group":
        out["config_groups"]["group_0"]["weights"]["actorder"] = "group"
    return out


def dequantized(folder: Path, name: str, scheme: str) -> torch.Tensor:
    """The float32 values of integer weight ``name`` (X.weight), decompressed by compressed-tensors (a
    ``weight_g_idx``: its columns sorted by group around the decompression, as compressed-tensors did)."""
    fmt, sch = _scheme(scheme)
    tensors = load_file(folder / "model.safetensors")
    prefix = name.removesuffix("weight")
    state = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix + "weight")}
    state["weight_scale"] = state["weight_scale"].float()
    groups = state.pop("weight_g_idx", None)
    if groups is None:
        return compressor(fmt).decompress(state, sch)["weight"].float()
    order = torch.argsort(groups, stable=True)
    grouped = compressor(fmt).decompress(_columns(state, fmt, sch.weights.num_bits, order), sch)["weight"]
    return grouped[:, torch.argsort(order)].float()


def dense_copy(src: Path, folder: Path, scheme: str) -> Path:
    """``src`` decompressed: every integer weight as its float32 values (compressed-tensors'), no
    quantization_config; the reference an edit of ``src`` is compared with."""
    import shutil

    shutil.copytree(src, folder)
    tensors = load_file(src / "model.safetensors")
    dense = {}
    for name, value in tensors.items():
        if name.endswith(".weight_packed") or (name.endswith(".weight") and value.dtype == torch.int8):
            weight = name.removesuffix("_packed")  # packed codes, or int-quantized I8 codes under the weight's name
            dense[weight] = dequantized(src, weight, scheme).contiguous()
        elif not name.endswith((".weight_scale", ".weight_shape", ".weight_zero_point", ".weight_g_idx")):
            dense[name] = value.float()
    return write_float_copy(folder, dense)


def write_float_copy(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """Overwrite the checkpoint copied to ``folder`` with its float32 ``tensors`` and a config without
    quantization_config: a quantized checkpoint's decompressed copy."""
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    config["dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def decoded_pair(folder: Path, layout: str, **overrides) -> tuple[Path, Path]:
    """(integer checkpoint at ``folder``/int, its copy decompressed by compressed-tensors at ``folder``/dense)
    of ``layout``: a scheme of :data:`SCHEMES`, optionally "+actorder-group", or "awq" (``overrides``: the
    config's sizes, ``arch``)."""
    from . import awq

    if layout == "awq":
        src = awq.build_awq(folder / "int", **overrides)
        return src, awq.dense_copy(src, folder / "dense")
    scheme, _, actorder = layout.partition("+actorder-")
    src = build_int(folder / "int", scheme, actorder=actorder or None, **overrides)
    return src, dense_copy(src, folder / "dense", scheme)
