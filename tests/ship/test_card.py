"""Model cards: front matter, body sections, and exact verify/undo around the card."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from surgery.bake.bake import bake
from surgery.bake.card import card_hook, card_text
from surgery.bake.check import edited_check
from surgery.bake.record import BakeRecord, UndoRecord
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import VerificationError
from surgery.core.evaluation_table import Evaluation
from surgery.model.loading import Source
from surgery.ship.card import refresh_card

RECIPE = Recipe((HeadScale(0, 1, 2.5), NeuronScale(1, 3, 0.0)))
EVALUATION = {
    "rows": [
        {"label": "Perplexity (retention passages)", "before": 12.5, "after": 12.75, "retained_pct": 98.04},
        {"label": "BBQ bias (ambiguous)", "before": 0.1, "after": 0.05, "retained_pct": None},
    ]
}


def _measured(path) -> dict:
    """What surgery eval records about a model it measured."""
    from surgery.core.evaluation_result import measured

    return measured(path, Checkpoint(path).fingerprint())


def _record(recipe: Recipe, source: Source) -> BakeRecord:
    """The record of a bake of ``recipe`` from ``source`` that edited nothing yet: what a card needs."""
    return BakeRecord(
        tool_version="0",
        created="2026-12-01T00:00:00+00:00",
        source=source,
        model_type="llama",
        recipe=recipe,
        edited_tensors=[],
        files={},
        source_files={},
        undo=UndoRecord(file="surgery.undo", replaced_files=[], added_files=[]),
    )


def _meta(text: str) -> dict:
    return yaml.safe_load(text[4 : text.index("\n---", 4)])


def _source_with_card(tiny):
    src = tiny("llama")
    (src / "README.md").write_text("---\nlicense: apache-2.0\nlanguage: [en]\n---\n# Source card\n")
    return src


def test_card_front_matter_and_sections(tiny, tmp_path):
    src = _source_with_card(tiny)
    ckpt = Checkpoint(src)
    out = tmp_path / "baked"
    bake(
        ckpt,
        RECIPE,
        out,
        source=Source(src, "org/tiny-llama", None),
        check=edited_check(ckpt, RECIPE),
        card=card_hook(Evaluation.from_dict(EVALUATION)),
        extra={
            "findings": {"kind": "heads", "top_head": "0.1", "delta_s": -0.42},
            "heads_findings": {"selected_heads": [[7, 7], [8, 17]], "rows": [{"layer": 1}] * 20},
        },
    )
    text = (out / "README.md").read_text()
    meta = _meta(text)
    assert meta["base_model"] == "org/tiny-llama" and meta["base_model_relation"] == "finetune"
    assert meta["license"] == "apache-2.0" and meta["language"] == ["en"] and meta["library_name"] == "transformers"
    assert {"surgery", "attention-heads", "neuron-pruning"} <= set(meta["tags"])
    prov = json.loads((out / "surgery.json").read_text())
    assert f"{prov['verification']['max_abs_diff']:.2e}" in text and "surgery verify SOURCE" in text
    assert "| attention head | 0 | 1 | α = 2.5 |" in text and "| MLP neuron | 1 | 3 | 0 |" in text
    assert "  - delta_s: -0.42" in text and "  - top_head: 0.1" in text  # why: the findings summary
    assert "  - selected_heads: 7.7, 8.17" in text and "  - rows: 20 entries (see surgery.json)" in text
    assert "| Perplexity (retention passages) | 12.5 | 12.75 | 98.0% |" in text
    assert prov["evaluation"] == EVALUATION  # the table is in provenance too
    assert prov["undo"]["replaced_files"] == ["README.md"]


def test_local_source_has_no_base_model(tiny, tmp_path):
    bake(Checkpoint(tiny("llama")), RECIPE, tmp_path / "baked", card=card_hook())
    meta = _meta((tmp_path / "baked" / "README.md").read_text())
    assert "base_model" not in meta and "base_model_relation" not in meta and "license" not in meta


def test_refresh_card_keeps_verify_and_undo_exact(tiny, tmp_path):
    src = _source_with_card(tiny)
    out = tmp_path / "baked"
    bake(Checkpoint(src), RECIPE, out, card=card_hook())
    assert "Evaluation" not in (out / "README.md").read_text()
    refresh_card(out, Evaluation.from_dict(EVALUATION))
    text = (out / "README.md").read_text()
    assert "## Evaluation: before and after" in text and _meta(text)["license"] == "apache-2.0"
    prov = json.loads((out / "surgery.json").read_text())
    assert prov["files"]["README.md"] == file_sha256(out / "README.md") and prov["evaluation"] == EVALUATION
    assert verify(Checkpoint(src), out, run_model=False).ok
    undo(out, tmp_path / "restored")
    for f in src.iterdir():
        assert file_sha256(f) == file_sha256(tmp_path / "restored" / f.name), f.name


def test_refresh_card_without_source_card_adds_it(tiny, tmp_path):
    src = tiny("llama")
    out = tmp_path / "baked"
    bake(Checkpoint(src), RECIPE, out)  # library bake without a card
    refresh_card(out)
    prov = json.loads((out / "surgery.json").read_text())
    assert prov["undo"]["added_files"] == ["README.md"]
    assert verify(Checkpoint(src), out, run_model=False).ok
    undo(out, tmp_path / "restored")
    assert sorted(p.name for p in (tmp_path / "restored").iterdir()) == sorted(p.name for p in src.iterdir())


def test_refresh_card_refuses_tampered_folder(tiny, tmp_path):
    out = tmp_path / "baked"
    bake(Checkpoint(tiny("llama")), RECIPE, out, card=card_hook())
    (out / "config.json").write_text("{}")
    with pytest.raises(VerificationError, match="changed after the bake"):
        refresh_card(out, Evaluation.from_dict(EVALUATION))


def test_card_text_lists_many_edits_compactly():
    recipe = Recipe(tuple(NeuronScale(2, i, 0.0) for i in range(100)))
    text = card_text(_record(recipe, Source(Path("/x/src"))))
    assert "and 36 more edits" in text and text.count("| MLP neuron |") == 64


def test_card_command_with_eval_json(tiny, tmp_path):
    from click.testing import CliRunner

    from surgery.cli.main import cli
    from surgery.core.evaluation_result import new_result, save_result

    src = tiny("llama")
    out = tmp_path / "baked"
    bake(Checkpoint(src), RECIPE, out, card=card_hook())
    result = new_result(_measured(out), _measured(src), {"limit": 5})
    result["metrics"] = {"model": {"mcq_accuracy": 0.4}, "against": {"mcq_accuracy": 0.5}}
    result["retained_pct"] = {"mcq_accuracy": 80.0}
    save_result(result, tmp_path / "eval.json")
    r = CliRunner().invoke(cli, ["card", str(out), "--eval", str(tmp_path / "eval.json")])
    assert r.exit_code == 0, r.output
    assert "| General-knowledge MCQ accuracy | 0.5 | 0.4 | 80.0% |" in (out / "README.md").read_text()
    assert verify(Checkpoint(src), out, run_model=False).ok


@pytest.mark.parametrize(
    "damage, named",
    [
        (lambda out: (out / "config.json").write_text("{}"), "config.json changed after the bake"),
        (lambda out: (out / "pytorch_model.bin").write_bytes(b"x"), "pytorch_model.bin holds weights"),
        (lambda out: (out / "notes.txt").write_text("x"), "notes.txt is not recorded"),
    ],
)
def test_refresh_refuses_a_folder_that_fails_the_integrity_check(tiny, tmp_path, damage, named):
    """The card refresh runs the same integrity check as verify and push: it never re-seals a
    folder whose files no longer match their record."""
    out = tmp_path / "baked"
    bake(Checkpoint(tiny("llama")), RECIPE, out, card=card_hook())
    before = (out / "surgery.json").read_bytes()
    damage(out)
    with pytest.raises(VerificationError, match=named):
        refresh_card(out, Evaluation.from_dict(EVALUATION))
    assert (out / "surgery.json").read_bytes() == before


@pytest.mark.parametrize(
    "source_card",
    [
        None,
        "no front matter",
        "---\nlicense: apache-2.0\nlanguage: [en]\n---\n# Source card\n",
        "---\r\nlicense: other\r\nlicense_name: gemma\r\nlicense_link: https://x\r\npipeline_tag: text-generation\r\n---\r\n",
        "---\nbad: [unclosed\n---\n",
        "---\n- a list\n---\n",
        "---\nlicense: é中文\n---\n",
    ],
)
def test_card_is_what_huggingface_hub_renders(source_card):
    """The card is written without huggingface_hub's card classes (their import is most of a small
    bake): it must be byte for byte what ModelCard.from_template renders, and parse back the same."""
    from huggingface_hub import ModelCard, ModelCardData

    from surgery.bake.card import CARRIED_KEYS, front_matter, render_card

    text = card_text(_record(RECIPE, Source(Path("/m"), "org/m")), source_card)
    carried = {k: v for k, v in front_matter(source_card).items() if k in CARRIED_KEYS}
    body = text[text.index("\n---\n\n", 4) + 6 :]
    data = ModelCardData(
        base_model="org/m",
        base_model_relation="finetune",
        library_name="transformers",
        tags=["surgery", "model-surgery", "attention-heads", "neuron-pruning", "surgery"],
        **carried,
    )
    hub = str(ModelCard.from_template(data, template_str="---\n{{ card_data }}\n---\n\n{{ body }}\n", body=body))
    assert render_card(data.to_dict(), body) == hub == text
    assert ModelCard(text).data.to_dict() == _meta(text)


def test_card_names_the_weights_of_this_architecture(tiny, tmp_path):
    """The edits table names the entries each edit changed as this model names them (the site
    map), not Llama's names: phi3 fuses gate and up into one matrix."""
    src = tiny("phi3")
    ckpt = Checkpoint(src)
    bake(ckpt, RECIPE, tmp_path / "baked", card=card_hook())
    text = (tmp_path / "baked" / "README.md").read_text()
    d = ckpt.config["hidden_size"] // ckpt.config["num_attention_heads"]
    assert f"head output × 2.5 (`self_attn.o_proj` columns {d}–{2 * d - 1})" in text
    rows = f"3, {ckpt.config['intermediate_size'] + 3}"
    assert f"neuron pruned (zeroed: `mlp.down_proj` column 3; `mlp.gate_up_proj` rows {rows})" in text
    assert "gate_proj" not in text.replace("gate_up_proj", "")


