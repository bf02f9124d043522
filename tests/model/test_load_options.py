"""Every command hands the user's load options to every model it loads.

The checkpoint here needs its own code (``auto_map`` → ``modeling_custom.py``, a Llama subclass that
leaves a mark when it is built): without --trust-remote-code every command refuses it; with it,
every command runs, transformers' loaders receive ``trust_remote_code=True`` on every call, the
custom class really is the one that runs, and ``--device`` reaches every model load.
"""

from __future__ import annotations

import json

import pytest
import transformers

import surgery.model.loading
import surgery.model.placement
from tests.support.binding import char_model, write_small_benchmark
from tests.support.cli import main_code
from tests.support.commands import model_commands
from tests.support.hub_cache import hub_cache

MODELING = '''
import os

from transformers import LlamaForCausalLM


class CustomForCausalLM(LlamaForCausalLM):
    """A Llama that says it was built: proof that the checkpoint's own code ran."""

    def __init__(self, config):
        super().__init__(config)
        with open(os.environ["SURGERY_TEST_REMOTE_MARK"], "a") as f:
            f.write("built\\n")
'''
# --revision picks a commit of a Hub id (a local folder refuses it): that test's MODEL is the checkpoint
# as a Hub-cache snapshot, read offline at this branch
HUB_ID, REVISION = "org/custom", "main"
DEVICE = "cpu:0"  # a valid device distinct from the default "cpu": seen only if the option arrives
# Bakes whose findings come from a cache (or a recipe) and whose source ran before run no model: the
# bake's own check reads the edited weight slices only, and the source runs once before its first bake
# (surgery.bake.runnable: prune-neurons' bake here, with these same options). They must still refuse
# the custom code without the flag (test below).
RUN_NO_MODEL = {"amplify-heads", "apply"}


@pytest.fixture
def remote(tiny, tmp_path, monkeypatch):
    """A checkpoint that needs remote code, with spies on every model and tokenizer load."""
    path = char_model(tiny, "llama")
    (path / "modeling_custom.py").write_text(MODELING)
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    mark = tmp_path / "remote-code-ran"
    monkeypatch.setenv("SURGERY_TEST_REMOTE_MARK", str(mark))
    # transformers copies the checkpoint's code into its modules cache: keep that in tmp_path
    monkeypatch.setattr("transformers.dynamic_module_utils.HF_MODULES_CACHE", str(tmp_path / "hf-modules"))

    calls: list[tuple[str, object]] = []
    for kind, cls in (("model", transformers.AutoModelForCausalLM), ("tokenizer", transformers.AutoTokenizer)):
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _kind=kind, _original=original, **kwargs):
            calls.append((_kind, kwargs.get("trust_remote_code")))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    real_check = surgery.model.placement.check_device

    def device_spy(device: str) -> None:
        calls.append(("device", device))
        real_check(device)

    monkeypatch.setattr(surgery.model.placement, "check_device", device_spy)
    real_resolve = surgery.model.loading.resolve

    def resolve_spy(model: str, revision: str | None = None):
        calls.append(("revision", (str(model), revision)))
        return real_resolve(model, revision)

    monkeypatch.setattr(surgery.model.loading, "resolve", resolve_spy)
    return path, calls, mark


def test_every_command_passes_trust_device_and_revision_to_every_load(remote, tmp_path, capsys, monkeypatch):
    path, calls, mark = remote
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hub_cache(path, tmp_path / "hub", HUB_ID)))
    model = HUB_ID
    for name, args in model_commands(model, tmp_path).items():
        calls.clear()
        mark.unlink(missing_ok=True)
        code = main_code([*args, "--trust-remote-code", "--device", DEVICE, "--revision", REVISION])
        assert code == 0, f"{name}: {capsys.readouterr().err[-2000:]}"
        loads = [value for kind, value in calls if kind in ("model", "tokenizer")]
        devices = [value for kind, value in calls if kind == "device"]
        assert all(value is True for value in loads), f"{name}: trust_remote_code {loads}"
        if name in RUN_NO_MODEL:
            assert not any(kind == "model" for kind, _ in calls), f"{name} loaded a model"
        else:
            assert any(kind == "model" for kind, _ in calls), f"{name} loaded no model"
            assert devices and set(devices) == {DEVICE}, f"{name}: devices {devices}"
            assert mark.is_file(), f"{name}: the checkpoint's own code did not run"
        # MODEL is resolved at the revision asked for (eval's --against is another model, at its default)
        revisions = {
            rev
            for kind, (where, rev) in ((k, v) for k, v in calls if k == "revision")
            if where == str(args[1] if name != "apply" else model)
        }
        assert revisions == {REVISION}, f"{name}: revisions {revisions}"


@pytest.mark.parametrize(
    "name", ["find-neurons", "prune-neurons", "score-binding", "find-heads", "amplify-heads", "apply", "eval"]
)
def test_without_the_flag_every_command_refuses_the_custom_code(remote, tmp_path, capsys, name):
    model, calls, mark = remote
    args = model_commands(model, tmp_path)[name]
    if name == "eval":
        args = ["eval", model, "--limit", "1"]
    assert main_code(args) == 2
    assert "--trust-remote-code" in capsys.readouterr().err
    assert not [c for c in calls if c[0] == "model"] and not mark.exists()


def test_inspect_and_export_lora_open_it_with_the_flag(remote, tmp_path, capsys):
    model, _, _ = remote
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 2.0}\n")
    assert main_code(["inspect", model, "--trust-remote-code"]) == 0
    assert main_code(["export-lora", model, "--recipe", recipe, "--out", tmp_path / "a", "--trust-remote-code"]) == 0
    assert main_code(["inspect", model]) == 2 and "--trust-remote-code" in capsys.readouterr().err


@pytest.mark.parametrize(
    "device, message",
    [
        ("cuda", "no CUDA GPU"),
        ("cuda:3", "no CUDA GPU"),
        ("tpu7", "is not a torch device"),
    ],
)
def test_a_device_this_machine_lacks_is_one_line(tiny, tmp_path, capsys, device, message):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    model = char_model(tiny, "llama")
    code = main_code(
        [
            "score-binding",
            model,
            "--benchmark",
            write_small_benchmark(tmp_path / "b.jsonl"),
            "--max-pairs",
            "4",
            "--device",
            device,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0] and err[0].startswith("Error: --device")


@pytest.mark.parametrize("command", ["find-neurons", "score-binding", "find-heads"])
def test_a_config_that_does_not_describe_the_weights_is_one_line_before_loading(tiny, tmp_path, capsys, command):
    """num_key_value_heads edited after saving: the find commands say which field and tensor, as the
    bake does, instead of a size mismatch from inside transformers' loader."""
    model = char_model(tiny, "llama")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 1}))
    args = model_commands(model, tmp_path)[command]
    code = main_code(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "k_proj.weight' has shape" in err[0] and "num_key_value_heads" in err[0] and "internal" not in err[0]
