"""Every command that loads a model runs with layers offloaded to disk, on tied and untied embeddings.

``--device-map auto --max-memory cpu=<two layers>`` leaves most decoder layers on disk. A model
with tied embeddings (SmolLM2, Gemma) has no ``lm_head.weight`` in its files: accelerate must keep
lm_head with embed_tokens, or the first forward fails looking for it on disk (issue 22, point 5).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from surgery.core.checkpoint import Checkpoint
from surgery.model.loading import LoadSpec, load_model
from surgery.model.placement import largest_layer_bytes
from tests.support.binding import char_model
from tests.support.cli import main_code
from tests.support.commands import model_commands

# The bakes find (or check) through the same loader: with --recompute they capture again.
RECOMPUTE = {"prune-neurons", "amplify-heads"}


def _budget(model: Path) -> str:
    """CPU memory for about two decoder layers: accelerate puts the rest on disk."""
    return f"cpu={2 * largest_layer_bytes(Checkpoint(model).tensors, 4) + 4096}B"


@pytest.fixture
def placements(monkeypatch):
    """The device map of every model transformers loads."""
    maps: list[dict] = []
    original = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def spy(klass, *args, **kwargs):
        model = original(klass, *args, **kwargs)
        maps.append(dict(getattr(model, "hf_device_map", None) or {}))
        return model

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    return maps


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_tied_embeddings_stay_together_under_disk_offload(tiny, tmp_path, tied):
    model = char_model(tiny, "llama", num_hidden_layers=4, tie_word_embeddings=tied)
    assert ("lm_head.weight" in Checkpoint(model).tensors) is not tied
    net = load_model(
        model,
        LoadSpec(device="cpu", device_map="auto", max_memory=_budget(model), offload_folder=str(tmp_path / "offload")),
    )
    where = net.hf_device_map
    assert "disk" in where.values(), where
    if tied:
        assert where["lm_head"] == where["model.embed_tokens"], where
    assert net(input_ids=__import__("torch").tensor([[5, 9, 14]])).logits.shape == (1, 3, 128)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_every_command_runs_with_layers_on_disk(tiny, tmp_path, capsys, placements, tied):
    model = char_model(tiny, "llama", num_hidden_layers=4, tie_word_embeddings=tied)
    offload = ["--device", "cpu", "--device-map", "auto", "--max-memory", _budget(model)]
    for name, args in model_commands(model, tmp_path).items():
        placements.clear()
        code = main_code([*args, *offload, *(["--recompute"] if name in RECOMPUTE else [])])
        assert code == 0, f"{name}: {capsys.readouterr().err[-2000:]}"
        if name == "apply":  # the bake's own check reads the edited slices: no model
            assert not placements, f"{name} loaded a model"
            continue
        assert placements, f"{name} loaded no model"
        assert all("disk" in where.values() for where in placements), f"{name}: {placements}"
