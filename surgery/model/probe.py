"""Can transformers build and run this checkpoint's model? Asked before work that needs the answer.

A config.json can describe its weights (every shape checks out, so inspect and the torch-free bake
accept it) and still name what transformers cannot build (an activation or a RoPE type it does not
know) or cannot run. Such a failure inside transformers is the checkpoint's, not surgery's: it is
said in one line naming what failed, not as an internal error, and before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import CheckpointError

if TYPE_CHECKING:
    from .loading import LoadSpec


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def check_buildable(path: str | Path, trust_remote_code: bool = False) -> None:
    """Build the model from ``path``'s config.json on the meta device (no weight read, no memory):
    a config transformers cannot build a model from is one :class:`CheckpointError`."""
    import torch
    from transformers import AutoConfig

    from .loading import auto_class

    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        with torch.device("meta"):  # as the loader builds it (its auto class picks the wrapped configs' class)
            auto_class(config.model_type).from_config(config, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers' own code on the checkpoint's config: its failure is the config's
        raise CheckpointError(
            f"transformers cannot build a model from {Path(path) / 'config.json'} ({_first_line(exc)}): "
            "correct that field of the config or re-download the checkpoint"
        ) from exc


def load_or_refuse(path: str | Path, load: LoadSpec):
    """:func:`~surgery.model.loading.load_model` of ``path`` under ``load``. A failure that
    transformers alone repeats (:func:`check_buildable`) is the config's: one :class:`CheckpointError`;
    any other is raised as it is."""
    from .loading import load_model

    try:
        return load_model(path, load)
    except Exception:
        check_buildable(path, load.trust_remote_code)
        raise


def check_runs(model, ids, path: str | Path) -> None:
    """One forward pass of the loaded, unedited ``model`` on ``ids``: a model that cannot run is one
    :class:`CheckpointError`."""
    import torch

    from .placement import input_device

    try:
        with torch.inference_mode():
            model(input_ids=ids.to(input_device(model)))
    except Exception as exc:  # the unedited model on in-range ids: transformers' forward on this config
        raise CheckpointError(
            f"the model in {path} cannot run a forward pass ({_first_line(exc)}): its config.json does not "
            "describe a model transformers can run; correct it or re-download the checkpoint"
        ) from exc
