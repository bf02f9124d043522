"""The finder registry: one declaration per family, read by the findings checks, the report, the
library's option names and the command line's flags; a family is imported only when asked for."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest

from surgery.core.errors import SurgeryError
from surgery.find import finders
from surgery.find.directions.params import DirectionParams, KernelParams
from surgery.find.findings import Findings
from surgery.find.heads.params import FindParams
from surgery.find.neurons.params import CaptureParams, SelectParams
from tests.support.paths import REPO


@pytest.fixture
def registry(monkeypatch):
    """The registry with the shipped families loaded, restored after the test."""
    list(finders.finders())
    monkeypatch.setattr(finders, "_FINDERS", dict(finders._FINDERS))
    return finders


@dataclass(kw_only=True)
class SaeFindings(Findings):
    KIND: ClassVar[str] = "features"


@dataclass(frozen=True)
class SaeParams:
    width: int = 16


def test_the_shipped_families_are_declared_once_with_their_commands_and_options():
    table = {f.name: (f.find_command, f.bake_command, f.record.KIND, f.option_types) for f in finders.finders()}
    assert table == {
        "heads": ("find-heads", "amplify-heads", "heads", (FindParams,)),
        "neurons": ("find-neurons", "prune-neurons", "neurons", (CaptureParams, SelectParams)),
        "directions": ("find-direction", "ablate-direction", "directions", (DirectionParams, KernelParams)),
    }
    assert finders.finder("neurons").param_fields() == {
        "pairs",
        "language",
        "categories",
        "strict",
        "batch_size",
    }


def test_a_new_family_registers_in_one_call_and_is_read_everywhere(registry, tmp_path):
    """Registered, it is a findings kind: its files load as its record with its command in errors."""
    sae = registry.register_finder(
        "features",
        find_command="find-features",
        bake_command="ablate-features",
        record=SaeFindings,
        params=(SaeParams,),
    )
    assert registry.finder("features") is sae
    assert registry.kinds()[-1] == "features"
    assert sae.param_fields() == {"width"}
    bad = tmp_path / "f.json"
    bad.write_text(json.dumps({"format": "surgery-findings", "version": 99, "kind": "features"}))
    from surgery.find.findings import load_findings

    with pytest.raises(SurgeryError, match="recompute it with surgery find-features"):
        load_findings(bad, "features", SaeFindings)


def test_a_name_is_taken_once_and_a_record_of_another_kind_is_refused(registry):
    with pytest.raises(SurgeryError, match="two finders are named 'heads'"):
        registry.register_finder("heads", find_command="x", bake_command="y", record=SaeFindings, params=())
    with pytest.raises(SurgeryError, match="its record SaeFindings is of kind 'features'"):
        registry.register_finder("other", find_command="x", bake_command="y", record=SaeFindings, params=())


def test_an_unknown_kind_names_the_finders():
    with pytest.raises(
        SurgeryError, match=r"no finder writes 'nope' findings; the finders are: heads, neurons, directions"
    ):
        finders.finder("nope")


def test_asking_for_one_family_imports_no_other():
    probe = (
        "import sys\n"
        "from surgery.find.finders import finder\n"
        "finder('neurons')\n"
        "print(sorted({m.split('.')[2] for m in sys.modules if m.startswith('surgery.find.') and m.count('.') > 2}))"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['neurons']"
