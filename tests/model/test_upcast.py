"""float32 compute of a 16-bit checkpoint at 16-bit memory (surgery/model/upcast.py).

The reference is what load_model did before: the whole model converted to float32 when loaded.
The new way keeps the weights as stored and upcasts a layer per call; bf16 → f32 is exact, so
logits, run-time twins and the finders' captures must be bit-identical, and the stored weights
must still be 16-bit after every forward, also one stopped by an exception.
"""

from __future__ import annotations

import pytest
import torch

from surgery.core.architectures import text_config
from surgery.core.checkpoint import Checkpoint
from surgery.model.hooks import applied, model_architecture
from surgery.model.loading import LoadSpec, auto_class, load_model
from surgery.model.upcast import compute_dtype_of, stored_dtype
from tests.support.coverage import build_family, proof_edits, save_family
from tests.support.neuron_capture import TEXTS
from tests.support.tiny import build_tiny
from tests.support.tokenizer import save_char_tokenizer

CPU = LoadSpec(device="cpu")  # --dtype auto: float32 on a CPU
# A dense model, a tied one, a mixture of experts, a hybrid (linear attention and attention layers),
# and Gemma 3, whose embedding scale √40 is a buffer computed when built (rounded if built in bf16).
CASES = {
    "llama": lambda path: build_tiny("llama", path, dtype=torch.bfloat16),
    "llama-tied": lambda path: build_tiny("llama", path, dtype=torch.bfloat16, tie_word_embeddings=True),
    "mixtral": lambda path: build_tiny("mixtral", path, dtype=torch.float16),
    "qwen3_next": lambda path: save_family(build_family("qwen3_next").to(torch.bfloat16), path),
    "gemma3_text": lambda path: save_family(build_family("gemma3_text", hidden_size=40).to(torch.bfloat16), path),
}


def _both(path):
    """(the whole model converted to float32 as loaded, the model as load_model loads it now)."""
    cls = auto_class(Checkpoint(path).config["model_type"])
    return cls.from_pretrained(path, dtype=torch.float32).eval(), load_model(path, CPU)


def _batch(path) -> dict[str, torch.Tensor]:
    """Two sequences, the second left-padded (masked positions exercise the attention mask's dtype)."""
    vocab = int(text_config(Checkpoint(path).config)["vocab_size"])
    ids = torch.randint(3, vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def _stored(model) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_bit_identical_to_whole_conversion(tmp_path, case):
    path = CASES[case](tmp_path / case)
    old, new = _both(path)
    batch = _batch(path)
    assert _stored(old) == {torch.float32} and torch.float32 not in _stored(new)  # loaded as stored
    got = _logits(new, batch)
    assert got.dtype == torch.float32 and torch.equal(got, _logits(old, batch))
    assert torch.float32 not in _stored(new)  # the float32 copies were dropped after the call
    assert compute_dtype_of(new) == torch.float32
    if case == "llama-tied":  # one stored table, still shared
        assert new.get_output_embeddings().weight is new.get_input_embeddings().weight


@pytest.mark.parametrize("case", ["llama", "mixtral", "qwen3_next"])
def test_twins_bit_identical(tmp_path, case):
    """Every kind of run-time edit the architecture offers (heads, neurons, experts) sees the same tensors."""
    path = CASES[case](tmp_path / case)
    old, new = _both(path)
    edits = [e for group in proof_edits(model_architecture(old)).values() for e in group]
    batch = _batch(path)
    with applied(old, edits):
        want = _logits(old, batch)
    with applied(new, edits):
        got = _logits(new, batch)
    assert not torch.equal(want, _logits(old, batch))  # the edits change the output
    assert torch.equal(got, want)


@pytest.mark.parametrize("case", ["llama", "mixtral"])
def test_neuron_capture_bit_identical(tmp_path, case):
    """find-neurons' capture (it stops the forward with an exception after the last needed layer)."""
    from transformers import AutoTokenizer

    from surgery.find.neurons.capture import capture_pooled
    from surgery.find.neurons.experts import capture_experts

    path = save_char_tokenizer(CASES[case](tmp_path / case), bos=True)
    tok = AutoTokenizer.from_pretrained(path)
    old, new = _both(path)
    outputs: list[list] = [[], []]
    for model, got in zip((old, new), outputs):
        if case == "mixtral":
            capture_experts(model, tok, TEXTS, lambda start, *parts, got=got: got.append(parts), batch_size=4)
        else:
            capture_pooled(model, tok, TEXTS, lambda start, p, got=got: got.append((p,)), batch_size=4, layers=[0])
    assert len(outputs[0]) == len(outputs[1]) == 2
    for want, got in zip(*outputs):  # an expert no token reached is NaN in both
        for a, b in zip(want, got):
            torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)
    assert torch.float32 not in _stored(new)  # restored although the forward was stopped


