"""What a bake tells its caller while it runs: :class:`Callbacks`, one object for the progress bars,
the notes and the hooks that ``prune_neurons``, ``amplify_heads`` and ``ablate_direction`` share.

The flat keywords these functions took before (``report=print`` …) still work for one release:
they build the same object, with a DeprecationWarning that says what to write instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.progress import Progress, StageProgress, silent, silent_stages
from ._common import grouped

if TYPE_CHECKING:
    from .baked import Baked, Planned


@dataclass(frozen=True)
class Callbacks:
    """Who hears what while a bake runs; every part may be left out.

    Attributes:
        progress: the progress bar of a finder that runs first (findings computed on a cache miss).
        stages: the progress of the bake's stages (load, edit, verify, write).
        report: one-line notes (default: the ``surgery`` logger).
        on_plans: sees every plan (recipe and its record) before the first bake.
        on_each: called with ``(label, baked)`` once each output is written.
    """

    progress: Progress = silent
    stages: StageProgress = silent_stages
    report: Callable[[str], None] | None = None
    on_plans: Callable[[list[Planned]], None] | None = None
    on_each: Callable[[str | None, Baked], None] | None = None


def callback_options(function: str, given: Callbacks | None, options: dict[str, Any]) -> Callbacks:
    """``given`` (default: ``Callbacks()``), or one built from the flat keywords of an older call
    (``report=print`` …), taken out of ``options`` with a DeprecationWarning saying what to write."""
    # stacklevel 5: the caller of the API function, past this function and its names_bake_options wrapper
    return grouped(function, Callbacks, "callbacks", given, options, values=False, stacklevel=5)
