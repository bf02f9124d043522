"""A sweep folder (``--alpha 2,3`` → ``OUT/alpha-2``, ``OUT/alpha-3``): one baked folder per value.

In core, so that every command given the sweep itself (``eval OUT``, ``card OUT``, …) names it as one
and points to a value's folder, instead of "has no config.json".
"""

from __future__ import annotations

from pathlib import Path

# bake.provenance.PROVENANCE_NAME: the record each baked folder holds (core imports no bake module)
RECORD_NAME = "surgery.json"


def sweep_values(path: Path) -> list[str]:
    """The value folders of a sweep (``alpha-2``, ``n-40``, …): subfolders holding a bake's record."""
    path = Path(path)
    return sorted(p.name for p in path.iterdir() if (p / RECORD_NAME).is_file()) if path.is_dir() else []


def is_a_sweep(path: Path, values: list[str]) -> str:
    """The one line that says ``path`` is a sweep of ``values`` and names one to give instead."""
    shown = ", ".join(values[:4]) + (f" and {len(values) - 4} more" if len(values) > 4 else "")
    return f"{path} is a sweep made by surgery, one baked folder per value ({shown}); give one of them, e.g. {Path(path) / values[0]}"
