"""Data-parallel finding under torchrun (2 processes, gloo, 1 thread each) against one process.

The four data-parallel commands run on the planted fixtures in one torchrun launch and must give
the single-process findings: every number within 1e-5 relative, the same selected heads and
neurons. A second launch runs ``python -m surgery`` itself, as a user types it. Ranks given
different pairs refuse in one line.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from surgery.cli.main import main
from surgery.core import distributed
from tests.support.cli import cli_env
from tests.support.paths import FIXTURES, REPO, TESTS

BIAS, BINDING = FIXTURES / "bias_model", FIXTURES / "binding_model"
PAIRS = BIAS / "pairs.jsonl"
HEADS = ["--benchmark", BINDING / "benchmark.jsonl", "--max-pairs", "32", "--random-sets", "2", "--confirm", "3"]
RTOL = 1e-5
SKIP_KEYS = {"created", "seconds"}  # the wall clock, not a finding


def torchrun(args: list[Any], cache: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 ARGS`` (gloo, one thread per process)."""
    env = cli_env(
        OMP_NUM_THREADS="1",
        SURGERY_CACHE=str(cache),
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def single(capsys, args: list[Any]) -> str:
    """One process, in this one, on one thread like each rank: the reference the ranks must
    reproduce (another thread count sums in another order: KL of ~1e-5 then differs at 1e-5 relative)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        main([str(a) for a in args])
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().out


def assert_close(a: Any, b: Any, where: str = "") -> None:
    """Same structure, same strings and ints, floats within RTOL relative (NaN equals NaN)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            if k not in SKIP_KEYS:
                assert_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not (isinstance(b, float) and math.isnan(a) and math.isnan(b)):
        assert b == pytest.approx(a, rel=RTOL, abs=1e-12), where
    else:
        assert a == b, where


def test_shard_deals_whole_chunks_round_robin(monkeypatch):
    items = list(range(11))
    monkeypatch.delenv("RANK", raising=False)
    assert distributed.shard(items, 3) == items and not distributed.under_torchrun()
    dealt = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        dealt.append(distributed.shard(items, 2))
    assert dealt == [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10]]


