"""The Python API is the command line's library: the same calls give the same files, and Python
callers get the command line's checks.

Every bake command is run twice on the same source — once as ``surgery …`` (in this process, through
the console script's entry point), once as the ``surgery.*`` function with the same options — and the
two outputs must hold byte-identical files and the same surgery.json, its creation time (and the
seal over it, and where its sha256s came from) aside. Sweeps bake one folder per value both ways; push uploads the same files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import surgery
from surgery.core.errors import OptionError, ParameterError, RecipeError
from tests.support.binding import FAST, char_model, write_small_benchmark
from tests.support.cli import main_output
from tests.support.fakehub import FakeHub
from tests.support.neuron_pairs import write_pairs
from tests.support.paths import REPO
from tests.support.tokenizer import save_char_tokenizer

# surgery.json entries that say when and how (not what) a bake ran: its time, the seal that covers
# it, and where each sha256 came from (the second bake of a source takes the source's from the hash
# cache the first one filled; the sha256s themselves are compared, in "files" and "source_files")
WHEN = ("created", "provenance_sha256", "hashing")


def _record(folder: Path) -> dict:
    prov = json.loads((folder / "surgery.json").read_text())
    return {k: v for k, v in prov.items() if k not in WHEN}


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "surgery.json"
    }


def assert_same_bake(cli_out: Path, api_out: Path) -> None:
    """Same files byte for byte (weights, undo data, card), same surgery.json but for its time."""
    assert _files(cli_out) == _files(api_out)
    assert _record(cli_out) == _record(api_out)


def _cli(capsys, *args) -> str:
    code, out, err = main_output(capsys, *args)
    assert code == 0, err
    return out


@pytest.fixture
def neuron_model(tiny, tmp_path):
    """A tiny Llama with a tokenizer and a pairs file; its findings computed once (both runs read
    them from the cache, so the findings record in surgery.json is the same)."""
    model = tiny("llama")
    save_char_tokenizer(model, bos=True)
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    surgery.find_neurons(model, pairs=str(pairs))
    return model, pairs


def test_prune_neurons_from_findings_and_named(neuron_model, tmp_path, capsys):
    model, pairs = neuron_model
    _cli(capsys, "prune-neurons", model, "--pairs", pairs, "--n", "4", "--score", "bias", "--out", tmp_path / "cli")
    baked = surgery.prune_neurons(model, tmp_path / "api", n=4, pairs=str(pairs), score="bias")
    assert_same_bake(tmp_path / "cli", tmp_path / "api")
    assert isinstance(baked, surgery.Baked) and baked.out == tmp_path / "api" and baked.tensors_edited > 0
    assert baked.extra["neuron_selection"]["n"] == 4 and baked.extra["neuron_selection"]["score"] == "bias"

    _cli(capsys, "prune-neurons", model, "--neurons", "0:3,1:5", "--factor", "0.5", "--out", tmp_path / "named-cli")
    surgery.prune_neurons(model, tmp_path / "named-api", neurons=["0:3", "1:5"], factor=0.5)
    assert_same_bake(tmp_path / "named-cli", tmp_path / "named-api")


def test_neurons_and_heads_are_named_by_pairs_as_by_labels(tiny, tmp_path):
    """prune_neurons(neurons=[(1, 5)]) bakes what neurons="1:5" bakes (pairs, labels and numpy
    numbers mixed in one list too), as amplify_heads takes heads=[(0, 1)] for "0.1"."""
    model, fast = tiny("llama"), surgery.BakeOptions(verify=False)
    surgery.prune_neurons(model, tmp_path / "label", neurons="1:5,0:3", bake=fast)
    surgery.prune_neurons(model, tmp_path / "pairs", neurons=[(1, 5), (0, 3)], bake=fast)
    surgery.prune_neurons(model, tmp_path / "mixed", neurons=[np.array([1, 5]), "0:3"], bake=fast)
    for other in ("pairs", "mixed"):
        assert_same_bake(tmp_path / "label", tmp_path / other)
    surgery.amplify_heads(model, tmp_path / "h-label", heads="0.1,1.2", alpha=2.0, bake=fast)
    surgery.amplify_heads(model, tmp_path / "h-pairs", heads=[(0, 1), "1.2"], alpha=2.0, bake=fast)
    assert_same_bake(tmp_path / "h-label", tmp_path / "h-pairs")


@pytest.mark.parametrize(
    ("given", "shown"),
    [((1, 5, 7), "(1, 5, 7)"), ((1,), "(1,)"), (15, "15"), ((1.5, 2), "(1.5, 2)"), ((True, 2), "(True, 2)")],
)
def test_a_pair_of_another_shape_is_one_line_naming_the_parameter(given, shown, tiny, tmp_path):
    model = tiny("llama")
    with pytest.raises(ParameterError) as neurons:
        surgery.prune_neurons(model, tmp_path / "n", neurons=[given])
    assert str(neurons.value) == (
        f"neurons: {shown} is not a (layer, neuron) pair of whole numbers; give e.g. [(28, 17), (28, 901)] "
        "or '28:17,28:901'; an expert's neuron as '3:e5:17' (shared: '3:s:17')"
    )
    with pytest.raises(ParameterError) as heads:
        surgery.amplify_heads(model, tmp_path / "h", heads=[given], alpha=2.0)
    assert str(heads.value) == (
        f"heads: {shown} is not a (layer, head) pair of whole numbers; give e.g. [(7, 7), (8, 17)] or '7.7,8.17'"
    )
    assert "\n" not in str(heads.value) and not (tmp_path / "n").exists() and not (tmp_path / "h").exists()


def test_prune_neurons_sweep(neuron_model, tmp_path, capsys):
    model, pairs = neuron_model
    out = _cli(capsys, "prune-neurons", model, "--pairs", pairs, "--n", "2,3", "--json", "--out", tmp_path / "cli")
    baked = surgery.prune_neurons(model, tmp_path / "api", n=[2, 3], pairs=str(pairs))
    assert sorted(baked) == ["n-2", "n-3"] and [v["label"] for v in json.loads(out)] == ["n-2", "n-3"]
    for label in baked:
        assert_same_bake(tmp_path / "cli" / label, tmp_path / "api" / label)


def test_amplify_heads_found_named_and_swept(tiny, tmp_path, capsys):
    model = char_model(tiny)
    bench = write_small_benchmark(tmp_path / "bench.jsonl")
    options = dict(benchmark=str(bench), max_pairs=4, random_sets=1)
    surgery.find_heads(model, **options)  # both runs read the cached findings
    _cli(
        capsys,
        "amplify-heads",
        model,
        "--alpha",
        "2.5",
        "--top",
        "2",
        "--benchmark",
        bench,
        *FAST,
        "--out",
        tmp_path / "cli",
    )
    surgery.amplify_heads(model, tmp_path / "api", alpha=2.5, top=2, **options)
    assert_same_bake(tmp_path / "cli", tmp_path / "api")

    _cli(capsys, "amplify-heads", model, "--heads", "0.1,1.2", "--alpha", "2,3", "--out", tmp_path / "sweep-cli")
    baked = surgery.amplify_heads(model, tmp_path / "sweep-api", heads=[(0, 1), (1, 2)], alpha=[2, 3])
    assert sorted(baked) == ["alpha-2", "alpha-3"]
    for label in baked:
        assert_same_bake(tmp_path / "sweep-cli" / label, tmp_path / "sweep-api" / label)


def test_apply_verify_undo_and_export(tiny, tmp_path, capsys):
    model = tiny("llama")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 2.0}\n"
        "  - {type: neuron, layer: 1, neuron: 3, factor: 0.0}\n"
    )
    _cli(capsys, "apply", recipe, "--model", model, "--out", tmp_path / "cli")
    baked = surgery.apply(recipe, model, tmp_path / "api")
    assert_same_bake(tmp_path / "cli", tmp_path / "api")
    assert (
        surgery.apply(surgery.Recipe.load(recipe), model, tmp_path / "from-object").provenance.recipe
        == baked.provenance.recipe
    )

    report = surgery.verify(model, tmp_path / "api")
    assert isinstance(report, surgery.Report) and report.ok and report.max_abs_logit_diff <= 1e-4
    hashes = surgery.undo(tmp_path / "api", tmp_path / "restored")
    assert {n: (tmp_path / "restored" / n).read_bytes() for n in hashes} == {
        n: (model / n).read_bytes() for n in hashes
    }

    _cli(capsys, "export-lora", model, "--recipe", recipe, "--out", tmp_path / "lora-cli")
    surgery.export_lora(model, recipe, tmp_path / "lora-api")
    assert _files(tmp_path / "lora-cli") == _files(tmp_path / "lora-api")


def test_push_uploads_what_the_command_uploads(tiny, tmp_path):
    """--push-to and push_to= upload the same files to the same branches (loopback fake Hub)."""
    model = tiny("llama")
    script = textwrap.dedent(f"""
        import surgery
        surgery.amplify_heads({str(model)!r}, {str(tmp_path / "api")!r}, heads="0.1", alpha=[2, 3],
                              bake=surgery.BakeOptions(push_to="me/api"))
    """)
    token = "hf_fakeTokenForLoopbackTests0123456789"
    with FakeHub(token) as hub:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(
            HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HOME=str(tmp_path / "hf-home"), HF_TOKEN=token, NO_COLOR="1"
        )
        for cmd in (
            [
                sys.executable,
                "-m",
                "surgery",
                "amplify-heads",
                str(model),
                "--heads",
                "0.1",
                "--alpha",
                "2,3",
                "--push-to",
                "me/cli",
                "--out",
                str(tmp_path / "cli"),
            ],
            [sys.executable, "-c", script],
        ):
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=180)
            assert r.returncode == 0, r.stderr
        for label in ("alpha-2", "alpha-3"):
            cli, api = hub.files("me/cli", label), hub.files("me/api", label)
            assert {n: b for n, b in cli.items() if n != "surgery.json"} == {
                n: b for n, b in api.items() if n != "surgery.json"
            }
            assert cli.keys() == api.keys() and "model.safetensors" in cli


def test_python_callers_get_the_command_lines_checks(tiny, tmp_path):
    model = tiny("llama")
    with pytest.raises(OptionError, match=r"--batch-size \(CaptureParams.batch_size\) must be ≥ 1, got 0"):
        surgery.prune_neurons(model, tmp_path / "out", n=4, batch_size=0)
    with pytest.raises(ParameterError, match="^n must be whole numbers ≥ 1, got 0$"):
        surgery.prune_neurons(model, tmp_path / "out", n=[4, 0])
    with pytest.raises(
        ParameterError, match="alpha 0 does not amplify.*pass bake=surgery\\.BakeOptions\\(allow_zero=True\\)"
    ):
        surgery.amplify_heads(model, tmp_path / "out", heads="0.1", alpha=0)
    with pytest.raises(TypeError, match=r"unknown option scroe"):
        surgery.prune_neurons(model, tmp_path / "out", n=4, scroe="bias")
    with pytest.raises(TypeError, match="either a LoadSpec or its options"):
        surgery.verify(model, tmp_path, load=surgery.LoadSpec(), device="cpu")
    with pytest.raises(RecipeError, match="rounds every weight of head 0.1 to zero"):
        surgery.amplify_heads(model, tmp_path / "out", heads="0.1", alpha=1e-50)
    assert not (tmp_path / "out").exists()


def test_the_command_line_names_flags_where_python_names_parameters(tiny, tmp_path, capsys):
    code, _, err = main_output(capsys, "prune-neurons", tiny("llama"), "--n", "0", "--out", tmp_path / "out")
    assert code == 2 and "Error: --n must be whole numbers ≥ 1, got 0" in err


def test_import_surgery_is_cheap_and_exports_what_it_lists():
    probe = (
        "import sys, surgery; heavy = [m for m in ('torch', 'transformers', 'sklearn') if m in sys.modules]; "
        "names = [getattr(surgery, n) for n in surgery.__all__]; print(heavy, len(names))"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"[] {len(surgery.__all__)}"
    for name in (
        "find_neurons",
        "find_heads",
        "score_binding",
        "prune_neurons",
        "amplify_heads",
        "apply",
        "verify",
        "undo",
        "export_lora",
        "evaluate",
        "push",
        "Recipe",
        "LoadSpec",
        "CaptureParams",
        "SelectParams",
        "FindParams",
        "EvalParams",
        "Baked",
        "Report",
        "NeuronFindings",
        "HeadFindings",
    ):
        assert name in surgery.__all__
    with pytest.raises(AttributeError):
        surgery.not_a_name  # noqa: B018


def test_exported_names_are_their_objects_whatever_was_imported_first():
    """A subpackage of the same name as an export would shadow it once imported (a package's
    submodules are set as its attributes): every name in __all__ must stay the exported object."""
    probe = (
        "import importlib, pkgutil, surgery\n"
        "for m in pkgutil.walk_packages(surgery.__path__, 'surgery.'):\n"
        "    if m.name != 'surgery.__main__':  # that one runs the command\n"
        "        importlib.import_module(m.name)\n"
        "import types\n"
        "bad = [n for n in surgery.__all__ if isinstance(getattr(surgery, n), types.ModuleType)]\n"
        "print(bad)"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_the_api_package_imports_an_operation_when_it_is_first_asked_for():
    """``surgery.api`` alone imports none of its modules (a command loads only what it calls), and
    each listed name is its module's object."""
    probe = (
        "import sys, surgery.api as api\n"
        "print(sorted(m for m in sys.modules if m.startswith('surgery.api.')))\n"
        "api.find_neurons\n"
        "print(sorted(m for m in sys.modules if m.startswith('surgery.api.') and not m.endswith('_common')))"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines() == [
        "[]",
        "['surgery.api.bake_options', 'surgery.api.baked', 'surgery.api.baking', 'surgery.api.callbacks', "
        "'surgery.api.findings_source', 'surgery.api.neurons']",
    ]
    import importlib

    import surgery.api as api

    for name in api.__all__:
        assert getattr(api, name) is getattr(importlib.import_module(f"surgery.api.{api._EXPORTS[name]}"), name)
    with pytest.raises(AttributeError):
        api.not_a_name  # noqa: B018
