"""What the commands print counts in the right number: "Restored 1 file", "1 edited tensor"."""

from __future__ import annotations

from tests.support.cli import run_main
from tests.support.typed_gguf import write_typed_gguf


def test_one_file_and_one_tensor_are_singular(tmp_path, capsys):
    src, out, back = tmp_path / "src.gguf", tmp_path / "h.gguf", tmp_path / "back.gguf"
    write_typed_gguf(src, "F32")
    baked = run_main(["amplify-heads", src, "--heads", "0.1", "--alpha", "2", "--out", out], capsys)
    assert baked.returncode == 0, baked.stderr
    verified = run_main(["verify", src, out], capsys)
    assert verified.returncode == 0, verified.stderr
    # the GGUF and its sidecar record: 2 files
    assert "OK: 2 files, 1 edited tensor match the source" in " ".join(verified.stdout.split()), verified.stdout
    undone = run_main(["undo", out, "--out", back], capsys)
    assert undone.returncode == 0, undone.stderr
    assert "Restored 1 file, sha256-identical to the source" in " ".join(undone.stdout.split()), undone.stdout
