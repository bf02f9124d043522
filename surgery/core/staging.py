"""Write an output folder so that it either appears complete or not at all.

Work happens in a hidden temporary folder next to the destination (same filesystem, so the final
``rename`` is atomic). A lock file serialises writers of one destination: of two concurrent runs
exactly one succeeds. Temporary folders left by a killed run are removed by the next run (the lock
proves nobody is still writing them) and reported with their size; an earlier output that a killed
``--force`` run had moved aside is put back.

Where an output may go and what ``--force`` may replace is surgery/core/destinations.py: those
checks run when the staged write starts, and again under the lock for an output put back by
recovery.

Every temporary and aside folder is named after its destination and its writer's process
(``.NAME.surgery-tmp-PID@HOST``): a staged write first removes those that dead writers left
anywhere in its parent folder, each under its destination's lock, so a live writer's are never
touched.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import os
import secrets
import shutil
import socket
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .destinations import (
    Replaceable,
    already_exists,
    check_destination,
    check_free_file,
    check_parent,
    check_replaceable,
)
from .errors import DestinationError
from .sizes import human_size

TMP_TAG = ".surgery-tmp-"
OLD_TAG = ".surgery-old-"
LOCK_TAG = ".surgery-lock"

# A temporary's name carries its writer's host: a pid says nothing about another machine's processes
# (an output folder on a shared filesystem). Only characters that are safe in a file name.
_HOST = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname()) or "host"


@contextmanager
def _lock(target: Path) -> Iterator[None]:
    """An exclusive, non-blocking lock on ``.<name>.surgery-lock`` next to the destination."""
    path = target.parent / f".{target.name}{LOCK_TAG}"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DestinationError(
                f"another surgery process is writing {target}; wait for it or choose another --out"
            ) from None
        # The previous holder may have unlinked the file between our open and flock: retry then.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_symlink():  # rmtree refuses links (a --force run may have replaced one)
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def _size(path: Path) -> int:
    """Bytes under ``path`` (links not followed)."""
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size
    return sum(Path(root, f).lstat().st_size for root, _, files in os.walk(path) for f in files)


def _recover(target: Path, report: Callable[[str], None]) -> bool:
    """Clean up after earlier, killed runs for this destination (we hold the lock: none is running);
    True when an earlier output was put back.

    A folder that a killed ``--force`` run had moved aside, with nothing published in its place, is
    the user's previous output: it is put back, not deleted. Everything else is removed.
    """
    pattern = glob.escape(f".{target.name}")
    olds = sorted(target.parent.glob(f"{pattern}{OLD_TAG}*"))
    restored = False
    if olds and not (target.exists() or target.is_symlink()):
        os.rename(olds[0], target)
        report(f"restored {target.name} from {olds[0].name}, where an interrupted --force run had moved it")
        olds, restored = olds[1:], True
    for stale in [*sorted(target.parent.glob(f"{pattern}{TMP_TAG}*")), *olds]:
        size = human_size(_size(stale))
        _remove(stale)
        report(f"removed {stale.name} ({size}), left behind by an interrupted run")
    return restored


def _owner() -> str:
    """Who writes a temporary folder: ``PID@HOST``, so that another run can tell it is dead."""
    return f"{os.getpid()}@{_HOST}"


def _owner_alive(owner: str) -> bool:
    """Whether the writer named by a temporary's ``PID@HOST`` may still run (a process of another
    host, or a name surgery did not make, may: it is left alone)."""
    pid, _, host = owner.partition("@")
    if not pid.isdigit() or (host and host != _HOST):
        return True
    return _pid_alive(int(pid))


def _clear_parent(target: Path, report: Callable[[str], None]) -> None:
    """Clean up after killed runs for the other destinations of ``target``'s folder: those whose
    temporaries' writers are dead and whose lock is free (a live writer holds it; we never wait)."""
    leftovers: dict[str, list[str]] = {}
    for entry in target.parent.iterdir():
        for tag in (TMP_TAG, OLD_TAG, LOCK_TAG):
            name, found, owner = entry.name.rpartition(tag)
            if found and name.startswith(".") and len(name) > 1:
                leftovers.setdefault(name[1:], []).append(owner)
    for name, owners in sorted(leftovers.items()):
        if name == target.name or any(_owner_alive(o) for o in owners if o):
            continue
        try:
            with _lock(target.parent / name):
                _recover(target.parent / name, report)
        except DestinationError:  # a writer is at work there
            continue


