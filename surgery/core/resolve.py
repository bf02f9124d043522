"""A site resolved to the stored tensors it touches: the one place that turns sites into tensor names.

A :class:`~surgery.core.sites.Site` names a module relative to a decoder layer ("self_attn.o_proj",
"mlp.experts.down") and the columns or rows it scales. A checkpoint stores that module under its
own layer prefix, with or without a bias, and a routed expert's matrix either as a tensor of its own
or as one expert's window of a fused 3-D tensor (possibly transposed, gate and up interleaved).
:class:`Resolver` answers, once per checkpoint, where each site lies: a list of :class:`TensorSlice`.
The byte plan, the bake's check, verify, the vanishing guard, the LoRA export and the card all read
these slices instead of spelling tensor names themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from .architectures import Architecture
from .errors import RecipeError
from .sites import Site


@dataclass(frozen=True)
class TensorSlice:
    """The part of one stored tensor a site scales.

    The tensor is viewed as 2-D ([all leading dims, last dim]; a 1-D bias as [n, 1]). ``lines`` are
    rows of that view when ``as_rows``, else columns; with ``window`` set they are relative to the
    block of ``window`` rows starting at ``first_row`` (one expert of a fused tensor), and columns
    apply within that block only. A projection site's slice is the whole tensor (or window), with
    no ``lines``: ``as_rows`` then says that the residual stream runs along its rows (else its columns).
    """

    tensor: str  # the name in the checkpoint
    shape: tuple[int, ...]  # the shape the config says it has (checked against the header)
    lines: tuple[int, ...]
    as_rows: bool
    scale: float
    site: Site
    first_row: int = 0
    window: int | None = None
    is_bias: bool = False

    @property
    def key(self) -> str:
        """One patch per key: a tensor, or one expert's window of a fused tensor."""
        return self.tensor if self.window is None else f"{self.tensor}#{self.first_row}"