# A vocabulary whose table is several decoder layers' size (the head's logits then come in chunks), as
# on real models: untied, tied to the head, and Gemma 3's scaled embeddings (its scale after the lookup).
BIG_VOCAB = {
    "llama": lambda path: build_tiny("llama", path, dtype=torch.bfloat16, vocab_size=1000),
    "llama-tied": lambda path: build_tiny(
        "llama", path, dtype=torch.bfloat16, vocab_size=1000, tie_word_embeddings=True
    ),
    "gemma3_text": lambda path: save_family(
        build_family("gemma3_text", hidden_size=40, vocab_size=1000).to(torch.bfloat16), path
    ),
}


@pytest.mark.parametrize("case", sorted(BIG_VOCAB))
def test_the_vocabulary_table_is_widened_a_part_at_a_time(tmp_path, case, monkeypatch):
    """The embeddings widen only their tokens' rows and the head a chunk of at most one decoder layer's
    weights at a time, never the whole table, and the logits stay the whole conversion's bit for bit: with
    a padding token in the batch and without, in inference mode, with run-time edits, and where autograd
    records the call."""
    from surgery.model import vocab_table
    from surgery.model.hooks import decoder_layers
    from surgery.model.widening import weight_count

    path = BIG_VOCAB[case](tmp_path / case)
    old, new = _both(path)
    widened: list[tuple[str, tuple[int, ...]]] = []
    widen = vocab_table._widened

    def spy(table, rows):
        wide = widen(table, rows)
        widened.append(("head" if isinstance(rows, slice) else "rows", tuple(wide.shape)))
        return wide

    monkeypatch.setattr(vocab_table, "_widened", spy)
    batch = _batch(path)
    padded = {**batch, "input_ids": batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 0)}
    table = new.get_input_embeddings().weight
    layer = max(weight_count(m) for m in decoder_layers(new))
    for inputs in (batch, padded):
        widened.clear()
        assert torch.equal(_logits(new, inputs), _logits(old, inputs))
        heads = [shape for kind, shape in widened if kind == "head"]
        rows = [shape for kind, shape in widened if kind == "rows"]
        assert rows == [(len(inputs["input_ids"].unique()), table.shape[1])]
        assert len(heads) > 1 and sum(r for r, _ in heads) == table.shape[0]
        assert max(r * c for r, c in heads) <= layer < table.numel()
    with torch.inference_mode():
        assert torch.equal(new(**padded).logits, old(**padded).logits)
    edits = [e for group in proof_edits(model_architecture(old)).values() for e in group]
    with applied(old, edits), applied(new, edits):
        assert torch.equal(_logits(new, padded), _logits(old, padded))
    recorded = new(**padded).logits  # autograd records it: the chunks are concatenated
    assert recorded.requires_grad and torch.equal(recorded.detach(), _logits(old, padded))
    assert torch.float32 not in _stored(new)
    if case == "llama-tied":
        assert new.get_output_embeddings().weight is table


def test_failed_forward_restores_stored_weights(tmp_path):
    path = CASES["llama"](tmp_path / "m")
    model = load_model(path, CPU)
    with pytest.raises(IndexError):
        _logits(model, {"input_ids": torch.tensor([[10_000]])})  # past the vocabulary
    assert _stored(model) == {torch.bfloat16}