def disk_error(exc: OSError, where: Path) -> DestinationError:
    """One clear line for the write errors users can fix."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DestinationError(
            f"no space left while writing {where} ({os.strerror(exc.errno)}); "
            "free space or choose another --out; nothing was left behind"
        )
    if exc.errno == errno.EFBIG:  # a file-size limit (ulimit -f) or the filesystem's largest file
        return DestinationError(
            f"a file grew past the largest size allowed while writing {where} "
            f"({os.strerror(exc.errno)}); raise the limit (ulimit -f) or choose another "
            "--out; nothing was left behind"
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return DestinationError(f"cannot write {where} ({os.strerror(exc.errno)}); choose another --out")
    return DestinationError(f"writing {where} failed: {exc.strerror or exc}; nothing was left behind")


@contextmanager
def staged_output(
    dest: Path,
    protected: Iterable[Path] = (),
    force: bool = False,
    report: Callable[[str], None] = lambda msg: None,
    replaceable: Replaceable | None = None,
) -> Iterator[Path]:
    """Yield an empty temporary folder; on normal exit it replaces ``dest`` atomically.

    On any error (or Ctrl-C) the temporary folder is removed and ``dest`` is left as it was.
    ``replaceable(folder)``: an existing folder, besides surgery's marked outputs, that ``force``
    may replace (see :func:`~surgery.core.destinations.check_free`).
    """
    target = check_destination(Path(dest), protected, force, replaceable)
    with _lock(target):
        restored = _recover(target, report)
        _clear_parent(target, report)
        if target.exists() or target.is_symlink():
            if not force:
                raise already_exists(Path(dest))  # restored by _recover just now, or made since the check
            if restored:  # checked like any taken destination (it was not there at the check)
                check_replaceable(Path(dest), target, replaceable)
        tmp = target.parent / f".{target.name}{TMP_TAG}{_owner()}"
        try:
            tmp.mkdir()
            yield tmp
            _publish(tmp, target, force)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise disk_error(exc, target) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _publish(tmp: Path, target: Path, force: bool) -> None:
    if target.exists() or target.is_symlink():
        if not force:  # appeared while we worked (not through surgery, which holds the lock)
            raise DestinationError(f"{target} appeared while writing; nothing was replaced")
        old = target.parent / f".{target.name}{OLD_TAG}{_owner()}"
        os.rename(target, old)
        try:
            os.rename(tmp, target)
        except BaseException:
            os.rename(old, target)  # the previous output stays where it was
            raise
        _remove(old)
    else:
        os.rename(tmp, target)


@contextmanager
def staged_files(
    dest: Path,
    protected: Iterable[Path] = (),
    force: bool = False,
    report: Callable[[str], None] = lambda msg: None,
    replaceable: Replaceable | None = None,
    companions: Iterable[str] = (),
) -> Iterator[Path]:
    """Yield an empty temporary folder for a single-file output (a GGUF and its sidecars); on normal
    exit every file in it is moved next to ``dest`` under its own name, ``dest`` itself last, and
    any ``companions`` (sidecar names) of an earlier output that this one did not write are removed.

    ``dest`` is refused when it is or holds a protected path, is a link, or exists (without
    ``force``; with it, unless ``replaceable(dest)`` says it is surgery's own). Nothing is moved
    when the block fails.
    """
    dest = Path(dest)
    target = check_free_file(dest, protected, force, replaceable)
    check_parent(dest, target)
    with _lock(target):
        _recover(target, report)
        _clear_parent(target, report)
        tmp = target.parent / f".{target.name}{TMP_TAG}{_owner()}"
        try:
            tmp.mkdir()
            yield tmp
            written = sorted(p.name for p in tmp.iterdir())
            for name in sorted(written, key=lambda n: n == target.name):  # the file itself last
                os.replace(tmp / name, target.parent / name)
            for name in companions:
                if name not in written:
                    (target.parent / name).unlink(missing_ok=True)
            tmp.rmdir()
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise disk_error(exc, target) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _remove_dead_temporaries(path: Path) -> None:
    """Remove temporary files that killed writers of ``path`` left behind (their pid is gone)."""
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid = tmp.name[len(path.name) + 2 :].split(".")[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and rename: readers never see half a file.

    The temporary name is chosen before the file is created inside ``try``, so a Ctrl-C at any
    point removes it (``mkstemp`` could be interrupted after creating its file, before returning).
    A failure is reported for ``path``: the temporary's name means nothing to the reader.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_temporaries(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        # the same error (its errno picks the subclass: IsADirectoryError …), naming the destination
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) atomically, as :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))
