"""Exact PEFT LoRA export: an adapter whose effect on the source is exactly the recipe.

Every twin site of an edit (surgery/core/sites.py) scales input features of one module by s: o_proj's
d columns for a head, down_proj's column for a neuron. That is the low-rank update ΔW = B·A with A
selecting the edited columns (one-hot rows) and B = (s − 1)·W[:, columns], so W + B·A holds s·W in
the edited columns and W elsewhere. With ``lora_alpha = r`` the LoRA scaling is 1 and nothing else
changes. Pruned neurons (s = 0) give B = −W_down[:, i]; their gate/up rows (bake-only sites) stay,
but the neuron's output is multiplied by a zero column.

A direction edit's projection site is rank 1: W′ = (I − w·r·rᵀ)·W·S = W·S + B·A with A = rᵀ·W·S
(S: the module's column scales, if a head or neuron edit scales it too) and B = −w·r, appended to
the module's scale factors. Every routed expert's down matrix projected is one adapter on the fused
3-D parameter (PEFT's ``target_parameters``), rank 1 per expert. A projected bias has no adapter
(PEFT leaves biases as they are): such a recipe is refused in one line, as vLLM is for experts.

``vllm=True`` pads every module to one rank from ``VLLM_RANKS`` (vLLM ignores per-module ranks):
the padding is zero rows of A and zero columns of B, so the product is unchanged.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..core import finite_json
from ..core.architectures import Architecture
from ..core.checkpoint import Checkpoint
from ..core.edits import Recipe, edit_kinds
from ..core.errors import CheckpointError, RecipeError
from ..core.resolve import Resolver
from ..core.sites import all_sites, sites
from ..core.staging import staged_output
from ..core.strict_files import load_json
from ..model.hooks import scale_vectors
from ..model.loading import Source, local_source
from .bake import hash_files
from .card import adapter_card
from .provenance import ADAPTER_PROVENANCE_NAME
from .record import AdapterRecord

VLLM_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
ADAPTER_WEIGHTS = "adapter_model.safetensors"
COUNTED_SINCE_0_1 = ("head", "neuron")  # surgery_adapter.json counts these kinds even at 0 (the 0.1 layout)


@dataclass
class LoraModule:
    """One adapted module: its full name in the loaded model and its LoRA factors (fp32).

    With ``experts`` > 1 it is a fused 3-D experts parameter (``name`` is the parameter's): PEFT's
    layout, A = (experts · rank, in) with expert e's rows at e·rank…, B = (out, rank · experts) with
    expert e's columns at k·experts + e.
    """

    name: str
    A: torch.Tensor  # (rank [· experts], in_features)
    B: torch.Tensor  # (out_features, rank [· experts])
    experts: int = 1
    conv1d: bool = False  # the base module is a Conv1D (weight stored [in, out]: PEFT's fan_in_fan_out)
    # The name its weights are saved under: the module as the family's releases name it, since
    # PEFT renames an adapter's weights with transformers' checkpoint conversion when it loads them.
    saved_as: str = ""

    @property
    def key(self) -> str:
        """The name ``lora_A``/``lora_B`` are saved under (see ``saved_as`` and :attr:`module`)."""
        return self.saved_as or self.module

    @property
    def rank(self) -> int:
        return self.A.shape[0] // self.experts

    @property
    def module(self) -> str:
        """The module whose ``lora_A``/``lora_B`` hold the factors (a parameter's owner)."""
        return self.name.rsplit(".", 1)[0] if self.experts > 1 else self.name

    def padded(self, rank: int) -> LoraModule:
        """The same update at a larger rank (zero rows of A, zero columns of B)."""
        extra = rank - self.rank
        A = torch.cat([self.A, self.A.new_zeros(extra, self.A.shape[1])])
        B = torch.cat([self.B, self.B.new_zeros(self.B.shape[0], extra)], dim=1)
        return LoraModule(self.name, A, B, self.experts, self.conv1d, self.saved_as)


def meta_model(ckpt: Checkpoint) -> torch.nn.Module:
    """The model as transformers loads it, built on the meta device (no weights).

    Multimodal wrappers (Gemma-3) name their text layers differently in the checkpoint and in the
    loaded model; PEFT matches the loaded model's names, so they are read from a real instance.
    """
    from transformers import AutoConfig

    from ..model.loading import auto_class

    config = AutoConfig.from_pretrained(str(ckpt.path))
    with torch.device("meta"):
        return auto_class(config.model_type).from_config(config)


def peft_moved_targets(config, model: torch.nn.Module) -> list[str]:
    """The target modules of ``config`` that PEFT, loading the adapter on ``model``, would not adapt as named.

    For transformers 5, PEFT renames the gate/up/down (w1/w2/w3) targets of mixture-of-experts model
    types to their fused experts' parameters by the module's last name, a dense MLP's and a shared
    expert's as well; such an adapter would act on the routed experts. PEFT's own conversion is run
    on a copy of the config (PEFT versions without it rename nothing).
    """
    import importlib.util
    from copy import deepcopy

    if importlib.util.find_spec("peft.utils.transformers_weight_conversion") is None:
        return []
    from peft.utils.transformers_weight_conversion import (
        convert_peft_config_for_transformers,
        get_model_conversion_mapping,
    )

    probe = deepcopy(config)
    convert_peft_config_for_transformers(probe, model=model, conversions=get_model_conversion_mapping(model))
    return sorted(set(config.target_modules) - set(probe.target_modules or ()))


def _read_weight(ckpt: Checkpoint, name: str) -> torch.Tensor:
    from safetensors import safe_open

    info = ckpt.tensor(name)
    with safe_open(str(ckpt.path / info.file), framework="pt") as f:
        return f.get_tensor(name).float()


def plan_ranks(arch: Architecture, recipe: Recipe) -> dict[tuple[str, int], torch.Tensor]:
    """Per (module, layer): the scale vector of its input features, from the recipe's twin sites
    (only modules the recipe scales); a recipe with an edit that has no exact adapter is refused."""
    refused = [(e, why) for e in recipe.active() if (why := e.lora_refusal(arch))]
    if refused:
        (first, why), more = refused[0], len(refused) - 1
        raise RecipeError(f"export-lora: {first.kind} {first.label}{f' and {more} more' if more else ''}: {why}")
    vectors = scale_vectors(arch, recipe.active())
    return {key: v for key, v in vectors.items() if bool((v != 1).any())}


def _projections(resolver: Resolver, recipe: Recipe) -> tuple[dict, dict]:
    """The recipe's projection sites: per dense (module, layer) its slice, and per layer the slices
    of its routed experts' down matrices (by expert). A projected bias is refused."""
    arch, dense, experts = resolver.arch, {}, {}
    for e in recipe.active():
        for sl in resolver.all(sites(arch, e)):
            if sl.site.op != "project":
                continue
            if sl.is_bias:
                raise RecipeError(
                    f"export-lora: {e.kind} {e.label}: '{sl.tensor}' is projected too, and a LoRA "
                    "adapter cannot change a bias; ship the baked checkpoint instead"
                )
            if sl.site.expert is None:
                dense[(sl.site.module, sl.site.layer)] = sl
            else:
                experts.setdefault(sl.site.layer, {})[sl.site.expert] = sl
    return dense, experts


def _expert_module(
    ckpt: Checkpoint, arch: Architecture, loaded: str, layer: int, slices: dict[int, Any], transposed: bool
) -> LoraModule:
    """Every routed expert's down matrix projected, as one rank-1-per-expert adapter on the fused
    parameter: ΔW_e = B_e·A_e with A_e = rᵀ·W_e, B_e = −w·r (W_e in [hidden, expert width] orientation).

    ``transposed``: PEFT reads this parameter's update as [hidden, expert width]ᵀ (Llama 4: stored [E,
    width, hidden] in memory, with no ``is_transposed`` flag for PEFT to see); the update is then
    ΔW_eᵀ = (W_eᵀ·r)·(−w·rᵀ), so the two factors trade places."""
    first, E = slices[0], arch.geometry.num_experts
    r = torch.from_numpy(first.site.unit().copy())
    stored = _read_weight(ckpt, first.tensor)
    reads, writes = [], []  # per expert: rᵀ·W_e (expert width), −w·r (hidden)
    for e in range(E):
        sl = slices[e]
        W = _read_weight(ckpt, sl.tensor) if sl.tensor != first.tensor else stored
        W = W[e] if sl.window is not None else W  # the expert's window of a fused tensor
        reads.append(r @ W if sl.as_rows else W @ r)  # stored [in, out] when the residual runs along columns
        writes.append(-first.site.scale * r)
    A, B = (writes, reads) if transposed else (reads, writes)
    return LoraModule(
        f"{arch.module_name(loaded, layer, arch.layout.experts.weights.module)}.down_proj",
        torch.stack(A),
        torch.stack(B, dim=1),
        E,
    )


def lora_modules(ckpt: Checkpoint, recipe: Recipe, model: torch.nn.Module | None = None) -> list[LoraModule]:
    """The exact LoRA factors of ``recipe`` on ``ckpt``, read with safetensors (no weights loaded);
    ``model``: the model as transformers builds it, on the meta device (default: built here, :func:`meta_model`)."""
    arch = recipe.validate(ckpt.config)
    resolver = Resolver(arch, ckpt.tensors)
    model = meta_model(ckpt) if model is None else model
    names = dict(model.named_modules())
    loaded = arch.layer_prefix(names)
    scaled = plan_ranks(arch, recipe)
    projected, experts = _projections(resolver, recipe)
    weights = {
        (s.module, s.layer): sl.tensor
        for sl in resolver.all(all_sites(arch, recipe.active()))
        if (s := sl.site).twin and not sl.is_bias and s.expert is None
    }
    modules = []
    for module, layer in sorted(set(scaled) | set(projected), key=lambda key: (key[1], key[0])):
        W = _read_weight(ckpt, weights[(module, layer)])
        conv1d = arch.stored_flipped(module)
        W = W.T if conv1d else W  # the [out, in] map of a Conv1D's [in, out] weight
        scales = scaled.get((module, layer), torch.ones(W.shape[1]))
        idx = torch.nonzero(scales != 1).flatten()
        A = torch.zeros(len(idx), W.shape[1])
        A[torch.arange(len(idx)), idx] = 1.0
        B = W[:, idx] * (scales[idx] - 1.0)
        if (module, layer) in projected:  # rank 1 more: −w·r ⊗ rᵀ·W·S
            site = projected[(module, layer)].site
            r = torch.from_numpy(site.unit().copy())
            A = torch.cat([A, (r @ (W * scales))[None]])
            B = torch.cat([B, (-site.scale * r)[:, None]], dim=1)
        name = arch.module_name(loaded, layer, module)
        saved_as = arch.module_name(loaded, layer, arch.stored_module(module))
        modules.append(LoraModule(name, A, B, conv1d=conv1d, saved_as=saved_as))
    for layer, slices in sorted(experts.items()):
        # PEFT takes a 3-D parameter as [experts, out, in] unless its module says ``is_transposed`` (read as
        # PEFT reads it, absent = False); the table says whether the loaded layout is [experts, in, out].
        flagged = getattr(
            names[arch.module_name(loaded, layer, arch.layout.experts.weights.module)], "is_transposed", False
        )
        modules.append(
            _expert_module(ckpt, arch, loaded, layer, slices, arch.layout.experts.weights.transposed != flagged)
        )
    return modules


def vllm_rank(needed: int) -> int:
    """The smallest rank vLLM accepts that holds ``needed``; a clear error above the largest."""
    for r in VLLM_RANKS:
        if r >= needed:
            return r
    raise RecipeError(
        f"one module of this recipe needs LoRA rank {needed}, above vLLM's largest "
        f"max_lora_rank {VLLM_RANKS[-1]}; split the recipe into smaller adapters, "
        "bake it into the weights instead, or export without --vllm"
    )


def peft_config(modules: list[LoraModule], base: str, vllm: bool):
    """A LoraConfig with scaling 1 everywhere (lora_alpha = r per module); fused experts parameters
    through ``target_parameters`` (their rank pattern keyed by the parameter's name)."""
    from peft import LoraConfig

    ranks = {m.name: m.rank for m in modules}
    common = max(ranks.values())
    linear = sorted(m.name for m in modules if m.experts == 1)
    fused = sorted(m.name for m in modules if m.experts > 1)
    # PEFT adapts a Conv1D (GPT-2) with fan_in_fan_out=True: the forward pass is the same either way,
    # merging transposes the update to the stored [in, out] weight. No family mixes Conv1D and Linear.
    kw = dict(
        r=common,
        lora_alpha=common,
        target_modules=linear or None,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base,
        fan_in_fan_out=any(m.conv1d for m in modules),
        **({"target_parameters": fused} if fused else {}),
    )
    if vllm:
        return LoraConfig(**kw)
    other = {name: r for name, r in ranks.items() if r != common}
    return LoraConfig(**kw, rank_pattern=other, alpha_pattern=dict(other))


def peft_base(source: Source) -> str:
    """adapter_config.json's ``base_model_name_or_path``: the Hub id, for a GGUF file the Hub repo its
    metadata says it was converted from (PEFT cannot load the file), else the local path."""
    from ..gguf import is_gguf
    from ..gguf.hub_origin import file_hub_origin

    named = source.hub_id or (is_gguf(source.path) and source.path.is_file() and file_hub_origin(source.path))
    return named or str(source.path)


def refuse_quantized(ckpt: Checkpoint) -> None:
    """One line when ``ckpt`` stores quantized weights: an adapter's factors are read from the stored
    weights, which must be the floats."""
    if ckpt.format.quantized:
        raise CheckpointError(
            f"export-lora writes an adapter from float weights, and {ckpt.path} stores "
            f"{ckpt.format.describe()} weights: bake the recipe into the checkpoint itself (exact in its own "
            "format), or export the adapter from the float model it was quantized from"
        )


def export_lora(
    ckpt: Checkpoint,
    recipe: Recipe,
    out: str | Path,
    *,
    vllm: bool = False,
    force: bool = False,
    source: Source | None = None,
    report: Callable[[str], None] = lambda m: None,
) -> AdapterRecord:
    """Write a PEFT LoRA adapter equal to ``recipe`` at ``out`` (atomically); return its record
    (surgery_adapter.json). ``report`` hears how to load an adapter whose base PEFT cannot load."""
    from safetensors.torch import save_file

    from ..gguf import is_gguf

    refuse_quantized(ckpt)
    arch = recipe.validate(ckpt.config)
    model = meta_model(ckpt)
    modules = lora_modules(ckpt, recipe, model)
    if not modules:
        raise RecipeError(
            "the recipe changes nothing (every α and factor is 1, every weight 0): there is no adapter to export"
        )
    if vllm and any(m.experts > 1 for m in modules):
        raise RecipeError(
            "export-lora --vllm: vLLM serves no adapter on the fused experts parameters that a "
            "direction edit of 'experts' adapts; export without --vllm, or ship the baked checkpoint"
        )
    needed = max(m.rank for m in modules)
    rank = vllm_rank(needed) if vllm else needed
    if vllm:
        modules = [m.padded(rank) for m in modules]
    source = source or local_source(ckpt.path)
    base = peft_base(source)
    config = peft_config(modules, base, vllm)
    if moved := peft_moved_targets(config, model):  # an adapter PEFT loads elsewhere is not the recipe
        import peft

        raise RecipeError(
            f"export-lora: PEFT {peft.__version__} would load the adapter of '{moved[0]}'"
            f"{f' and {len(moved) - 1} more' if len(moved) > 1 else ''} onto {arch.model_type}'s "
            "fused experts (it renames mixture-of-experts targets by name), so it would not be this "
            "edit; ship the baked checkpoint instead, or export head edits alone"
        )
    tensors = {}
    for m in modules:
        tensors[f"base_model.model.{m.key}.lora_A.weight"] = m.A.contiguous()
        tensors[f"base_model.model.{m.key}.lora_B.weight"] = m.B.contiguous()
    counts = Counter(e.kind for e in recipe.active())
    record = AdapterRecord(
        tool_version=__version__,
        source=source,
        model_type=arch.model_type,
        recipe=recipe,
        vllm=vllm,
        max_rank=rank,
        modules={m.name: m.rank for m in modules},
        # "heads": 2, "neurons": 40, …: the kinds surgery 0.1 counted always (0 when the recipe has
        # none, as its records did), any later kind when the recipe has it
        extra={f"{kind}s": counts.get(kind, 0) for kind in edit_kinds() if kind in counts or kind in COUNTED_SINCE_0_1},
    )
    with staged_output(Path(out), [ckpt.path], force) as tmp:
        _save_adapter_config(config, tmp)
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (tmp / "README.md").write_text(adapter_card(record, arch), encoding="utf-8")
        record.files = hash_files(tmp, sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()))
        (tmp / ADAPTER_PROVENANCE_NAME).write_text(
            finite_json.dumps(record.to_dict(), indent=1) + "\n", encoding="utf-8"
        )
    if base == str(source.path) and is_gguf(source.path):  # PEFT cannot load a GGUF file as base
        report(
            f"adapter_config.json names {source.path.name} as the base model (its metadata names no Hub repo), "
            f"which PEFT cannot load: load its import (`surgery import-gguf {source.path.name} --out DIR`) "
            "and put the adapter on it with PeftModel.from_pretrained"
        )
    return record


def _save_adapter_config(config: Any, folder: Path) -> None:
    """PEFT's adapter_config.json with its sets (target_modules) sorted: PEFT writes a set in hash order,
    which differs between processes, so the same export would not give the same bytes twice."""
    config.save_pretrained(str(folder))
    path = folder / "adapter_config.json"
    written = load_json(path.read_text(encoding="utf-8"))
    for key, value in config.to_dict().items():
        if isinstance(value, set):
            written[key] = sorted(value)
    path.write_text(json.dumps(written, indent=2, sort_keys=True), encoding="utf-8")  # PEFT's own layout
