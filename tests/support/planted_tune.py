"""What the tune tests share: the dosed planted-binding fixture, heads findings that rank its heads as
brute force does, and neutral prompts in its vocabulary.

The findings are written from the fixture's ground truth (tests/fixtures/binding_dose/ground_truth.json,
every head's brute-force edge effect), so the tune is tested on a ranking known to be right and no
test pays for a find-heads run (its selection of the same head is proven in
tests/find/heads/test_planted_amplify.py). The shipped retention prompts are English, which the
planted tokenizer reads as unknown tokens: the neutral prompts are the benchmark's own stems around
its neutral items, words it knows that bind to no identity.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.paths import FIXTURES

DOSE = FIXTURES / "binding_dose"
BENCHMARK = DOSE / "benchmark.jsonl"
RANKED = 6  # heads the written findings rank (brute force's best first)
SELECTED = 3  # the selection they record (find-heads' default --knockout-heads)
NEUTRAL = 24  # neutral prompts written


def dosed_head() -> tuple[int, int]:
    """The one head that carries the binding (the fixture's training configuration)."""
    config = json.loads((DOSE / "training.json").read_text())["config"]
    return 0, int(config["dose_head"])


def truth_findings(path: Path) -> Path:
    """Heads findings for the fixture whose ranking is brute force's (largest edge effect first)."""
    from surgery import __version__
    from surgery.core.checkpoint import Checkpoint
    from surgery.find.findings import new_findings

    truth = json.loads((DOSE / "ground_truth.json").read_text())
    heads = sorted(truth["heads"], key=lambda h: -h["edge"])[:RANKED]
    findings = new_findings("heads", Checkpoint(DOSE), "0" * 64, {"benchmark": str(BENCHMARK)}, __version__)
    findings["discovery"] = {"heads": [{"layer": h["layer"], "head": h["head"], "coef": h["edge"]} for h in heads]}
    findings["selected_heads"] = [[h["layer"], h["head"]] for h in heads[:SELECTED]]
    path.write_text(json.dumps(findings), encoding="utf-8")
    return path


def neutral_prompts(path: Path) -> Path:
    """A JSONL file of ``NEUTRAL`` prompts: the benchmark's stems around its neutral items."""
    rows = [json.loads(line) for line in BENCHMARK.read_text().splitlines() if line.strip()]
    stems = [r["text"] for r in rows if r["kind"] == "template"]
    items = [r["item"] for r in rows if r["kind"] == "neutral"]
    lines = [json.dumps({"text": stems[i % len(stems)].format(item=items[i % len(items)])}) for i in range(NEUTRAL)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


BIAS = FIXTURES / "bias_model"
BIAS_PAIRS = BIAS / "pairs.jsonl"


def bias_truth(top: int) -> list[str]:
    """The ``top`` neurons of the planted bias model whose zeroing removes most of its bias gap (brute force)."""
    truth = json.loads((BIAS / "ground_truth.json").read_text())["neurons"]
    return [f"{n['layer']}:{n['neuron']}" for n in sorted(truth, key=lambda n: -n["bias"])[:top]]


def bias_neutral_prompts(path: Path) -> Path:
    """A JSONL file of the bias task's prompts with the group word left out: what the model must keep
    deciding as before (the capability), which no pair contrasts."""
    rows = [json.loads(line) for line in BIAS_PAIRS.read_text().splitlines() if line.strip()]
    texts = sorted({r["prompt_1"].replace(f" {r['attribute_1']} ", " ", 1) for r in rows})
    kept = texts[:: max(1, len(texts) // NEUTRAL)][:NEUTRAL]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in kept), encoding="utf-8")
    return path


DIRECTION = FIXTURES / "direction_model"


def refusal_marker(path: Path) -> Path:
    """The planted direction model's behaviour as a marker: it answers ``no`` to a trigger prompt."""
    path.write_text("no\n", encoding="utf-8")
    return path
