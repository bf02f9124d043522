#!/usr/bin/env python3
"""Write a random checkpoint with the exact shapes of a real model (default Llama-3.1-8B), offline.

    python examples/synthetic_checkpoint.py OUT [--shape llama-3.1-8b|gpt-oss-20b] [--layers 4] [--shard-gb 5] [--seed 0]

Random weights, safetensors shards written tensor by tensor (building a 16 GB checkpoint needs ~0.3 GB),
the model's config, and a character-level tokenizer (the real tokenizer needs the Hub; any ids below the
vocabulary size exercise the same shapes). bf16 tensors: std 0.02, norms around 1 (windows of a pool of
16M normal draws at random offsets). ``gpt-oss-20b`` stores its experts as the release does, in MXFP4
(``quant_method: mxfp4``): ``*_blocks`` U8 [experts, out, in/32, 16] of random e2m1 codes and ``*_scales``
U8 [experts, out, in/32] of E8M0 scales drawn from 119..125 (2^-8..2^-2: weights of at most 1.5, as
trained ones are small), attention, router, embeddings and biases in bf16. ``--layers`` keeps the
per-layer shapes and cuts the depth: 4 layers of Llama-3.1-8B are 3.9 GB, all 32 are 16 GB; gpt-oss-20b
is 2.3 GB of embeddings plus 0.48 GB a layer (12 layers 8.1 GB, all 24 13.8 GB in 3 shards of ≤ 5 GB, as
the release). A folder already holding the same build is reused.
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

# The published configs' facts (hidden, MLP width, heads, KV heads, head_dim, vocab, depth; gpt-oss-20b's
# experts and attention window: its config.json, whose other fields are transformers' GptOssConfig's defaults).
SHAPES = {
    "llama-3.1-8b": dict(
        model_type="llama",
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
    "gpt-oss-20b": dict(
        model_type="gpt_oss",
        hidden_size=2880,
        intermediate_size=2880,
        num_local_experts=32,
        num_experts_per_tok=4,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=201088,
        num_hidden_layers=24,
        sliding_window=128,
        max_position_embeddings=131072,
    ),
}
# gpt-oss's release: the modules its MXFP4 quantization_config leaves in bf16 (tests/support/mxfp4.py's)
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
MX_BLOCK = 32  # inputs per E8M0 scale
MX_SCALES = (119, 126)  # E8M0 scales drawn from 119..125: 2^-8..2^-2
POOL = 16 << 20  # random values drawn once, written in windows at random offsets
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
Tensor = tuple[str, tuple[int, ...], str]  # name, shape, safetensors dtype


def _llama_layer(cfg: dict) -> list[Tensor]:
    h, f, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    return [
        ("input_layernorm.weight", (h,), "BF16"),
        ("self_attn.q_proj.weight", (q, h), "BF16"),
        ("self_attn.k_proj.weight", (kv, h), "BF16"),
        ("self_attn.v_proj.weight", (kv, h), "BF16"),
        ("self_attn.o_proj.weight", (h, q), "BF16"),
        ("post_attention_layernorm.weight", (h,), "BF16"),
        ("mlp.gate_proj.weight", (f, h), "BF16"),
        ("mlp.up_proj.weight", (f, h), "BF16"),
        ("mlp.down_proj.weight", (h, f), "BF16"),
    ]


def _gpt_oss_layer(cfg: dict) -> list[Tensor]:
    """gpt-oss's tensors as transformers stores them: fused experts [experts, in, out] in MXFP4."""
    h, f, d, e = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"], cfg["num_local_experts"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    out = [("input_layernorm.weight", (h,), "BF16")]
    for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv), ("o_proj", h)):
        out += [(f"self_attn.{name}.weight", (rows, q if name == "o_proj" else h), "BF16")]
        out += [(f"self_attn.{name}.bias", (rows,), "BF16")]
    out += [
        ("self_attn.sinks", (cfg["num_attention_heads"],), "BF16"),
        ("post_attention_layernorm.weight", (h,), "BF16"),
        ("mlp.router.weight", (e, h), "BF16"),
        ("mlp.router.bias", (e,), "BF16"),
    ]
    for name, inp, rows in (("gate_up_proj", h, 2 * f), ("down_proj", f, h)):
        out += [
            (f"mlp.experts.{name}_blocks", (e, rows, inp // MX_BLOCK, MX_BLOCK // 2), "U8"),
            (f"mlp.experts.{name}_scales", (e, rows, inp // MX_BLOCK), "U8"),
            (f"mlp.experts.{name}_bias", (e, rows), "BF16"),
        ]
    return out


def all_tensors(cfg: dict) -> list[Tensor]:
    layer = _gpt_oss_layer(cfg) if cfg["model_type"] == "gpt_oss" else _llama_layer(cfg)
    embed = (cfg["vocab_size"], cfg["hidden_size"])
    out = [("model.embed_tokens.weight", embed, "BF16")]
    for i in range(cfg["num_hidden_layers"]):
        out += [(f"model.layers.{i}.{name}", shape, dtype) for name, shape, dtype in layer]
    return out + [("model.norm.weight", (cfg["hidden_size"],), "BF16"), ("lm_head.weight", embed, "BF16")]


def config_for(shape: str, layers: int | None, sizes: dict | None = None) -> dict:
    """The config.json of ``shape`` at depth ``layers`` (``sizes``: other facts replaced, for a small copy)."""
    cfg = {**SHAPES[shape], **(sizes or {})}
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    if cfg["model_type"] == "gpt_oss":
        from transformers import GptOssConfig

        del cfg["model_type"]
        cfg["layer_types"] = [
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(cfg["num_hidden_layers"])
        ]
        ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        config = GptOssConfig(**cfg, **ids, tie_word_embeddings=False, dtype="bfloat16").to_dict()
        config.pop("transformers_version", None)  # the stamp compares configs: the same build under any version
        return {
            **config,
            "architectures": ["GptOssForCausalLM"],
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED},
        }
    return {
        "architectures": ["LlamaForCausalLM"],
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


def _u8_pool(rng: np.random.Generator, low: int, high: int) -> bytes:
    """POOL bytes uniform in low..high − 1 (doubled, as :func:`_bf16_pool`)."""
    return rng.integers(low, high, POOL, dtype=np.uint8).tobytes() * 2


def _write_values(f, nbytes: int, pool: bytes, item: int, rng: np.random.Generator) -> None:
    """``nbytes`` bytes of ``item``-byte values: windows of the pool at random offsets (drawing 8 billion
    normals would take longer than writing them; the shapes and value statistics are what the checks need)."""
    for start in range(0, nbytes, POOL * item):
        n = min(POOL * item, nbytes - start)
        offset = int(rng.integers(POOL)) * item
        f.write(pool[offset : offset + n])


ITEMSIZE = {"BF16": 2, "U8": 1}


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * ITEMSIZE[dtype]


def write_shard(path: Path, tensors: list[Tensor], rng: np.random.Generator) -> int:
    """One safetensors file written tensor by tensor; returns its data bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, dtype in tensors:
        size = _nbytes(shape, dtype)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    pools = {"weights": _bf16_pool(rng, 0.0), "norms": _bf16_pool(rng, 1.0)}
    if any(dtype == "U8" for _, _, dtype in tensors):  # every byte two random e2m1 codes; E8M0 scales
        pools |= {"_blocks": _u8_pool(rng, 0, 256), "_scales": _u8_pool(rng, *MX_SCALES)}
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for name, shape, dtype in tensors:
            kind = next((k for k in ("_blocks", "_scales") if name.endswith(k)), None) if dtype == "U8" else None
            kind = kind or ("norms" if name.endswith("norm.weight") else "weights")
            _write_values(f, _nbytes(shape, dtype), pools[kind], ITEMSIZE[dtype], rng)
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
    sizes: dict | None = None,
) -> Path:
    """The checkpoint at ``folder`` (built unless the same build is already there); ``sizes`` replaces some
    of the shape's facts (e.g. a narrow gpt-oss-20b for a test)."""
    config = config_for(shape, layers, sizes)
    stamp = {"shape": shape, "seed": seed, "shard_gb": shard_gb, "generator": "pool-windows", "config": config}
    stamp = json.loads(json.dumps(stamp))  # as it reads back (the config's tuples are lists there)
    if (folder / "synthetic.json").is_file() and json.loads((folder / "synthetic.json").read_text()) == stamp:
        return folder
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shards, current, size = [], [], 0
    for tensor in all_tensors(config):
        nbytes = _nbytes(*tensor[1:])
        if current and size + nbytes > shard_gb * 1e9:
            shards.append(current)
            current, size = [], 0
        current.append(tensor)
        size += nbytes
    shards.append(current)
    rng = np.random.default_rng(seed)
    weight_map, total = {}, 0
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        started = time.perf_counter()
        total += write_shard(tmp / fname, tensors, rng)
        weight_map.update({name: fname for name, _, _ in tensors})
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
