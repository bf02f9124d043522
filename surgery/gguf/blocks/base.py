"""The declared interface of a GGUF block type, its registry, and the exact edit every quantized one shares.

A GGUF tensor is stored in one ggml type (gguf-py's ``GGMLQuantizationType``): runs of blocks of
``values`` numbers in ``nbytes`` bytes each (a float type: one value). One subclass of
:class:`GgufBlockType` per type says what an edit can do to its blocks: whether one value can be
zeroed alone (:attr:`~GgufBlockType.zeroes_values`), the new bytes of blocks whose values are
multiplied by factors, exactly or refused in one line (:meth:`~GgufBlockType.edit`), and whether
gguf-py can requantize it when ``--requantize`` lets an inexact edit be rounded
(:attr:`~GgufBlockType.requantizable`). A subclass that sets ``name`` (the ``GGMLQuantizationType``
member's name, which the GGUF header reader gives every tensor) registers itself.

:class:`QuantizedBlocks` is the edit the block types share: every block's scale carries a factor on
the whole block; values are zeroed alone where the type can; gguf-py's dequantizer must then give, bit
for bit in float32, the old values times the factors, for every block (it is checked, not assumed),
or the block is requantized (``requantize``) or the edit refused.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ...core.errors import RecipeError
from ...core.optional import require
from ...core.registry import register

_REGISTRY: dict[str, type[GgufBlockType]] = {}
ROW_BLOCKS = 256  # blocks handed to gguf-py's dequantizer as one row (it decodes 16 rows per numpy call)


IMPORT = "import the GGUF (surgery import-gguf) and bake the checkpoint"


@dataclass(frozen=True)
class PartialEdit:
    """What an edit that scales part of a block is, as its refusal names it, and what the user can
    do instead besides ``--requantize`` (the plan knows the edit; a block type only its factors)."""

    what: str = "the edit"
    instead: tuple[str, ...] = (IMPORT,)

    def options(self, requantize: str | None) -> str:
        """``requantize`` (when the type can: "add --requantize") and the alternatives, as one clause."""
        said = [*([requantize] if requantize else []), *self.instead]
        return said[0] if len(said) == 1 else ", ".join(said[:-1]) + ", or " + said[-1]


@dataclass
class Edited:
    """New bytes of the edited blocks, and what requantizing some of them cost."""

    blocks: np.ndarray  # (U, bytes) uint8
    requantized: int = 0  # blocks rewritten by quantization rather than exactly
    max_abs_error: float = 0.0  # over the requantized blocks: max |dequantized − edited values|
    rel_rms_error: float = 0.0  # ‖dequantized − edited‖ / ‖edited‖ over them


class GgufBlockType(ABC):
    """One ggml tensor type as an edit sees its blocks; stateless (an instance per lookup)."""

    name: ClassVar[str]  # the GGMLQuantizationType member's name; a subclass that sets it registers itself
    # gguf-py quantizes it, so an inexact edit may be rounded into it (``--requantize``)
    requantizable: ClassVar[bool] = False
    # one value of a block can be set to 0 alone, exactly (a pruned neuron's down column)
    zeroes_values: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register(_REGISTRY, cls, "GGUF block types")

    @property
    def qtype(self) -> Any:
        """gguf-py's ``GGMLQuantizationType`` member of this type."""
        return require("gguf").GGMLQuantizationType[self.name]

    @property
    def block_shape(self) -> tuple[int, int]:
        """(values, bytes) of one block (a float type: one value)."""
        return require("gguf").GGML_QUANT_SIZES[self.qtype]

    def dequantize(self, blocks: np.ndarray) -> np.ndarray:
        """float32 values (U, values) of ``blocks`` (U, bytes: one block or several a row), by gguf-py's
        dequantizer.

        gguf-py decodes a tensor 16 rows per numpy call; given one block a row, a bake's scattered blocks
        (a pruned neuron's down column is a block in every row) took a call per 16 blocks, most of the
        bake's time. Each block decodes on its own, so they are handed over :data:`ROW_BLOCKS` a row
        (the last row filled with zero bytes, whose values are dropped): the same values, in few calls."""
        gguf = require("gguf")
        values, width = self.block_shape
        each = blocks.reshape(-1, width)  # one block a row (a caller may give rows of several)
        count = len(each)
        if count > 1:
            rows = -(-count // ROW_BLOCKS)
            padded = np.zeros((rows * ROW_BLOCKS, width), dtype=np.uint8)
            padded[:count] = each
            each = padded.reshape(rows, ROW_BLOCKS * width)
        return gguf.quants.dequantize(each, self.qtype).reshape(-1, values)[:count].reshape(len(blocks), -1)

    def quantize(self, values: np.ndarray) -> np.ndarray:
        """Blocks (U, bytes) of ``values`` (U, values), quantized as gguf-py does."""
        gguf = require("gguf")
        out = gguf.quants.quantize(np.ascontiguousarray(values, dtype=np.float32), self.qtype)
        return np.ascontiguousarray(out).view(np.uint8).reshape(len(values), -1)

    @abstractmethod
    def edit(
        self, blocks: np.ndarray, factors: np.ndarray, tensor: str, requantize: bool, part: PartialEdit = PartialEdit()
    ) -> Edited:
        """New bytes for ``blocks`` (U, bytes) whose values are multiplied by ``factors`` (U, values):
        exactly, or refused in one line naming ``tensor`` unless ``requantize`` (then the error is measured);
        ``part`` names the edit where it scales part of a block."""


class QuantizedBlocks(GgufBlockType):
    """A block type whose values share a scale: a factor on a whole block goes through it (:meth:`scaled`),
    a 0 on single values through the codes where the type can (:meth:`zeroed`), the rest is requantized
    or refused. Every block is checked against gguf-py's dequantizer."""

    # why a factor on part of a block cannot go through its scale, as the refusal says it
    part_reason: ClassVar[str] = "a block has one scale for all its values"

    @abstractmethod
    def scaled(self, blocks: np.ndarray, factor: np.ndarray) -> np.ndarray:
        """``blocks`` with each block's scale times its ``factor`` (U,); a block the scale cannot carry
        the factor for may be left as it is: the exactness check then finds it."""

    def zeroed_whole(self, blocks: np.ndarray, scaled: np.ndarray) -> np.ndarray:
        """Blocks multiplied by 0 as a whole, given ``scaled`` (their scale times 0): that, where a 0
        scale zeroes every value."""
        return scaled

    def zeroed(self, blocks: np.ndarray, factors: np.ndarray) -> np.ndarray:
        """``blocks`` with each value whose factor is 0 set to an exact 0 (types that ``zeroes_values``)."""
        raise NotImplementedError(f"{self.name} cannot zero a single value")

    def edit(
        self, blocks: np.ndarray, factors: np.ndarray, tensor: str, requantize: bool, part: PartialEdit = PartialEdit()
    ) -> Edited:
        old = self.dequantize(blocks)
        with np.errstate(over="ignore", invalid="ignore"):
            want = old * factors.astype(np.float32)
        uniform = (factors == factors[:, :1]).all(axis=1)
        new = self.scaled(blocks, factors[:, 0])
        whole = uniform & (factors[:, 0] == 0)
        if whole.any():
            new[whole] = self.zeroed_whole(blocks[whole], new[whole])
        if not uniform.all():
            parts = ~uniform
            if self.zeroes_values and np.isin(factors[parts], (0.0, 1.0)).all():
                new[parts] = self.zeroed(blocks[parts], factors[parts])
            elif not requantize:
                raise RecipeError(self._part_refusal(tensor, factors.shape[1], part))
        exact = (self.dequantize(new) == want).all(axis=1)
        if exact.all():
            return Edited(new)
        if not requantize:
            # name the factor: one recipe's edits scale many tensors, the ready ones by α 2.5
            named = ", ".join(f"{f:g}" for f in np.unique(factors[~exact, 0]))
            raise RecipeError(
                f"{tensor} ({self.name}): the factor {named} times the blocks' scales is not exact (the product "
                f"must be a {self.name} scale and scale the dequantized float32 values exactly, as a power of two "
                "does); use a power of two" + (", or --requantize" if self.requantizable else "")
            )
        if not self.requantizable:
            if not uniform.all():  # part of a block, which requantizing would have carried: said as without it
                raise RecipeError(self._part_refusal(tensor, factors.shape[1], part))
            raise RecipeError(
                f"{tensor} ({self.name}): the edit is not exact in {self.name} and gguf-py cannot requantize "
                f"{self.name} (only {', '.join(requantizable())}); use a power-of-two factor"
            )
        redo = ~exact
        new[redo] = self.quantize(want[redo])
        err = self.dequantize(new[redo]) - want[redo]
        norm = float(np.sqrt((want[redo].astype(np.float64) ** 2).sum()))
        return Edited(
            new,
            int(redo.sum()),
            float(np.abs(err).max()),
            float(np.sqrt((err.astype(np.float64) ** 2).sum())) / norm if norm else 0.0,
        )

    def _part_refusal(self, tensor: str, values: int, part: PartialEdit) -> str:
        fix = part.options("add --requantize" if self.requantizable else None)
        cannot = "" if self.requantizable else f"gguf-py cannot requantize {self.name}: "
        return (
            f"{tensor} ({self.name}): {part.what} scales part of a {values}-value block, and {self.part_reason}; "
            f"{cannot}{fix}"
        )


def registered() -> list[type[GgufBlockType]]:
    """Every registered block type, in the order of registration."""
    return list(_REGISTRY.values())


def supported() -> tuple[str, ...]:
    """The names of the types surgery edits, in the order of registration."""
    return tuple(_REGISTRY)


def requantizable() -> tuple[str, ...]:
    """The names of the types gguf-py requantizes an inexact edit into."""
    return tuple(name for name, cls in _REGISTRY.items() if cls.requantizable)


def block_type(kind: Any, tensor: str = "a tensor") -> GgufBlockType:
    """The block type of a tensor stored as ``kind`` (a ``GGMLQuantizationType`` or its name), or a
    one-line refusal naming ``tensor`` when no registered type edits it."""
    name = getattr(kind, "name", kind)
    cls = _REGISTRY.get(name)
    if cls is None:
        raise RecipeError(
            f"{tensor} is stored as {name}, which surgery cannot edit in a GGUF (no scale field "
            f"carries an edit); supported types: {', '.join(supported())}"
        )
    return cls()
