"""Run several ``surgery`` commands in one torchrun launch (one process group, started once).

``torchrun … tests/support/torchrun_cli.py SPEC.json``: SPEC is a list of ``{"args": [...],
"stdout": PATH}``; ``{rank}`` in an argument becomes this process's rank (to give ranks different
inputs on purpose). Rank 0 writes each command's stdout to its PATH and the exit codes, in order,
to ``SPEC.json.codes``. Starting torchrun once instead of per command keeps the tests fast.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import redirect_stdout
from pathlib import Path

from surgery.cli.main import main
from surgery.core import distributed


def run(spec_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    rank = os.environ["RANK"]
    codes = []
    with distributed.session():
        for command in spec:
            args = [a.replace("{rank}", rank) for a in command["args"]]
            try:
                if distributed.is_main():
                    with open(command["stdout"], "w") as out, redirect_stdout(out):
                        main(args)
                else:
                    main(args)
                codes.append(0)
            except SystemExit as exc:
                codes.append(exc.code if isinstance(exc.code, int) else 1)
    if distributed.is_main():
        Path(f"{spec_path}.codes").write_text(json.dumps(codes))


if __name__ == "__main__":
    run(Path(sys.argv[1]))
