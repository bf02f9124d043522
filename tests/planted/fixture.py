"""A shipped planted-binding fixture as the tests load it: stock transformers with the reference
attention function, its training configuration and its task."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.planted.brute import GROUND_TRUTH_SEED, HeadEffect, Prompts, brute_force, eval_pairs
from tests.planted.reference import ATTN_NAME, register
from tests.planted.task import World, make_world
from tests.planted.train import TrainConfig


@dataclass(frozen=True)
class Planted:
    """A loaded fixture: model, tokenizer, the configuration it was trained with, its world."""

    model: Any
    tokenizer: Any
    config: TrainConfig
    world: World

    def pairs(self, seed: int, per_item: int) -> Prompts:
        """``per_item`` seeded match/mismatch pairs for every item."""
        return Prompts.build(self.tokenizer, eval_pairs(self.world, seed, per_item))

    def brute_force(self, per_item: int) -> tuple[float, list[HeadEffect]]:
        """ΔS and every head's effects on the ground-truth pairs, largest edge effect first."""
        return brute_force(self.model, self.tokenizer, self.pairs(GROUND_TRUTH_SEED, per_item))


def load_planted(folder: Path, rebuild: str) -> Planted:
    """Load ``folder``; a missing fixture fails the test with ``rebuild``, the command that makes it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (folder / "model.safetensors").is_file():
        pytest.fail(f"{folder} is missing; rebuild it: {rebuild}")
    torch.set_num_threads(1)  # the model is tiny: on a shared CPU extra threads spin rather than work
    register()
    config = TrainConfig(**json.loads((folder / "training.json").read_text())["config"])
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=ATTN_NAME).eval()
    return Planted(
        model,
        AutoTokenizer.from_pretrained(folder),
        config,
        make_world(config.seed, config.n_items, config.n_neutral, config.n_neutral_items),
    )