class Resolver:
    """Where the sites of ``arch`` lie in a checkpoint whose tensors are ``names``."""

    def __init__(self, arch: Architecture, names: Iterable[str]):
        self.arch = arch
        self.names = frozenset(names)
        # loaded name → stored name (the same but where the family's conversion renames whole names)
        self._renamed = arch.loaded_names(self.names)
        self.prefix = arch.layer_prefix(self._renamed)
        self._experts: tuple[tuple[str, str] | None] | None = None

    @property
    def stored_experts(self) -> tuple[str, str] | None:
        """The fused (gate_up, down) tensors of routed experts; None when stored one tensor per expert."""
        if self._experts is None:
            self._experts = (self.arch.stored_experts(self.names),)
        return self._experts[0]

    @property
    def fused_experts(self) -> bool:
        """Whether routed experts are stored fused (3-D) rather than one tensor per expert."""
        return self.stored_experts is not None

    def stored(self, layer: int | None, module: str, part: str = "weight") -> str:
        """The checkpoint's name of ``module``'s ``part`` (weight, bias) in ``layer``: ``module`` is an
        in-memory name relative to a layer (``layer`` None: relative to the layer list's siblings, e.g.
        the embeddings); the checkpoint may hold it under that name, under the family's conversion
        renames (``Names.renames``) or under its releases' own module name (``Names.stored_names``)."""
        if layer is None:
            prefix = self.arch.root_prefix(self._renamed)
        else:  # a sub-layer's module (LongCat-Flash) is named in its decoder layer
            decoder, module = self.arch.block(layer, module)
            prefix = self.prefix.format(layer=decoder)
        loaded = f"{prefix}{module}.{part}"
        if loaded in self._renamed:
            return self._renamed[loaded]
        release = f"{prefix}{self.arch.stored_module(module)}.{part}"
        return release if release in self.names else loaded

    def slices(self, site: Site) -> list[TensorSlice]:
        """The tensor slices ``site`` scales (or projects), weight first, then its bias entries (output
        sites); an addition's: its bias alone."""
        if site.op == "add":
            return self._added_bias(site)
        if site.expert is not None:
            return self._expert_slices(site)
        flipped = self.arch.stored_flipped(site.module)
        first, window = site.rows or (0, None)  # a grouped site: its columns within its block of rows
        # A Conv1D stores [in, out]: the map's columns are its stored rows and vice versa.
        out = [
            TensorSlice(
                self.stored(site.layer, site.module),
                self.arch.stored_shape(site.module, site.shape),
                site.indices,
                (site.axis == "out") != flipped,
                site.scale,
                site,
                first_row=first,
                window=window,
            )
        ]
        # Output features: the rows and, where the checkpoint has one, the bias entries.
        bias = self.stored(site.layer, site.module, "bias")
        if site.axis == "out" and bias in self.names:
            out.append(TensorSlice(bias, (site.shape[0],), site.indices, True, site.scale, site, is_bias=True))
        return out

    def _expert_slices(self, site: Site) -> list[TensorSlice]:
        """A routed expert's matrix, on the tensors its on-disk layout stores it in."""
        arch, fused = self.arch, self.fused_experts
        part = site.module.rsplit(".", 1)[1]
        prefix = self.arch.module_name(self.prefix, site.layer, "")
        lines = (
            site.indices
            if site.axis == "in"
            else tuple(r for i in site.indices for r in arch.expert_rows(part, i, fused))
        )
        out = []
        for rel, shape, first, window, flipped in arch.expert_slices(site.expert, part, fused, self.stored_experts):
            # "in" = columns of the [out, in] matrix; a transposed (flipped) window stores them as rows.
            as_rows = (site.axis == "out") != flipped
            out.append(
                TensorSlice(
                    f"{prefix}{rel}",
                    shape,
                    lines,
                    as_rows,
                    site.scale,
                    site,
                    first_row=first if fused else 0,
                    window=window if fused else None,
                    is_bias=rel.endswith("_bias"),
                )
            )
        if site.op == "project":  # the expert's output bias is projected with its down matrix
            out += self._expert_down_bias(site, prefix, out[0])
        return out

    def _expert_down_bias(self, site: Site, prefix: str, weight: TensorSlice) -> list[TensorSlice]:
        """The bias of a routed expert's down matrix where the checkpoint has one: the expert's row
        of the fused [E, hidden] ``…_bias`` tensor (GPT-OSS), or the per-expert tensor's ``.bias``."""
        H, E = self.arch.geometry.hidden_size, self.arch.geometry.num_experts
        if weight.window is not None:
            name = f"{weight.tensor}_bias"
            if name in self.names:
                return [
                    TensorSlice(
                        name, (E, H), (), False, site.scale, site, first_row=site.expert, window=1, is_bias=True
                    )
                ]
            return []
        name = weight.tensor.removesuffix(".weight") + ".bias"
        return [TensorSlice(name, (H,), (), True, site.scale, site, is_bias=True)] if name in self.names else []

    def _added_bias(self, site: Site) -> list[TensorSlice]:
        """The output bias an addition (a steer edit) changes: the projection's bias slices, or a
        one-line refusal when the checkpoint stores none."""
        biases = [sl for sl in self.slices(replace(site, op="project")) if sl.is_bias]
        if not biases:
            module = site.module if site.layer is None else self.arch.block(site.layer, site.module)[1]
            where = "every routed expert's down matrix" if site.expert is not None else f"'{module}'"
            raise RecipeError(
                f"steer: {where} of layer {site.layer} has no bias in this checkpoint ({self.arch.model_type}); "
                "adding one would change the checkpoint's tensor names and config, which surgery never does: "
                "use a direction edit (the projection) or a model whose output matrices have biases"
            )
        return [replace(sl, site=site) for sl in biases]

    def all(self, sites: Iterable[Site]) -> list[TensorSlice]:
        """The slices of every site, in site order."""
        return [s for site in sites for s in self.slices(site)]
