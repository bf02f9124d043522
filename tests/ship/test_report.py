"""surgery report: PNGs that open, sections present only when their data is, clear error without matplotlib."""

from __future__ import annotations

import json
import math
import re
import struct
import sys

import pytest

from surgery.core.checkpoint import Checkpoint
from surgery.core.errors import SurgeryError
from surgery.core.evaluation_result import new_result, save_result
from surgery.core.optional import pip_install
from surgery.find.directions.record import DirectionsFindings
from surgery.find.findings import new_findings, save_findings
from surgery.find.heads.record import HeadsFindings
from surgery.find.neurons.record import NeuronsFindings
from surgery.ship.report import build_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def inputs(tiny, tmp_path):
    ckpt = Checkpoint(tiny("llama"))
    heads = new_findings("heads", ckpt, "0" * 64, {"benchmark": "builtin"}, "test")
    heads.update(
        {
            "selected_heads": [[1, 2], [2, 0]],
            "discovery": {
                "auc": 0.81,
                "coef_grid": [[0.0, 0.1, -0.2, 0.0], [0.0, 0.0, 0.9, 0.0], [-0.5, 0.0, 0.0, 0.2]],
            },
            "knockout": {"tested": {"effect_pct": 14.2, "ci95": [9.0, 19.5]}},
            "dose_response": [
                {"alpha": a, "edge_delta_s": -1.0 * a, "whole_delta_s": -0.8 * a} for a in (0, 0.5, 1, 2, 3)
            ],
            "awareness": [
                {
                    "alpha": a,
                    "edge": {"diffaware": 0.4 + 0.02 * a, "ctxtaware": 0.9},
                    "whole": {"diffaware": 0.4 + 0.01 * a, "ctxtaware": 0.88},
                }
                for a in (1.0, 2.0, 3.0)
            ],
        }
    )
    neurons = new_findings("neurons", ckpt, "1" * 64, {"method": 1}, "test")
    neurons["summary"] = {
        "n": 3,
        "score": "bias",
        "rule": "global",
        "categories": ["age", "gender"],
        "neurons": [
            {"layer": 2, "neuron": i, "bias": 0.5 - 0.1 * i, "signed": 0.1, "top_category": "age"} for i in range(3)
        ],
        "layer_distribution": [0, 0, 3],
        "overlap": {"categories": ["age", "gender"], "n": 3, "jaccard": [[1.0, 0.2], [0.2, 1.0]]},
    }
    result = new_result({"path": "edited"}, {"path": "source"}, {"limit": 10})
    result["metrics"] = {
        "model": {"perplexity": 12.0, "mcq_accuracy": 0.5, "bbq_bias_ambig": 0.02},
        "against": {"perplexity": 11.0, "mcq_accuracy": 0.52, "bbq_bias_ambig": 0.08},
    }
    result["retained_pct"] = {"perplexity": 91.7, "mcq_accuracy": 96.2}
    paths = {name: tmp_path / f"{name}.json" for name in ("heads", "neurons", "eval")}
    save_findings(HeadsFindings.from_dict(heads), paths["heads"])
    save_findings(NeuronsFindings.from_dict(neurons), paths["neurons"])
    save_result(result, paths["eval"])
    return paths


