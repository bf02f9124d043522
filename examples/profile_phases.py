#!/usr/bin/env python3
"""Achieved GFLOP/s of every phase of find-neurons, score-binding and find-heads, against a matmul
micro-benchmark of the same shapes on the same machine.

    python examples/profile_phases.py MODEL [--commands find-neurons,score-binding,find-heads]
        [--pairs FILE] [--max-pairs 8] [--random-sets 2] [--threads N] [--json FILE]

Each command runs in this process, as ``surgery COMMAND MODEL ...`` (``--recompute`` where it caches), three times:

1. timed: the wall time of each phase (a phase is one library call the command makes, wrapped by
   name, as in examples/profile_find_heads.py; a wrapped call inside a phase belongs to it);
2. counted: torch's FLOP counter (``torch.utils.flop_counter.FlopCounterMode``: matmuls, attention,
   convolutions) per phase, and the shape of every matrix multiply (``aten.mm``/``addmm``/``bmm``/``linear``:
   the linear layers at the phase's batch × tokens, ``[B·T, in] × [in, out]``, the lm_head, ...);
3. profiled: ``torch.profiler`` per phase: how much of the phase's wall is inside torch's operators,
   and which operators take it (what is not a matmul: attention, softmax, norms, copies).

Then every distinct multiply shape is timed alone (``torch.mm`` on random tensors of the same shape
and memory layout, the same thread count, median of repeats): a phase's micro-benchmark rate is its
multiplies' FLOPs over their time alone. Printed per phase: wall, FLOPs, achieved GFLOP/s (FLOPs /
wall), the micro-benchmark's GFLOP/s, achieved as % of it, the multiplies' share of the FLOPs, the
multiplies' time alone as % of the wall, the time outside torch's operators (Python, tokenization,
numpy) as % of the wall, and the operators that take the most time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from machine import stamp
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

DEFAULT_MODEL = Path.home() / ".cache" / "surgery" / "models" / "smollm2-135m-instruct"
COMMANDS = ("find-neurons", "score-binding", "find-heads")
OTHER = "other (CLI, pairs, encoding, scores, printing)"
RECOMPUTE = {"find-neurons": ["--recompute"], "find-heads": ["--recompute"]}  # a cached result times nothing
MM = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
LINEAR = torch.ops.aten.linear.default
MIN_REPEAT_S = 0.05  # each shape is timed for at least this long (and 3 times)


# (module, attribute, phase name or a function of the call's arguments giving it), per command
def _phases(command: str) -> list[tuple[str, str, str | Callable[..., str]]]:
    load = [(m, f, "model load") for m in ("surgery.model.loading",) for f in ("load_model", "load_tokenizer")]
    load += [
        (m, f, "model load")
        for m in ("surgery.find.neurons.find", "surgery.find.heads.find")
        for f in ("load_model", "load_tokenizer")
    ]

    def prompts(*args: Any, **kwargs: Any) -> str:
        # score_binding runs the binding prompts (with find-heads' attention features) and the knowledge prompts
        return "binding prompts + attention features" if kwargs.get("features") else "S and K prompts (scores only)"

    if command == "find-neurons":
        return load + [
            ("surgery.find.neurons.find", "accumulate_pair_sums", "capture"),
            ("surgery.find.neurons.find", "ppm_scores", "PPM (weights)"),
            ("surgery.find.neurons.scores.NeuronScores", "stored", "scores"),
            ("surgery.find.neurons.scores.NeuronScores", "from_dict", "scores"),
            ("surgery.find.neurons.find", "summary", "scores"),
            ("surgery.find.neurons.find", "write_findings", "writing"),
        ]
    scoring = [("surgery.find.heads.scores", "run_prompts", prompts)]
    if command == "score-binding":
        return load + scoring
    return (
        load
        + scoring
        + [
            ("surgery.find.heads.find", "discover", "discovery (L1)"),
            ("surgery.find.heads.find", "confirmation", "single-head confirmations"),
            ("surgery.find.heads.find", "knockout_report", "knockouts + random sets"),
            ("surgery.find.heads.find", "dose_response", "dose response"),
            ("surgery.find.heads.causal.PairRunner", "prefetch", "knockouts + dose response (shared sweep)"),
            ("surgery.find.heads.find", "save_findings", "writing"),
        ]
    )


class Shapes(TorchDispatchMode):
    """Counts every matrix multiply by (op, batch, M, K, N, layout of each operand)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is LINEAR:  # under inference_mode linear arrives whole: input [..., K] × weight [N, K]ᵀ
            x, w = args[0], args[1]
            self.seen[(1, x.numel() // x.shape[-1], x.shape[-1], w.shape[0], False, True)] += 1
        elif func in MM:
            a, b = args[-2], args[-1]  # addmm(bias, a, b)
            batch = a.shape[0] if a.dim() == 3 else 1
            m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
            self.seen[(batch, m, k, n, _col_major(a), _col_major(b))] += 1
        return func(*args, **(kwargs or {}))


def _col_major(t: torch.Tensor) -> bool:
    return t.stride(-2) == 1 and t.shape[-2] > 1


class Recorder:
    """The phase being run and, per phase, wall seconds, FLOPs, multiply shapes, operator times."""

    def __init__(self) -> None:
        self.active: list[str] = []
        self.wall: dict[str, float] = defaultdict(float)
        self.flops: dict[str, int] = defaultdict(int)
        self.shapes: dict[str, Counter] = defaultdict(Counter)
        self.ops: dict[str, Counter] = defaultdict(Counter)  # operator → self CPU seconds
        self.counter: FlopCounterMode | None = None
        self.shape_mode: Shapes | None = None
        self.profile = False

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.active:  # inside a phase: part of it
            yield
            return
        self.active.append(name)
        flops = self.counter.get_total_flops() if self.counter else 0
        seen = Counter(self.shape_mode.seen) if self.shape_mode else Counter()
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if self.profile else None
        start = time.perf_counter()
        try:
            with prof or nullcontext():
                yield
        finally:
            self.wall[name] += time.perf_counter() - start
            self.active.pop()
            if self.counter:
                self.flops[name] += self.counter.get_total_flops() - flops
            if self.shape_mode:
                self.shapes[name].update(self.shape_mode.seen - seen)
            if prof is not None:
                for e in prof.key_averages():
                    if e.key.startswith("aten::"):
                        self.ops[name][e.key] += e.self_cpu_time_total / 1e6


def resolve(dotted: str) -> Any:
    """A module, or a class in one (``package.module.Class``)."""
    import importlib

    path = dotted.split(".")
    for cut in range(len(path), 0, -1):  # the longest importable prefix; the rest are attributes
        try:
            owner: Any = importlib.import_module(".".join(path[:cut]))
            break
        except ModuleNotFoundError:
            continue
    for part in path[cut:]:
        owner = getattr(owner, part)
    return owner


def wrap(recorder: Recorder, owner: Any, attr: str, name: str | Callable[..., str]) -> Callable[[], None]:
    """Time every call of ``owner.attr`` (a module's function, a class's method) as a phase; returns the undo."""
    inner = getattr(owner, attr, None)
    raw = vars(owner).get(attr, inner)  # a classmethod as defined, put back as it was
    if inner is None:
        print(f"note: {owner.__name__}.{attr} not found: its time counts as '{OTHER}'", file=sys.stderr)
        return lambda: None

    def outer(*args, **kwargs):
        with recorder.phase(name(*args, **kwargs) if callable(name) else name):
            return inner(*args, **kwargs)

    setattr(owner, attr, outer)
    return lambda: setattr(owner, attr, raw)


def run(command: str, argv: list[str], mode: str) -> Recorder:
    """One in-process run of ``surgery COMMAND ...`` with its phases recorded in ``mode``
    (timed, counted or profiled)."""
    from surgery.cli import main as surgery_command

    recorder = Recorder()
    phases = [(resolve(m), attr, name) for m, attr, name in _phases(command)]  # every import before any wrap
    undo = [wrap(recorder, *p) for p in phases]
    recorder.profile = mode == "profiled"
    counting = mode == "counted"
    if counting:
        recorder.counter, recorder.shape_mode = FlopCounterMode(display=False), Shapes()
    start = time.perf_counter()
    try:
        with recorder.counter or nullcontext(), recorder.shape_mode or nullcontext():
            try:
                surgery_command([command, *argv, *RECOMPUTE.get(command, [])])
            except SystemExit as exc:
                if exc.code:
                    raise
    finally:
        for u in reversed(undo):
            u()
    recorder.wall[OTHER] = time.perf_counter() - start - sum(recorder.wall.values())
    if counting:
        recorder.flops[OTHER] = recorder.counter.get_total_flops() - sum(recorder.flops.values())
        recorder.shapes[OTHER] = recorder.shape_mode.seen - sum(recorder.shapes.values(), Counter())
    return recorder


def _operands(key: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    batch, m, k, n, a_col, b_col = key
    lead = (batch,) if batch > 1 else ()

    def make(rows: int, cols: int, col_major: bool) -> torch.Tensor:
        t = torch.randn(*lead, cols, rows) if col_major else torch.randn(*lead, rows, cols)
        return t.transpose(-1, -2) if col_major else t

    return make(m, k, a_col), make(k, n, b_col)


def mm_seconds(key: tuple, cache: dict[tuple, float]) -> float:
    """Median seconds of one multiply of this shape and layout, alone (after a warm-up)."""
    if key not in cache:
        a, b = _operands(key)
        fn = torch.bmm if key[0] > 1 else torch.mm
        fn(a, b)
        times: list[float] = []
        while len(times) < 3 or sum(times) < MIN_REPEAT_S:
            start = time.perf_counter()
            fn(a, b)
            times.append(time.perf_counter() - start)
        cache[key] = statistics.median(times)
    return cache[key]


def mm_flops(key: tuple) -> int:
    batch, m, k, n = key[:4]
    return 2 * batch * m * k * n


def table(command: str, timed: Recorder, counted: Recorder, profiled: Recorder, cache: dict) -> list[dict]:
    rows = []
    for name in [*[n for n in timed.wall if n != OTHER], OTHER]:
        wall, flops = timed.wall[name], counted.flops.get(name, 0)
        shapes = counted.shapes.get(name, Counter())
        mmf = sum(mm_flops(k) * c for k, c in shapes.items())
        mm_s = sum(mm_seconds(k, cache) * c for k, c in shapes.items())
        ops = profiled.ops.get(name, Counter())
        in_ops = sum(ops.values())
        row = {
            "command": command,
            "phase": name,
            "wall_s": round(wall, 3),
            "gflop": round(flops / 1e9, 3),
            "achieved_gflops": round(flops / wall / 1e9, 1) if flops and wall > 0 else None,
            "micro_gflops": round(mmf / mm_s / 1e9, 1) if mm_s else None,
            "mm_share_of_flops": round(mmf / flops, 3) if flops else None,
            "mm_alone_of_wall": round(mm_s / wall, 3) if wall > 0 and mm_s else None,
            "outside_ops_of_wall": round(max(0.0, 1 - in_ops / profiled.wall[name]), 3)
            if profiled.wall.get(name)
            else None,
            "top_ops": {k: round(v / profiled.wall[name], 3) for k, v in ops.most_common(4)} if ops else {},
            "distinct_mm_shapes": len(shapes),
        }
        if row["achieved_gflops"] and row["micro_gflops"]:
            row["pct_of_micro"] = round(100 * row["achieved_gflops"] / row["micro_gflops"], 1)
        rows.append(row)
    return rows


def show(rows: list[dict]) -> None:
    print(
        f"{'command':14} {'phase':44} {'wall s':>7} {'GFLOP':>8} {'GFLOP/s':>8} {'micro':>7} {'%micro':>7} "
        f"{'mm/FLOP':>7} {'mm/wall':>7} {'py/wall':>7}  top operators (share of the phase's wall)"
    )

    def cell(v: Any, fmt: str) -> str:
        return format(v, fmt) if v is not None else "—"

    for r in rows:
        ops = ", ".join(f"{k.removeprefix('aten::')} {v:.0%}" for k, v in r["top_ops"].items())
        print(
            f"{r['command']:14} {r['phase'][:44]:44} {r['wall_s']:7.2f} {r['gflop']:8.2f} "
            f"{cell(r['achieved_gflops'], '8.1f')} {cell(r['micro_gflops'], '7.1f')} "
            f"{cell(r.get('pct_of_micro'), '6.1f') + ('%' if r.get('pct_of_micro') is not None else ''):>7} "
            f"{cell(r['mm_share_of_flops'], '7.0%')} {cell(r['mm_alone_of_wall'], '7.0%')} "
            f"{cell(r['outside_ops_of_wall'], '7.0%')}  {ops}"
        )


def command_args(command: str, args: argparse.Namespace) -> list[str]:
    model = str(args.model)
    if command == "find-neurons":
        return [model, *(["--pairs", str(args.pairs)] if args.pairs else [])]
    if command == "score-binding":
        return [model, "--max-pairs", str(args.max_pairs)]
    return [model, "--max-pairs", str(args.max_pairs), "--random-sets", str(args.random_sets)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--commands", default=",".join(COMMANDS), help="comma-separated, of " + ", ".join(COMMANDS))
    ap.add_argument("--pairs", type=Path, default=None, help="find-neurons' --pairs (default: its builtin pairs)")
    ap.add_argument("--max-pairs", type=int, default=8, help="score-binding's and find-heads' --max-pairs")
    ap.add_argument("--random-sets", type=int, default=2, help="find-heads' --random-sets")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    unknown = sorted(set(commands) - set(COMMANDS))
    if unknown:
        ap.error(f"unknown command(s) {', '.join(unknown)}; choose from {', '.join(COMMANDS)}")
    if not (args.model / "config.json").is_file():
        print(f"skipped: no model at {args.model} (python examples/get_models.py gets it)")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = stamp()
    rows: list[dict] = []
    cache: dict[tuple, float] = {}
    for command in commands:
        cmd_argv = command_args(command, args)
        line = " ".join([command, *cmd_argv, *RECOMPUTE.get(command, [])])
        print(f"surgery {line} (timed, counted, profiled)", file=sys.stderr)
        timed = run(command, cmd_argv, "timed")
        counted = run(command, cmd_argv, "counted")
        profiled = run(command, cmd_argv, "profiled")
        done = table(command, timed, counted, profiled, cache)
        print(f"surgery {line} on {torch.get_num_threads()} thread(s):")
        show(done)  # each command's table as soon as it is measured
        rows += done
        if args.json:  # rewritten after each command: a later failure keeps the earlier ones
            record = {"machine": machine, "threads": torch.get_num_threads(), "argv": sys.argv[1:], "phases": rows}
            args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
