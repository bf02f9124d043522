"""A pass with gradients (find-heads' attribution screen) at stored-precision memory (surgery/model/rewiden.py):
autograd keeps no layer's float32 copy until the backward, which widens each again, and the logits and
gradients are those of the copies kept, bit for bit."""

from __future__ import annotations

import weakref

import pytest
import torch

from surgery.find.heads.atp import frozen
from surgery.model.loading import LoadSpec, load_model
from surgery.model.rewiden import Rewidening
from tests.support.tiny import build_tiny

CPU = LoadSpec(device="cpu")  # float32 compute
CASES = {
    "llama": lambda path: build_tiny("llama", path, dtype=torch.bfloat16, vocab_size=1000),
    "llama-tied": lambda path: build_tiny("llama", path, dtype=torch.bfloat16, tie_word_embeddings=True),
    "mixtral": lambda path: build_tiny("mixtral", path, dtype=torch.float16),
}


def _input_gradient(model, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, ∂Σlogits²/∂embeds) with the weights frozen, as the screen runs."""
    embeds = embeds.detach().requires_grad_(True)
    with frozen(model):
        logits = model(inputs_embeds=embeds).logits
        (grad,) = torch.autograd.grad(logits.square().sum(), embeds)
    return logits.detach(), grad


def _spy(monkeypatch) -> tuple[list[tuple[str, weakref.ref]], dict[str, str]]:
    """Every float32 copy the upcast and the head's chunks make, as (phase, weak reference), and the phase
    (the caller switches it)."""
    from surgery.model import upcast, vocab_table

    made: list[tuple[str, weakref.ref]] = []
    phase = {"now": "forward"}
    for module in (upcast, vocab_table):

        def spy(*args, _widen=module._widened):
            wide = _widen(*args)
            made.append((phase["now"], weakref.ref(wide)))
            return wide

        monkeypatch.setattr(module, "_widened", spy)
    return made, phase


def _chunked_head(monkeypatch) -> None:
    """The head's logits in chunks of the fewest rows (the tiny tables are smaller than a layer: one chunk)."""
    from surgery.model import vocab_table

    attach = vocab_table.attach_table
    monkeypatch.setattr(vocab_table, "attach_table", lambda m, _: attach(m, vocab_table.ALIGN * m.config.hidden_size))


@pytest.mark.parametrize("chunks", ["one", "several"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_backward_widens_each_call_again_with_the_kept_copies_gradients(tmp_path, case, chunks, monkeypatch):
    if chunks == "several":
        _chunked_head(monkeypatch)
    path = CASES[case](tmp_path / case)
    model = load_model(path, CPU)
    ids = torch.randint(3, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
    with monkeypatch.context() as kept:  # as before: every copy autograd saves is kept until the backward
        kept.setattr(Rewidening, "add", lambda self, copy, remake: None)
        want = _input_gradient(model, embeds)
    made, phase = _spy(monkeypatch)
    leaf = embeds.detach().requires_grad_(True)
    with frozen(model):
        logits = model(inputs_embeds=leaf).logits
        forward = [ref for when, ref in made if when == "forward"]
        assert forward and all(ref() is None for ref in forward)  # the graph is alive and holds none of them
        phase["now"] = "backward"
        (grad,) = torch.autograd.grad(logits.square().sum(), leaf)
    assert any(when == "backward" for when, _ in made)  # made again for the backward
    assert torch.equal(logits.detach(), want[0]) and torch.equal(grad, want[1])
    assert {p.dtype for p in model.parameters()} == {next(model.parameters()).dtype}  # still as stored


def test_a_copy_written_after_it_was_made_is_saved_as_it_is():
    """A copy changed in place (a run-time edit of the widened weight) is not what its widening makes: it is
    kept, and the backward uses it as it was."""
    stored = torch.randn(4, 3, dtype=torch.bfloat16)
    remade = []

    def remake():
        remade.append(1)
        return stored.float()

    x = torch.randn(2, 3, requires_grad=True)
    with Rewidening() as rw:
        wide = stored.float()
        rw.add(wide, remake)
        wide.mul_(2)  # written after it was registered
        y = x @ wide.T
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert not remade and torch.equal(grad, (stored.float() * 2).sum(0).expand(2, 3))
    with Rewidening() as rw:
        wide = stored.float()
        rw.add(wide, remake)
        y = x @ wide.T
    del wide
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert remade == [1] and torch.equal(grad, stored.float().sum(0).expand(2, 3))


@pytest.mark.parametrize("case", ["llama", "mixtral"])
def test_the_copies_made_again_go_with_the_backward_without_a_garbage_collection(tmp_path, case, monkeypatch):
    """No remade copy outlives the backward that used it: a hooks object referring to itself (a cycle) kept the
    last call's, a whole layer in float32, until Python's collector ran (find-heads' next pass widened
    another layer on top of it)."""
    import gc

    path = CASES[case](tmp_path / case)
    model = load_model(path, CPU)
    ids = torch.randint(3, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
    made, phase = _spy(monkeypatch)
    gc.collect()
    gc.disable()
    try:
        leaf = embeds.detach().requires_grad_(True)
        with frozen(model):
            logits = model(inputs_embeds=leaf).logits
            phase["now"] = "backward"
            torch.autograd.grad(logits.square().sum(), leaf)
        remade = [ref for when, ref in made if when == "backward"]
        assert remade and all(ref() is None for ref in remade)
    finally:
        gc.enable()


def test_a_graph_never_backpropagated_goes_with_its_output():
    """A tensor saved as it is (not a registered copy) is kept without its graph: a saved output (softmax's)
    kept with its grad_fn, the node that saves it, was a cycle no collector sees, and every activation of a
    graph no backward released (the screen's layer outputs dropped, branches the backward skips) lived on."""
    import gc

    x = torch.randn(64, 64, requires_grad=True)
    with Rewidening():
        y = x.softmax(-1)  # saves its output
    where = y.data_ptr()
    del y
    gc.collect()
    # type(), not isinstance(): the latter reads __class__ of every object, some of which warn (torch.distributed)
    assert not [t for t in gc.get_objects() if type(t) is torch.Tensor and t.data_ptr() == where]
