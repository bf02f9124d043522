#!/usr/bin/env python3
"""Benchmark: the streaming copy under every bake (``surgery.bake.stream.stream_patched``) against ``cp``.

    python examples/bench_stream.py [--gb 2] [--runs 3] [--old-tree DIR] [--json FILE]

Writes a random file of ``--gb`` GB once (a temporary folder, left in the page cache), then times,
interleaved, each in a fresh child (its imports not counted), from a warm page cache and after a
``sync`` (no earlier output left to write back):

* ``cp SRC DST`` (the floor of a copy: every byte written once);
* ``sha256``: hashlib over the file in 1 MB ``preadv`` slices (the floor of a bake, which hashes
  every byte it writes; one sha256 cannot be split over cores);
* ``stream_patched`` with ``one`` patch (8 bytes at offset 100) or ``gguf`` patches (one 144-byte block
  every 8,064 bytes over 15 % of the file, as a pruned Q4_K ``ffn_down`` column), each with
  ``hash_source`` off (a bake from a source hashed before) and on (the first bake: both sha256s);
* with ``--old-tree DIR``, the same calls by that checkout's ``surgery`` right after each, the
  sha256s both return compared (the same bytes, or the run fails), and the median of the runs'
  ratios this tree / the old one (each run's pair under the same load).

Medians of the runs and their ratio to ``cp``'s median, the machine stamp and the load are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import stamp

REPO = Path(__file__).resolve().parent.parent
STREAM_CHILD = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from surgery.bake.stream import stream_patched
src, dst, pattern, hash_source = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
size = src.stat().st_size
def patches(fd):
    if pattern == "one":
        yield 100, memoryview(b"\\xff" * 8)
        return
    block = memoryview(b"\\x5a" * 144)
    for offset in range(int(size * 0.30), int(size * 0.45), 8064):
        yield offset, block
t = time.perf_counter()
hashes = stream_patched(src, dst, patches, hash_source=hash_source)
print(json.dumps({"s": time.perf_counter() - t, "hashes": hashes}))
"""
HASH_CHILD = """
import hashlib, os, sys, time
t = time.perf_counter()
h, buf = hashlib.sha256(), bytearray(1 << 20)
view, fd, pos = memoryview(buf), os.open(sys.argv[1], os.O_RDONLY), 0
while n := os.preadv(fd, [view], pos):
    h.update(view[:n])
    pos += n
print(time.perf_counter() - t)
"""


def run(cmd: list[str]) -> tuple[float, str]:
    """(wall seconds, stdout) of ``cmd`` in a child, started with no dirty pages left to write back."""
    os.sync()  # the run before's output would otherwise be written back during this one
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return time.perf_counter() - t, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--old-tree", type=Path, default=None, help="another checkout, timed right after this one")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    machine = stamp()
    trees = {"": REPO} | ({" old": args.old_tree.resolve()} if args.old_tree else {})
    cases = [(p, h) for p in ("one", "gguf") for h in (False, True)]
    times: dict[str, list[float]] = {}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
        src, dst = Path(tmp) / "src.bin", Path(tmp) / "out.bin"
        with open(src, "wb") as f:
            for _ in range(int(args.gb * 1024)):
                f.write(os.urandom(1 << 20))
        for _ in range(args.runs):
            times.setdefault("cp", []).append(run(["cp", str(src), str(dst)])[0])
            dst.unlink()
            times.setdefault("sha256", []).append(float(run([sys.executable, "-c", HASH_CHILD, str(src)])[1]))
            for pattern, hashed in cases:
                got = {}
                for label, tree in trees.items():
                    flag = "1" if hashed else "0"
                    cmd = [sys.executable, "-c", STREAM_CHILD, str(tree), str(src), str(dst), pattern, flag]
                    result = json.loads(run(cmd)[1])
                    dst.unlink()
                    name = f"{pattern} hash_source={hashed}{label}"
                    times.setdefault(name, []).append(result["s"])
                    got[label] = result["hashes"]
                if len(set(map(tuple, got.values()))) != 1:
                    raise SystemExit(f"{pattern} hash_source={hashed}: the trees' sha256s differ: {got}")
            loads.append(os.getloadavg()[0])
    cp = statistics.median(times["cp"])
    print(f"{args.gb:g} GB random file, median of {args.runs} runs, load {min(loads):.2f}-{max(loads):.2f}")
    print(f"{'':32} {'seconds':>8} {'× cp':>6}")
    summary: dict = {"machine": machine, "gb": args.gb, "runs": args.runs, "load": [min(loads), max(loads)]}
    for name, rows in times.items():
        wall = statistics.median(rows)
        print(f"{name:32} {wall:8.3f} {wall / cp:6.2f}")
        summary[name] = {"median_s": round(wall, 3), "ratio_to_cp": round(wall / cp, 2), "runs_s": rows}
    for name in [n for n in times if f"{n} old" in times]:  # each run's own pair: the load moves between runs
        paired = statistics.median(new / old for new, old in zip(times[name], times[f"{name} old"], strict=True))
        print(f"{name}: this tree / the old tree, median of the runs' ratios {paired:.2f}")
        summary[name]["ratio_to_old"] = round(paired, 2)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
