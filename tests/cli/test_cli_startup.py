"""The command line starts fast: help and argument errors never import torch or transformers."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
from surgery.cli.main import main
try:
    main(["--help"])
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "transformers", "sklearn") if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
"""


def test_help_imports_no_heavy_library():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY=", (
        "surgery --help imported " + proc.stdout.strip().splitlines()[-1]
    )
