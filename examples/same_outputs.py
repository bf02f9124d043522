"""Do two commits write the same bytes? Bake a fixed set of edits with each and compare every file.

    python examples/same_outputs.py --against REV [--keep DIR]

For a change that must not change behaviour (a refactor): the fixtures (tiny seeded models in plain
float32, bfloat16 with a mixture of experts, FP8 with block and tensor scales, int4 compressed-tensors,
AutoAWQ, and a Q8_0 GGUF) are written once, by this checkout's tests/support/, and both commits run the
same CLI commands on them (prune-neurons; apply and export-lora with a recipe of heads, neurons and a
direction, and with one of the edits quantized formats store exactly; undo), each in its own process
with its own code first on the path and an empty cache. Every output file's sha256 is compared (surgery.json without its "created" time and the
hash over it); the run fails naming any that differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from surgery.core.hash_cache import SETTLE_SECONDS  # noqa: E402


def build_fixtures(root: Path) -> dict[str, Path]:
    """The checkpoints both commits bake, written by this checkout's test builders."""
    import torch
    from safetensors.torch import save_file

    from tests.support.awq import build_awq
    from tests.support.fp8 import build_fp8
    from tests.support.int_packed import build_int
    from tests.support.tiny import build_tiny
    from tests.support.tiny_gguf import gguf_source_model, write_tiny_gguf

    root.mkdir(parents=True)
    fixtures = {
        "llama-f32": build_tiny("llama", root / "llama-f32"),
        "qwen2_moe-bf16": build_tiny("qwen2_moe", root / "qwen2_moe-bf16", torch.bfloat16),
        "fp8-block": build_fp8(root / "fp8-block", "block"),
        "fp8-tensor": build_fp8(root / "fp8-tensor", "per-tensor"),
        "int-w4a16": build_int(root / "int-w4a16", "w4a16-g8"),
        "awq": build_awq(root / "awq"),
    }
    gguf = root / "tiny.gguf"
    write_tiny_gguf(gguf, gguf_source_model())
    fixtures["gguf-q8_0"] = gguf
    for hidden in (32, 64):  # the tiny models' hidden sizes (tests/support/tiny.py, tests/support/tiny_gguf.py)
        save_file({"r": torch.linspace(-1, 1, hidden)}, root / f"direction{hidden}.safetensors")
    return fixtures


def recipe(root: Path, moe: bool, exact: bool, hidden: int) -> Path:
    """Heads and neurons in one recipe (layers 0 and 1 exist in every fixture); in a mixture of experts
    the neurons are a routed expert's and the shared expert's. ``exact``: edits a quantized format
    stores exactly (α 2, pruned neurons), else α 2.5, a neuron halved and a direction too."""
    routed, shared = (", expert: 1", ", expert: shared") if moe else ("", "")
    alpha, factor = ("2.0", "0.0") if exact else ("2.5", "0.5")
    lines = [
        f"- {{type: head, layer: 0, head: 1, alpha: {alpha}}}",
        f"- {{type: neuron, layer: 1{routed}, neuron: 3, factor: 0.0}}",
        f"- {{type: neuron, layer: 0{shared}, neuron: 5, factor: {factor}}}",
    ]
    if not exact:
        vector = root / f"direction{hidden}.safetensors"
        lines.append(f"- {{type: direction, layer: 1, module: attention, vector: {vector}#r, weight: 1.0}}")
    path = root / f"recipe-{'moe' if moe else 'dense'}-{'exact' if exact else 'float'}-{hidden}.yaml"
    path.write_text("version: 1\nedits:\n" + "\n".join(lines) + "\n")
    return path


