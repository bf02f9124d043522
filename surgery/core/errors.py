"""Errors that the CLI turns into one line: ``Error: <what is wrong>; <what to do>``."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable


class SurgeryError(Exception):
    """Base class: its message is shown to the user as is, so it says what to do.

    A message may name parameters as ``{name}`` placeholders, listed after it (switches, on/off
    parameters, in ``switches``): Python callers read the keyword (``alpha``; a switch ``force=True``),
    the command line its flag (``--alpha``, ``--force``; see :meth:`spelled`). Only the listed names
    are placeholders: a path with braces in the message stays as it is.
    """

    names: tuple[str, ...] = ()
    switches: frozenset[str] = frozenset()

    def __init__(self, message: str = "", *names: str, switches: Iterable[str] = ()) -> None:
        self.switches = frozenset(switches)
        self.template, self.names = message, (*names, *sorted(self.switches))
        super().__init__(self.spelled(self.keyword) if self.names else message)

    def keyword(self, name: str) -> str:
        """A parameter as a Python caller writes it: ``alpha``, or ``force=True`` for a switch."""
        return f"{name}=True" if name in self.switches else name

    def spelled(self, spell: Callable[[str], str]) -> str:
        """The message with every named parameter written by ``spell(name)`` (the command line: its flag)."""
        template = getattr(self, "template", None)  # None: a subclass that does not call __init__
        if not self.names or template is None:
            return str(self)
        return re.sub(r"\{(\w+)\}", lambda m: spell(m[1]) if m[1] in self.names else m[0], template)


class CheckpointError(SurgeryError):
    """The checkpoint on disk cannot be read, is unsafe, or is not what we need."""


class UnsupportedArchitecture(SurgeryError):
    """The model_type has no row in the architecture table."""


class OptionError(SurgeryError):
    """A parameter (a command-line option) is outside its bounds or not one of its choices."""


class RecipeError(SurgeryError):
    """A recipe or an edit does not fit the model it is applied to."""


class FindingsError(SurgeryError):
    """A findings file is malformed or belongs to another model."""


class DestinationError(SurgeryError):
    """The output location is unsafe or already taken."""


class VerificationError(SurgeryError):
    """A baked checkpoint does not match its source and recipe."""


class EvaluationError(SurgeryError):
    """An evaluation result is used for a model it did not measure."""


class ParameterError(SurgeryError):
    """A parameter's value is wrong; the message names it as a ``{name}`` placeholder (see
    :class:`SurgeryError`): ``{n}`` reads ``n`` in Python and ``--n`` on the command line."""


def not_a_file(path: object) -> str:
    """Why a path given for an input file is not one: ``is a folder`` or ``does not exist`` (a folder is
    there, so "does not exist" would send the user looking for a typo)."""
    from pathlib import Path

    return "is a folder" if Path(str(path)).is_dir() else "does not exist"


def require_model_path(model: object, name: str = "model") -> None:
    """``model`` names a checkpoint (a path or a Hub id), or a ParameterError naming the parameter
    ``name`` says what it is instead: a loaded model or a recipe in its place would fail deep in path
    handling, naming neither."""
    import os

    if isinstance(model, (str, os.PathLike)):
        return
    hint = (
        ": surgery reads and writes the checkpoint's files, not a loaded model; save it with "
        "save_pretrained(DIR) and give DIR"
        if hasattr(model, "save_pretrained")
        else ""
    )
    raise ParameterError(
        f"{{{name}}} must be a checkpoint folder (a str or pathlib.Path) or a Hub id, got {what_was_given(model)}"
        + hint,
        name,
    )


def what_was_given(value: object) -> str:
    """``value`` named by its type in an error (a loaded model's repr is its whole module tree)."""
    return "None" if value is None else f"an object of type {type(value).__name__}"
