"""A shipped planted-bias fixture (dense or mixture of experts) as its proofs load it: the folder,
the configuration it was trained with, and the model and tokenizer as stock transformers loads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

Config = TypeVar("Config")


def shipped_fixture(folder: Path, script: str) -> Path:
    """``folder``; a missing fixture fails the test with the command that makes it (``examples/<script>``)."""
    if not (folder / "model.safetensors").is_file():
        pytest.fail(f"{folder} is missing; rebuild it: python examples/{script} --out {folder}")
    return folder


def trained_config(folder: Path, config_class: type[Config]) -> Config:
    """The configuration recorded in the fixture's training.json."""
    return config_class(**json.loads((folder / "training.json").read_text())["config"])


def load_stock(folder: Path) -> tuple[Any, Any]:
    """(model, tokenizer) as stock transformers loads them, on one thread (the model is tiny)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
