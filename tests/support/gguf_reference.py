"""The import as transformers alone does it (from_pretrained dequantizing the whole GGUF, then
save_pretrained), and a tensor-for-tensor comparison of two imported folders."""

from __future__ import annotations

import json
from pathlib import Path


def reference_import(gguf: Path, out: Path, dtype: str = "float32") -> Path:
    """``out``: what ``from_pretrained(gguf_file=…, GgufConfig(dequantize=True))`` + ``save_pretrained`` write."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=getattr(torch, dtype),
        device_map=None,
    )
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    return out


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of an imported folder (the index's shards, or the single file)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / n for n in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return [folder / "model.safetensors"]


def raw_tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Every tensor of the folder as (safetensors dtype, shape, raw bytes), by name, whatever the shards."""
    import torch
    from safetensors import safe_open

    out = {}
    for path in weight_files(folder):
        with safe_open(path, "pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                out[name] = (f.get_slice(name).get_dtype(), tuple(t.shape), raw)
    return out


def differences(ours: Path, theirs: Path, files: tuple[str, ...]) -> list[str]:
    """What differs between two imports: tensors (name, dtype, shape, bytes) and the named files."""
    a, b = raw_tensors(ours), raw_tensors(theirs)
    problems = [f"only in ours: {n}" for n in sorted(a.keys() - b.keys())]
    problems += [f"only in theirs: {n}" for n in sorted(b.keys() - a.keys())]
    for name in sorted(a.keys() & b.keys()):
        if a[name][:2] != b[name][:2]:
            problems.append(f"{name}: {a[name][:2]} vs {b[name][:2]}")
        elif a[name][2] != b[name][2]:
            problems.append(f"{name}: different bytes")
    for name in files:
        if (ours / name).read_bytes() != (theirs / name).read_bytes():
            problems.append(f"{name} differs")
    return problems
