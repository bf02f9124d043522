"""The command line starts fast: help and argument errors never import torch or transformers, and a
command imports its own module and the library it runs, not the other commands' (each module of
NOT_USED below would cost start-up time for nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from surgery.cli.group import COMMANDS
from tests.support.commands import model_commands
from tests.support.tokenizer import save_char_tokenizer

CHECK = """
import sys
from surgery.cli.main import main
try:
    main(["--help"])
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "transformers", "sklearn") if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
"""

# What a command runs that imports none of these, and why each is not needed by it.
NOT_USED = {
    "gguf": "gguf-py reads and writes GGUF files: GGUF models and import-gguf only",
    "surgery.gguf.model": "the GGUF reader: only when MODEL is a .gguf file",
    "surgery.gguf.importing": "import-gguf and GGUF models only",
    "surgery.evaluation": "eval (and a bake's --eval) only",
    "surgery.ship": "push, card and report only",
    "surgery.find.directions": "find-direction and ablate-direction only",
    "matplotlib": "report's figures only",
    "peft": "export-lora's check only",
    "compressed_tensors": "compressed-tensors checkpoints only",
    "pandas": "surgery never uses it",
}
# ... and per command, what only other commands use.
ALSO_NOT_USED = {
    "find-neurons": {"surgery.find.heads": "the head finders", "sklearn": "find-heads' L1 discovery only"},
    "score-binding": {"surgery.find.neurons": "the neuron finder", "sklearn": "find-heads' L1 discovery only"},
}

# A command run in-process (main with arguments returns), then what the script appends is printed.
COMMAND = """
import gc, json, sys
from surgery.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    if exc.code:
        raise
"""
RUN = COMMAND + 'print("MODULES=" + json.dumps(sorted(sys.modules)))\n'

RESOLVE = """
import json, sys
import click
from surgery.cli.group import cli
cli.get_command(click.Context(cli), sys.argv[1])
print("MODULES=" + json.dumps(sorted(sys.modules)))
"""


def _modules(code: str, *args: str, env: dict | None = None) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(json.loads(proc.stdout.strip().splitlines()[-1].removeprefix("MODULES=")))


def _loaded(modules: set[str], names) -> list[str]:
    return sorted(n for n in names if any(m == n or m.startswith(n + ".") for m in modules))


def test_help_imports_no_heavy_library():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY=", (
        "surgery --help imported " + proc.stdout.strip().splitlines()[-1]
    )


@pytest.mark.parametrize("command", ["find-neurons", "find-heads", "score-binding", "prune-neurons", "verify", "eval"])
def test_a_command_imports_its_own_module_and_nothing_heavy(command):
    modules = _modules(RESOLVE, command)
    others = {f"surgery.cli.{m}" for m in COMMANDS.values()} - {f"surgery.cli.{COMMANDS[command]}"}
    assert not _loaded(modules, others), f"surgery {command} imported other commands' modules"
    # numpy: every command uses it (torch imports it too); surgery's own modules: checked per run below
    heavy = ["torch", "transformers", *(m for m in NOT_USED if not m.startswith("surgery."))]
    assert not _loaded(modules, heavy), f"surgery {command} imported these before running: {_loaded(modules, heavy)}"


# What a command's start does not need (its run may: torch and transformers read package metadata).
NOT_AT_START = {
    "importlib.metadata": "an install hint's pip command only",
    "rich.progress": "progress bars, drawn on a terminal only",
}


@pytest.mark.parametrize("command", ["apply", "verify", "find-neurons"])
def test_a_command_starts_without_metadata_or_bars(command):
    modules = _modules(RESOLVE, command)
    loaded = _loaded(modules, NOT_AT_START)
    assert not loaded, f"surgery {command} imported " + "; ".join(f"{m} ({NOT_AT_START[m]})" for m in loaded)


def test_every_command_is_in_the_table_under_its_module():
    from surgery.cli.group import cli, register_all

    register_all()
    assert set(cli.commands) == set(COMMANDS)
    for name, command in cli.commands.items():
        assert command.callback.__module__ == f"surgery.cli.{COMMANDS[name]}", name


@pytest.mark.parametrize("command", ["find-neurons", "score-binding"])
def test_a_run_imports_nothing_the_command_does_not_use(command, tiny, tmp_path):
    model = tiny("llama")
    save_char_tokenizer(model, bos=True)
    args = [str(a) for a in model_commands(model, tmp_path)[command]]
    modules = _modules(RUN, *args, "--json", env={**os.environ, "SURGERY_CACHE": str(tmp_path / "cache")})
    assert {"torch", "transformers"} <= modules  # it did run the model
    unused = {**NOT_USED, **ALSO_NOT_USED[command]}
    loaded = _loaded(modules, unused)
    assert not loaded, f"surgery {command} imported " + "; ".join(f"{m} ({unused[m]})" for m in loaded)


FULL_COLLECTIONS = COMMAND + (
    'print("FULL=" + str(gc.get_stats()[2]["collections"]) + " THRESHOLD=" + ",".join(map(str, gc.get_threshold())))\n'
)


def test_a_find_neurons_run_walks_every_object_at_most_once(tiny, tmp_path):
    """A full garbage collection walks every live object (0.15 s once torch and transformers are
    imported): none while they import, none after the capture when the model was freed by its last
    reference (surgery.core.freed_memory); CPython's default schedule runs six during the imports."""
    model = tiny("llama")
    save_char_tokenizer(model, bos=True)
    args = [str(a) for a in model_commands(model, tmp_path)["find-neurons"]]
    env = {**os.environ, "SURGERY_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-c", FULL_COLLECTIONS, *args, "--json"], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    full, threshold = line.removeprefix("FULL=").split(" THRESHOLD=")
    assert int(full) <= 1, f"{full} full collections"
    assert threshold == ",".join(map(str, __import__("gc").get_threshold()))  # put back after the command
