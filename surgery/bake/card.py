"""Model cards for baked checkpoints: what was edited, why, how it was verified, what it costs.

The card is what huggingface_hub's ``ModelCard.from_template`` writes: YAML front matter
(base_model, base_model_relation, tags including ``surgery``, library_name, the source's licence)
and a markdown body rendered from the bake's provenance (surgery.json). It is written here with
PyYAML and huggingface_hub's own front-matter rule, because importing huggingface_hub's card
classes costs ~0.2 s, most of a small bake. ``card_hook`` plugs it
into :func:`surgery.bake.bake.bake`; :func:`folder_card` renders the card of an existing bake, what
its container answers (``FolderContainer.card``); surgery/ship/card.py puts an evaluation on it.
A baked GGUF's card is surgery/bake/gguf_card.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from ..core.architectures import Architecture, architecture
from ..core.counted import counted
from ..core.edits import Recipe
from ..core.evaluation_table import Evaluation
from ..core.heads_caveats import caveats, held_out_caveat
from ..core.hub_id import HUB_ID
from ..core.sites import where_text
from ..core.strict_files import dump_yaml, load_json, load_yaml
from ..model.loading import Source
from .lineage import WRITTEN_FOR
from .provenance import PROVENANCE_NAME, UNDO_NAME, load_undo
from .public import public, public_values
from .record import AdapterRecord, BakeRecord, Verification

CARD_NAME = "README.md"
# Front-matter keys carried over from the source's card when it has them.
CARRIED_KEYS = ("license", "license_name", "license_link", "language", "pipeline_tag")
MAX_EDIT_ROWS = 64
# huggingface_hub's rule for a card's front matter (repocard.REGEX_YAML_BLOCK).
YAML_BLOCK = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")
# ModelCardData's field order, which its YAML keeps; other keys follow in the order given.
FIELD_ORDER = (
    "base_model",
    "datasets",
    "language",
    "library_name",
    "license",
    "license_name",
    "license_link",
    "metrics",
    "model_name",
    "pipeline_tag",
    "tags",
)


def front_matter(text: str | None) -> dict[str, Any]:
    """The YAML metadata of a model card's text ({} when there is none or it does not parse)."""
    match = YAML_BLOCK.search(text or "")
    if not match:
        return {}
    try:
        data = load_yaml(match.group(2))
    except yaml.YAMLError:  # a malformed source card (a repeated key too) must not block the bake: it carries nothing
        return {}
    return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else {}


def render_card(meta: Mapping[str, Any], body: str) -> str:
    """A card's text: ``meta`` as YAML front matter (None values left out) and the markdown ``body``,
    byte for byte what ``ModelCard.from_template`` renders from ``ModelCardData(**meta)``."""
    data = {k: meta[k] for k in FIELD_ORDER if meta.get(k) is not None}
    data.update({k: v for k, v in meta.items() if k not in data and k not in FIELD_ORDER and v is not None})
    if isinstance(data.get("tags"), list):  # ModelCardData keeps each tag once
        data["tags"] = list(dict.fromkeys(data["tags"]))
    return f"---\n{dump_yaml(data).strip()}\n---\n\n{body}"


def _base_model(source: Source) -> str | None:
    """The Hub id of the checkpoint that was edited, for ``base_model`` (the Hub rejects local paths
    there). Never the recipe's ``base_model``: a recipe may have been written for another model."""
    return source.hub_id if source.hub_id and HUB_ID.match(source.hub_id) else None


def _source_name(source: Source) -> str:
    """How the card names the edited checkpoint: its Hub id, the repo of a Hub-cache snapshot, else
    its folder's name; never a path (see :func:`public`)."""
    return _base_model(source) or public(str(source.path))


def _fmt(value: Any) -> str:
    # NaN is how findings record a bootstrap that gave no interval: "nan" on a card reads as a bug.
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return public(str(value))