def test_card_names_routed_expert_entries():
    from surgery.bake.card import edits_section
    from surgery.core.architectures import architecture

    config = {
        "model_type": "mixtral",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_local_experts": 4,
    }
    text = edits_section(Recipe((NeuronScale(1, 7, 0.0, expert=2),)), architecture(config))
    assert "| expert 2 neuron (`1:e2:7`) | 1 | 7 | 0 | neuron pruned (zeroed: " in text
    assert "(zeroed: expert 2's down matrix column 7; expert 2's gate matrix row 7; expert 2's up matrix row 7)" in text


def test_adapter_card_describes_what_the_adapter_changes(tiny, tmp_path):
    """The LoRA realises a pruned neuron on down_proj alone: its card names that column, not the
    gate/up rows the baked checkpoint also zeroes (phi3: the fused gate_up_proj)."""
    from surgery.bake.lora import export_lora

    src = tiny("phi3")
    export_lora(Checkpoint(src), RECIPE, tmp_path / "adapter")
    text = (tmp_path / "adapter" / "README.md").read_text()
    assert "neuron pruned (zeroed: `mlp.down_proj` column 3) |" in text
    assert "gate_up_proj" not in text.split("## What it edits")[1].split("\n\n")[1]  # not in the table
    assert "gate/up rows, which the baked checkpoint also zeroes, are not part of the adapter" in text


