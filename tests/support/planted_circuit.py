"""What the planted binding-circuit proofs share: their thresholds, the find-heads run, the criteria."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import cli_env, run_here

HELD_OUT_SEED = 4242  # pairs neither training (seed + 1) nor the brute force drew
PER_ITEM = 4  # pairs per item for the brute force and the held-out checks
CIRCUIT_EFFECT = 20.0  # % of ΔS removed by one head's edge knockout: a clear circuit head
NO_EFFECT = 5.0  # % below which an effect counts as none (controls, heads outside the circuit)
LARGE_EFFECT = 50.0  # % the selected heads' knockout must remove
TOP = 3  # heads compared between find-heads and brute force (the paper's 2–3)
AMPLIFY = 2.0  # the α of the amplification checks
# Exact agreement of two implementations / of the bake and the run-time hook, in units of S.
SAME = 1e-4
# One thread: the model is tiny, and on a shared CPU extra threads spin rather than work.
ENV = cli_env(OMP_NUM_THREADS="1")


def find_heads_cli(fixture_dir: Path, tmp: Path, *options: str) -> dict:
    """``surgery find-heads`` on a planted fixture with its benchmark file (a fresh findings cache),
    with ``options`` (``--exhaustive``) added."""
    out = tmp / "findings.json"
    env = dict(ENV, SURGERY_CACHE=str(tmp / "cache"))
    res = run_here(
        [
            "find-heads",
            fixture_dir,
            "--benchmark",
            fixture_dir / "benchmark.jsonl",
            "--random-sets",
            "10",
            "--batch-size",
            "64",
            "--out",
            out,
            *options,
        ],
        env=env,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text())


def circuit(truth) -> list[tuple[int, int]]:
    """The brute-force circuit: every head whose own edge knockout removes CIRCUIT_EFFECT % of ΔS."""
    return [(r.layer, r.head) for r in truth[1] if r.edge >= CIRCUIT_EFFECT]


def check_screen_agrees(screened: dict, exhaustive: dict) -> None:
    """The screened procedure selects the heads the exhaustive one selects, after fewer single-head
    knockouts, at a fraction of its FLOPs; the screen ranks the heads it put forward as the exact
    knockouts do (Spearman ≥ 0.75 where 4 or more were put forward: one swap among 4 is 0.8)."""
    assert screened["selected_heads"] == exhaustive["selected_heads"]
    conf = screened["confirmation"]
    assert conf["candidates"] < exhaustive["confirmation"]["candidates"]
    if conf["candidates"] >= 4:
        assert conf["spearman"] >= 0.75, conf
    assert "screen" not in exhaustive and len(screened["screen"]["heads"]) == len(exhaustive["discovery"]["heads"])
    cost = screened["cost"]
    assert cost["forward_flops_full_passes"] == exhaustive["cost"]["forward_flops_full_passes"]
    assert cost["share_of_full_passes"] < exhaustive["cost"]["share_of_full_passes"]


def check_confirmed_selection(f: dict, truth) -> None:
    """The criterion for the knockout-confirmed selection against brute force: every selected head
    is a circuit head and brute force's best two are selected; every candidate brute force puts in
    the circuit has a significant single-head effect, every one it puts outside (|effect| below
    NO_EFFECT) has none above NO_EFFECT in the confirmation either."""
    brute = {(r.layer, r.head): r.edge for r in truth[1]}
    selected = [tuple(h) for h in f["selected_heads"]]
    best = [(r.layer, r.head) for r in truth[1][:2]]
    assert set(selected) <= set(circuit(truth)) and set(best) <= set(selected), (selected, circuit(truth))
    for h in f["confirmation"]["heads"]:
        edge = brute[(h["layer"], h["head"])]
        if edge >= CIRCUIT_EFFECT:
            assert h["significant"], h
        elif abs(edge) < NO_EFFECT:
            assert abs(h["effect_pct"]) < NO_EFFECT, h
