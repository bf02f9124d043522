"""What find-direction and ablate-direction are asked to do, as typed objects from the command line
to the code (torch-free: the CLI builds its options from these fields, see surgery.core.options)."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.options import check_options, param

TEMPLATES = ("auto", "chat", "plain")
# The residual writers ablate-direction edits by default: "attention" means a hybrid layer's other token
# mixer's output too, and on a mixture-of-experts layer "mlp" means every routed expert's down matrix and
# the shared expert's (see surgery.find.directions.ablate).
DEFAULT_MODULES = "attention,mlp"


@dataclass(frozen=True)
class DirectionParams:
    """The two prompt sets of find-direction and how they are run through the model."""

    a: str | None = param(
        None,
        'Prompts that show the behaviour: a text file (one prompt a line) or JSONL ({"prompt": …} a line).',
        kind="str",
        metavar="FILE",
    )
    b: str | None = param(None, "Prompts that do not (same formats).", kind="str", metavar="FILE")
    projected: bool = param(
        False,
        'Remove from each layer\'s direction its component along the b mean ("projected abliteration").',
        is_flag=True,
    )
    template: str = param(
        "auto",
        "auto: the chat template when the tokenizer has one (instruct models); chat; plain: the text as is.",
        choices=TEMPLATES,
    )
    batch_size: int = param(16, "Prompts per forward pass.", minimum=1)

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class KernelParams:
    """Which layers ablate-direction edits, with which weight and which direction (``add``: the
    steer edit, b ← b + w·r on the output bias, instead of the projection).

    The weight of layer L falls linearly from ``weight`` at ``position`` to ``floor`` at ``width``
    layers from it; layers further away are not edited (the kernel abliteration tools use).
    """

    weight: float = param(
        1.0,
        "Peak weight w of W ← W − w·r(rᵀW): 1 removes the direction, 0.5 halves it, a negative weight amplifies it.",
    )
    position: int | None = param(
        None,
        "Layer of the peak weight (default: the layer whose direction separates the two sets best).",
        kind="int",
        minimum=0,
    )
    floor: float | None = param(
        None, "Weight at --width layers from the peak (default: the peak weight: flat).", kind="float"
    )
    width: int | None = param(
        None,
        "Layers from the peak over which the weight falls to --floor; layers further "
        "away are not edited (default: every layer).",
        kind="int",
        minimum=1,
    )
    layers: str | None = param(None, "Only these layers, e.g. 10-20 or 3,5,8 (default: every layer).", kind="str")
    direction_layer: int | None = param(
        None, "Use this layer's direction for every edited layer (default: each layer its own).", kind="int", minimum=0
    )
    modules: str = param(
        DEFAULT_MODULES,
        "Residual writers to edit, comma-separated: attention (and a hybrid layer's Mamba, linear-attention or "
        "convolution output), mlp (on a mixture-of-experts layer: every routed expert and the shared expert).",
        kind="str",
    )
    add: bool = param(
        False,
        "Add the direction instead: b ← b + w·r on each module's output bias (a control vector; "
        "a module without a bias is refused).",
        is_flag=True,
    )

    def __post_init__(self) -> None:
        check_options(self)
