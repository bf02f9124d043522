"""What find-heads is asked to do: one typed object, from the command line to the findings file.

Torch-free, so that the CLI can build its options from these fields at start-up (surgery.core.options).
Every field is recorded in the findings and is part of their cache key (``findings_key``) but
``keep_memory``, which decides the run's memory and time, not its findings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from numbers import Integral
from typing import Any

from ...core.errors import ParameterError
from ...core.options import check_options, param
from ...core.sizes import parse_size
from .pairs import DEFAULT_PER_IDENTITY

# α values of the dose-response (edge-level and whole-head), and those at which DiffAware /
# CtxtAware are measured (baseline, the paper's range, the default bake).
DOSE_GRID = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
AWARENESS_ALPHAS = (1.0, 2.0, 2.5, 3.0)
# The fields that say which prompts are measured and how: score-binding takes only these.
PAIR_FIELDS = ("benchmark", "max_pairs", "per_identity", "seed", "batch_size", "instruct")
# The discovery and causal-test fields that amplify-heads offers too (it finds heads when it must).
SEARCH_FIELDS = ("knockout_heads", "confirm", "candidates", "random_sets", "level", "exhaustive")
FORMATS = {"auto": None, "instruct": True, "base": False}
# What find-heads and tune keep of their baseline passes (every decoder layer's inputs and keys/values
# per prompt; 24 SmolLM2 pairs take 0.79 GB) unless told otherwise: a later sweep or trial reads them
# instead of running those layers again. Past it, slower; the same numbers.
KEEP_MEMORY = "2GiB"
# The fields that decide how a run goes, not what it finds: left out of the findings' cache key.
RUN_ONLY = ("keep_memory",)


def keep_memory_param(past: str) -> Any:
    """The ``keep_memory`` option of a command that keeps baseline passes; ``past``: what the batches
    past the bound do instead (one declaration for find-heads and tune, so they read alike)."""
    return param(
        KEEP_MEMORY,
        "Most memory the baseline passes' recordings (each decoder layer's inputs, keys and values per "
        f"prompt) may hold, e.g. 2GiB, 512MiB, 8G; 0 keeps none. Batches past it {past}: slower, the same "
        "numbers.",
        kind="str",
        metavar="SIZE",
    )


def keep_bytes(value: int | str) -> int:
    """``keep_memory`` (bytes, or a size such as ``"2GiB"``) as bytes; a bad value is one line."""
    size = None
    if isinstance(value, str):
        size = parse_size(value)
    elif isinstance(value, Integral) and not isinstance(value, bool) and value >= 0:
        size = int(value)  # numpy's whole numbers too: the record holds a plain int
    if size is None:
        raise ParameterError(
            f"{{keep_memory}} {value!r} is not a size; give e.g. 2GiB, 512MiB or 8G (0 keeps none)", "keep_memory"
        )
    return size


@dataclass(frozen=True)
class FindParams:
    """Everything that changes the findings (recorded in the file and part of its cache key)."""

    benchmark: str = param("builtin", "'builtin', a JSONL file in surgery's benchmark format, or the N4 JSONL.")
    seed: int = param(0, "Seed of pairs and option order.", minimum=0)  # numpy refuses negative seeds
    per_identity: int = param(DEFAULT_PER_IDENTITY, "Times each identity may be the 'correct' one.", minimum=1)
    max_pairs: int | None = param(
        None, "Use at most this many pairs (a balanced random subset).", kind="int", minimum=2
    )
    instruct: bool | None = param(
        None,
        "Prompt format: chat template (instruct) or base; auto = instruct when the tokenizer has a chat template.",
        flag="--format",
        choices=FORMATS,
    )
    batch_size: int = param(8, "Pairs per forward pass.", minimum=1)
    folds: int = 5
    inner_folds: int = 3
    top_k: int = 10
    # How many heads are selected, knocked out together and reported as the finding (the paper
    # found 2–3 binding heads per model).
    knockout_heads: int = param(3, "How many heads are selected and knocked out together (the finding).", minimum=1)
    # The paper keeps the top 10 |coef| heads per fold: the heads discovery itself considers.
    confirm: int = param(
        10,
        "Knock out each of discovery's top K heads alone and select by that effect (one extra pass "
        "over the pairs per head; without --exhaustive in the screen's order, only while another could "
        "still be selected); 0 selects discovery's top heads.",
        minimum=0,
    )
    # The screened procedure knocks out the screen's top heads of discovery's candidates first, as
    # many as the finding holds unless asked otherwise; more where its error leaves them a chance.
    candidates: int | None = param(
        None,
        "Without --exhaustive: knock out the screen's top K of discovery's top --confirm first (default: "
        "--knockout-heads), then any other the screen's error leaves a chance of selection.",
        kind="int",
        minimum=1,
    )
    random_sets: int = param(
        20, "Random head sets of the same size for the knockout baseline (at most this many).", minimum=1
    )
    level: float = param(
        0.05,
        "Without --exhaustive: level of the random-set baseline's p-value; random sets stop once p ≤ level is "
        "out of reach.",
        minimum=0.0,
        maximum=1.0,
        max_open=True,
    )
    # The screened procedure (the default) selects what this one selects on the planted fixtures and
    # on SmolLM2-135M (docs/guides/heads.md#cost); this one knocks out every candidate, every set.
    exhaustive: bool = param(
        False,
        "Knock out every one of discovery's top --confirm heads alone and run every random set, without the "
        "attribution-patching screen's order and the sequential stop (more exact passes).",
        is_flag=True,
    )
    dose_response: bool = param(
        False, "Also compare edge-level α with whole-head α on ΔS, DiffAware and CtxtAware.", is_flag=True
    )
    dose_grid: tuple[float, ...] = DOSE_GRID
    awareness_alphas: tuple[float, ...] = AWARENESS_ALPHAS
    awareness_max: int | None = param(
        None,
        "With --dose-response: at most this many '≠' and '=' questions (generation is slow).",
        kind="int",
        minimum=1,
    )
    keep_memory: int | str = keep_memory_param("run their baseline pass again in each sweep")
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_options(self)
        # as bytes from here on: the findings record the bound their run kept to, whatever its spelling
        object.__setattr__(self, "keep_memory", keep_bytes(self.keep_memory))
        if self.candidates is not None and self.candidates < self.knockout_heads:
            raise ParameterError(
                f"{{candidates}} {self.candidates} puts forward fewer heads than the {self.knockout_heads} that "
                f"{{knockout_heads}} selects; give {{candidates}} at least {self.knockout_heads}",
                "candidates",
                "knockout_heads",
            )
        if 0 < self.confirm < self.knockout_heads:  # the selection is taken from the confirmed heads
            raise ParameterError(
                f"{{confirm}} {self.confirm} confirms fewer heads than the {self.knockout_heads} that "
                f"{{knockout_heads}} selects; give {{confirm}} 0 (no confirmation) or at least {self.knockout_heads}",
                "confirm",
                "knockout_heads",
            )

    @property
    def screened(self) -> bool:
        """Whether the attribution-patching screen orders the confirmation and the random sets stop."""
        return not self.exhaustive

    def screen_candidates(self) -> int:
        """How many heads the screen and discovery each put forward for exact knockouts."""
        return self.knockout_heads if self.candidates is None else self.candidates

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dose_grid"], d["awareness_alphas"] = list(self.dose_grid), list(self.awareness_alphas)
        return d

    def findings_key(self) -> dict[str, Any]:
        """The fields that decide the findings (their cache key): all but ``keep_memory``."""
        return {k: v for k, v in self.to_dict().items() if k not in RUN_ONLY}
