"""What the planted tasks share: invented words, the tiny Llama, and next-token logits."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import torch


def nonsense_words(rng: random.Random, syllables: Sequence[str], n: int, taken: set[str]) -> list[str]:
    """``n`` new two-syllable nonsense words, none in ``taken`` (they are added to it)."""
    out: list[str] = []
    while len(out) < n:
        word = rng.choice(syllables) + rng.choice(syllables)
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


def tiny_llama(
    tokenizer, *, hidden: int, intermediate: int, layers: int, heads: int, head_dim: int, max_positions: int
):
    """A freshly initialised LlamaForCausalLM over ``tokenizer``'s vocabulary (no tied embeddings)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)


def last_logits(model, tokenizer, texts: Sequence[str]) -> torch.Tensor:
    """Next-token logits after each text. Right padding: causal attention never sees the pads."""
    enc = tokenizer(list(texts), padding=True, padding_side="right", return_tensors="pt")
    logits = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask).logits
    last = enc.attention_mask.sum(1) - 1
    return logits[torch.arange(len(texts)), last]


def add_config_options(parser, config_class) -> None:
    """One ``--option`` per field of the dataclass ``config_class``, typed and defaulted from it."""
    from dataclasses import fields

    defaults = config_class()
    for f in fields(config_class):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}", type=type(getattr(defaults, f.name)), default=getattr(defaults, f.name)
        )


def config_from(args, config_class):
    """The ``config_class`` instance that ``add_config_options``' parsed ``args`` describe."""
    from dataclasses import fields

    return config_class(**{f.name: getattr(args, f.name) for f in fields(config_class)})


def same_float_path(rebuilt: float, shipped: float) -> bool:
    """Whether a retraining followed the fixture's floating-point path, judged by a headline number
    of its ground truth. Training is bit-reproducible on one kind of CPU only: another CPU's BLAS
    kernels sum in another order, and a thousand optimizer steps turn the last bit into another
    solution of the same task (seen: the shipped fixtures retrain to other units on an AMD EPYC
    with OpenBLAS's Haswell kernels). Then the retraining checks assert what the task fixes, not
    which units carry it."""
    return abs(rebuilt - shipped) <= 1e-6 * max(abs(shipped), 1e-12)


def retrain(script: str, fixture_dir: Path, config_class: type, out: Path, timeout: float) -> tuple[dict, dict]:
    """Run ``examples/<script>`` with the options recorded in the fixture's training.json into
    ``out`` (one thread); check it records the same config; return (shipped, rebuilt) ground truths."""
    import json
    import os
    import subprocess
    import sys
    from dataclasses import asdict

    from tests.support.paths import REPO

    recorded, defaults = json.loads((fixture_dir / "training.json").read_text())["config"], asdict(config_class())
    options = [a for k, v in recorded.items() if v != defaults[k] for a in (f"--{k.replace('_', '-')}", str(v))]
    res = subprocess.run(
        [sys.executable, str(REPO / "examples" / script), "--out", str(out), *options],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert res.returncode == 0, res.stderr
    # Fixtures trained before an option existed do not record it: it had its default then.
    assert json.loads((out / "training.json").read_text())["config"] == {**defaults, **recorded}
    shipped, rebuilt = (json.loads((d / "ground_truth.json").read_text()) for d in (fixture_dir, out))
    return shipped, rebuilt
