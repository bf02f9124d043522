"""Checkpoints and recipes from Python: inspect a model, apply a recipe, verify a bake, undo it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.edits import Recipe
from ..core.errors import RecipeError, require_model_path
from ..core.progress import StageProgress, silent_stages
from ..gguf import is_gguf
from ..model.loading import LoadSpec, open_checkpoint
from ..model.placement import check_offload_folder
from ._common import given_path, no_other_options, reporter, typed
from .bake_options import BakeOptions, bake_options, names_bake_options
from .baking import Baked, bake_recipe, refuse_load_for_gguf, refuse_load_options
from .results import Inspection

if TYPE_CHECKING:
    from ..bake.verify import Report
    from ..core.architectures import Architecture, LayerEdits


def inspect(model: str | Path, *, load: LoadSpec | None = None, **options: Any) -> Inspection:
    """What ``model`` is and what surgery may edit in it, read from its config and safetensors headers
    (no weights loaded): architecture, layers, heads, kv heads, head_dim, sizes, dtypes, shards, its
    experts, MLA sizes, and per kind of layer what an edit may touch and what it refuses and why
    (``layer_kinds``; a hybrid model's kinds of layer by name). A model surgery does not edit says why
    (``supported`` False, ``refused`` the one-line reason); a config whose sizes contradict its
    tensors is an error naming the tensor. A GGUF file is read as a bake reads it (its header and
    config, nothing imported): its stored types (``Q4_K`` …) and its size on disk.
    ``to_dict()`` is what ``inspect --json`` prints."""
    from ..core.architectures import architecture, refusal
    from ..core.patches import check_layers
    from ..core.resolve import Resolver

    load = typed(LoadSpec, options, load)
    no_other_options("inspect", options, LoadSpec)
    if is_gguf(model) and Path(model).is_file():
        return _inspect_gguf(Path(model))
    ckpt, source = open_checkpoint(model, load)
    files = dict(
        path=str(source.path),
        dtypes=tuple(sorted({t.dtype for t in ckpt.tensors.values()})),
        shards=len(ckpt.weight_files),
        tensors=len(ckpt.tensors),
        bytes=ckpt.total_bytes(),
    )
    why = refusal(ckpt.config)
    if why:
        return Inspection(**files, model_type=ckpt.config.get("model_type"), supported=False, refused=why)
    arch = architecture(ckpt.config)
    check_layers(ckpt.format.view(ckpt), arch)  # an int4 / int8 weight: its codes' logical shape
    layout = (
        "fused 3-D" if arch.geometry.sparse_layers and arch.fused_experts(ckpt.tensors) else "one tensor per expert"
    )
    resolver = Resolver(arch, ckpt.tensors)
    down = _stored_expert_down(arch, resolver.stored_experts) if arch.geometry.sparse_layers else None
    return _inspection(files, arch, resolver.prefix, layout, down)


def _inspect_gguf(path: Path) -> Inspection:
    """A GGUF file as a bake reads it: its header (the stored types, e.g. Q4_K, and the file's size)
    and its config, nothing dequantized: importing it would write a float32 copy, 4x a 4-bit file,
    into the cache. The bake's plan checks each edited tensor's shape against the config."""
    from ..core.architectures import architecture, refusal
    from ..core.resolve import Resolver
    from ..gguf.model import GgufModel, read_gguf

    header, config = read_gguf(path)
    files = dict(
        path=str(path),
        dtypes=tuple(sorted(set(header.tensor_types.values()))),
        shards=1,
        tensors=len(header.tensors),
        bytes=path.stat().st_size,
    )
    why = refusal(config)
    if why:
        return Inspection(**files, model_type=config.get("model_type"), supported=False, refused=why)
    arch = architecture(config)
    model = GgufModel(path, header, config, arch)
    # llama.cpp stacks a layer's experts (ffn_*_exps); a bake edits them where the table's per-expert
    # names map onto the stacks (surgery/gguf/plan.py refuses expert edits otherwise)
    layout = (
        "stacked 3-D"
        if model.expert_names()
        else "stacked 3-D, its routed experts not editable in the file: edit an import"
    )
    return _inspection(files, arch, Resolver(arch, model.hf_names()).prefix, layout)


def _inspection(
    files: dict[str, Any],
    arch: Architecture,
    prefix: str,
    expert_layout: str,
    expert_down: str | None = None,
) -> Inspection:
    """The inspection of a model surgery edits: ``files`` (path, dtypes, shards, tensors, bytes), the
    sizes of ``arch``, its layers' ``prefix`` and (a mixture of experts) how its experts are stored:
    ``expert_layout`` in words, ``expert_down`` the routed experts' down matrix as the file names it
    (see :func:`_stored_expert_down`; None: transformers' in-memory name, as for a GGUF)."""
    g = arch.geometry
    sizes: dict[str, Any] = {}
    if g.sparse_layers:  # mixture of experts: neurons are named L:eE:N (routed), L:s:N (shared)
        sizes.update(
            experts=g.num_experts,
            expert_width=g.expert_size,
            expert_layers=f"{len(g.sparse_layers)} of {g.num_layers}",
            expert_layout=expert_layout,
            shared_expert_width=g.shared_size or None,
        )
    if g.mla:  # multi-head latent attention: head_dim above is a head's width in o_proj (v_head_dim)
        sizes["mla"] = dict(g.mla.__dict__)
    if g.o_groups:  # DeepSeek-V4: a head is its columns of o_a_proj within its group's rows
        sizes.update(o_groups=g.o_groups, o_lora_rank=g.o_rank)
    return Inspection(
        **files,
        model_type=arch.model_type,
        supported=True,
        layers=g.num_layers,
        heads=g.num_heads,
        kv_heads=g.num_kv_heads,
        head_dim=g.head_dim,
        hidden_size=g.hidden_size,
        mlp_width=g.intermediate_size,
        layer_prefix=prefix.format(layer="N"),
        **sizes,
        layer_kinds=tuple(
            {"layers": list(layers), **kind.to_dict(), "summary": _summary(layers, kind)}
            for layers, kind in (
                (layers, _as_stored(arch, layers[0], kind, expert_down)) for layers, kind in arch.layer_kinds()
            )
        ),
    )


def _stored_expert_down(arch: Architecture, stored_experts: tuple[str, str] | None) -> str | None:
    """The routed experts' down matrix, relative to a layer, as a safetensors checkpoint stores it
    (``stored_experts``: its fused tensors, None: one tensor per expert): Mixtral's
    ``block_sparse_moe.experts.E.w2`` (E the expert), a release's own fused name, else None."""
    weights = arch.layout.experts.weights if arch.layout.experts else None
    if weights is None:
        return None
    if stored_experts is not None:
        return stored_experts[1].removesuffix(".weight")
    return weights.per_expert[2].format(expert="E") if weights.per_expert else None


def _as_stored(arch: Architecture, layer: int, kind: LayerEdits, expert_down: str | None) -> LayerEdits:
    """``kind`` with its routed experts' residual writer named ``expert_down``, as the file holds it, not
    transformers' in-memory ``mlp.experts.down_proj``, which no file of a per-expert release holds (a
    direction edit names the writer by its role, ``experts``, either way)."""
    in_memory = arch.residual_writers(layer).get("experts")
    if expert_down is None or in_memory is None:
        return kind
    stored = arch.block(layer, expert_down)[1]
    return replace(kind, writers=tuple(stored if writer == in_memory else writer for writer in kind.writers))


def _summary(layers: tuple[int, ...], kind: LayerEdits) -> str:
    """One line for a kind of layer, e.g. "layers 0–2, 5 (full_attention): 4 heads; 48 MLP neurons"."""
    return f"layers {_spans(layers)}{f' ({kind.kind})' if kind.kind else ''}: {kind.text()}"


def _spans(numbers: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` → ``"0–2, 5"``."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}–{b}" if b > a else str(a) for a, b in runs)


@names_bake_options
def apply(
    recipe: Recipe | str | Path,
    model: str | Path,
    out: str | Path,
    *,
    bake: BakeOptions | None = None,
    load: LoadSpec | None = None,
    stages: StageProgress = silent_stages,
    report: Callable[[str], None] | None = None,
    **options: Any,
) -> Baked:
    """Bake ``recipe`` (a :class:`~surgery.core.edits.Recipe` or a recipe YAML file) into a copy of
    ``model`` at ``out``. A recipe whose ``base_model`` names another model is refused unless
    ``bake=BakeOptions(allow_other_base=True)``. Options: ``LoadSpec`` fields (``revision``,
    ``trust_remote_code`` …)."""
    bake = bake_options("apply", bake, options)
    load = typed(LoadSpec, options, load)
    no_other_options("apply", options, LoadSpec)  # a typo named as apply's, not bake_recipe's
    require_model_path(model)  # before the recipe: swapped, the model folder would be "a folder, not a recipe"
    refuse_load_for_gguf(model, load)
    recipe = recipe if isinstance(recipe, Recipe) else Recipe.load(given_path(recipe, "recipe"))
    if not recipe.edits:  # a recipe file without edits is refused as it is read; a Recipe object here
        raise RecipeError("the recipe has no edits: a bake of it would be a copy of the model; give at least one edit")
    return bake_recipe(model, recipe, out, bake=bake, stages=stages, report=report, load=load)


def verify(
    source: str | Path,
    baked: str | Path,
    *,
    structural_only: bool = False,
    load: LoadSpec | None = None,
    stages: StageProgress = silent_stages,
    **options: Any,
) -> Report:
    """Check ``baked`` against ``source``: files, bytes, every sha256 recomputed, and (unless
    ``structural_only``) the logits against the run-time edit. The report's ``ok`` says whether
    all is well and ``problems`` lists what is not. A baked GGUF is checked against its sidecars
    and the ``source`` file (surgery/bake/gguf_verify.py): no model is loaded. The two swapped (the
    bake given first) is one line saying so."""
    from ..bake.provenance import record_file
    from ..core.container import open_container
    from ..core.errors import VerificationError

    load = typed(LoadSpec, options, load)
    no_other_options("verify", options, LoadSpec)
    require_model_path(source, "source")
    baked = given_path(baked, "baked")
    # the record of the bake is what verify reads: had only the first argument one, they are swapped
    if record_file(Path(source).expanduser()).is_file() and not record_file(Path(baked)).is_file():
        raise VerificationError(
            f"{source} was made by surgery and {baked} was not: the source comes first: surgery verify SOURCE BAKED"
        )
    if is_gguf(baked):  # checked from its blocks and sidecars: no model is loaded, no option of loading applies
        refuse_load_options(load, f"{baked} is a baked GGUF: verify recomputes its edited blocks")
    check_offload_folder(baked, load.offload_folder)  # verify reads the output, never writes into it
    return open_container(baked).verify(source, structural_only=structural_only, load=load, progress=stages)


def undo(
    baked: str | Path, out: str | Path, *, force: bool = False, report: Callable[[str], None] | None = None
) -> dict[str, str]:
    """Restore the exact source of a baked folder at ``out``; returns the sha256 of every file
    written (each equals the source's, as recorded at bake time). A baked GGUF file restores to the
    file ``out``."""
    from ..core.container import open_container

    return open_container(given_path(baked, "baked")).undo(out, force, report=reporter(report))
