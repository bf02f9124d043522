"""The data files of ``evaluate``'s optional suites as one object, :class:`EvalData` (the command
line's ``--bbq``, ``--n4``, ``--lm-eval``, ``--lm-eval-include``, ``--prompts``, ``--markers``).

Like the other option objects, its fields may be given flat (``bbq=["bbq.jsonl"]``) or as one
object (``data=EvalData(bbq=("bbq.jsonl",))``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EvalData:
    """What the optional suites read; each suite runs only when its data is given.

    Attributes:
        bbq: BBQ-format JSONL files or folders (the BBQ bias suite).
        n4: an N4-format JSONL file (DiffAware / CtxtAware).
        lm_eval: lm-eval task names (needs lm-eval).
        lm_eval_include: a folder of extra lm-eval task YAML files.
        prompts: prompts of the markers suite: text (one a line) or JSONL.
        markers: the markers suite's markers, one a line.
    """

    bbq: Iterable[str | Path] = ()
    n4: str | Path | None = None
    lm_eval: Iterable[str] = ()
    lm_eval_include: str | Path | None = None
    prompts: str | Path | None = None
    markers: str | Path | None = None
