"""surgery.undo is written streaming (a projected tensor's originals are spooled to disk as the bake
goes) and read an entry at a time, in the safetensors layout that earlier versions wrote."""

from __future__ import annotations

import threading

import numpy as np
from safetensors.numpy import load_file, save

from surgery.bake.provenance import Spooled, UndoSpool, load_undo, write_undo


def test_in_memory_entries_are_laid_out_as_safetensors_writes_them(tmp_path):
    arrays = {
        "slice0.rows": np.arange(7, dtype=np.uint8),
        "file:README.md": np.frombuffer(b"# card\n", np.uint8),
        "slice10.cols": np.arange(300, dtype=np.uint16).view(np.uint8),
        "slice2.cols": np.zeros(0, np.uint8),
    }
    write_undo(tmp_path / "surgery.undo", arrays)
    assert (tmp_path / "surgery.undo").read_bytes() == save(arrays)
    write_undo(tmp_path / "empty.undo", {})
    assert (tmp_path / "empty.undo").read_bytes() == save({"empty": np.zeros(0, dtype=np.uint8)})


def test_spooled_entries_from_two_threads_read_back_whole(tmp_path):
    spool = UndoSpool(tmp_path)
    rng = np.random.default_rng(0)
    parts = {
        key: [rng.integers(0, 255, n, dtype=np.uint8) for n in (5000, 1, 70000, 3)] for key in ("a.block", "b.block")
    }

    def feed(key: str) -> None:
        for part in parts[key]:
            spool.add(key, part)

    threads = [threading.Thread(target=feed, args=(k,)) for k in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert list(tmp_path.iterdir()) == []  # the spool has no name in the folder
    write_undo(
        tmp_path / "surgery.undo",
        {
            "slice0.block": Spooled("a.block"),
            "slice1.block": Spooled("b.block"),
            "slice2.rows": np.arange(4, dtype=np.uint8),
        },
        spool,
    )
    spool.close()
    whole = {k: np.concatenate(v) for k, v in parts.items()}
    loaded = load_file(str(tmp_path / "surgery.undo"))  # safetensors reads it
    assert np.array_equal(loaded["slice0.block"], whole["a.block"]) and np.array_equal(
        loaded["slice1.block"], whole["b.block"]
    )
    undo = load_undo(tmp_path / "surgery.undo")
    assert undo.read("slice1.block", 4999, 3) == whole["b.block"][4999:5002].tobytes()
    assert np.array_equal(undo["slice2.rows"], np.arange(4, dtype=np.uint8))
