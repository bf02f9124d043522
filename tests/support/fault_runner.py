"""Run the surgery CLI with one fault armed: ``python tests/support/fault_runner.py FAULT -- ARGS…``.

Test-only. The fault is injected by wrapping a real surgery or os function in this process (the
product code has no hooks for it), so the run takes exactly the code path a user's run takes until
the fault fires. Before firing, the runner writes ``fault: FAULT`` to stderr so a test can tell a
fault that fired from one whose point was never reached.

FAULT is one of:
  kill@copy      SIGKILL in the middle of copying a weights file (part of it written)
  kill@pwrite    SIGKILL right after the first patch write (bake) or restore write (undo)
  int@pwrite     SIGINT (Ctrl-C) at the same point: the run must clean up after itself
  term@pwrite    SIGTERM (kill, container stop) at the same point: cleaned up as for Ctrl-C
  kill@hash      SIGKILL when hashing starts (weights patched, surgery.undo written)
  kill@publish   SIGKILL just before the staged folder is renamed into place
  kill@swap      SIGKILL between the two renames of a --force publish (old output moved aside)
  hold:DIR       no fault: on the first copied file, create DIR/holding and wait for DIR/go, so that
                 a test can start a concurrent run while this one holds the destination's lock
"""

from __future__ import annotations

import os
import signal
import sys
import time


def fire(fault: str, sig: int = signal.SIGKILL) -> None:
    sys.stderr.write(f"fault: {fault}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), sig)
    time.sleep(5)  # a SIGINT is handled at the next bytecode; never get past the fault point


def arm(fault: str) -> None:
    import surgery.bake.bake as bake
    import surgery.core.staging as staging

    if fault == "kill@copy":
        real_copy = bake.copy_file
        bake.COPY_BLOCK = 4096  # many blocks per file, so the kill lands inside one

        def copy_file(src, dst, on_bytes=lambda n: None):
            seen = [0]

            def tick(n: int) -> None:
                on_bytes(n)
                seen[0] += 1
                if str(dst).endswith(".safetensors") and seen[0] == 2:
                    fire(fault)

            real_copy(src, dst, tick)

        bake.copy_file = copy_file
    elif fault in ("kill@pwrite", "int@pwrite", "term@pwrite"):
        real_pwrite = os.pwrite
        sig = {"kill": signal.SIGKILL, "int": signal.SIGINT, "term": signal.SIGTERM}[fault.split("@")[0]]

        def pwrite(fd, data, offset):
            n = real_pwrite(fd, data, offset)
            fire(fault, sig)
            return n

        os.pwrite = pwrite
    elif fault == "kill@hash":

        def hash_files(root, names):
            fire(fault)

        bake.hash_files = hash_files
    elif fault == "kill@publish":

        def publish(tmp, target, force):
            fire(fault)

        staging._publish = publish
    elif fault == "kill@swap":
        real_rename = os.rename

        def rename(src, dst):
            real_rename(src, dst)
            if staging.OLD_TAG in str(dst):
                fire(fault)

        os.rename = rename
    elif fault.startswith("hold:"):
        from pathlib import Path

        barrier, real_copy = Path(fault[len("hold:") :]), bake.copy_file

        def held_copy(src, dst, on_bytes=lambda n: None):
            if not (barrier / "holding").exists():
                (barrier / "holding").touch()
                deadline = time.monotonic() + 120
                while not (barrier / "go").exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            real_copy(src, dst, on_bytes)

        bake.copy_file = held_copy
    else:
        raise SystemExit(f"fault_runner: unknown fault {fault!r}")


if __name__ == "__main__":
    fault, sep, *args = sys.argv[1:]
    assert sep == "--", "usage: fault_runner.py FAULT -- CLI ARGS"
    # Ctrl-C as a terminal delivers it: a shell's background job (`bash .ci/run &`) starts its children
    # with SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    arm(fault)
    from surgery.cli.main import main

    main(args)