def edits_section(
    recipe: Recipe, arch: Architecture | None = None, adapter: bool = False, record_name: str = PROVENANCE_NAME
) -> str:
    """One table row per edit (each kind writes its own, surgery/core/edit_kind.py); with ``arch``
    each row names the weight entries it changed (the site map; for an ``adapter`` those the LoRA
    changes: the sites with a run-time twin, e.g. a pruned neuron's down_proj column, not its gate/up rows)."""
    rows = ["| edit | layer | index | scale | effect |", "|---|---|---|---|---|"]
    for e in recipe.edits[:MAX_EDIT_ROWS]:
        where = where_text(arch, e, twin_only=adapter) if arch else f"see `{record_name}` for the weight entries"
        rows.append("| " + " | ".join(e.card_row(where)) + " |")
    if len(recipe.edits) > MAX_EDIT_ROWS:
        rows.append(f"\n… and {len(recipe.edits) - MAX_EDIT_ROWS} more edits: see `{record_name}`.")
    return "\n".join(rows)


def _directions_section(record: BakeRecord) -> str | None:
    """Per projected matrix, how much of the direction the rounding to the stored dtype left,
    ‖rᵀW′‖ / ‖rᵀW‖, next to what the weight asks for (|1 − w|: 0 for a removal); the experts of
    one fused or per-expert layer on one row (their largest)."""
    rows: dict[str, list[tuple[float, float]]] = {}
    for e in record.edited_tensors:
        if e.direction_left is not None and not e.tensor.endswith(("bias", "_bias")):
            name = re.sub(r"\.experts\.\d+\.", ".experts.N.", e.tensor)
            rows.setdefault(name, []).append((e.direction_left, abs(1 - e.direction_weight)))
    if not rows:
        return None
    lines = ["| matrix | direction left | asked for |", "|---|---|---|"]
    for name, values in list(rows.items())[:MAX_EDIT_ROWS]:
        left, asked = max(values)
        what = f"`{public(name)}`" + (f" ({len(values)} experts, the largest)" if len(values) > 1 else "")
        lines.append(f"| {what} | {100 * left:.3g} % | {100 * asked:.3g} % |")
    if len(rows) > MAX_EDIT_ROWS:
        lines.append(f"\n… and {len(rows) - MAX_EDIT_ROWS} more matrices: see `surgery.json` (edited_tensors).")
    return (
        "How much of each direction is left in the matrices it was projected out of, after the "
        "rounding to the stored dtype (‖rᵀW′‖ / ‖rᵀW‖; not zero in bf16):\n\n" + "\n".join(lines)
    )


MAX_LIST = 12


def _short(value: Any) -> str:
    """One line for a value of a findings summary (long lists are counted, not printed)."""
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {_short(v)}" for k, v in value.items() if not isinstance(v, (Mapping, list)))
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_LIST or any(isinstance(v, Mapping) for v in value):
            return f"{len(value)} entries (see surgery.json)"
        return ", ".join(".".join(map(str, v)) if isinstance(v, (list, tuple)) else _fmt(v) for v in value)
    return _fmt(value)


def _tune_caveats(key: str, summary: Mapping[str, Any]) -> list[str]:
    """A tuned bake whose held-out effect is not shown above 0 says so (its one-line summary above
    leaves out the interval)."""
    shown = held_out_caveat(summary) if key == "tune" else None
    if shown is None:
        return []
    effect, low, high = shown
    return [
        f"on the held-out split the chosen point's effect was {_fmt(effect)} "
        f"(95% CI {_fmt(low)}, {_fmt(high)}): not shown above 0, the edit is not shown to work there"
    ]


def why_section(record: BakeRecord) -> str:
    """What the baking command recorded about its findings (the ``extra`` entries of surgery.json),
    with the caveats of what it quotes (a ΔS or a knockout reduction that is not significant)."""
    lines = []
    for key in sorted(record.extra):
        value = record.extra[key]
        if isinstance(value, Mapping):
            lines.append(f"- **{key}**")
            lines += [f"  - {k}: {_short(v)}" for k, v in value.items() if _short(v)]
            lines += [f"  - **Caveat:** {c}" for c in [*caveats(value), *_tune_caveats(key, value)]]
        elif value not in (None, "", [], {}):
            lines.append(f"- **{key}**: {_short(value)}")
    for k, v in record.recipe.notes.items():
        if k != WRITTEN_FOR:  # said at the top of the card
            lines.append(f"- {k}: {_short(v)}")
    return "\n".join(lines) or "No findings summary was recorded: the edits were given by hand."


