"""A tiny Qwen2-MoE written as a llama.cpp GGUF: routed experts stacked in 3-D tensors
(``ffn_{gate,up,down}_exps``), a shared expert (``ffn_*_shexp``), the expert FFN tensors in a chosen type.

transformers reads no expert sizes from qwen2moe metadata (its config takes the class defaults:
moe_intermediate_size 1408, shared_expert_intermediate_size 5632), so the file uses those sizes.
A 1408-value row fits no 256-value K block: ``ffn_down_exps`` is stored as ``DOWN_FALLBACK`` then,
as llama.cpp's quantizer falls back for such tensors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from surgery.gguf.blocks import block_type
from tests.support.typed_gguf import TOKENS, add_tokenizer, random_blocks

HIDDEN, EXPERT, SHARED, EXPERTS, LAYERS, HEADS, KV_HEADS = 256, 1408, 5632, 3, 2, 2, 1
DOWN_FALLBACK = "Q8_0"
EDITED = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")


def shapes() -> dict[str, tuple[int, ...]]:
    """Every tensor's numpy shape ([E, out, in] for the stacked experts), by GGUF name without ``.weight``."""
    head_dim = HIDDEN // HEADS
    out = {"token_embd": (len(TOKENS), HIDDEN), "output_norm": (HIDDEN,), "output": (len(TOKENS), HIDDEN)}
    for la in range(LAYERS):
        b = f"blk.{la}."
        out.update(
            {
                b + "attn_norm": (HIDDEN,),
                b + "ffn_norm": (HIDDEN,),
                b + "attn_q": (HEADS * head_dim, HIDDEN),
                b + "attn_k": (KV_HEADS * head_dim, HIDDEN),
                b + "attn_v": (KV_HEADS * head_dim, HIDDEN),
                b + "attn_output": (HIDDEN, HEADS * head_dim),
                b + "ffn_gate_inp": (EXPERTS, HIDDEN),
                b + "ffn_gate_exps": (EXPERTS, EXPERT, HIDDEN),
                b + "ffn_up_exps": (EXPERTS, EXPERT, HIDDEN),
                b + "ffn_down_exps": (EXPERTS, HIDDEN, EXPERT),
                b + "ffn_gate_inp_shexp": (HIDDEN,),
                b + "ffn_gate_shexp": (SHARED, HIDDEN),
                b + "ffn_up_shexp": (SHARED, HIDDEN),
                b + "ffn_down_shexp": (HIDDEN, SHARED),
            }
        )
    return out


def kind_of(base: str, kind: str) -> str:
    """The type tensor ``base`` is stored in when the expert FFN tensors are ``kind``."""
    if base.split(".")[-1] not in EDITED:
        return "F32"
    values, _ = block_type(kind).block_shape
    return kind if shapes()[base][-1] % values == 0 else DOWN_FALLBACK


def write_moe_gguf(path: Path, kind: str, seed: int = 0, extra: dict[str, np.ndarray] | None = None) -> None:
    """A 2-layer qwen2moe GGUF at ``path``: the expert FFN tensors in ``kind``, the rest F32; ``extra``:
    more F32 tensors by name."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "qwen2moe")
    w.add_name("typed test qwen2moe")
    w.add_context_length(128)
    w.add_block_count(LAYERS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(EXPERT)
    w.add_expert_feed_forward_length(EXPERT)
    w.add_expert_shared_feed_forward_length(SHARED)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(2)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    add_tokenizer(w)
    for base, shape in shapes().items():
        t = kind_of(base, kind)
        if len(shape) == 1:
            w.add_tensor(f"{base}.weight", (1 + rng.normal(0, 0.05, shape)).astype(np.float32))
            continue
        rows = int(np.prod(shape[:-1]))
        data = random_blocks(t, rows, shape[-1], rng).reshape(*shape[:-1], -1)
        if t in ("F32", "F16"):
            w.add_tensor(f"{base}.weight", data)
        else:
            w.add_tensor(f"{base}.weight", data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[t])
    for la in range(LAYERS):  # Qwen2's q/k/v biases
        for name, n in (("attn_q", HIDDEN), ("attn_k", HIDDEN // HEADS * KV_HEADS), ("attn_v", HIDDEN // HEADS)):
            w.add_tensor(f"blk.{la}.{name}.bias", rng.normal(0, 0.02, n).astype(np.float32))
    for name, data in (extra or {}).items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
