"""Bad input through the real CLI: every case fails with one clear line and leaves nothing behind.

Each case breaks one thing in a fresh copy of a tiny checkpoint (or in the command line, recipe or
destination) and asserts: non-zero exit, exactly one ``Error: …`` line naming the problem and the
fix, no traceback, no output folder and no hidden staging folder left, and the source's sha256s
unchanged.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from surgery.core.checkpoint import read_safetensors_header
from surgery.core.errors import CheckpointError
from tests.support import corrupt as bad
from tests.support.bad_file_cases import FILE_CASES
from tests.support.bad_model_cases import MODEL_CASES
from tests.support.cases import Case, Ctx
from tests.support.cli import REPO, cli_env, error_line, hidden_entries, run_cli, run_main, tree_hashes
from tests.support.tiny import build_tiny


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    """Tiny llamas (single file, sharded, F16, BF16), built once and copied per case."""
    root = tmp_path_factory.mktemp("bases")
    return {
        "single": build_tiny("llama", root / "single"),
        "sharded": build_tiny("llama", root / "sharded", shard="20KB"),
        "f16": build_tiny("llama", root / "f16", dtype=torch.float16),
        "bf16": build_tiny("llama", root / "bf16", dtype=torch.bfloat16),
        "phi3": build_tiny("phi3", root / "phi3"),
        "qwen2_moe": build_tiny("qwen2_moe", root / "qwen2_moe"),
        "gpt_oss": build_tiny("gpt_oss", root / "gpt_oss"),
    }


CASES = MODEL_CASES + FILE_CASES


# These also run through a real ``python -m surgery`` subprocess (one or two per group); the rest run
# in-process through surgery.cli.main.main, which is what the console script calls.
SUBPROCESS = {
    "missing-path",
    "direction-wrong-size",
    "direction-weight-overflows-bf16",
    "pickle-bin",
    "truncated-half",
    "quantized-gptq",
    "alpha-zero",
    "recipe-not-yaml",
    "recipe-neuron-octal",
    "findings-other-architecture",
    "dest-exists",
    "alpha-underflows-bf16",
    "tokenizer-encodes-nothing-verify",
}
RUNS = [pytest.param(c, "in-process", id=c.id) for c in CASES] + [
    pytest.param(c, "subprocess", id=f"{c.id}-subprocess") for c in CASES if c.id in SUBPROCESS
]


@pytest.mark.parametrize("case,how", RUNS)
def test_bad_input_fails_cleanly(case: Case, how: str, bases, tmp_path, capsys):
    src = tmp_path / "model" / "src"
    shutil.copytree(bases[case.source], src)
    outs = tmp_path / "outs"
    outs.mkdir()
    ctx = Ctx(src, outs / "baked", tmp_path)
    args = case.setup(ctx)
    source_before = tree_hashes(src)
    hidden_before = {p: hidden_entries(p) for p in (outs, src.parent)}
    dest_before = tree_hashes(ctx.out) if ctx.out.is_dir() else ctx.out.read_bytes() if ctx.out.exists() else None

    result = run_cli(args) if how == "subprocess" else run_main(args, capsys)

    line = error_line(result)
    for needle in case.needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert tree_hashes(src) == source_before, "the source changed"
    for parent, before in hidden_before.items():
        assert hidden_entries(parent, before) == [], f"hidden leftovers in {parent}"
    if case.dest_exists:
        after = tree_hashes(ctx.out) if ctx.out.is_dir() else ctx.out.read_bytes()
        assert after == dest_before, "an existing destination was modified"
    else:
        assert not ctx.out.exists(), "an output folder was left behind"
    assert not (tmp_path / "UNPICKLED").exists(), "a pickle was unpickled"


def _in_private_mount_namespace(script: str) -> subprocess.CompletedProcess | None:
    """Run ``script`` with sh in a private mount namespace (its mounts vanish with it); None when
    this machine does not allow that (not root, no unshare)."""
    if not shutil.which("unshare"):
        return None
    cmd = ["unshare", "-m", "--propagation", "private"]
    if subprocess.run([*cmd, "true"], capture_output=True).returncode != 0:
        return None
    return subprocess.run(
        [*cmd, "sh", "-c", script], capture_output=True, text=True, cwd=REPO, env=cli_env(), timeout=300
    )


def test_unwritable_destination(bases, tmp_path):
    """A destination folder the user cannot write: a clear error before any work.

    As root, chmod does not stop writes, so the folder becomes a read-only tmpfs instead.
    """
    src = tmp_path / "src"
    shutil.copytree(bases["single"], src)
    ro = tmp_path / "ro"
    ro.mkdir()
    args = ["amplify-heads", src, "--heads", "0.1", "--alpha", "2", "--out", ro / "baked"]
    before = tree_hashes(src)
    if os.geteuid() != 0:
        ro.chmod(0o555)
        try:
            result = run_cli(args)
        finally:
            ro.chmod(0o755)
    else:
        cli = shlex.join([sys.executable, "-m", "surgery", *map(str, args)])
        result = _in_private_mount_namespace(f"mount -t tmpfs -o ro,size=64k tmpfs {shlex.quote(str(ro))} && {cli}")
        if result is None:
            pytest.skip("root without mount namespaces: chmod cannot make a folder unwritable for root")
    line = error_line(result)
    assert "cannot write" in line and "choose another --out" in line, line
    assert tree_hashes(src) == before
    assert list(ro.iterdir()) == []


# --- fuzzing the header reader: any JSON in any field is a CheckpointError, never a crash ---

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 1 << 70) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_field = st.sampled_from(["dtype", "shape", "data_offsets", None])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=_field, value=_json, name=st.sampled_from(["a", "b"]))
def test_header_fuzz_never_crashes(tmp_path, field, value, name):
    header = {
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]},
    }
    if field is None:
        header[name] = value  # the whole entry replaced
    else:
        header[name][field] = value
    path = tmp_path / "fuzz.safetensors"
    bad.write_raw(path, header, bytes(24))
    try:
        start, parsed = read_safetensors_header(path)
    except CheckpointError as exc:
        assert "\n" not in str(exc)
    else:
        assert start % 8 == 0 and set(parsed) == {"a", "b"}