def test_card_refuses_an_evaluation_of_another_model(tiny, tmp_path, capsys):
    """surgery card --eval puts numbers on this model's card only when the eval measured this bake
    (and, for the source column, its source); anything else is one line and leaves the folder as it was."""
    from surgery.core.evaluation_result import new_result, save_result
    from tests.support.cli import error_line, run_main

    # A vocabulary this large puts the layers past every block the fingerprint samples: the
    # fingerprint alone cannot tell this bake from its source, as on a real model.
    src = tiny("llama", vocab_size=32768)
    out, other_alpha = tmp_path / "baked", tmp_path / "other-alpha"
    bake(Checkpoint(src), RECIPE, out, card=card_hook())
    bake(Checkpoint(src), Recipe((HeadScale(0, 1, 3.0), NeuronScale(1, 3, 0.0))), other_alpha)
    assert Checkpoint(src).fingerprint() == Checkpoint(out).fingerprint() == Checkpoint(other_alpha).fingerprint()
    stranger = tiny("llama")
    old = new_result({"path": str(out), "fingerprint": Checkpoint(out).fingerprint()}, None, {})  # before weight hashes
    cases = {
        "the source": (new_result(_measured(src), None, {}), "is an evaluation of another model"),
        "another α": (new_result(_measured(other_alpha), None, {}), "is an evaluation of another model"),
        "another model": (new_result(_measured(stranger), None, {}), "is an evaluation of another model"),
        "another source": (new_result(_measured(out), _measured(stranger), {}), "which is not the source"),
        "an older eval": (old, "does not record which bake it measured"),
    }
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    for name, (result, needle) in cases.items():
        result["metrics"] = {"model": {"mcq_accuracy": 0.4}, "against": {}}
        path = tmp_path / f"{name}.json"
        save_result(result, path)
        line = error_line(run_main(["card", out, "--eval", path], capsys))
        assert needle in line and f"re-run `surgery eval {out}" in line, (name, line)
        assert {f.name: f.read_bytes() for f in out.iterdir()} == before, name
    good = new_result(_measured(out), _measured(src), {})
    good["metrics"] = {"model": {"mcq_accuracy": 0.4}, "against": {"mcq_accuracy": 0.5}}
    save_result(good, tmp_path / "good.json")
    assert run_main(["card", out, "--eval", tmp_path / "good.json"], capsys).returncode == 0
    assert "| General-knowledge MCQ accuracy | 0.5 | 0.4 |" in (out / "README.md").read_text()


