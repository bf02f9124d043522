#!/usr/bin/env python3
"""Benchmark and real-model check: SmolLM2 in a 4-bit format (NVFP4, W4A16 or an MXFP4 GGUF), baked and loaded.

    python examples/bench_fp4.py [--format nvfp4|w4a16|mxfp4-gguf] [--model ~/.cache/surgery/models/smollm2-135m-instruct]
        [--gguf ~/.cache/surgery/models/.gguf/SmolLM2-135M-Instruct.Q4_1.gguf] [--runs 3] [--json FILE]
        [--tasks cp imports bake load] [--old-tree DIR] [--calls 1]

``nvfp4`` (the default) compresses the model's decoder linears to ``nvfp4-pack-quantized`` with
compressed-tensors' NVFP4 compressor (llm-compressor's min/max observer rule: tests/support/nvfp4.py),
``w4a16`` to int4 ``pack-quantized`` (symmetric, groups of 64: examples/bench_packed_hold.py's), their other
tensors in bfloat16 (as llm-compressor saves a model loaded in bf16); ``mxfp4-gguf`` re-encodes SmolLM2's
Q4_1 GGUF's decoder matrices in MXFP4 (GGUF type 39, gguf-py's quantizer: examples/fp4_gguf.py). Then, in
fresh child processes, interleaved, on a warm page cache:

* ``cp -r`` of the folder (``cp`` of the GGUF file): the floor, every byte has to be written once;
* the bake's imports alone (torch, compressed-tensors or gguf-py, surgery's bake): on a file this small
  they are most of a bake, and they do not grow with the file;
* the bake (library call, every edited block checked by the format's own decoder, no logits) of 40 pruned
  neurons and 2 halved heads (SmolLM2's head_dim 64: whole groups and blocks, so a power of two goes
  through the scales), its peak RSS from ``os.wait4``/VmHWM, and the library call's own time (the imports
  above done first; ``--calls K``: the median of K calls in the process); with ``--old-tree``, the same bake by another checkout's surgery right after it, and the ratios
  new / old of each run;
* (folders) the model loaded for float32 compute as finders, eval and verify load it (its packed codes
  and scales held as stored, each layer decoded for its call) and one forward pass: its peak RSS against
  the file's size.

Printed: bake / cp and (bake − its imports) / cp, each the median of the runs' ratios, and the peak RSS.
Then, once, for a folder: ``surgery verify`` (the dequantized weights by the format's decoder, and logits
on the CPU against the run-time edit) and undo (sha256 of every file equal to the source's).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from machine import one_line, stamp  # noqa: E402
from measure import run_measured  # noqa: E402

MB = 1024**2
NEURONS = [(layer, n) for layer in (3, 11, 19, 27) for n in range(7, 1500, 150)]  # 40 neurons
HEADS = [(5, 2), (17, 6)]


def quantize(src: Path, out: Path) -> Path:
    """``src`` with its decoder linears compressed to NVFP4 by compressed-tensors (written beside, renamed).

    Shard by shard and tensor by tensor (a real-shape checkpoint, e.g. examples/synthetic_checkpoint.py's
    Llama-3.1-8B, needs one shard's output in memory, not the model in float32); a sharded checkpoint's
    index is rewritten to name the compressed tensors."""
    if out.exists():
        return out
    import torch
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors import safe_open
    from safetensors.torch import save_file

    from surgery.core.strict_files import load_json
    from tests.support.int_packed import IGNORE, LINEARS
    from tests.support.nvfp4 import FORMAT, _compress, scheme

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(src, partial, ignore=shutil.ignore_patterns("*.gguf*", "*.safetensors"))
    sch, weight_map, total = scheme(), {}, 0
    for shard in sorted(src.glob("*.safetensors")):
        tensors = {}
        with safe_open(shard, "pt") as f:
            for name in f.keys():
                value = f.get_tensor(name)
                if name.endswith(".weight") and name.split(".")[-2] in LINEARS:
                    for key, part in _compress(value.to(torch.float32), sch).items():
                        tensors[name.removesuffix("weight") + key] = part.contiguous()
                else:  # the rest in bfloat16, as llm-compressor saves a model it loaded in bf16
                    tensors[name] = value.to(torch.bfloat16) if value.dtype == torch.float32 else value
        save_file(tensors, partial / shard.name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard.name))
        total += sum(t.nbytes for t in tensors.values())
        del tensors
    index = partial / "model.safetensors.index.json"
    if index.exists():
        old = load_json(index.read_text())
        index.write_text(json.dumps({**old, "metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    config = load_json((partial / "config.json").read_text())
    cfg = QuantizationConfig(
        config_groups={"group_0": sch}, format=FORMAT, quantization_status="compressed", ignore=IGNORE
    )
    config["quantization_config"] = json.loads(cfg.model_dump_json(exclude_none=True))
    (partial / "config.json").write_text(json.dumps(config, indent=1))
    partial.rename(out)
    return out


def recipe():
    from surgery.core.edits import HeadScale, NeuronScale, Recipe

    return Recipe((*(NeuronScale(layer, n, 0.0) for layer, n in NEURONS), *(HeadScale(l, h, 0.5) for l, h in HEADS)))


def make_source(fmt: str, model: Path, gguf_source: Path, scratch: Path) -> Path:
    """The 4-bit checkpoint of ``fmt`` made from ``model`` (a GGUF from ``gguf_source``), made once in ``scratch``."""
    if fmt == "nvfp4":
        return quantize(model, scratch / f"{model.name}-nvfp4")
    if fmt == "w4a16":
        from bench_packed_hold import quantize_int4

        return quantize_int4(model, scratch / f"{model.name}-w4a16")
    from fp4_gguf import fp4_gguf

    out = scratch / f"{gguf_source.stem}-MXFP4.gguf"
    return out if out.exists() else fp4_gguf(gguf_source, out, "MXFP4")


def child(task: str, src: str, dst: str, tree: str = "", calls: str = "1") -> None:
    """The measured process: ``task`` ("imports", "bake" or "load") on ``src``, with the surgery of ``tree``
    (another checkout) when given; a bake's library call ``calls`` times (the first into ``dst``)."""
    if tree:
        sys.path.insert(0, tree)
    if src.endswith(".gguf"):
        if task == "imports":
            import gguf  # noqa: F401

            import surgery.api.gguf_baking  # noqa: F401
            import surgery.bake.gguf  # noqa: F401

            return
        from surgery.api.gguf_baking import bake_gguf_recipe

        bake_gguf_recipe(Path(src), recipe(), Path(dst))
        return
    # what the bake imports before its first byte: its floor on a small file
    import compressed_tensors.compressors.nvfp4.helpers  # noqa: F401
    import compressed_tensors.quantization.lifecycle.forward  # noqa: F401

    import surgery.bake.bake  # noqa: F401
    import surgery.bake.check  # noqa: F401

    if task == "imports":
        return
    if task == "bake":  # the call timed with its imports done
        import surgery
        from surgery.bake.bake import bake
        from surgery.bake.check import edited_check
        from surgery.core.checkpoint import Checkpoint

        assert not tree or Path(surgery.__file__).resolve().is_relative_to(Path(tree).resolve()), surgery.__file__
        times = []
        for k in range(int(calls)):
            out = Path(dst) if k == 0 else Path(f"{dst}.again")
            shutil.rmtree(out, ignore_errors=True)
            started = time.perf_counter()
            ckpt = Checkpoint(src)
            bake(ckpt, recipe(), out, check=edited_check(ckpt, recipe()))
            times.append(time.perf_counter() - started)
        shutil.rmtree(f"{dst}.again", ignore_errors=True)
        print(json.dumps({"call_s": statistics.median(times)}))
        return
    import torch

    from surgery.model.dequantized import holds_codes
    from surgery.model.loading import LoadSpec, load_model

    model = load_model(src, LoadSpec(device="cpu", dtype="float32"))
    assert holds_codes(model)
    ids = torch.randint(3, model.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert model(input_ids=ids).logits.dtype == torch.float32


def measure(cmd: list[str]) -> dict:
    started = time.perf_counter()
    res, peak = run_measured(cmd)
    wall = time.perf_counter() - started
    if res.returncode != 0:
        sys.exit(f"{cmd[-3:]} failed:\n{res.stderr[-3000:]}")
    row = {"wall_s": wall, "rss_mb": peak.rss_bytes / MB, "anon_mb": peak.anon_bytes / MB}
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    return {**row, **json.loads(lines[-1])} if lines else row


def size_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / MB
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) / MB


def remove(path: Path) -> None:
    """A previous run's output: a folder, or a GGUF file and its sidecars."""
    if path.is_dir():
        shutil.rmtree(path)
    for stale in path.parent.glob(path.name + "*") if path.suffix == ".gguf" else ():
        stale.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", choices=("nvfp4", "w4a16", "mxfp4-gguf"), default="nvfp4")
    ap.add_argument("--model", type=Path, default=Path.home() / ".cache/surgery/models/smollm2-135m-instruct")
    ap.add_argument(
        "--gguf",
        type=Path,
        default=Path.home() / ".cache/surgery/models/.gguf/SmolLM2-135M-Instruct.Q4_1.gguf",
        help="the GGUF whose decoder matrices --format mxfp4-gguf re-encodes",
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/surgery-bench-fp4"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--tasks", nargs="+", default=["cp", "imports", "bake", "load"], help="what to time, in order")
    ap.add_argument("--old-tree", type=Path, help="another checkout: its bake timed after each bake (bake-old)")
    ap.add_argument("--calls", type=int, default=1, help="library calls per bake process (call_s: their median)")
    ap.add_argument("--child", nargs="+", metavar="TASK SRC DST [TREE [CALLS]]", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    machine = stamp()
    print("machine:", one_line(machine))
    args.scratch.mkdir(parents=True, exist_ok=True)
    src = make_source(args.format, args.model, args.gguf, args.scratch)
    is_gguf = src.suffix == ".gguf"
    tasks = [t for t in args.tasks if not (is_gguf and t == "load")]  # the held model is a folder's
    if args.old_tree and "bake" in tasks:
        tasks.insert(tasks.index("bake") + 1, "bake-old")
    file_mb = size_mb(src)
    runs = []
    for k in range(args.runs):
        row = {}
        for task in tasks:
            dst = args.scratch / (f"out-{args.format}-{task}" + (".gguf" if is_gguf else ""))
            remove(dst)
            cmd = (
                ["cp", "-r", str(src), str(dst)]
                if task == "cp"
                else [sys.executable, __file__, "--child", task, str(src), str(dst)]
            )
            if task in ("bake", "bake-old"):
                cmd[3] = "bake"
                cmd += [str(args.old_tree.resolve()) if task == "bake-old" else "", str(args.calls)]
            row[task] = measure(cmd)
        runs.append(row)
        print(f"run {k}: " + ", ".join(f"{t} {r['wall_s']:.2f} s / {r['rss_mb']:.0f} MB" for t, r in row.items()))
    med = {t: {m: statistics.median(r[t][m] for r in runs) for m in runs[0][t]} for t in runs[0]}
    line = [f"{args.format} file {file_mb:.0f} MB"]
    ratios = []
    if {"cp", "bake"} <= med.keys():
        ratios = [r["bake"]["wall_s"] / r["cp"]["wall_s"] for r in runs]
        line.append(f"cp {med['cp']['wall_s']:.2f} s, bake {med['bake']['wall_s']:.2f} s")
        line.append(f"bake / cp (same run, median of {args.runs}) {statistics.median(ratios):.2f}×")
        line.append(
            f"bake peak RSS {med['bake']['rss_mb']:.0f} MB ({'≤' if med['bake']['rss_mb'] <= 400 else '>'} 400)"
        )
    if {"imports", "bake"} <= med.keys():
        work = [r["bake"]["wall_s"] - r["imports"]["wall_s"] for r in runs]
        line.append(
            f"bake less its imports {statistics.median(work):.2f} s (imports {med['imports']['wall_s']:.2f} s, "
            f"{med['imports']['rss_mb']:.0f} MB)"
        )
        if "cp" in med:
            over = [(r["bake"]["wall_s"] - r["imports"]["wall_s"]) / r["cp"]["wall_s"] for r in runs]
            line.append(f"(bake − imports) / cp {statistics.median(over):.2f}×")
    if "call_s" in med.get("bake", {}):
        line.append(f"the bake call alone {med['bake']['call_s']:.2f} s")
    if "bake-old" in med:
        for metric in ("wall_s", "call_s"):
            new_old = [r["bake"][metric] / r["bake-old"][metric] for r in runs]
            line.append(
                f"bake-old {metric} {med['bake-old'][metric]:.2f} s, new / old (same run, median of {args.runs}) "
                f"{statistics.median(new_old):.2f}×"
            )
    if "load" in med:
        line.append(
            f"held load + forward peak RSS {med['load']['rss_mb']:.0f} MB = {med['load']['rss_mb'] / file_mb:.2f}× the file"
        )
    print("; ".join(line))
    if is_gguf:  # verify and undo of a GGUF bake: tests/gguf/ (its sidecars alone)
        if args.json:
            args.json.write_text(
                json.dumps(
                    {"machine": machine, "file_mb": file_mb, "runs": runs, "medians": med, "bake_over_cp": ratios},
                    indent=1,
                )
            )
        return
    from surgery.bake.undo import undo
    from surgery.bake.verify import verify
    from surgery.core.checkpoint import Checkpoint, file_sha256

    out = args.scratch / f"out-{args.format}-bake"
    if not out.exists():
        child("bake", str(src), str(out))
    report = verify(Checkpoint(src), out)
    print(
        f"verify: ok={report.ok} {report.numeric_check}; max |Δlogit| {report.max_abs_logit_diff:.3g} "
        f"(tolerance {report.tolerance:.3g}) {report.problems}"
    )
    restored = args.scratch / "restored"
    shutil.rmtree(restored, ignore_errors=True)
    undo(out, restored)
    same = all(file_sha256(restored / f.name) == file_sha256(f) for f in src.iterdir() if f.is_file())
    print(f"undo: every file's sha256 equals the source's: {same}")
    if args.json:
        record = {
            "machine": machine,
            "file_mb": file_mb,
            "runs": runs,
            "medians": med,
            "bake_over_cp": ratios,
            "verify_ok": report.ok,
            "max_abs_logit_diff": report.max_abs_logit_diff,
            "undo_exact": same,
        }
        args.json.write_text(json.dumps(record, indent=1))
    if not (report.ok and same):
        sys.exit(1)


if __name__ == "__main__":
    main()
