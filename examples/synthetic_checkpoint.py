#!/usr/bin/env python3
"""Write a random checkpoint with the exact shapes of a real model (default Llama-3.1-8B), offline.

    python examples/synthetic_checkpoint.py OUT [--shape llama-3.1-8b] [--layers 4] [--shard-gb 5] [--seed 0]

Random bf16 weights (std 0.02; norms around 1; windows of a pool of 16M normal draws at random
offsets), safetensors shards written tensor by tensor (building a 16 GB checkpoint needs ~0.3 GB), the model's config, and a
character-level tokenizer (the real tokenizer needs the Hub; any ids below the vocabulary size
exercise the same shapes). ``--layers`` keeps the per-layer shapes and cuts the depth: 4 layers of
Llama-3.1-8B are 3.9 GB, all 32 are 16 GB. A folder already holding the same build is reused.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import string
import sys
import time
from pathlib import Path

import numpy as np

# The published configs' shapes (hidden, MLP width, heads, KV heads, head_dim, vocab, depth).
SHAPES = {
    "llama-3.1-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        num_hidden_layers=32,
        rope_theta=500000.0,
        max_position_embeddings=131072,
    ),
}
POOL = 16 << 20  # random values drawn once, written in windows at random offsets
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def layer_tensors(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, f, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    return [
        ("input_layernorm.weight", (h,)),
        ("self_attn.q_proj.weight", (q, h)),
        ("self_attn.k_proj.weight", (kv, h)),
        ("self_attn.v_proj.weight", (kv, h)),
        ("self_attn.o_proj.weight", (h, q)),
        ("post_attention_layernorm.weight", (h,)),
        ("mlp.gate_proj.weight", (f, h)),
        ("mlp.up_proj.weight", (f, h)),
        ("mlp.down_proj.weight", (h, f)),
    ]


def all_tensors(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], cfg["hidden_size"]))]
    for i in range(cfg["num_hidden_layers"]):
        out += [(f"model.layers.{i}.{name}", shape) for name, shape in layer_tensors(cfg)]
    return out + [
        ("model.norm.weight", (cfg["hidden_size"],)),
        ("lm_head.weight", (cfg["vocab_size"], cfg["hidden_size"])),
    ]


def config_for(shape: str, layers: int | None) -> dict:
    cfg = dict(SHAPES[shape])
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **cfg,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "dtype": "bfloat16",
    }


def _bf16_pool(rng: np.random.Generator, shift: float) -> bytes:
    """POOL normal values (std 0.02, plus ``shift``) as bf16 bytes, rounded to nearest even as torch does."""
    values = rng.standard_normal(POOL, dtype=np.float32) * np.float32(0.02) + np.float32(shift)
    bits = values.view(np.uint32)
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).astype(np.uint16).tobytes() * 2  # doubled: any POOL-long window is one slice


def _write_values(f, numel: int, pool: bytes, rng: np.random.Generator) -> None:
    """``numel`` bf16 values: windows of the pool at random offsets (drawing 8 billion normals would
    take longer than writing them; the shapes and value statistics are what the checks need)."""
    for start in range(0, numel, POOL):
        n = min(POOL, numel - start)
        offset = int(rng.integers(POOL))
        f.write(pool[2 * offset : 2 * (offset + n)])


def write_shard(path: Path, tensors: list[tuple[str, tuple[int, ...]]], rng: np.random.Generator) -> int:
    """One safetensors file written tensor by tensor; returns its data bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        size = math.prod(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    weights, norms = _bf16_pool(rng, 0.0), _bf16_pool(rng, 1.0)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for name, shape in tensors:
            _write_values(f, math.prod(shape), norms if name.endswith("norm.weight") else weights, rng)
    return offset


def save_tokenizer(folder: Path) -> None:
    """One token per printable character (ids 0–3 are pad, bos, eos, unk), no network needed."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(folder)


def build(
    folder: Path,
    shape: str = "llama-3.1-8b",
    layers: int | None = None,
    shard_gb: float = 5.0,
    seed: int = 0,
    log=lambda msg: None,
) -> Path:
    """The checkpoint at ``folder`` (built unless the same build is already there)."""
    config = config_for(shape, layers)
    stamp = {"shape": shape, "seed": seed, "shard_gb": shard_gb, "generator": "pool-windows", "config": config}
    if (folder / "synthetic.json").is_file() and json.loads((folder / "synthetic.json").read_text()) == stamp:
        return folder
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shards, current, size = [], [], 0
    for name, dims in all_tensors(config):
        nbytes = math.prod(dims) * 2
        if current and size + nbytes > shard_gb * 1e9:
            shards.append(current)
            current, size = [], 0
        current.append((name, dims))
        size += nbytes
    shards.append(current)
    rng = np.random.default_rng(seed)
    weight_map, total = {}, 0
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        started = time.perf_counter()
        total += write_shard(tmp / fname, tensors, rng)
        weight_map.update({name: fname for name, _ in tensors})
        log(f"wrote {fname} ({total / 1e9:.1f} GB so far, {time.perf_counter() - started:.0f} s)")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    save_tokenizer(tmp)
    (tmp / "synthetic.json").write_text(json.dumps(stamp, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)  # a half-built folder never looks finished
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    ap.add_argument("--layers", type=int, default=None, help="depth (default: the real model's)")
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    started = time.perf_counter()
    build(args.out, args.shape, args.layers, args.shard_gb, args.seed, log=lambda m: print(m, file=sys.stderr))
    size = sum(p.stat().st_size for p in args.out.glob("*.safetensors"))
    print(
        f"{args.out}: {args.shape} shapes, {config_for(args.shape, args.layers)['num_hidden_layers']} layers, "
        f"{size / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
