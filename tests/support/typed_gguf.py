"""Tiny llama GGUFs whose edited tensors (attn_output, ffn_gate/up/down) are stored in a chosen type.

Every row is a multiple of 256 values, so each block type fits. Blocks are random bytes (any byte
pattern is a valid block of these types) with finite, moderate f16 scale fields, so α·scale stays a
normal f16: the exactness the bake claims is then the dequantizer's arithmetic, not luck.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from surgery.gguf.blocks import block_type, supported
from surgery.gguf.blocks.floats import FloatValues
from surgery.gguf.blocks.mxfp4 import MXFP4
from surgery.gguf.blocks.nvfp4 import GROUPS, NVFP4

HIDDEN, FFN, LAYERS, KV_HEADS = 256, 512, 2, 1
TOKENS = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(29)]
EDITED = ("attn_output", "ffn_gate", "ffn_up", "ffn_down")


def add_tokenizer(w) -> None:
    """The tiny vocabulary (unknown, two controls, normal tokens) as llama tokenizer metadata of writer ``w``."""
    w.add_vocab_size(len(TOKENS))
    w.add_tokenizer_model("llama")
    w.add_token_list(TOKENS)
    w.add_token_scores([0.0] * len(TOKENS))
    w.add_token_types([2, 3, 3] + [1] * (len(TOKENS) - 3))


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw data of a (rows, cols) tensor of ``kind``: float values, or random blocks with sane scales."""
    import gguf

    stored = block_type(kind) if kind in supported() else None  # a type surgery refuses: random bytes
    if isinstance(stored, FloatValues):
        data = rng.normal(0, 0.05, (rows, cols)).astype(np.float32)
        if kind == "F32":
            return data
        if kind == "F16":
            return data.astype(np.float16)
        return gguf.quants.quantize(data, gguf.GGMLQuantizationType.BF16)
    values, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    raw = rng.integers(0, 256, (rows, cols // values, nbytes), dtype=np.uint8)
    for at in getattr(stored, "scale_fields", ()):
        scale = (rng.uniform(0.01, 0.1, raw.shape[:2]) * rng.choice([-1, 1], raw.shape[:2])).astype(np.float16)
        raw[:, :, at : at + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    if isinstance(stored, MXFP4):  # E8M0 exponents near 2^-6: moderate values, room to shift either way
        raw[:, :, stored.exponent] = rng.integers(118, 124, raw.shape[:2])
    if isinstance(stored, NVFP4):  # normal e4m3 group scales near 2^-4: room to halve or double exactly
        exponent, mantissa = rng.integers(2, 5, (*raw.shape[:2], GROUPS)), rng.integers(0, 8, (*raw.shape[:2], GROUPS))
        raw[:, :, :GROUPS] = (exponent << 3 | mantissa).astype(np.uint8)
    return raw.reshape(rows, -1)


def write_typed_gguf(
    path: Path,
    kind: str,
    *,
    heads: int = 2,
    head_dim: int = 256,
    arch: str = "llama",
    seed: int = 0,
    types: dict[str, str] | None = None,
) -> None:
    """A 2-layer llama GGUF at ``path``: the ``EDITED`` tensors in ``kind`` (``types`` overrides per
    GGUF tensor name), everything else F32."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("typed test llama")
    w.add_context_length(128)
    w.add_block_count(LAYERS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(heads)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    add_tokenizer(w)
    shapes = {"token_embd": (len(TOKENS), HIDDEN), "output_norm": (HIDDEN,), "output": (len(TOKENS), HIDDEN)}
    for layer in range(LAYERS):
        shapes.update(
            {
                f"blk.{layer}.attn_norm": (HIDDEN,),
                f"blk.{layer}.ffn_norm": (HIDDEN,),
                f"blk.{layer}.attn_q": (heads * head_dim, HIDDEN),
                f"blk.{layer}.attn_k": (KV_HEADS * head_dim, HIDDEN),
                f"blk.{layer}.attn_v": (KV_HEADS * head_dim, HIDDEN),
                f"blk.{layer}.attn_output": (HIDDEN, heads * head_dim),
                f"blk.{layer}.ffn_gate": (FFN, HIDDEN),
                f"blk.{layer}.ffn_up": (FFN, HIDDEN),
                f"blk.{layer}.ffn_down": (HIDDEN, FFN),
            }
        )
    for base, shape in shapes.items():
        name = f"{base}.weight"
        t = (types or {}).get(name) or (kind if base.split(".")[-1] in EDITED else "F32")
        if len(shape) == 1:
            w.add_tensor(name, np.ones(shape, np.float32))
            continue
        data = random_blocks(t, *shape, rng)
        if t in ("F32", "F16"):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tensor_values(path, name):
    """The dequantized (rows, cols) values of tensor ``name`` of the GGUF at ``path``."""
    from surgery.gguf.header import tensor_bytes
    from surgery.gguf.model import open_gguf

    t = open_gguf(path).header.tensors[name]
    with open(path, "rb") as f:
        f.seek(t.offset)
        raw = np.frombuffer(f.read(tensor_bytes(t)), dtype=np.uint8)
    rows = t.shape[0]
    return block_type(t.type).dequantize(raw.reshape(rows, -1)).reshape(t.shape)