def test_mixed_or_wide_checkpoints_load_whole(tmp_path):
    """A checkpoint with some float32 tensors would lose them to a 16-bit load: converted whole, as before."""
    from safetensors.torch import load_file, save_file

    path = CASES["llama"](tmp_path / "m")
    assert stored_dtype(Checkpoint(path).tensors) == torch.bfloat16
    weights = load_file(path / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"].float()
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    assert stored_dtype(Checkpoint(path).tensors) is None
    assert _stored(load_model(path, CPU)) == {torch.float32}
    assert _stored(load_model(path, LoadSpec(device="cpu", dtype="bfloat16"))) == {torch.bfloat16}


def _small_chunks(monkeypatch) -> None:
    """The head's logits in chunks of the fewest rows it takes (``ALIGN``): the tiny models' tables are
    smaller than a decoder layer, so their logits would come in one chunk."""
    from surgery.model import vocab_table

    attach = vocab_table.attach_table
    rows = vocab_table.ALIGN
    monkeypatch.setattr(vocab_table, "attach_table", lambda model, _: attach(model, rows * model.config.hidden_size))


def _whole(monkeypatch) -> None:
    """load_model as before: the checkpoint treated as not 16-bit, so converted whole to float32."""
    monkeypatch.setattr("surgery.model.upcast.stored_dtype", lambda tensors: None)


def test_finders_give_the_findings_of_the_whole_conversion(tiny, tmp_path, monkeypatch):
    """find-heads (its own attention function, knockouts, prefix caches)
    and find-neurons end to end, down to the compute dtype they record, the head's logits in chunks."""
    from surgery.find.heads.benchmark import load_benchmark
    from surgery.find.heads.find import find_heads
    from surgery.find.heads.pairs import build_pairs
    from surgery.find.heads.params import FindParams
    from surgery.find.neurons.find import find_neurons
    from surgery.find.neurons.pairs import load_pairs
    from tests.support.binding import char_model, write_small_benchmark
    from tests.support.neuron_pairs import write_pairs

    _small_chunks(monkeypatch)  # the head's logits in 2 chunks
    model = char_model(tiny, "llama", dtype=torch.bfloat16)
    head_pairs = build_pairs(load_benchmark(write_small_benchmark(tmp_path / "small.jsonl")), seed=0, max_pairs=6)
    neuron_pairs = load_pairs(write_pairs(tmp_path / "pairs.jsonl"))
    params = FindParams(max_pairs=6, random_sets=1, confirm=0, knockout_heads=2)
    runs = []
    for whole in (False, True):
        if whole:
            _whole(monkeypatch)
        monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / f"cache-{whole}"))
        heads = find_heads(model, head_pairs, params, load=CPU).to_dict()
        neurons = find_neurons(Checkpoint(model), neuron_pairs, load=CPU, recompute=True).data.to_dict()
        runs.append((heads, neurons))
    (heads, neurons), (heads_whole, neurons_whole) = runs
    assert heads["scores"] == heads_whole["scores"] and heads["selected_heads"] == heads_whole["selected_heads"]
    assert neurons["scores"] == neurons_whole["scores"]
    assert heads["compute"]["dtype"] == neurons["compute"]["dtype"] == "float32"


def test_verify_gives_the_report_of_the_whole_conversion(tiny, tmp_path, monkeypatch):
    from surgery.bake.verify import verify
    from tests.support.cli import main_code

    _small_chunks(monkeypatch)
    src = tiny("llama", dtype=torch.bfloat16, vocab_size=256)  # the head's logits in 4 chunks
    out = tmp_path / "pruned"
    assert main_code(["prune-neurons", str(src), "--neurons", "0:3,2:47", "--no-verify", "--out", str(out)]) == 0
    report = verify(Checkpoint(src), out, load=CPU)
    _whole(monkeypatch)
    whole = verify(Checkpoint(src), out, load=CPU)
    assert report.ok and report.to_dict() == whole.to_dict()
    assert report.tolerance_basis.dtype == "BF16"  # the bf16 weights set it, as before; float32 compute adds nothing


def test_a_model_the_table_does_not_know_loads_whole(tmp_path):
    """The decoder layers are the unit upcast, and only the table says where they are (eval may
    load any causal LM): such a model is converted whole, as before."""
    from surgery.model.loading import _layerwise_dtype
    from tests.support.corrupt import edit_config

    path = CASES["llama"](tmp_path / "m")
    assert _layerwise_dtype(Checkpoint(path), None, True) == torch.bfloat16
    edit_config(path, model_type="rwkv")
    assert _layerwise_dtype(Checkpoint(path), None, True) is None
