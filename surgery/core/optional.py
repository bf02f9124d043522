"""Optional dependencies: which package each feature needs, and the one pip command that brings it.

Every import of a package that an installation without extras may lack goes through
:func:`require`, so a missing package is one ``Error:`` line naming the package and a pip command
that installs it, never a traceback or an "internal error". The command installs surgery again the
way it was installed here (a clone, a git URL, an index), with the extra: the distribution is not on
PyPI, so ``pip install 'llm-surgery[plots]'`` would fail for someone who installed from a clone.
"""

from __future__ import annotations

import importlib
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import unquote, urlparse

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
    "compressed_tensors": Optional(
        "compressed-tensors", "quant", "baking into int4 / int8 checkpoints (compressed-tensors, AutoAWQ)"
    ),
    "optuna": Optional("optuna", "tune", "surgery tune (the Optuna search)"),
}


class MissingDependency(SurgeryError):
    """An optional package is not installed."""


DISTRIBUTION = "llm-surgery"
# The package folder's parent: a clone's root when surgery runs from its source tree.
SOURCE_TREE = Path(__file__).resolve().parents[2]


def pip_command(direct_url: Mapping[str, Any] | None, extra: str | None = None, source_tree: Path | None = None) -> str:
    """The pip command that installs surgery (with ``extra``) from where this copy came from.

    ``direct_url`` is the installed distribution's PEP 610 record (``direct_url.json``: a local
    folder, editable or not, a VCS URL or an archive); None means installed from an index, or, with
    ``source_tree``, not installed at all but imported from a clone.
    """
    suffix = f"[{extra}]" if extra else ""
    if direct_url is None:
        if source_tree is not None:
            return f"pip install -e {shlex.quote(f'{source_tree}{suffix}')}"
        return f"pip install {shlex.quote(DISTRIBUTION + suffix)}"
    url = str(direct_url.get("url", ""))
    if "dir_info" in direct_url and url.startswith("file:"):
        editable = "-e " if direct_url["dir_info"].get("editable") else ""
        return f"pip install {editable}{shlex.quote(unquote(urlparse(url).path) + suffix)}"
    vcs = direct_url.get("vcs_info")
    if vcs:
        url = f"{vcs.get('vcs', 'git')}+{url}@{vcs.get('commit_id') or vcs.get('requested_revision')}"
    return f"pip install {shlex.quote(f'{DISTRIBUTION}{suffix} @ {url}')}"


def _direct_url() -> tuple[Mapping[str, Any] | None, bool]:
    """(this installation's direct_url.json or None, whether surgery is installed at all).

    Every copy of the metadata is asked: run from a clone, the source tree's own
    ``llm_surgery.egg-info`` (left by the editable build) comes first on ``sys.path`` and carries
    no pip record, while the installed ``.dist-info`` does.
    """
    import importlib.metadata  # only where an install hint is printed: start-up stays short

    found = list(importlib.metadata.distributions(name=DISTRIBUTION))
    text = next((t for d in found if (t := d.read_text("direct_url.json"))), None)
    try:
        # pip's own record, read with plain json: yaml (strict_files) may be the missing package
        return (json.loads(text) if text else None), bool(found)
    except ValueError:  # a damaged record: the index form is the best guess left
        return None, True


def pip_install(extra: str | None = None) -> str:
    """The pip command that installs this surgery again, with ``extra``, however it was installed."""
    direct, installed = _direct_url()
    tree = SOURCE_TREE if not installed and (SOURCE_TREE / "pyproject.toml").is_file() else None
    return pip_command(direct, extra, tree)


def install_hint(module: str) -> str:
    """The one line a user reads when ``module`` is missing."""
    top = module.split(".")[0]
    dep = OPTIONAL.get(top)
    if dep is None:
        return (
            f"the package '{top}' is missing from this installation; install surgery's "
            f"dependencies again: {pip_install()}"
        )
    return f"{dep.needed_for} needs the package '{dep.distribution}', which is not installed: {pip_install(dep.extra)}"


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
