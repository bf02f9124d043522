"""A device that is no torch device (``gpu``) is refused where the LoadSpec is made, in one line naming
the parameter as the caller spells it (``device`` in Python, ``--device`` on the command line); a device
this machine lacks is said when a model runs, also in the caller's spelling."""

from __future__ import annotations

import pytest

import surgery
from surgery.core.errors import CheckpointError, ParameterError
from surgery.model.placement import check_device
from tests.support.cli import main_code


@pytest.mark.parametrize("device", ["gpu", "cuda:x", 0])
def test_an_unknown_device_is_refused_when_the_load_spec_is_made(device):
    with pytest.raises(ParameterError) as caught:
        surgery.LoadSpec(device=device)
    assert str(caught.value) == f"device {device!r} is not a torch device; give auto, cpu, cuda, cuda:N or mps"


def test_a_python_call_is_refused_before_it_opens_the_model(tmp_path):
    """The model is not even looked for: it was refused only once a model ran, naming --device."""
    with pytest.raises(ParameterError, match=r"^device 'gpu' is not a torch device"):
        surgery.score_binding(tmp_path / "no-model", device="gpu")


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1", "mps", "meta"])
def test_every_torch_device_is_taken_whether_or_not_this_machine_has_it(device):
    assert surgery.LoadSpec(device=device).device == device


def test_the_command_line_names_the_flag(tmp_path, capsys):
    assert main_code(["score-binding", tmp_path / "no-model", "--device", "gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["Error: --device 'gpu' is not a torch device; give auto, cpu, cuda, cuda:N or mps"]


def test_a_device_this_machine_lacks_names_the_parameter_in_python():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(CheckpointError) as caught:
        check_device("cuda")
    assert str(caught.value) == "device is 'cuda', but this machine has no CUDA GPU usable by torch; give 'cpu'"
