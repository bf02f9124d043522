"""Comma-separated option values (``--alpha 1.5,2,2.5``, ``--heads 7.7,8.17``): their items, with
an empty item and a repeated one refused in one line.

``2,,3`` or ``2,3,`` is a typo (a value left out), and a head or neuron named twice is a mistake
(the edit is made once, so the list is not what the user meant): both are said, not skipped.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from .errors import ParameterError, SurgeryError


def comma_items(spec: str, option: str, example: str, error: type[SurgeryError] = ParameterError) -> list[str]:
    """The stripped items of ``spec``; an empty one raises ``error`` naming ``{option}`` (a
    placeholder: ``--alpha`` on the command line), the item's place and ``example``. A ``spec`` of
    nothing but blanks and commas gives [] (the caller says that the option is empty)."""
    items = [item.strip() for item in str(spec).split(",")]
    if not any(items):
        return []
    if "" in items:
        at = items.index("") + 1
        raise error(
            f"{{{option}}} '{spec.strip()}': item {at} of {len(items)} is empty (two commas in a row, or one "
            f"at an end); give a list like {example}",
            option,
        )
    return items


def no_repeats(labels: Iterable[Hashable], option: str, what: str, error: type[SurgeryError] = ParameterError) -> None:
    """Raise ``error`` when ``{option}`` names one ``what`` (a head, a neuron) twice, naming it."""
    seen: set[Hashable] = set()
    for label in labels:
        if label in seen:
            raise error(f"{{{option}}} names {what} {label} twice; give each {what} once", option)
        seen.add(label)
