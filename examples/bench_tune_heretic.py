#!/usr/bin/env python3
"""Benchmark: ``surgery tune --method direction`` beside heretic-llm 1.4.0's own search, same budget.

    python examples/bench_tune_heretic.py [--model DIR] [--trials 8] [--prompts 16] [--threads 1] [--trials-at-once 1] [--heretic-first] [--heretic-python PY] [--work DIR] [--json FILE]

Both search the weight kernel of a direction edit of SmolLM2-135M-Instruct (the peak weight, its
layer, the width and the floor; heretic per writer, surgery per edit with a choice of writers) with
Optuna's multivariate TPE, minimising two things at once: the behaviour left and the first-token KL.

* The behaviour is answering in Spanish (examples/directions/: 48 everyday questions in Spanish and the
  same in English). Both tools take their directions from those two files: heretic computes its own
  (its ``good_prompts`` / ``bad_prompts``), surgery's are ``find-direction --a es --b en``.
* The same prompts are measured: the first ``--prompts`` questions of each file are the tune's
  behaviour and neutral prompts, and surgery's tune split of them (``--seed``, half of each, as
  ``surgery tune`` draws it) is what heretic is given as its evaluation prompts. The behaviour left is
  the share of greedy answers (16 new tokens, the chat template with SmolLM2's own system prompt)
  holding one of examples/directions/spanish_letters.txt (á é í ó ú ñ ¿ ¡); heretic counts them with
  its refusal markers set to those (it also counts an empty answer as one).
* The same KL: the mean over the English prompts of KL(base ‖ edited) of the next-token distribution
  at the prompt's last position (heretic's ``F.kl_div(…, batchmean, log_target=True)``, surgery's
  first-token KL), both over the prompts through SmolLM2's chat template with its system prompt:
  the same tokens.
* The same number of trials. heretic's random start-up trials are scaled to the budget as its
  defaults have them (60 of 200); surgery's TPE starts with Optuna's 10, which it measures together
  (the same draws as one at a time); ``--trials-at-once K`` measures its later trials K at a time too
  (other draws: Optuna's constant liar).
* The same threads: both run with ``OMP_NUM_THREADS`` set to ``--threads`` (default 1). On a machine
  shared with other jobs, torch's default (a thread per core) spends most of a small model's time
  waiting for its threads (a surgery trial took 60 s at 2 threads, 8 s at 1, at load 7 on 2 cores).

heretic (AGPL-3.0) runs in its own environment (``--heretic-python``, default
``$HERETIC_PYTHON`` or /tmp/heretic-venv/bin/python; made with ``python -m venv /tmp/heretic-venv;
/tmp/heretic-venv/bin/pip install torch==2.13.0 heretic-llm==1.4.0``), as its command line, offline,
reading a config.toml; nothing of it is imported here. Its command line ends in an interactive menu
once the study is done, so the benchmark stops it when its study journal holds every trial and
reads the trials from that journal.

Printed: both fronts (behaviour left, KL), their hypervolume against one reference point (behaviour
left 1, the largest KL any trial of either tool reached), time per trial, trials per minute, the
process's wall and CPU time (and its CPU time per trial, setup included: a measure less moved by the
machine's other jobs than wall time), peak RSS, and surgery's ratio to heretic on each. When the model or
heretic's environment is missing the script says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HERE = REPO / "examples" / "directions"
sys.path.insert(0, str(REPO / "examples"))
MODELS = Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models"))
BEHAVIOUR, NEUTRAL = HERE / "es_questions.txt", HERE / "en_questions.txt"
# Letters English answers do not hold and Spanish ones mostly do within a few words (está, qué, más,
# también, ¿…?): the marker words of spanish_markers.txt are too rare in 16 tokens.
MARKERS = HERE / "spanish_letters.txt"
MAX_NEW_TOKENS = 16
BATCH = 8
# heretic's defaults: 60 random start-up trials of 200.
HERETIC_STARTUP_SHARE = 60 / 200
# The system prompt SmolLM2's chat template inserts when a chat has none (surgery's formatting); heretic
# always sends one, so it is given this one.
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
POLL_S = 10.0  # each look at heretic's journal starts a Python in its environment

# Runs in heretic's environment: prints the journal's trials as JSON (argv[1]: the journal file).
READ_JOURNAL = r"""
import json, sys
import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
storage = JournalStorage(JournalFileBackend(sys.argv[1]))
out = []
for study in storage.get_all_studies():
    for t in optuna.load_study(study_name=study.study_name, storage=storage).trials:
        if t.state.name != "COMPLETE":
            continue
        out.append({
            "number": t.number, "kl": t.user_attrs["kl_divergence"], "refusals": t.user_attrs["refusals"],
            "prompts": t.user_attrs["n_bad_prompts"], "base": t.user_attrs["base_refusals"],
            "seconds": (t.datetime_complete - t.datetime_start).total_seconds(), "params": t.params,
        })
