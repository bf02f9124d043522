"""Loading tiny checkpoints in tests: the model in float32, its stored tensors, its logits."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from surgery.core.checkpoint import Checkpoint


def load_fp32(path: str | Path):
    """The checkpoint as transformers loads it, in float32, in eval mode."""
    from surgery.model.loading import auto_class

    model_type = Checkpoint(Path(path)).config["model_type"]
    return auto_class(model_type).from_pretrained(path, dtype=torch.float32).eval()


def stored_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's weight files, as stored."""
    from safetensors import safe_open

    path = Path(path)
    out = {}
    for f in Checkpoint(path).weight_files:
        with safe_open(str(path / f), "pt") as st:
            out.update({k: st.get_tensor(k) for k in st.keys()})
    return out


def logits(model, edits: Iterable = (), seed: int = 1) -> torch.Tensor:
    """The model's logits on fixed random ids, with ``edits`` applied at run time (hooks)."""
    from surgery.model.hooks import applied

    ids = torch.randint(3, 90, (2, 10), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad(), applied(model, list(edits)):
        return model(input_ids=ids).logits


def assert_same_function(got: torch.Tensor, want: torch.Tensor, model) -> None:
    """Logits of two computations of one function on bit-identical float32 weights, held in another
    layout (decoded per call, or read in place from a file at an offset that is not 64-byte aligned):
    equal up to float32 summation order, not bit for bit. A GEMM kernel may take another path for
    another alignment or CPU vector width (AVX-512 against AVX2), and so sum in another order; the
    bound is the one ``surgery verify`` allows between two such computations (surgery/bake/tolerance.py)."""
    from surgery.bake.tolerance import logit_tolerance
    from surgery.model.hooks import model_architecture

    got, want = got.detach(), want.detach()
    layers = model_architecture(model).geometry.num_layers
    tolerance = logit_tolerance({"F32"}, float(want.abs().max()), layers).value
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    assert float((got - want).abs().max()) <= tolerance, (float((got - want).abs().max()), tolerance)