def commands(name: str, src: Path, root: Path, out: Path) -> list[tuple[str, list[str]]]:
    """(output label, CLI arguments) of every command run on fixture ``name``."""
    suffix = ".gguf" if src.suffix == ".gguf" else ""
    moe = "moe" in name
    hidden = 64 if suffix else 32
    neurons = "0:e1:1,1:s:3" if moe else "0:1,1:3"
    runs = [("prune", ["prune-neurons", src, "--neurons", neurons, "--out", out / f"{name}-prune{suffix}"])]
    for exact in (False, True):
        kind = "exact" if exact else "float"
        rec = recipe(root, moe, exact, hidden)
        runs.append((f"apply {kind}", ["apply", rec, "--model", src, "--out", out / f"{name}-apply-{kind}{suffix}"]))
        if not suffix:
            runs.append((f"lora {kind}", ["export-lora", src, "--recipe", rec, "--out", out / f"{name}-lora-{kind}"]))
    if not suffix:
        runs.append(("undo", ["undo", out / f"{name}-prune", "--out", out / f"{name}-undone"]))
    return [(label, [str(a) for a in args]) for label, args in runs]


def run_commit(code: Path, fixtures: dict[str, Path], root: Path, out: Path) -> dict[str, str]:
    """Run every command with ``code`` first on the path; {command: exit status and first error line}."""
    out.mkdir(parents=True)
    cache = Path(tempfile.mkdtemp(prefix="same-outputs-cache-"))
    # PYTHONHASHSEED: PEFT writes an adapter's target_modules from a set, in hash order
    env = {
        **os.environ,
        "PYTHONPATH": str(code),
        "SURGERY_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "PYTHONHASHSEED": "0",
    }
    status = {}
    try:
        for name, src in fixtures.items():
            for label, args in commands(name, src, root, out):
                done = subprocess.run(
                    [sys.executable, "-m", "surgery", *args], env=env, capture_output=True, text=True, cwd=root
                )
                error = next((line for line in done.stderr.splitlines() if line.startswith("Error")), "")
                error = error.replace(str(out), "OUT")  # the two commits write to different folders
                status[f"{name} {label}"] = f"exit {done.returncode}{': ' + error if error else ''}"
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return status


def _content(path: Path) -> bytes:
    """The bytes compared: surgery.json without the time it was written (and the hash that covers
    it), every other file as it is."""
    if not path.name.endswith("surgery.json"):
        return path.read_bytes()
    record = json.loads(path.read_text())
    record.pop("created", None)
    record.pop("provenance_sha256", None)
    return json.dumps(record, sort_keys=True).encode()


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``, by path relative to it."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(_content(p)).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the commit to compare this checkout with")
    parser.add_argument("--keep", type=Path, help="keep fixtures and outputs in this (new) folder")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="same-outputs-"))
    old_code = Path(tempfile.mkdtemp(prefix="same-outputs-old-")) / "repo"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(old_code), args.against], check=True
    )
    try:
        fixtures = build_fixtures(root / "fixtures")
        time.sleep(2 * SETTLE_SECONDS)  # both runs may remember the fixtures' hashes (core/hash_cache.py)
        started = time.perf_counter()
        old = run_commit(old_code, fixtures, root / "fixtures", root / "old")
        new = run_commit(REPO, fixtures, root / "fixtures", root / "new")
        print(
            f"{len(old)} commands on {len(fixtures)} fixtures, each commit once ({time.perf_counter() - started:.0f} s)"
        )
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_code)], check=False)
    bad = [f"{c}: {old[c]} then {new[c]}" for c in old if old[c] != new[c]]
    a, b = digests(root / "old"), digests(root / "new")
    bad += [f"{p}: only {'before' if p in a else 'now'}" for p in sorted(set(a) ^ set(b))]
    bad += [f"{p}: sha256 differs" for p in sorted(set(a) & set(b)) if a[p] != b[p]]
    for command, result in old.items():
        print(f"  {command:<28} {result}")
    print(f"{len(set(a) & set(b))} files compared against {args.against}: {len(bad)} differences")
    for line in bad:
        print(f"  DIFFERS {line}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