print(json.dumps(out))
"""


def lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def tune_split(texts: list[str], seed: int) -> list[str]:
    """The rows ``surgery tune`` searches on (its split of ``texts`` at the default test share)."""
    from surgery.find.tune.params import TuneParams
    from surgery.find.tune.split import split_rows

    return [texts[i] for i in split_rows(len(texts), TuneParams().test_share, seed, "prompts").tune]


def run_measured(cmd: list[str], cwd: Path, env: dict[str, str], done=None, log: str = "run.log") -> dict[str, Any]:
    """Run ``cmd`` (its output in ``cwd / log``): its exit code, wall time, and its own CPU time and peak
    RSS (``os.wait4``'s rusage of that child alone). ``done()`` true: stop it (SIGTERM) — heretic
    waits at a menu once its study is complete."""
    start = time.perf_counter()
    with open(cwd / log, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        stopped = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if done is not None and not stopped and done():
                # os.kill, not proc.send_signal: that polls first, and would reap a child that has
                # exited on its own (heretic does at its menu without a terminal), losing its rusage
                os.kill(proc.pid, signal.SIGTERM)
                stopped = True
            time.sleep(POLL_S)
    return {
        "returncode": os.waitstatus_to_exitcode(status),
        "wall_s": time.perf_counter() - start,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_gb": usage.ru_maxrss / 1e6,  # kB on Linux
        "stopped": stopped,
    }


def front(points: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """The points (left, KL, trial) no other beats on both (both minimised), by behaviour left."""
    out = [p for p in points if not any(q[0] <= p[0] and q[1] <= p[1] and q[:2] != p[:2] for q in points)]
    return sorted(set(out))


def hypervolume(points: list[tuple[float, float, int]], ref: tuple[float, float]) -> float:
    """The area dominated by a 2-objective front (both minimised) up to ``ref``."""
    area, kl_above = 0.0, ref[1]
    for left, kl, _ in sorted(p for p in points if p[0] <= ref[0] and p[1] <= ref[1]):
        if kl < kl_above:
            area += (ref[0] - left) * (kl_above - kl)
            kl_above = kl
    return area


def run_surgery(args, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """find-direction (recomputed: heretic computes its directions in its run) then the tune, each
    its own measured process; the process figures are the two together."""
    folder = work / "surgery"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder / "study", ignore_errors=True)  # a study left by an earlier run would be resumed
    direction = folder / "direction.json"
    cmd = [sys.executable, "-m", "surgery", "find-direction", str(args.model), "--a", str(BEHAVIOUR)]
    cmd += ["--b", str(NEUTRAL), "--recompute", "--out", str(direction)]
    find = run_measured(cmd, folder, env, log="find.log")
    if find["returncode"] != 0:
        raise SystemExit(f"surgery find-direction failed ({find['returncode']}): see {folder / 'find.log'}")
    cmd = [sys.executable, "-m", "surgery", "tune", str(args.model), "--method", "direction"]
    behaviour, neutral = folder / "behaviour.txt", folder / "neutral.txt"
    behaviour.write_text("\n".join(lines(BEHAVIOUR)[: args.prompts]) + "\n", encoding="utf-8")
    neutral.write_text("\n".join(lines(NEUTRAL)[: args.prompts]) + "\n", encoding="utf-8")
    cmd += ["--findings", str(direction), "--behaviour", str(behaviour), "--markers", str(MARKERS)]
    cmd += ["--neutral", str(neutral), "--max-new-tokens", str(MAX_NEW_TOKENS), "--batch-size", str(BATCH)]
    cmd += ["--trials", str(args.trials), "--seed", str(args.seed), "--out", str(folder / "study"), "--json"]
    cmd += ["--trials-at-once", str(args.trials_at_once)]
    run = run_measured(cmd, folder, env)
    if run["returncode"] != 0:
        raise SystemExit(f"surgery tune failed ({run['returncode']}): see {folder / 'run.log'}")
    record = json.loads((folder / "study" / "tune.json").read_text())
    trials = record["trials"]
    return {
        **run,
        "wall_s": find["wall_s"] + run["wall_s"],
        "cpu_s": find["cpu_s"] + run["cpu_s"],
        "peak_rss_gb": max(find["peak_rss_gb"], run["peak_rss_gb"]),
        "find_direction": find,
        "points": [(t["marker_rate"], t["kl"], t["number"]) for t in trials],
        "seconds": [t["seconds"] for t in trials],
        "base_left": record["baseline"]["marker_rate"],
    }


def run_heretic(args, work: Path, env: dict[str, str]) -> dict[str, Any]:
    folder = work / "heretic"
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    good, bad = folder / "good_eval.txt", folder / "bad_eval.txt"
    good.write_text("\n".join(tune_split(lines(NEUTRAL)[: args.prompts], args.seed)) + "\n", encoding="utf-8")
    bad.write_text("\n".join(tune_split(lines(BEHAVIOUR)[: args.prompts], args.seed)) + "\n", encoding="utf-8")
    startup = max(1, round(HERETIC_STARTUP_SHARE * args.trials))
    config = {
        "model": str(args.model),
        "dtypes": ["float32"],
        "device_map": "cpu",
        "batch_size": BATCH,
        "max_response_length": MAX_NEW_TOKENS,
        "n_trials": args.trials,
        "n_startup_trials": startup,
        "seed": args.seed,
        "response_prefix": "",
        "system_prompt": SMOLLM_SYSTEM,
        "study_checkpoint_dir": str(folder / "checkpoints"),
        "refusal_markers": lines(MARKERS),
    }
    toml = "".join(f"{k} = {json.dumps(v, ensure_ascii=False)}\n" for k, v in config.items())
    for name, path in (
        ("good_prompts", NEUTRAL),
        ("bad_prompts", BEHAVIOUR),
        ("good_evaluation_prompts", good),
        ("bad_evaluation_prompts", bad),
    ):
        toml += f'\n[{name}]\ndataset = "{path}"\n'
    (folder / "config.toml").write_text(toml, encoding="utf-8")
    for old in (folder / "checkpoints").glob("*.jsonl"):
        old.unlink()  # a study left by an earlier run would be resumed

    def journal() -> list[dict[str, Any]]:
        files = list((folder / "checkpoints").glob("*.jsonl"))
        if not files:
            return []
        done = subprocess.run(
            [args.heretic_python, "-c", READ_JOURNAL, str(files[0])], capture_output=True, text=True, env=env
        )
        return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else []

    def complete() -> bool:
        return len(journal()) >= args.trials

    heretic = str(Path(args.heretic_python).parent / "heretic")
    run = run_measured([heretic], folder, env, done=complete)
    trials = journal()
    if len(trials) < args.trials:
        tail = (folder / "run.log").read_text(errors="replace").strip().splitlines()[-1:]
        raise SystemExit(f"heretic stopped after {len(trials)} of {args.trials} trials: {' '.join(tail)}")
    return {
        **run,
        "points": [(t["refusals"] / t["prompts"], t["kl"], t["number"]) for t in trials],
        "seconds": [t["seconds"] for t in trials],
        "base_left": trials[0]["base"] / trials[0]["prompts"],
        "startup_trials": startup,
    }


def report(results: dict[str, dict[str, Any]], trials: int, reference_kls: list[float]) -> dict[str, Any]:
    """Print both fronts, their hypervolumes at each reference KL, the speeds and memory, and the ratios."""
    largest = max(kl for r in results.values() for _, kl, _ in r["points"])
    refs = [largest, *sorted(set(reference_kls) - {largest})]
    print(f"{trials} trials each; reference points: behaviour left 1 and KL " + ", ".join(f"{k:.4g}" for k in refs))
    print(f"(KL {largest:.4g}: the largest of any trial; a trial above a reference KL adds nothing there)")
    for name, r in results.items():
        r["front"] = front([tuple(p) for p in r["points"]])
        r["hypervolume"] = {f"{k:.6g}": hypervolume(r["front"], (1.0, k)) for k in refs}
        r["trial_s"] = sum(r["seconds"]) / len(r["seconds"])
        r["trials_per_min"] = 60.0 / r["trial_s"]
        r["median_trial_s"] = statistics.median(r["seconds"])  # less moved by the other jobs' bursts
        r["cpu_per_trial_s"] = r["cpu_s"] / len(r["seconds"])  # the setup's CPU included
        print(f"\n{name}: behaviour left unedited {r['base_left']:.3f}; front (behaviour left, KL, trial):")
        for left, kl, number in r["front"]:
            print(f"  {left:.3f}  {kl:.4g}  #{number}")
        hv = ", ".join(f"{v:.4g} (KL ≤ {k})" for k, v in r["hypervolume"].items())
        print(
            f"  hypervolume {hv}; {r['trial_s']:.2f} s a trial ({r['trials_per_min']:.2f} trials/min; "
            f"median {r['median_trial_s']:.2f} s); "
            f"process: {r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU ({r['cpu_per_trial_s']:.1f} s a trial, "
            f"setup included), peak RSS {r['peak_rss_gb']:.2f} GB"
        )
    s, h = results["surgery"], results["heretic"]
    ratios = {
        "hypervolume": {
            k: (v / h["hypervolume"][k] if h["hypervolume"][k] else None) for k, v in s["hypervolume"].items()
        },
        "trials_per_min": s["trials_per_min"] / h["trials_per_min"],
        "median_trial": h["median_trial_s"] / s["median_trial_s"],
        "peak_rss": s["peak_rss_gb"] / h["peak_rss_gb"],
        "wall": s["wall_s"] / h["wall_s"],
        "trials_per_cpu_s": h["cpu_per_trial_s"] / s["cpu_per_trial_s"],
    }
    hv = ", ".join("—" if v is None else f"{v:.2f}× (KL ≤ {k})" for k, v in ratios["hypervolume"].items())
    print(
        f"\nsurgery / heretic: hypervolume {hv}; trials per minute {ratios['trials_per_min']:.2f}× "
        f"(by the median trial {ratios['median_trial']:.2f}×), "
        f"trials per process CPU second {ratios['trials_per_cpu_s']:.2f}×, peak RSS {ratios['peak_rss']:.2f}×, "
        f"process wall {ratios['wall']:.2f}×"
    )
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODELS / "smollm2-135m-instruct")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument(
        "--prompts", type=int, default=16, help="Questions of each language the tune reads (half are searched on)."
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--trials-at-once",
        type=int,
        default=1,
        help="surgery tune's --trials-at-once: TPE trials drawn and measured together after the start-up ones.",
    )
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of both tools.")
    parser.add_argument(
        "--heretic-first",
        action="store_true",
        help="Run heretic before surgery (alternate the order between runs: the machine's other jobs change).",
    )
    parser.add_argument("--heretic-python", default=os.environ.get("HERETIC_PYTHON", "/tmp/heretic-venv/bin/python"))
    parser.add_argument("--work", type=Path, default=Path("bench-tune-heretic"))
    parser.add_argument(
        "--reference-kl",
        type=float,
        action="append",
        default=[],
        help="Also the hypervolume with this KL in the reference point (repeatable; always: the largest KL).",
    )
    parser.add_argument("--json", type=Path, default=None, help="Write the measurements (and the analysis) here.")
    parser.add_argument(
        "--analyse", type=Path, default=None, help="Only analyse the measurements of an earlier --json."
    )
    args = parser.parse_args()
    if args.analyse is not None:
        saved = json.loads(args.analyse.read_text())
        report({k: saved[k] for k in ("surgery", "heretic")}, saved["trials"], args.reference_kl)
        return
    if not (args.model / "config.json").is_file():
        print(f"no model at {args.model}: run python examples/get_models.py --only smollm2 first")
        return
    if not Path(args.heretic_python).is_file() or not (Path(args.heretic_python).parent / "heretic").is_file():
        print(
            f"no heretic at {args.heretic_python}: python -m venv /tmp/heretic-venv; "
            "/tmp/heretic-venv/bin/pip install torch==2.13.0 heretic-llm==1.4.0"
        )
        return
    from machine import stamp

    machine = stamp()
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", NO_COLOR="1", OMP_NUM_THREADS=str(args.threads)
    )
    print(f"both tools: OMP_NUM_THREADS={args.threads}")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    runs = {"surgery": run_surgery, "heretic": run_heretic}
    order = ["heretic", "surgery"] if args.heretic_first else ["surgery", "heretic"]
    # absolute: each tool runs in its own folder under it, and is given paths into it
    results = {name: runs[name](args, args.work.resolve(), env) for name in order}
    ratios = report(results, args.trials, args.reference_kl)
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at the end (1, 5, 15 min): {load[0]}, {load[1]}, {load[2]}")
    if args.json:
        record = {
            "machine": machine,
            "trials": args.trials,
            "threads": args.threads,
            "load_end": load,
            **results,
            "ratios": ratios,
        }
        args.json.write_text(json.dumps(record))


if __name__ == "__main__":
    main()
