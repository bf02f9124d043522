"""Optional dependencies: which package each feature needs, and the one pip command that brings it.

Every import of a package that a plain ``pip install llm-surgery`` may lack goes through
:func:`require`, so a missing package is one ``Error:`` line naming the package and the extra to
install, never a traceback or an "internal error".
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from .errors import SurgeryError


@dataclass(frozen=True)
class Optional:
    """A package imported on demand: its PyPI name, the extra that installs it, what needs it."""

    distribution: str
    extra: str
    needed_for: str


# Import name → what to tell the user. gguf is a core dependency (import-gguf is the offline way to
# a real model); it stays here because a broken or partial install can still lack it.
OPTIONAL = {
    "gguf": Optional("gguf", "gguf", "import-gguf (reading GGUF files)"),
    "matplotlib": Optional("matplotlib", "plots", "report figures"),
    "lm_eval": Optional("lm-eval", "lmeval", "eval --lm-eval (EleutherAI's lm-evaluation-harness)"),
}


class MissingDependency(SurgeryError):
    """An optional package is not installed."""


def install_hint(module: str) -> str:
    """The one line a user reads when ``module`` is missing."""
    top = module.split(".")[0]
    dep = OPTIONAL.get(top)
    if dep is None:
        return (f"the package '{top}' is missing from this installation; reinstall surgery "
                "(pip install --force-reinstall llm-surgery)")
    return (f"{dep.needed_for} needs the package '{dep.distribution}', which is not installed: "
            f"pip install 'llm-surgery[{dep.extra}]'")


def require(module: str) -> ModuleType:
    """Import ``module`` (e.g. ``"matplotlib"``), or raise :class:`MissingDependency` saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        # Only the package itself being absent is ours to explain; a broken import inside it is not.
        if (exc.name or module).split(".")[0] != module.split(".")[0]:
            raise
        raise MissingDependency(install_hint(module)) from None


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it twice when it can)."""
    try:
        require(module)
    except MissingDependency:
        return False
    return True
