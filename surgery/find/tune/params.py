"""What ``surgery tune`` is asked to do: one typed object, from the command line to the study record.

Torch-free, so that the CLI builds its options from these fields at start-up (surgery.core.options).
Every field is recorded in the study; a study folder run with other values is not resumed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ...core.errors import ParameterError
from ...core.options import check_options, param
from ..heads.params import keep_bytes, keep_memory_param

METHODS = ("heads", "neurons", "direction")
# Most neurons a neurons tune tries by default: fairness pruning removes tens of neurons (its
# quickstart prunes 40); the search goes a little past that. Capped at the selectable neurons.
N_MAX = 100
SAMPLERS = ("tpe", "nsga2")
# NSGA-II's generation size when none is given: a tune's budget is tens of trials, Optuna's default
# (50) would leave every one of them to the first, random generation.
NSGA2_POPULATION = 10
# The options that only one method reads: given with another method they would be ignored (and,
# being part of the study's key, start another study), so they are refused.
METHOD_FIELDS = {
    "heads": ("alpha_min", "alpha_max", "top_max"),
    "neurons": ("n_max", "factor_min", "factor_max"),
    "direction": ("behaviour", "markers", "max_new_tokens", "weight_max"),
}


def refuse_other_methods(method: str, values: Any, owners: dict[str, tuple[str, ...]]) -> None:
    """Refuse, in one line naming them, the fields of ``values`` (a dataclass) that ``owners`` gives to
    another method than ``method`` and that are not at their defaults."""
    defaults = {f.name: f.default for f in fields(values)}
    stray = [
        (name, owner)
        for owner, names in owners.items()
        if owner != method
        for name in names
        if getattr(values, name) != defaults[name]
    ]
    if stray:
        named = ", ".join(f"{{{name}}} ({owner})" for name, owner in stray)
        it, they = ("them", "they are") if len(stray) > 1 else ("it", "it is")
        raise ParameterError(
            f"{named}: not read by {{method}} {method}, which would ignore {it}; drop {it} or give the method "
            f"{they} for",
            "method",
            *(name for name, _ in stray),
        )


@dataclass(frozen=True)
class TuneParams:
    """The search: its method, budget, seed, the tune/test split and the parameter ranges."""

    method: str = param(
        "heads",
        "Which edit to tune: heads (α, how many of the found heads), neurons (n, factor, score, selection "
        "rule) or direction (the per-layer weight kernel and the residual writers).",
        choices=METHODS,
    )
    trials: int = param(40, "Trials of the search (a resumed study runs only the ones missing).", minimum=1)
    seed: int = param(0, "Seed of the split and of the sampler (a resumed study draws the same trials).", minimum=0)
    sampler: str = param("tpe", "Optuna's sampler: TPE or NSGA-II (both multi-objective).", choices=SAMPLERS)
    population: int | None = param(
        None,
        f"nsga2: trials per generation (default {NSGA2_POPULATION}; the first generation is drawn at random).",
        kind="int",
        minimum=2,
    )
    trials_at_once: int = param(
        1,
        "direction, TPE: trials drawn and measured together after its start-up ones (they see the others as running, "
        "Optuna's constant liar); the start-up trials, drawn at random, are always measured together.",
        minimum=1,
    )
    max_kl: float | None = param(
        None,
        "Choose the front's best effect with first-token KL at most this (default: the front's knee).",
        kind="float",
        minimum=0.0,
    )
    test_share: float = param(
        0.5,
        "Share of the items or pairs (and neutral prompts) held out for the confirmation, never seen by the search.",
        minimum=0.0,
        maximum=1.0,
        max_open=True,
    )
    alpha_min: float = param(1.0, "heads: smallest α the search tries.", minimum=0.0)
    alpha_max: float = param(4.0, "heads: largest α the search tries.", minimum=0.0)
    top_max: int | None = param(
        None,
        "heads: most heads of the findings' ranking the search tries (default: the knocked-out selection's size).",
        kind="int",
        minimum=1,
    )
    n_max: int = param(
        N_MAX, "neurons: most neurons the search prunes or scales (capped at the selectable ones).", minimum=1
    )
    factor_min: float = param(0.0, "neurons: smallest factor the search tries (0 prunes).", minimum=0.0, maximum=1.0)
    factor_max: float = param(
        1.0, "neurons: largest factor the search tries (1 leaves a neuron alone).", minimum=0.0, maximum=1.0
    )
    behaviour: str | None = param(
        None,
        "direction: prompts that show the behaviour (text, one a line, or JSONL): the marker rate is measured on them.",
        kind="str",
        metavar="FILE",
    )
    markers: str | None = param(
        None,
        "direction: a text file of markers (phrases), one a line: an answer holding one shows the behaviour.",
        kind="str",
        metavar="FILE",
    )
    max_new_tokens: int = param(16, "direction: tokens each answer is generated greedily for.", minimum=1)
    weight_max: float = param(
        1.5, "direction: largest peak weight the search tries (1 removes the direction).", minimum=0.0
    )
    neutral: str = param(
        "builtin",
        "Neutral prompts for the KL cost: 'builtin' (surgery's retention prompts), a JSONL file of "
        '{"text": …} or a text file (one prompt a line).',
    )
    batch_size: int = param(16, "Prompts per forward pass.", minimum=1)
    threads: int | None = param(
        None,
        "CPU threads torch computes with (default: OMP_NUM_THREADS when set, else the cores the machine's "
        "other jobs leave idle by its 1-minute load average, at least one).",
        kind="int",
        minimum=1,
    )
    # heads and neurons record baseline passes (direction records none: the bound does not concern it)
    keep_memory: int | str = keep_memory_param("run every layer under each trial's edit (heads, neurons)")

    def __post_init__(self) -> None:
        check_options(self)
        # as bytes from here on: the record holds the bound the run kept to, whatever its spelling
        object.__setattr__(self, "keep_memory", keep_bytes(self.keep_memory))
        refuse_other_methods(self.method, self, METHOD_FIELDS)
        if self.weight_max <= 0:
            raise ParameterError(
                f"{{weight_max}} {self.weight_max:g} leaves every layer unedited (each weight is drawn from 0 to "
                "it); give a value above 0 (1 removes the direction)",
                "weight_max",
            )
        if self.alpha_min > self.alpha_max:
            raise ParameterError(
                f"{{alpha_min}} {self.alpha_min} is above {{alpha_max}} {self.alpha_max}; give a range low to high",
                "alpha_min",
                "alpha_max",
            )
        if self.population is not None and self.sampler != "nsga2":
            raise ParameterError(
                f"{{population}} {self.population} is NSGA-II's generation size; give {{sampler}} nsga2 with it",
                "population",
                "sampler",
            )
        if self.trials_at_once > 1 and (self.sampler != "tpe" or self.method != "direction"):
            raise ParameterError(
                f"{{trials_at_once}} {self.trials_at_once} measures direction trials together, drawn by TPE; "
                "give {method} direction and {sampler} tpe with it",
                "trials_at_once",
                "method",
                "sampler",
            )
        if self.factor_min > self.factor_max:
            raise ParameterError(
                f"{{factor_min}} {self.factor_min} is above {{factor_max}} {self.factor_max}; give a range low to high",
                "factor_min",
                "factor_max",
            )

    @property
    def generation(self) -> int | None:
        """NSGA-II's population (the default when none is given); None for TPE."""
        if self.sampler != "nsga2":
            return None
        return NSGA2_POPULATION if self.population is None else self.population

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def study_key(self) -> dict[str, Any]:
        """What decides the trials: a study run with another key is not resumed (``trials`` may grow;
        ``keep_memory`` changes the time a trial takes, not what it measures).
        ``trials_at_once`` 1 draws as studies made before it did: left out then, so that they resume."""
        skip = ("trials", "max_kl", "threads", "keep_memory") + (
            ("trials_at_once",) if self.trials_at_once == 1 else ()
        )
        return {k: v for k, v in self.to_dict().items() if k not in skip}