def test_card_names_no_local_path_and_keeps_the_caveats(tmp_path, capsys):
    """A card is meant for the Hub: a source under a home folder's Hub cache, findings in a file of
    that machine and a recipe written for a local folder show as names (the snapshot's repo, the
    file's name), never as paths; the findings' ΔS, knockout and selection keep their caveats."""
    from surgery.find.findings import model_identity
    from tests.support.cli import run_main
    from tests.support.tiny import build_tiny

    home = tmp_path / "home" / "someone"
    src = build_tiny(
        "llama", home / ".cache" / "huggingface" / "hub" / "models--org--tiny" / "snapshots" / ("0a1b2c" * 7)[:40]
    )
    findings = home / "work" / "findings.json"
    findings.parent.mkdir()
    findings.write_text(
        json.dumps(
            {
                "format": "surgery-findings",
                "version": 1,
                "kind": "heads",
                "model": model_identity(Checkpoint(src)),
                "scores": {"S": {"delta": -0.01, "p": 0.6}},
                "discovery": {"auc": 0.6, "heads": [{"layer": 0, "head": 1}]},
                "knockout": {"tested": {"effect_pct": -12.2, "ci95": [-15.6, 4.9]}},
                "confirmation": {"n_significant": 0, "heads": []},
                "selected_heads": [[0, 1]],
            }
        )
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"version: 1\nbase_model: {home / 'models' / 'other'}\nedits:\n"
        "  - {type: neuron, layer: 1, neuron: 3, factor: 0.0}\n"
    )
    runs = {
        "heads": ["amplify-heads", src, "--findings", findings, "--alpha", "2", "--out", tmp_path / "heads"],
        "recipe": ["apply", recipe, "--model", src, "--allow-other-base", "--out", tmp_path / "recipe"],
    }
    for name, args in runs.items():
        assert run_main(args, capsys).returncode == 0, capsys.readouterr().err
        text = (tmp_path / name / "README.md").read_text()
        assert str(tmp_path) not in text and ".cache" not in text and "someone" not in text, text
        assert text.count("org/tiny") >= 2  # the title and the sentence name the snapshot's repo
    heads = (tmp_path / "heads" / "README.md").read_text()
    assert "  - file: findings.json" in heads and "  - model: org/tiny" in heads
    assert "**Caveat:** ΔS itself is not significant (p = 0.600)" in heads
    assert "**Caveat:** the knockout reduction is not significant (its 95% CI [-15.6, 4.9] % includes 0)" in heads
    assert "**Caveat:** 1 of the 1 selected heads have no significant single-head knockout" in heads
    recipe_card = (tmp_path / "recipe" / "README.md").read_text()
    assert "The recipe was written for **other**" in recipe_card and "base_model: org/tiny" in recipe_card


def test_a_findings_ci_without_interval_shows_as_a_dash_not_nan():
    """find-heads records a bootstrap that gave no interval as [NaN, NaN]; the card says "—" and the caveat."""
    from types import SimpleNamespace

    from surgery.bake.card import why_section

    summary = {"delta_s": 0.0098, "p_s": 0.72, "knockout_effect_pct": -0.04, "knockout_ci95": [math.nan, math.nan]}
    text = why_section(SimpleNamespace(extra={"heads_findings": summary}, recipe=SimpleNamespace(notes={})))
    assert "nan" not in text.lower() and "  - knockout_ci95: —, —" in text
    assert "**Caveat:** the knockout reduction has no 95% CI" in text


def test_a_tuned_bake_whose_held_out_effect_is_not_above_0_says_so():
    """SmolLM2's direction tune baked a point whose held-out effect was -0.25 [-0.75, 0]; the card's tune
    summary quoted "confirmation: effect: -0.25" and no interval (a list in a mapping is left out)."""
    from types import SimpleNamespace

    from surgery.bake.card import why_section

    def card(ci: list[float]) -> str:
        tune = {"method": "direction", "confirmation": {"effect": sum(ci) / 2, "effect_ci95": ci, "items": 4}}
        return why_section(SimpleNamespace(extra={"tune": tune}, recipe=SimpleNamespace(notes={})))

    assert (
        "**Caveat:** on the held-out split the chosen point's effect was -0.375 (95% CI -0.75, 0): not shown above 0"
        in card([-0.75, 0.0])
    )
    assert "Caveat" not in card([0.25, 0.75])
