#!/usr/bin/env python3
"""A 4-bit float GGUF made from a real one, for the llama.cpp checks of MXFP4 and NVFP4 bakes.

    python examples/fp4_gguf.py SOURCE.gguf OUT.gguf [--type MXFP4|NVFP4] [--llama-python PYTHON]

The decoder's attention and MLP matrices (``blk.N.attn_{q,k,v,output}``, ``blk.N.ffn_{gate,up,down}``)
are decoded by gguf-py and encoded again in the 4-bit float type; every other tensor (embeddings,
norms) and every metadata field is copied as it is. MXFP4 (GGUF type 39: 32 e2m1 codes and one E8M0
exponent a block) is encoded by gguf-py's quantizer, the reference port of ggml's; NVFP4 (type 40: 64
e2m1 codes and four unsigned e4m3 scales a block, one per 16 values), which gguf-py only decodes, by
ggml's own ``ggml_quantize_chunk``, called in the environment of llama-cpp-python (``--llama-python``,
or SURGERY_LLAMACPP_PYTHON; this file's ``ggml-quantize`` role). Nobody ships a dense 4-bit float
model small enough for a CPU test (gpt-oss keeps only its experts in MXFP4), so this makes one from a
file that is: the bake and llama.cpp read it as they would any such tensor. The output is written to
a temporary file beside OUT and renamed, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
# The decoder matrices a head or neuron edit reaches (llama.cpp's tensor names).
EDITED = re.compile(r"blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down))\.weight")
TYPES = ("MXFP4", "NVFP4")
BY_GGML = ("NVFP4",)  # encoded by ggml, not gguf-py (which only decodes it)


def fp4_gguf(source: Path, out: Path, qtype: str = "MXFP4", llama_python: str | None = None) -> Path:
    """Write ``out``: ``source`` with its decoder matrices in ``qtype``; returns ``out``. NVFP4 needs
    ``llama_python`` (the python of an environment with llama-cpp-python) for ggml's quantizer."""
    import gguf

    if qtype not in TYPES:
        raise ValueError(f"--type must be one of {', '.join(TYPES)}, not {qtype}")
    target = gguf.GGMLQuantizationType[qtype]
    reader = gguf.GGUFReader(source)
    edited = [t for t in reader.tensors if EDITED.fullmatch(t.name)]
    values = {t.name: gguf.quants.dequantize(np.asarray(t.data), t.tensor_type) for t in edited}
    if qtype in BY_GGML:
        encoded = _ggml_quantized(values, target.value, llama_python)  # gguf-py's numbers are ggml's
    else:
        encoded = {name: gguf.quants.quantize(v, target) for name, v in values.items()}
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    tmp = out.with_name(f".{out.name}.partial")
    writer = gguf.GGUFWriter(tmp, arch, endianess=reader.endianess)
    try:
        for field in reader.fields.values():
            # GGUFWriter writes the architecture and the GGUF.* header fields itself.
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
        for tensor in reader.tensors:
            data, kind = tensor.data, tensor.tensor_type
            if tensor.name in encoded:
                data, kind = encoded[tensor.name], target
            writer.add_tensor(tensor.name, np.asarray(data), raw_dtype=kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _ggml_quantized(values: dict[str, np.ndarray], ggml_type: int, llama_python: str | None) -> dict[str, np.ndarray]:
    """``values`` (float32 matrices by name) encoded as ``ggml_type`` by ggml, in llama-cpp-python's
    environment (this file's ``ggml-quantize`` role): the blocks, uint8 [rows, bytes a row]."""
    python = llama_python or os.environ.get("SURGERY_LLAMACPP_PYTHON")
    if not python:
        raise ValueError("NVFP4 is encoded by ggml: name llama-cpp-python's python with --llama-python")
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "values.npz", Path(tmp) / "blocks.npz"
        np.savez(src, **values)
        cmd = [python, str(HERE), "ggml-quantize", str(src), str(dst), "--ggml-type", str(ggml_type)]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"ggml's quantizer failed: {proc.stderr[-2000:]}")
        with np.load(dst) as blocks:
            return {name: blocks[name] for name in values}


def ggml_quantize_main(src: Path, dst: Path, ggml_type: int) -> None:
    """The ``ggml-quantize`` role (run with llama-cpp-python's python): every matrix of the .npz ``src``
    encoded by ``ggml_quantize_chunk`` into the .npz ``dst``."""
    import ctypes

    import llama_cpp

    ggml = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    ggml.ggml_row_size.restype = ctypes.c_size_t
    ggml.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    ggml.ggml_quantize_chunk.restype = ctypes.c_size_t
    ggml.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    ggml.ggml_quantize_chunk.argtypes += [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    out = {}
    with np.load(src) as values:
        for name in values.files:
            matrix = np.ascontiguousarray(values[name], dtype=np.float32)
            rows, cols = matrix.shape
            blocks = np.zeros((rows, ggml.ggml_row_size(ggml_type, cols)), np.uint8)
            written = ggml.ggml_quantize_chunk(ggml_type, matrix.ctypes.data, blocks.ctypes.data, 0, rows, cols, None)
            if written != blocks.size:
                raise RuntimeError(f"{name}: ggml wrote {written} bytes, expected {blocks.size}")
            out[name] = blocks
    np.savez(dst, **out)


def main() -> None:
    if sys.argv[1:2] == ["ggml-quantize"]:
        role = argparse.ArgumentParser(description="ggml's quantizer (llama-cpp-python's environment)")
        role.add_argument("role")
        role.add_argument("src", type=Path)
        role.add_argument("dst", type=Path)
        role.add_argument("--ggml-type", type=int, required=True)
        args = role.parse_args()
        ggml_quantize_main(args.src, args.dst, args.ggml_type)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--type", default="MXFP4", choices=TYPES)
    parser.add_argument("--llama-python", help="llama-cpp-python's python (NVFP4; default SURGERY_LLAMACPP_PYTHON)")
    args = parser.parse_args()
    if not args.source.is_file():
        sys.exit(f"error: {args.source} is not a file")
    if args.out.exists():
        sys.exit(f"error: {args.out} exists; choose another path")
    try:
        fp4_gguf(args.source, args.out, args.type, args.llama_python)
    except (ValueError, RuntimeError) as e:
        sys.exit(f"error: {e}")
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.0f} MB)")


if __name__ == "__main__":
    main()