def _verification_section(ver: Verification | None) -> str:
    if ver is None:
        return (
            "The numerical check was not run at bake time (`--no-verify`); run "
            "`surgery verify SOURCE THIS_FOLDER` to check it."
        )
    if ver.compared_logits:  # older bakes compared whole-model logits at bake time
        return (
            f"Before publishing, the baked weights were loaded and compared with the source running "
            f"the same edit as run-time hooks on {ver.prompts if ver.prompts is not None else '?'} prompts: "
            f"max |Δlogit| = {ver.max_abs_logit_diff:.2e} (tolerance {ver.tolerance:g}). Every byte outside "
            "the edited slices equals the source (sha256 of every file in `surgery.json`)."
        )
    return (
        f"Before publishing, each of the {ver.maps} edited weight maps was compared with the source "
        f"running the same edit as a run-time hook, on random inputs in float32: max |Δ| = "
        f"{ver.max_abs_diff:.2e}, within the rounding of the stored dtype. Every byte outside the "
        "edited slices equals the source (sha256 of every file in `surgery.json`); "
        "`surgery verify SOURCE THIS_FOLDER` compares the logits end to end."
    )


def evaluation_section(evaluation: Evaluation | None) -> str | None:
    if evaluation is None or not evaluation.rows:
        return None
    rows = ["| metric | source | edited | retained |", "|---|---|---|---|"]
    for r in evaluation.rows:
        kept = f"{r.retained_pct:.1f}%" if r.retained_pct is not None else ""
        rows.append(f"| {r.label} | {_fmt(r.before)} | {_fmt(r.after)} | {kept} |")
    return "\n".join(rows) + (f"\n\n{evaluation.note}" if evaluation.note else "")


def recipe_yaml(recipe: Recipe) -> str:
    """The recipe as a card shows it: its YAML with local paths made :func:`public`."""
    shown = Recipe(
        recipe.edits,
        public(recipe.base_model) if recipe.base_model else None,
        recipe.version,
        public_values(recipe.notes),
    )
    return shown.to_yaml().strip()


def card_text(record: BakeRecord, source_card: str | None = None, arch: Architecture | None = None) -> str:
    """The README.md text for the bake ``record`` (source's card text optional; with the model's
    ``arch`` the edits are described with its own module names)."""
    recipe = record.recipe
    src_meta = front_matter(source_card)
    tags = ["surgery", "model-surgery"] + sorted({t for e in recipe.edits for t in e.card_tags()})
    base = _base_model(record.source)
    meta = dict(
        base_model=base,
        base_model_relation="finetune" if base else None,
        tags=tags,
        library_name="transformers",
        **{k: src_meta[k] for k in CARRIED_KEYS if src_meta.get(k)},
    )
    name = _source_name(record.source)
    # the commit the source was read at (a Hub id's branch may have moved since)
    pinned = record.source.revision if base else None
    written_for = public(str(recipe.notes[WRITTEN_FOR])) if recipe.notes.get(WRITTEN_FOR) else None
    sections = [
        f"# {name} — edited with surgery\n\n"
        f"This is **{name}**{f' (revision `{pinned}`)' if pinned else ''} with {counted(len(recipe.edits), 'edit')} baked into its weights by "
        f"`surgery` {record.tool_version}. Tensor names, shapes, dtypes, shard layout and "
        "config are the source's, so stock transformers, vLLM, TGI and llama.cpp's converter load "
        "it with no custom code and no hooks."
        + (
            f"\n\nThe recipe was written for **{written_for}**, not for this model: its edits were baked "
            "here as given, with the scales chosen on that model."
            if written_for
            else ""
        ),
        "## What was edited\n\n"
        + edits_section(recipe, arch)
        + (f"\n\n{left}" if (left := _directions_section(record)) else ""),
        "## Why\n\n" + why_section(record),
        "## Verification\n\n" + _verification_section(record.verification),
    ]
    evaluation = evaluation_section(record.evaluation)
    if evaluation:
        sections.append("## Evaluation: before and after\n\n" + evaluation)
    sections.append(
        "## Reproduce or undo\n\n```yaml\n" + recipe_yaml(recipe) + "\n```\n\n"
        f"`surgery apply recipe.yaml --model {base or 'SOURCE'}{f' --revision {pinned}' if pinned else ''} --out OUT` bakes the same checkpoint"
        + (
            " (with the vector files it names next to it; their unit vectors are kept in `surgery.vectors`)"
            if recipe.directions
            else ""
        )
        + "; "
        "`surgery undo THIS_FOLDER --out SOURCE_COPY` restores the source byte for byte from `surgery.undo`."
    )
    if src_meta.get("license"):
        sections.append(f"## Licence\n\nThe source's licence (`{src_meta['license']}`) applies to this checkpoint.")
    return render_card(meta, "\n\n".join(sections))