def test_report_renders_every_figure(inputs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    md = build_report([inputs["heads"], inputs["neurons"]], [inputs["eval"]], out)
    text = md.read_text()
    pngs = sorted(out.glob("*.png"))
    assert {p.name for p in pngs} == {
        "01-heads-heads.png",
        "01-heads-dose.png",
        "02-neurons-layers.png",
        "02-neurons-overlap.png",
        "eval01-eval-before-after.png",
    }
    for p in pngs:
        w, h = _png_size(p)
        assert w > 200 and h > 150 and p.stat().st_size > 5000, p.name
        assert f"]({p.name})" in text  # every figure is linked from the markdown
    assert "Selected heads (layer.head): 1.2, 2.0" in text and "reduces |ΔS| by 14.2%" in text
    assert (
        "| 2 | 0 | 0.5 | 0.1 | — | — | age |" in text
        and "| General-knowledge MCQ accuracy | 0.52 | 0.5 | 96.2% |" in text
    )


def test_neuron_table_shows_the_ranking_score_and_the_choosing_category(inputs, tmp_path):
    """Ranked by fairness: the fairness and PPM columns are there; per-category: the category that chose it."""
    pytest.importorskip("matplotlib")
    data = json.loads(inputs["neurons"].read_text())
    data["summary"].update(score="fairness", rule="per-category")
    for row in data["summary"]["neurons"]:
        row.update(fairness=0.9, ppm=2.5, chosen_for="gender")  # its strongest category is age
    inputs["neurons"].write_text(json.dumps(data))
    text = build_report([inputs["neurons"]], [], tmp_path / "r").read_text()
    assert "| layer | neuron | bias | signed | fairness | PPM | chosen for |" in text
    assert "| 2 | 0 | 0.5 | 0.1 | 0.9 | 2.5 | gender |" in text


def test_partial_findings_still_report(inputs, tmp_path):
    pytest.importorskip("matplotlib")
    data = json.loads(inputs["heads"].read_text())
    for key in ("discovery", "dose_response", "awareness", "knockout"):
        data.pop(key)
    inputs["heads"].write_text(json.dumps(data))
    md = build_report([inputs["heads"]], [], tmp_path / "partial")
    assert "Selected heads" in md.read_text() and not list((tmp_path / "partial").glob("*.png"))


def test_without_matplotlib_the_message_names_the_extra(inputs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SurgeryError, match=re.escape(pip_install("plots"))):
        build_report([inputs["heads"]], [], tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_cli_report(inputs, tmp_path):
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from surgery.cli.main import cli

    r = CliRunner().invoke(
        cli, ["report", str(inputs["neurons"]), "--eval", str(inputs["eval"]), "--out", str(tmp_path / "rep")]
    )
    assert r.exit_code == 0, r.output
    assert "3 figures" in r.output


def test_report_draws_direction_findings(tiny, tmp_path):
    """find-direction's findings: the per-layer table and one figure (separation, norms, cosines)."""
    pytest.importorskip("matplotlib")
    found = new_findings("directions", Checkpoint(tiny("llama")), "2" * 64, {"method": 1}, "test")
    found.update(
        dataset={
            "a": {"file": "a.txt", "prompts": 12, "sha256": "3" * 64},
            "b": {"file": "b.txt", "prompts": 10, "sha256": "4" * 64},
        },
        best_layer=1,
        layers=[
            {"layer": i, "norm": 1.0 + i, "norm_a": 2.0, "norm_b": 2.0, "separation": s, "accuracy": a}
            for i, (s, a) in enumerate([(0.5, 0.6), (3.0, 1.0), (1.0, 0.75)])
        ],
        cosine=[[1.0, 0.5, 0.2], [0.5, 1.0, 0.7], [0.2, 0.7, 1.0]],
    )
    save_findings(DirectionsFindings.from_dict(found), tmp_path / "direction.json")
    md = build_report([tmp_path / "direction.json"], [], tmp_path / "report")
    text = md.read_text()
    w, h = _png_size(tmp_path / "report" / "01-direction-directions.png")
    assert w > 400 and h > 200 and "](01-direction-directions.png)" in text
    assert "a: 12 prompts, b: 10 prompts; best separation at layer 1." in text and "| 1 | 2 | 3 | 100.0% |" in text
    # one prompt a side: every layer infinite, and "layer 0" (the first of the tie) was no finding
    found.update(
        dataset={side: {"file": f"{side}.txt", "prompts": 1, "sha256": "5" * 64} for side in "ab"},
        best_layer=0,
        layers=[{"layer": i, "norm": 1.0, "separation": math.inf, "accuracy": 1.0} for i in range(3)],
    )
    save_findings(DirectionsFindings.from_dict(found), tmp_path / "one.json")
    text = build_report([tmp_path / "one.json"], [], tmp_path / "one-report").read_text()
    assert "a: 1 prompt, b: 1 prompt; layers 0, 1, 2 separate equally well (no spread within a set)" in text


def test_report_draws_a_tune_front_with_its_held_out_confirmation(tiny, tmp_path):
    """A tune record (surgery tune's tune.json): the front with the chosen point and its held-out
    confirmation in one figure, and a row per front point."""
    pytest.importorskip("matplotlib")
    from surgery.find.findings import ModelIdentity
    from surgery.find.tune.record import Chosen, HeldOutConfirmation, SplitSizes, Trial, TuneRecord, save_record

    points = [(0, 1.5, 0.2, 2), (1, 1.0, 0.01, 1), (2, 0.5, 0.3, 3), (3, 2.0, 0.5, 2)]
    record = TuneRecord(
        method="heads",
        model=ModelIdentity.of(Checkpoint(tiny("llama"))),
        parameters={"trials": 4},
        study={"storage": "study.db", "sampler": "tpe", "seed": 0},
        objectives={"effect": "ΔS gain", "kl": "first-token KL"},
        split=SplitSizes(
            seed=0,
            test_share=0.5,
            tune_items=["a"],
            test_items=["b"],
            tune_pairs=4,
            test_pairs=4,
            tune_neutral=2,
            test_neutral=2,
        ),
        trials=[
            Trial(number=n, params={"alpha": 1 + e, "top": top}, effect=e, kl=k, heads=[[0, 1]][:top])
            for n, e, k, top in points
        ],
        front=[1, 0, 3],
        chosen=Chosen(number=0, rule="knee"),
        confirmation=HeldOutConfirmation(effect=1.2, effect_ci95=[0.9, 1.5], kl=0.25, kl_ci95=[0.2, 0.3]),
    )
    save_record(record, tmp_path / "tune.json")
    md = build_report([tmp_path / "tune.json"], [], tmp_path / "report")
    text = md.read_text()
    (png,) = (tmp_path / "report").glob("*.png")
    assert png.name == "01-tune-front.png" and f"]({png.name})" in text
    w, h = _png_size(png)
    assert w > 200 and h > 150
    assert "4 trials (tpe, seed 0); 3 on the Pareto front" in text and "Chosen: trial 0 (the knee)" in text
    assert "ΔS gain (S units) 1.2 (95% CI 0.9 – 1.5), KL 0.25 (95% CI 0.2 – 0.3)" in text
    assert [line for line in text.splitlines() if line.startswith("| 1 | alpha 2")] == [
        "| 1 | alpha 2, top 1 | 1 | 0.01 |"
    ]
    assert "Caveat" not in text

    # a held-out effect not shown above 0 (SmolLM2: -0.25 [-0.75, 0]) was quoted without a word
    from dataclasses import replace

    record = replace(record, confirmation=replace(record.confirmation, effect=-0.25, effect_ci95=[-0.75, 0.0]))
    save_record(record, tmp_path / "tune.json")
    text = build_report([tmp_path / "tune.json"], [], tmp_path / "report-2").read_text()
    assert "**Caveat:** the held-out effect's 95% CI does not lie above 0: the chosen edit is not shown" in text


def test_a_registered_finder_without_a_section_gets_its_parameters(tiny, tmp_path, monkeypatch):
    """A family registered beyond the shipped ones (surgery.find.finders) reports as its record,
    with a short section: its kind, command, model and parameters."""
    from dataclasses import dataclass
    from typing import ClassVar

    from surgery.find import finders
    from surgery.find.findings import Findings

    @dataclass(kw_only=True)
    class FeatureFindings(Findings):
        KIND: ClassVar[str] = "features"

    list(finders.finders())
    monkeypatch.setattr(finders, "_FINDERS", dict(finders._FINDERS))
    finders.register_finder(
        "features", find_command="find-features", bake_command="ablate-features", record=FeatureFindings, params=()
    )
    raw = new_findings("features", Checkpoint(tiny("llama")), "2" * 64, {"width": 16, "layer": 3}, "test")
    save_findings(FeatureFindings.from_dict(raw), tmp_path / "features.json")
    md = build_report([tmp_path / "features.json"], [], tmp_path / "report").read_text()
    assert "## features findings (find-features) — " in md
    assert "- width: 16\n- layer: 3\n" in md


def test_a_heads_finding_without_significance_is_reported_with_its_caveats(inputs, tmp_path):
    pytest.importorskip("matplotlib")
    data = json.loads(inputs["heads"].read_text())
    data["scores"] = {"S": {"delta": 0.0098, "p": 0.72, "n_items": 8}}
    data["knockout"]["tested"]["ci95"] = [float("nan"), float("nan")]  # no bootstrap interval
    data["knockout"]["random"] = {"n": 3, "mean_pct": 5.4, "p": 0.75}
    inputs["heads"].write_text(json.dumps(data))
    text = build_report([inputs["heads"]], [], tmp_path / "r").read_text()
    assert "nan" not in text and "reduces |ΔS| by 14.2%\n" in text
    assert "ΔS = 0.0098 (match − mismatch; paired t-test over 8 items, p = 0.72)" in text
    assert "3 run, mean reduction 5.4%; p = 0.75" in text
    assert "**Caveat:** ΔS itself is not significant (p = 0.720)" in text
    assert "**Caveat:** the knockout reduction has no 95% CI" in text


def test_a_folder_given_to_report_is_named_a_folder(inputs, tmp_path):
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "tune.json").write_text("{}")
    with pytest.raises(SurgeryError) as caught:
        build_report([tmp_path / "tuned"], [], tmp_path / "r")
    said = str(caught.value)
    assert "tuned is a folder" in said and str(tmp_path / "tuned" / "tune.json") in said and "\n" not in said
    assert not (tmp_path / "r").exists()


def test_an_eval_result_given_as_findings_is_named_and_pointed_to_eval(inputs, tmp_path):
    with pytest.raises(SurgeryError) as caught:
        build_report([inputs["eval"]], [], tmp_path / "r")
    assert str(caught.value) == f"{inputs['eval']} is an eval result, not findings; give it as --eval {inputs['eval']}"


def test_an_out_named_like_a_file_is_refused_before_the_work(inputs, tmp_path):
    """`report --out report.md` wrote a folder named report.md; a name a user means as a file is refused."""
    import subprocess
    import sys

    args = ["report", str(inputs["neurons"]), "--out", str(tmp_path / "report.md")]
    r = subprocess.run([sys.executable, "-m", "surgery", *args], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "--out" in r.stderr and "names a file" in r.stderr and str(tmp_path / "report") in r.stderr
    assert not (tmp_path / "report.md").exists()
