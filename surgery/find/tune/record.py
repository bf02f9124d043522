"""A tune as a typed, versioned record (``tune.json`` in the study folder): every trial, the front,
the chosen point and its held-out confirmation, with the model, the splits, the seed and the study.

A bake of the chosen point records :meth:`TuneRecord.summary` in its surgery.json; ``surgery report``
reads the file back to draw the front.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ...core import finite_json
from ...core.errors import FindingsError, not_a_file
from ...core.json_record import Codec, JsonRecord, entry, listof, part
from ...core.staging import atomic_write_text
from ...core.strict_files import load_json
from ..findings import ModelIdentity

FORMAT = "surgery-tune"
TUNE_VERSION = 1
FILE = "tune.json"

# A measured number the data gave no value (a CI without interval, an effect over no prompts) is NaN
# in the code and null in the file (surgery.core.finite_json): read back as NaN, as a record written
# before (NaN in the file) reads, so what computes on it (the CI's caveat, the front) does as before.
MEASURED = Codec(lambda raw, at: math.nan if raw is None else raw, lambda value: value)


@dataclass(kw_only=True)
class Trial(JsonRecord):
    """One trial: the parameters drawn, the edit they make, its objectives on the tune split."""

    number: int
    params: dict[str, Any]
    # higher is better (heads: ΔS gain in S units; neurons: pair bias removed, nats)
    effect: float = entry(codec=MEASURED)
    kl: float = entry(codec=MEASURED)  # first-token KL on the neutral tune prompts, mean (nats)
    delta_s: float | None = None
    heads: list[list[int]] | None = None
    neurons: list[str] | None = None  # neurons' labels (L:N, L:eE:N), best first
    seconds: float | None = None  # wall time of the trial's measurement (both prompt sets)


@dataclass(kw_only=True)
class SplitSizes(JsonRecord):
    """How the prompts were split: binding pairs by item, fairness pairs and neutral prompts one by
    one (``*_items``: the items, or the fairness pairs' ids, on each side)."""

    seed: int
    test_share: float
    tune_items: list[str]
    test_items: list[str]
    tune_pairs: int
    test_pairs: int
    tune_neutral: int
    test_neutral: int


@dataclass(kw_only=True)
class HeldOutConfirmation(JsonRecord):
    """The chosen point re-measured on the test split, never seen by the search: 95% bootstrap CIs
    (items for the effect, prompts for the KL)."""

    effect: float = entry(codec=MEASURED)
    effect_ci95: list[float] = entry(codec=listof(MEASURED))
    kl: float = entry(codec=MEASURED)
    kl_ci95: list[float] = entry(codec=listof(MEASURED))
    delta_s_base: float | None = None
    delta_s: float | None = None
    p_base: float | None = None
    p: float | None = None
    bias_base: float | None = None  # neurons: the test pairs' mean bias (JS divergence) unedited
    bias: float | None = None  # … and under the chosen edit
    amplified: float | None = None  # neurons: the share of test pairs whose bias the edit raised
    rate_base: float | None = None  # direction: the test prompts' marker rate unedited
    rate: float | None = None  # … and under the chosen edit
    items: int | None = None  # test items (heads), pairs (neurons) or behaviour prompts (direction)
    neutral: int | None = None


@dataclass(kw_only=True)
class Chosen(JsonRecord):
    """The point chosen from the front and the rule that chose it (``max_kl`` or ``knee``)."""

    number: int
    rule: str
    max_kl: float | None = None


@dataclass(kw_only=True)
class TuneRecord(JsonRecord):
    """The whole tune; ``study`` names the Optuna storage it resumes from."""

    format: str = FORMAT
    version: int = TUNE_VERSION
    method: str
    tool_version: str | None = None
    model: ModelIdentity = entry(codec=part(ModelIdentity))
    parameters: dict[str, Any]
    prompts: dict[str, Any] | None = None
    study: dict[str, Any]
    objectives: dict[str, str]
    baseline: dict[str, Any] | None = None
    split: SplitSizes = entry(codec=part(SplitSizes))
    trials: list[Trial] = entry(codec=listof(part(Trial)))
    front: list[int]
    chosen: Chosen = entry(codec=part(Chosen))
    confirmation: HeldOutConfirmation = entry(codec=part(HeldOutConfirmation))

    LABEL: ClassVar[str] = "tune record"
    ERROR: ClassVar[type] = FindingsError
    FIX: ClassVar[str] = "run surgery tune again"

    def trial(self, number: int) -> Trial:
        """The trial numbered ``number``."""
        return next(t for t in self.trials if t.number == number)

    def summary(self) -> dict[str, Any]:
        """What a bake of the chosen point records: the study, seed, splits, chosen point and its confirmation."""
        chosen = self.trial(self.chosen.number)
        return {
            "method": self.method,
            "study": self.study,
            "seed": self.split.seed,
            "trials": len(self.trials),
            "split": {k: v for k, v in self.split.to_dict().items() if not k.endswith("_items")},
            "chosen": {**self.chosen.to_dict(), "params": chosen.params, "effect": chosen.effect, "kl": chosen.kl},
            "confirmation": self.confirmation.to_dict(),
        }


def save_record(record: TuneRecord, path: Path) -> None:
    """Write the record atomically; a missing number as ``null`` (strict JSON parsers refuse ``NaN``)."""
    atomic_write_text(path, finite_json.dumps(record.to_dict(), indent=1) + "\n")


def read_record(path: str | Path) -> TuneRecord:
    """A tune record written by ``surgery tune``, checked; a wrong file is a one-line error."""
    path = Path(path).expanduser()  # ~ as a shell would: a Python caller's string is not expanded
    if not path.is_file():
        raise FindingsError(f"tune record {path} {not_a_file(path)}; give the {FILE} that surgery tune wrote")
    raw = load_json(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("version") != TUNE_VERSION:
        raise FindingsError(f"{path} is not a surgery tune record (version {TUNE_VERSION}); give the {FILE} it wrote")
    return TuneRecord.from_dict(raw, str(path))
