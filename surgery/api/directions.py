"""Direction edits from Python: find a direction once, ablate it from any layers.

``surgery.find_direction(model, a="harmful.txt", b="harmless.txt")`` takes the residual stream at
each prompt's last token after every layer and returns each layer's difference of the two sets'
means, with norms, separation and cosines between layers (cached by the model key, prompt sets
and parameters); ``surgery.ablate_direction(model, out, direction=findings)`` bakes
W ← W − w·r(rᵀW) into every residual writer (attention output, a hybrid layer's Mamba, linear-attention
or convolution output projection, MLP down matrices, every expert's too) of the layers the weight
kernel picks, and names in one line the writers the table cannot project exactly. The options are those of ``surgery find-direction`` /
``surgery ablate-direction``, spelled as the fields of ``LoadSpec``, ``DirectionParams`` and
``KernelParams``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.architectures import architecture
from ..core.checkpoint import Checkpoint
from ..core.errors import ParameterError
from ..core.progress import Progress, silent
from ..find.directions.params import DirectionParams, KernelParams
from ..model.loading import LoadSpec, open_checkpoint
from ._common import given_path, no_other_options, reporter, typed
from .bake_options import BakeOptions, bake_options, names_bake_options
from .baking import Baked, Planned, bake_plans, check_outputs
from .callbacks import Callbacks, callback_options
from .findings_source import FindingsSource, findings_path

if TYPE_CHECKING:
    from ..find.directions.find import DirectionFindings


def direction_findings(
    model: str | Path | Checkpoint,
    *,
    source: FindingsSource | None = None,
    load: LoadSpec | None = None,
    params: DirectionParams | None = None,
    progress: Progress = silent,
    report: Callable[[str], None] | None = None,
    **options: Any,
) -> DirectionFindings:
    """The direction findings for ``model``: read from ``findings`` (a file; ``transfer`` accepts one
    of another checkpoint of the same architecture), else from the cache (``recompute``: computed
    again), else computed from the prompt sets ``a`` and ``b`` (``source``: ``findings``,
    ``transfer`` and ``recompute`` as one :class:`FindingsSource`)."""
    from ..core.prompts import read_prompts
    from ..find.directions.find import DirectionFindings
    from ..find.directions.find import find_direction as compute

    source = typed(FindingsSource, options, source)
    load, params = typed(LoadSpec, options, load), typed(DirectionParams, options, params)
    no_other_options("direction_findings", options, FindingsSource, LoadSpec, DirectionParams)
    note = reporter(report)
    ckpt = model if isinstance(model, Checkpoint) else open_checkpoint(model, load)[0]
    if source.findings is not None:
        if params.a or params.b or source.recompute:
            raise ParameterError(
                "{findings} already holds the directions; drop {a}/{b}/{recompute}, or drop "
                "{findings} to compute new ones",
                "findings",
                "a",
                "b",
                "recompute",
            )
    if (found := source.read(DirectionFindings, ckpt, note, check=True)) is not None:
        return found
    a, b = read_prompts(params.a, "a"), read_prompts(params.b, "b")
    return compute(
        ckpt,
        a,
        b,
        projected=params.projected,
        template=params.template,
        batch_size=params.batch_size,
        load=load,
        recompute=source.recompute,
        progress=progress,
        report=note,
    )


def find_direction(
    model: str | Path,
    *,
    recompute: bool = False,
    out: str | Path | None = None,
    progress: Progress = silent,
    report: Callable[[str], None] | None = None,
    **options: Any,
) -> DirectionFindings:
    """Per-layer directions between the prompt sets ``a`` and ``b`` of ``model`` (cached; ``recompute``
    captures again); ``out`` also writes the findings JSON there, with its vectors file next to it
    (``out`` with the suffix ``.safetensors``). Options: ``LoadSpec`` and ``DirectionParams`` fields."""
    from ..core.destinations import check_out_file, surgery_json
    from ..core.distributed import is_main
    from ..find.directions.find import vectors_path, write

    if out is not None:  # both files it writes, refused now rather than after the capture
        out = given_path(out, "out")  # ~ expanded: written where it was checked, not under ./~
        if out.suffix == ".safetensors":  # the vectors would go there too, and the JSON over them
            raise ParameterError(
                f"{{out}} {out} names the vectors file, which is written next to the findings JSON; "
                f"give the JSON's name, e.g. {{out}} {out.with_suffix('.json')}",
                "out",
            )
        check_out_file(out, "direction.json")
        # its vectors file is surgery's when the findings JSON beside it is
        check_out_file(vectors_path(Path(out)), "direction.safetensors", lambda _: surgery_json(Path(out)))
    # checked here too: a typo is named as find_direction()'s, not direction_findings()'s
    no_other_options("find_direction", options, FindingsSource, LoadSpec, DirectionParams, handed_to=direction_findings)
    found = direction_findings(model, recompute=recompute, progress=progress, report=report, **options)
    if out is not None and is_main():  # under torchrun rank 0 alone writes
        from safetensors.numpy import load_file

        out = Path(out)
        if vectors_path(out).resolve() == found.vectors.resolve():
            raise ParameterError("{out} is where the cached findings already are; choose another file", "out")
        write(found.data, load_file(str(found.vectors)), out)
    return found


@names_bake_options
def ablate_direction(
    model: str | Path,
    out: str | Path,
    *,
    direction: str | Path | DirectionFindings,
    transfer: bool = False,
    bake: BakeOptions | None = None,
    load: LoadSpec | None = None,
    kernel: KernelParams | None = None,
    callbacks: Callbacks | None = None,
    **options: Any,
) -> Baked:
    """Bake the direction of ``direction`` (a findings file of find-direction, or what
    :func:`find_direction` returned) out of ``model``:
    W ← W − w·r(rᵀW) on the modules and layers ``kernel`` picks, with its per-layer weights; with
    ``add=True`` the control vector b ← b + w·r on their output biases instead (steer edits).
    Options: ``LoadSpec`` and ``KernelParams`` fields (``weight``, ``position``, ``floor``, ``width``,
    ``layers``, ``direction_layer``, ``modules``, ``add``); ``bake``: the bake's switches
    (:class:`~surgery.api.bake_options.BakeOptions`); ``callbacks``: the bake's stages, notes and
    hooks (:class:`~surgery.api.callbacks.Callbacks`)."""
    from ..find.directions.ablate import direction_recipe

    direction = findings_path(direction, "direction")  # not None: that would compute new findings
    bake = bake_options("ablate_direction", bake, options)
    hooks = callback_options("ablate_direction", callbacks, options)
    load, kernel = typed(LoadSpec, options, load), typed(KernelParams, options, kernel)
    no_other_options("ablate_direction", options, LoadSpec, KernelParams)
    check_outputs(model, out, bake=bake, load=load)  # before the findings are read and checked
    ckpt = open_checkpoint(model, load)[0]
    source = FindingsSource(findings=direction, transfer=transfer)
    found = direction_findings(ckpt, source=source, load=load, report=hooks.report)
    recipe, record = direction_recipe(found, kernel, architecture(ckpt.config))
    if left := record["direction_kernel"].get("not_projected"):  # residual writers the table cannot edit exactly
        reporter(hooks.report)(f"ablate-direction: {left}")
    plans = [Planned(None, recipe, record)]
    if hooks.on_plans is not None:
        hooks.on_plans(plans)
    return bake_plans(
        model,
        plans,
        out,
        load=load,
        bake=bake,
        stages=hooks.stages,
        report=hooks.report,
        on_each=hooks.on_each,
    )
