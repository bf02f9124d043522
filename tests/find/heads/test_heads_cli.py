"""find-heads / amplify-heads / score-binding end to end on tiny models; edge-α during generation."""

from __future__ import annotations

import json

import pytest

from surgery.bake.verify import verify
from surgery.cli.main import main
from surgery.core.errors import SurgeryError
from surgery.evaluation.awareness import awareness
from surgery.find.findings import load_findings
from surgery.find.heads.attention import EdgeEdit, surgery_attention_on
from surgery.find.heads.awareness import awareness_at, edge_edit_in_generation, encode_records
from surgery.find.heads.benchmark import awareness_records, load_benchmark
from surgery.find.heads.causal import confirmed_order
from surgery.find.heads.find import cached_find_heads
from surgery.find.heads.pairs import build_pairs
from surgery.find.heads.params import FindParams
from surgery.model.loading import load_model
from tests.support.binding import FAST, char_model, write_small_benchmark
from tests.support.cli import main_stdout
from tests.support.tokenizer import char_tokenizer


def _fails(capsys, *args) -> str:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    assert exc.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("Error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


def test_find_heads_then_amplify_heads(tiny, tmp_path, capsys):
    model = char_model(tiny, "llama")
    bench = write_small_benchmark(tmp_path / "small.jsonl")
    out = main_stdout(capsys, "find-heads", model, "--benchmark", bench, *FAST, "--out", tmp_path / "f.json")
    assert "Discovery: CV AUC" in out and "Edge knockout" in out
    f = load_findings(tmp_path / "f.json", "heads").to_dict()
    assert f["dataset_sha256"] and f["parameters"]["max_pairs"] == 4 and len(f["selected_heads"]) == 3
    assert f["knockout"]["tested"]["ci95"] and f["knockout"]["random"]["n"] == 1
    assert len(f["discovery"]["heads"]) == 3 * 4 and "auc" in f["discovery"]
    assert "Cached findings" in main_stdout(capsys, "find-heads", model, "--benchmark", bench, *FAST)
    # amplify-heads reuses the cached findings (same parameters) and bakes the top 2 heads
    baked = tmp_path / "baked"
    out = main_stdout(
        capsys, "amplify-heads", model, "--alpha", "2.5", "--top", "2", "--benchmark", bench, *FAST, "--out", baked
    )
    assert "Heads from findings" in out and "Baked 2 edits" in out
    prov = json.loads((baked / "surgery.json").read_text())
    heads = [[e["layer"], e["head"]] for e in prov["recipe"]["edits"]]
    assert heads == f["selected_heads"][:2] and all(e["alpha"] == 2.5 for e in prov["recipe"]["edits"])
    assert prov["heads_findings"]["dataset_sha256"] == f["dataset_sha256"]
    assert verify(__import__("surgery.core.checkpoint", fromlist=["Checkpoint"]).Checkpoint(model), baked).ok
    from transformers import AutoModelForCausalLM  # stock transformers loads it, no custom code

    assert AutoModelForCausalLM.from_pretrained(baked) is not None
    # the --heads mode still works and refuses to mix with findings options
    out = main_stdout(capsys, "amplify-heads", model, "--heads", "0.1,2.3", "--alpha", "2", "--out", tmp_path / "h")
    assert "Baked 2 edits" in out
    assert "drop --findings" in _fails(
        capsys, "amplify-heads", model, "--heads", "0.1", "--top", "1", "--alpha", "2", "--out", tmp_path / "x"
    )
    # instruct → base transfer: findings of one checkpoint on another of the same architecture
    other = char_model(tiny, "llama", seed=1)
    assert "--transfer" in _fails(
        capsys, "amplify-heads", other, "--alpha", "2.5", "--findings", tmp_path / "f.json", "--out", tmp_path / "a"
    )
    out = main_stdout(
        capsys,
        "amplify-heads",
        other,
        "--alpha",
        "2.5",
        "--findings",
        tmp_path / "f.json",
        "--transfer",
        "--out",
        tmp_path / "b",
    )
    prov = json.loads((tmp_path / "b" / "surgery.json").read_text())
    assert "Baked 3 edits" in out and prov["heads_findings"]["transfer"] is True
    gemma = char_model(tiny, "gemma2")
    assert "different model" in _fails(
        capsys,
        "amplify-heads",
        gemma,
        "--alpha",
        "2.5",
        "--findings",
        tmp_path / "f.json",
        "--transfer",
        "--out",
        tmp_path / "c",
    )


def test_find_heads_confirms_the_selection_by_single_head_knockouts(tiny, tmp_path, capsys):
    model = char_model(tiny, "llama")
    bench = write_small_benchmark(tmp_path / "small.jsonl")
    out = main_stdout(
        capsys,
        "find-heads",
        model,
        "--benchmark",
        bench,
        *FAST,
        "--confirm",
        "5",
        "--exhaustive",
        "--out",
        tmp_path / "f.json",
    )
    assert "Knockout confirmation" in out and "Attribution-patching screen" not in out
    f = load_findings(tmp_path / "f.json", "heads").to_dict()
    conf = f["confirmation"]
    top5 = {(h["layer"], h["head"]) for h in f["discovery"]["heads"][:5]}
    assert conf["candidates"] == 5 and {(h["layer"], h["head"]) for h in conf["heads"]} == top5
    assert conf["heads"] == confirmed_order(conf["heads"]) and f["parameters"]["confirm"] == 5
    assert conf["n_significant"] == sum(h["significant"] for h in conf["heads"])
    assert f["selected_heads"] == [[h["layer"], h["head"]] for h in conf["heads"][:3]]
    # amplify-heads --top beyond the selection follows the confirmed ranking, not discovery's
    main_stdout(
        capsys,
        "amplify-heads",
        model,
        "--alpha",
        "2",
        "--findings",
        tmp_path / "f.json",
        "--top",
        "4",
        "--out",
        tmp_path / "a",
    )
    edits = json.loads((tmp_path / "a" / "surgery.json").read_text())["recipe"]["edits"]
    assert [[e["layer"], e["head"]] for e in edits] == [[h["layer"], h["head"]] for h in conf["heads"][:4]]
    # the default: discovery's top 10 knocked out alone in the screen's order, its top 3 of them first,
    # the screen shown beside them
    out = main_stdout(capsys, "find-heads", model, "--benchmark", bench, *FAST, "--out", tmp_path / "s.json")
    assert "Attribution-patching screen" in out
    sc = load_findings(tmp_path / "s.json", "heads").to_dict()
    pool = [(h["layer"], h["head"]) for h in sc["discovery"]["heads"][:10]]
    order = [(h["layer"], h["head"]) for h in sc["screen"]["heads"] if (h["layer"], h["head"]) in pool]
    knocked = {(h["layer"], h["head"]) for h in sc["confirmation"]["heads"]}
    assert set(order[:3]) <= knocked <= set(pool)
    assert all(h["screen_rank"] >= 1 for h in sc["confirmation"]["heads"])
    # --confirm 0: discovery's top heads, unconfirmed
    main_stdout(
        capsys, "find-heads", model, "--benchmark", bench, *FAST, "--confirm", "0", "--out", tmp_path / "g.json"
    )
    g = load_findings(tmp_path / "g.json", "heads").to_dict()
    assert "confirmation" not in g
    assert g["selected_heads"] == [[h["layer"], h["head"]] for h in g["discovery"]["heads"][:3]]
    assert "--confirm 2" in _fails(capsys, "find-heads", model, "--benchmark", bench, *FAST, "--confirm", "2")


def test_score_binding_json(tiny, tmp_path, capsys):
    model = char_model(tiny, "qwen2")
    bench = write_small_benchmark(tmp_path / "small.jsonl")
    res = json.loads(main_stdout(capsys, "score-binding", model, "--benchmark", bench, "--max-pairs", "2", "--json"))
    assert res["S"]["n_pairs"] == 2 and res["K"]["n_items"] == 2 and "p" in res["S"]
    assert "give 'builtin'" in _fails(capsys, "score-binding", model, "--benchmark", tmp_path / "none.jsonl")
    # the table says what S, K and option mass are, not only their numbers
    table = main_stdout(capsys, "score-binding", model, "--benchmark", bench, "--max-pairs", "2")
    assert "S: log-odds of the equal-treatment option (c)" in table and "K: the same score" in table
    assert "option mass: the share of probability on the option letters" in table


def test_dose_response_findings_and_edge_alpha_in_generation(tiny, tmp_path):
    path = char_model(tiny, "gemma3_text")
    bench = load_benchmark(write_small_benchmark(tmp_path / "small.jsonl"))
    pairs = build_pairs(bench, seed=0, max_pairs=4)
    records = awareness_records(bench, seed=0)[:2]  # one "≠" and one "=" question
    params = FindParams(
        max_pairs=4,
        random_sets=1,
        dose_response=True,
        dose_grid=(0.0, 1.0, 2.5),
        awareness_alphas=(1.0, 2.5),
        knockout_heads=2,
    )
    found = cached_find_heads(path, pairs, params, awareness_records=records)
    f = found.data.to_dict()
    assert not found.from_cache and found.path.is_file()
    assert [r["alpha"] for r in f["dose_response"]] == [0.0, 1.0, 2.5]
    assert [r["alpha"] for r in f["awareness"]] == [1.0, 2.5]
    assert f["awareness"][1]["edge"]["n_diff"] == 1 and f["awareness"][1]["whole"]["n_equal"] == 1
    # edge-α during generate: every row is recognised and gets its own spans
    model, tok = load_model(path), char_tokenizer()
    table = encode_records(tok, records, False)
    assert len(table) == len(records)
    with surgery_attention_on(model):
        with edge_edit_in_generation(model, table, EdgeEdit({0: (0, 1, 2, 3), 1: (0, 1, 2, 3)}, 0.0)) as plan:
            awareness(model, tok, records, instruct=False, batch_size=4, max_new_tokens=2)
            assert plan.masks["tested"].sum() > 0 and plan.masks["item"].sum() > 0
            rows = plan.masks["tested"].any(-1)
            assert rows.all()
        with edge_edit_in_generation(model, {}, EdgeEdit({0: (0,)}, 0.0)):
            with pytest.raises(SurgeryError, match="does not match any record"):
                awareness(model, tok, records[:1], instruct=False, max_new_tokens=1)
        rows = awareness_at(model, tok, records, [(0, 0)], (1.0,), instruct=False)
    assert rows[0]["edge"] == rows[0]["whole"]


def test_alpha_that_zeroes_a_head_needs_allow_zero_and_the_rule_is_the_stored_dtype(tiny, tmp_path, capsys):
    """1e-40 × weights of ~0.02 is a float32 subnormal (kept) but underflows bfloat16 (refused);
    with --allow-zero the head's o_proj columns are baked to exact zeros."""
    import torch
    from safetensors import safe_open

    f32, bf16 = tiny("llama"), tiny("llama", dtype=torch.bfloat16)
    main_stdout(
        capsys, "amplify-heads", f32, "--heads", "0.1", "--alpha", "1e-40", "--out", tmp_path / "f32", "--no-verify"
    )
    line = _fails(capsys, "amplify-heads", bf16, "--heads", "0.1", "--alpha", "1e-40", "--out", tmp_path / "bf16")
    assert "rounds every weight of head 0.1 to zero in this BF16 checkpoint" in line
    assert not (tmp_path / "bf16").exists()
    main_stdout(
        capsys, "amplify-heads", bf16, "--heads", "0.1", "--alpha", "1e-40", "--allow-zero", "--out", tmp_path / "bf16"
    )
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        w = f.get_tensor("model.layers.0.self_attn.o_proj.weight")
    assert not w[:, 8:16].any() and w[:, :8].abs().min() > 0
    with safe_open(str(tmp_path / "f32" / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.layers.0.self_attn.o_proj.weight")[:, 8:16].all()


def test_alpha_sweep_json_is_one_document(tiny, tmp_path, capsys):
    """--json on a sweep prints one JSON list (one object per value, with its label), not objects back to back."""
    model = tiny("llama")
    sweep = tmp_path / "sweep"
    doc = json.loads(
        main_stdout(
            capsys, "amplify-heads", model, "--heads", "0.1", "--alpha", "2,3", "--no-verify", "--json", "--out", sweep
        )
    )
    assert [d["label"] for d in doc] == ["alpha-2", "alpha-3"]
    assert [d["out"] for d in doc] == [str(sweep / "alpha-2"), str(sweep / "alpha-3")]
    for d, alpha in zip(doc, (2.0, 3.0)):
        assert d["edits"] == 1 and d["tensors_edited"] == 1
        assert json.loads((sweep / d["label"] / "surgery.json").read_text())["recipe"]["edits"][0]["alpha"] == alpha


def test_sweep_checks_every_destination_before_baking(tiny, tmp_path, capsys):
    model = tiny("llama")
    sweep = tmp_path / "sweep"
    (sweep / "alpha-3").mkdir(parents=True)
    line = _fails(capsys, "amplify-heads", model, "--heads", "0.1", "--alpha", "2,3", "--out", sweep)
    # the values already baked and those missing, as after an interrupted sweep
    assert "sweep already holds alpha-3; not yet baked: alpha-2 (sweep only those values" in line
    assert "pass --force to bake them again" in line
    assert sorted(p.name for p in sweep.iterdir()) == ["alpha-3"]  # alpha-2 was not baked first
    # a sweep folder inside the source is refused before it is created there
    line = _fails(capsys, "amplify-heads", model, "--heads", "0.1", "--alpha", "2,3", "--out", model / "sweep")
    assert "inside the source" in line and not (model / "sweep").exists()


def test_an_alpha_of_1_is_said_to_change_nothing(tiny, tmp_path, capsys):
    from tests.support.cli import run_main

    model = tiny("llama")
    done = run_main(["amplify-heads", model, "--heads", "0.1", "--alpha", "1,2", "--out", tmp_path / "s"], capsys)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())  # rich may wrap the note
    assert "note: 1 of the 1 edit changes nothing (α or factor 1, weight 0): head 0.1 (1.0);" in said
    assert said.count("changes nothing") == 1  # α = 2 changes the head: no note


def test_heads_given_by_hand_refuse_find_heads_options_they_would_ignore(tiny, tmp_path, capsys):
    import surgery
    from surgery.core.errors import ParameterError

    model, out = tiny("llama"), tmp_path / "amp"
    line = _fails(capsys, "amplify-heads", model, "--heads", "0.1", "--alpha", "2", "--max-pairs", "4", "--out", out)
    assert (
        line
        == "Error: --heads names the heads itself, so no findings are read or computed; drop --max-pairs, or drop --heads"
    )
    line = _fails(capsys, "amplify-heads", model, "--heads", "0.1", "--alpha", "2", "--recompute", "--out", out)
    assert "drop --recompute, or drop --heads" in line
    with pytest.raises(ParameterError, match="drop max_pairs, or drop heads"):
        surgery.amplify_heads(model, out, alpha=2.0, heads=[(0, 1)], max_pairs=4)
    assert not out.exists()


def test_an_unreachable_random_set_level_is_said_before_the_work(tiny, tmp_path, capsys):
    from tests.support.cli import run_main

    model = char_model(tiny, "llama")
    bench = write_small_benchmark(tmp_path / "small.jsonl")
    done = run_main(["find-heads", model, "--benchmark", bench, *FAST], capsys)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())
    unreachable = said.index("with --random-sets 1 the random-set baseline's smallest p is 1/2")
    assert unreachable < said.index("scoring prompts")  # not minutes into the run
    assert said.count("smallest p is") == 1
