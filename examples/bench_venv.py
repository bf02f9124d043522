"""A benchmark's own virtual environment for a reference library, never a dependency of surgery.

    python = bench_venv.ensure("optipfair", "optipfair[viz]==0.4.2")

The environment lives in ``$SURGERY_BENCH_VENVS`` (default ``~/.cache/surgery/bench-venvs``)/NAME
and is reused while it holds the pinned version. It is made with ``--system-site-packages`` from
the running interpreter; when that interpreter is itself a virtual environment (whose packages
``--system-site-packages`` does not reach: it points at the base Python), a ``.pth`` file adds its
site-packages, so torch and transformers are shared, not downloaded again. pip is asked first
(``--dry-run --report``) what the requirement would install; only what the running interpreter
lacks is installed, with ``--no-deps``: torch is never replaced.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

PTH = "_surgery_parent.pth"


class Unavailable(Exception):
    """The environment cannot be made (no PyPI, pip failed): the benchmark says why and stops."""


def root() -> Path:
    return Path(os.environ.get("SURGERY_BENCH_VENVS") or Path.home() / ".cache" / "surgery" / "bench-venvs")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def _why(res: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (res.stderr + res.stdout).splitlines() if ln.strip() and "is ignored" not in ln]
    return lines[-1].strip() if lines else f"exit status {res.returncode}"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _have(name: str) -> bool:
    """Whether the running interpreter (shared with the environment) has distribution ``name``."""
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def _installed(python: Path, dist: str) -> str | None:
    res = _run([str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"])
    return res.stdout.strip() if res.returncode == 0 else None


def _create(where: Path) -> Path:
    res = _run([sys.executable, "-m", "venv", "--system-site-packages", str(where)])
    if res.returncode:
        raise Unavailable(f"python -m venv {where} failed: {_why(res)}")
    return where / "bin" / "python"


def _share(python: Path) -> None:
    """Point the environment at this interpreter's site-packages (rewritten on every use, so a
    benchmark run from another checkout's venv shares that one's torch)."""
    if sys.prefix == sys.base_prefix:  # not a venv: --system-site-packages already shares them
        return
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(site) / PTH).write_text("".join(f"{p}\n" for p in ours))


def ensure(name: str, requirement: str, report=print) -> Path:
    """The python of environment ``name`` with ``requirement`` (``dist[extras]==version``) installed."""
    dist, version = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)$", requirement).groups()
    where = root() / name
    python = where / "bin" / "python"
    if not python.exists():
        report(f"making {where} (shares this interpreter's torch and transformers)")
        python = _create(where)
    _share(python)
    if _installed(python, dist) == version:
        return python
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "report.json"
        res = _run([str(python), "-m", "pip", "install", "--quiet", "--dry-run", "--report", str(plan), requirement])
        if res.returncode:
            raise Unavailable(f"pip cannot resolve {requirement} (is PyPI reachable?): {_why(res)}")
        wanted = [(i["metadata"]["name"], i["metadata"]["version"]) for i in json.loads(plan.read_text())["install"]]
    # Anything this interpreter already has (torch, numpy, ...) stays as it is, whatever pip proposed.
    kept = sorted(n for n, _ in wanted if _canonical(n) != _canonical(dist) and _have(n))
    todo = [f"{n}=={v}" for n, v in wanted if _canonical(n) == _canonical(dist) or not _have(n)]
    report(
        f"installing {' '.join(todo)} into {where}"
        + (f" (keeping this interpreter's {', '.join(kept)})" if kept else "")
    )
    res = _run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", *todo])
    if res.returncode:
        raise Unavailable(f"pip install {' '.join(todo)} failed: {_why(res)}")
    return python