def adapter_card(record: AdapterRecord, arch: Architecture | None = None) -> str:
    """README.md for an exported LoRA adapter (its ``record``, surgery_adapter.json; ``arch``: the base model's)."""
    recipe = record.recipe
    base = _base_model(record.source)
    meta = dict(
        base_model=base,
        base_model_relation="adapter" if base else None,
        library_name="peft",
        tags=["surgery", "lora", "model-surgery"],
    )
    ranks = sorted(set(record.modules.values()))
    pruned = (
        "\n\nA pruned neuron's gate/up rows, which the baked checkpoint also zeroes, are not part of "
        "the adapter: with its down-projection column at zero the neuron adds nothing to the output "
        "either way."
        if any(e.factor == 0 for e in recipe.neurons)
        else ""
    )
    body = (
        f"# LoRA adapter: the surgery recipe as an exact low-rank update\n\n"
        f"Applied to **{base or 'its source model'}**, this adapter reproduces the recipe below exactly: "
        f"{counted(len(record.modules), 'module')}, rank {'/'.join(map(str, ranks))}, lora_alpha = r "
        f"(scaling 1){', padded to one rank for vLLM' if record.vllm else ''}. "
        "`PeftModel.from_pretrained(base, THIS_FOLDER)` (merged or not) gives the same logits as the "
        "baked checkpoint.\n\n## What it edits\n\n" + edits_section(recipe, arch, adapter=True) + pruned
    )
    return render_card(meta, body)


def card_hook(evaluation: Evaluation | None = None) -> Callable[[Path, BakeRecord], str]:
    """A ``card`` callback for :func:`surgery.bake.bake.bake` (reads the source card copied into
    staging); ``evaluation`` goes into the record and onto the card."""

    def make(staged: Path, record: BakeRecord) -> str:
        if evaluation is not None:
            record.evaluation = evaluation
        source_card = staged / CARD_NAME
        return card_text(
            record,
            source_card.read_text(encoding="utf-8", errors="replace") if source_card.is_file() else None,
            _architecture(staged),
        )

    return make


def _architecture(folder: Path) -> Architecture:
    """The table's entry for the checkpoint in ``folder`` (a bake's output: its config is the source's)."""
    return architecture(load_json((folder / "config.json").read_text(encoding="utf-8")))


def _source_card(folder: Path, record: BakeRecord) -> str | None:
    """The source's README text, kept in surgery.undo when the bake replaced it."""
    if CARD_NAME not in record.undo.replaced_files:
        return None
    return load_undo(folder / UNDO_NAME)[f"file:{CARD_NAME}"].tobytes().decode("utf-8", "replace")


def folder_card(folder: Path, record: BakeRecord) -> str:
    """The README.md text of the baked ``folder`` from its ``record``: with the source's card kept in
    surgery.undo and the edits named by the folder's own architecture."""
    return card_text(record, _source_card(folder, record), _architecture(folder))
