"""How ``surgery eval`` measures, as one typed object from the command line to the suites (torch-free:
the CLI builds its options from these fields at start-up, see surgery.core.options)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.options import check_options, param

SUITES = ("retention", "kl", "bbq", "awareness", "markers", "lm-eval")


@dataclass(frozen=True)
class EvalParams:
    """Which suites run, on how many items, and how many sequences go through the model at once.

    The numbers must not change what is measured, only how fast: a batch size below 1 did
    (it reached the slicing of the batches), so each field is bounded here, for Python callers too.
    """

    suites: tuple[str, ...] = param(
        (),
        "Suite to run (repeatable; default: every suite whose inputs are given).",
        flag="--suite",
        multiple=True,
        choices=SUITES,
    )
    limit: int | None = param(
        None,
        "At most N items per data set (default: shipped sets in full, 100 per BBQ file and per N4 split).",
        kind="int",
        minimum=1,
    )
    batch_size: int = param(
        8, "Sequences per forward pass (multiple choice: questions, each with its options).", minimum=1
    )
    max_new_tokens: int = param(32, "Tokens each answer of the markers suite runs to (greedy).", minimum=1)

    def __post_init__(self) -> None:
        check_options(self)