def test_single_process_helpers_are_identities(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert np.array_equal(distributed.all_reduce(x), x) and distributed.all_reduce(x).dtype == np.float64
    assert np.array_equal(distributed.gather_rows(3, [2, 0, 1], x), x[[1, 2, 0]])
    distributed.check_agree("anything", "one", 2)  # nothing to disagree with
    assert distributed.is_main() and distributed.all_true(True) and not distributed.all_true(False)
    assert distributed.rank_device("auto") == "auto" and distributed.rank_device("cpu") == "cpu"


def test_a_shard_is_the_plain_loop_in_one_process(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    batches = [[0, 1], [2, 3], [4]]
    work = distributed.Shard(batches, items=5)
    rows = np.arange(10.0).reshape(5, 2)
    for batch in work:
        work.done(batch)
    assert list(work) == batches and work.gather(rows)[0] is rows
    advanced: list[int] = []
    work.finish(advanced.append, per_item=3)
    assert advanced == []  # every item was this process's
    big = 2**60 + 1  # FLOP counts: whole numbers stay exact (float64 would round this one)
    assert work.sum(big)[0] == big and work.sum(0.5, 2).tolist() == [0.5, 2.0]


def test_a_shard_deals_whole_batches_and_catches_up_on_the_others(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert list(distributed.Shard([[0, 1], [2, 3], [4]], items=5)) == [[2, 3]]
    pairs = distributed.Shard(list("abcde"), chunk=2)  # the units are the items: indices known
    assert pairs.units == ["c", "d"] and pairs.mine == [2, 3]
    advanced: list[int] = []
    pairs.finish(advanced.append, per_item=2)  # two prompts a pair: 10 steps, 4 of them here
    assert advanced == [6]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU node maps cuda/auto to cuda:LOCAL_RANK")
def test_rank_device_without_gpus(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.rank_device("auto") == "auto" and distributed.rank_device("mps") == "mps"
    assert distributed.rank_device("cuda") == "cuda"  # the loader's device check then refuses it


def test_four_commands_on_two_ranks_equal_one_process(tmp_path, capsys, monkeypatch):
    pruned = tmp_path / "pruned"  # eval compares a checkpoint with its source (KL needs one tokenizer)
    single(capsys, ["prune-neurons", BIAS, "--neurons", "0:3,1:5", "--out", pruned, "--no-verify"])
    commands = {
        "neurons": ["find-neurons", BIAS, "--pairs", PAIRS, "--json"],
        "heads": ["find-heads", BINDING, *HEADS, "--dose-response", "--awareness-max", "8"],  # generation too
        "binding": ["score-binding", BINDING, "--benchmark", BINDING / "benchmark.jsonl", "--json"],
        "eval": ["eval", pruned, "--against", BIAS, "--limit", "6"],
        "eval-warm": ["eval", pruned, "--against", BIAS, "--limit", "6"],  # the source from the cache
    }
    written = ("neurons", "heads", "eval", "eval-warm")
    outs = {
        name: [*args, "--out", tmp_path / f"{name}-{{}}.json"] if name in written else args
        for name, args in commands.items()
    }
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache-1"))
    alone = {name: single(capsys, [str(a).format(1) for a in args]) for name, args in outs.items()}

    other = tmp_path / "pairs-1.jsonl"  # rank 1 is given one pair fewer
    other.write_text("".join(PAIRS.read_text().splitlines(keepends=True)[1:]))
    (tmp_path / "pairs-0.jsonl").write_text(PAIRS.read_text())
    spec = [
        {"args": [str(a).format(2) for a in args], "stdout": str(tmp_path / f"{name}.out")}
        for name, args in outs.items()
    ]
    spec += [
        {
            "args": ["find-neurons", str(BIAS), "--pairs", str(tmp_path / "pairs-{rank}.jsonl")],
            "stdout": str(tmp_path / "disagree.out"),
        },
        {"args": ["verify", str(BIAS), str(pruned)], "stdout": str(tmp_path / "verify.out")},
    ]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    ran = torchrun([TESTS / "support" / "torchrun_cli.py", tmp_path / "spec.json"], tmp_path / "cache-2")
    assert ran.returncode == 0, ran.stderr[-3000:]
    codes = json.loads((tmp_path / "spec.json.codes").read_text())
    assert codes == [0, 0, 0, 0, 0, 2, 2], ran.stderr[-3000:]

    for name in written:
        one, two = (json.loads((tmp_path / f"{name}-{k}.json").read_text()) for k in (1, 2))
        assert_close(one, two, name)
    for name in ("eval", "eval-warm"):
        one, two = (json.loads((tmp_path / f"{name}-{k}.json").read_text()) for k in (1, 2))
        assert one["against"]["from_cache"] is two["against"]["from_cache"] is (name == "eval-warm")
    assert_close(json.loads(alone["binding"]), json.loads((tmp_path / "binding.out").read_text()), "binding")
    neurons = json.loads((tmp_path / "neurons.out").read_text())
    assert neurons["summary"]["neurons"] == json.loads(alone["neurons"])["summary"]["neurons"]
    heads = json.loads((tmp_path / "heads-2.json").read_text())
    assert heads["selected_heads"] == json.loads((tmp_path / "heads-1.json").read_text())["selected_heads"]
    # rank 0 alone wrote the cache, and printed: one table, one progress line per measurement
    assert len(list((tmp_path / "cache-2" / "neurons").iterdir())) == 1
    # eval's entry: rank 0 wrote every rank's KL reference, which each rank then read its part of
    assert len(list((tmp_path / "cache-2" / "eval").iterdir())) == 2
    assert (tmp_path / "heads.out").read_text().count("Saved findings") == 1
    assert ran.stderr.count("scoring prompts: ") == 2  # find-heads and score-binding, rank 0's only

    errors = [ln for ln in ran.stderr.splitlines() if ln.startswith("Error")]
    assert errors == [
        "Error: torchrun ranks disagree about the model and the pairs: rank 1 differ from "
        "rank 0; give every process the same model and inputs",
        "Error: surgery verify does not run data-parallel; run it without torchrun (under "
        "torchrun: find-neurons, find-heads, score-binding, eval, find-direction, tune)",
    ], ran.stderr[-3000:]


def test_moe_find_neurons_on_two_ranks_equals_one_process(tiny, tmp_path, capsys, monkeypatch):
    """A mixture of experts with a shared expert: the ranks add up the expert sums, the pairs that
    reached each expert and the routing shares, so two processes find what one does."""
    from tests.support.binding import char_model
    from tests.support.neuron_pairs import write_pairs

    model = char_model(tiny, "qwen2_moe")
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    args = ["find-neurons", model, "--pairs", pairs, "--batch-size", "2", "--json", "--out"]  # 6 batches, 3 a rank
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache-1"))
    alone = json.loads(single(capsys, [*args, tmp_path / "one.json"]))
    ran = torchrun(["-m", "surgery", *args, tmp_path / "two.json"], tmp_path / "cache-2")
    assert ran.returncode == 0, ran.stderr[-3000:]
    one, two = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("one", "two"))
    assert one["experts"]["routing"] and one["scores"]["experts"]["shared_width"] == 24
    assert_close(one, two, "findings")
    assert json.loads(ran.stdout)["summary"]["neurons"] == alone["summary"]["neurons"]


def test_python_m_surgery_under_torchrun(tmp_path, capsys, monkeypatch):
    """What a user types: ``torchrun --nproc-per-node 2 -m surgery find-neurons …``."""
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache-1"))
    alone = single(capsys, ["find-neurons", BIAS, "--pairs", PAIRS, "--json"])
    ran = torchrun(["-m", "surgery", "find-neurons", BIAS, "--pairs", PAIRS, "--json"], tmp_path / "cache-2")
    assert ran.returncode == 0, ran.stderr[-3000:]
    one, two = json.loads(alone), json.loads(ran.stdout)  # rank 1 printed nothing: stdout is one JSON
    assert one["summary"] == two["summary"] and one["dataset"] == two["dataset"]
    assert ran.stderr.count("capturing prompts: ") == 1
