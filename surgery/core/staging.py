"""Write an output folder so that it either appears complete or not at all.

Work happens in a hidden temporary folder next to the destination (same filesystem, so the final
``rename`` is atomic). A lock file serialises writers of one destination: of two concurrent runs
exactly one succeeds. Temporary folders left by a killed run are removed by the next run (the lock
proves nobody is still writing them) and reported with their size; an earlier output that a killed
``--force`` run had moved aside is put back.

``--force`` replaces only what surgery can tell is its own: an empty folder, a folder holding one
of the marker files of ``OUTPUT_MARKERS`` and nothing but the files that marker lists (a file the
user added since, an eval JSON or a plots/ folder, makes it refuse, naming it), or what a command's
own ``replaceable`` accepts (undo's earlier restore of the same bake). A destination that is a
symbolic link is refused, never followed: removing "the folder" would remove whatever the link
points to.

Every temporary and aside folder is named after its destination and its writer's process
(``.NAME.surgery-tmp-PID@HOST``): a staged write first removes those that dead writers left
anywhere in its parent folder, each under its destination's lock, so a live writer's are never
touched.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import secrets
import shutil
import socket
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import DestinationError
from .sizes import human_size
from .strict_files import load_json

TMP_TAG = ".surgery-tmp-"
OLD_TAG = ".surgery-old-"
LOCK_TAG = ".surgery-lock"
# The file each command writes into its output folder, with the "format" recorded in it: a bake
# (surgery/bake/provenance.py), export-lora (surgery/bake/lora.py), import-gguf
# (surgery/gguf/importing.py), report (surgery/ship/report.py). tests/core/test_staging.py
# checks that these are the names and formats those modules write.
OUTPUT_MARKERS = {
    "surgery.json": "surgery-checkpoint",
    "surgery_adapter.json": "surgery-adapter",
    "surgery.gguf.json": "surgery-gguf-import",
    "surgery_report.json": "surgery-report",
}
Replaceable = Callable[[Path], bool]
# A temporary's name carries its writer's host: a pid says nothing about another machine's processes
# (an output folder on a shared filesystem). Only characters that are safe in a file name.
_HOST = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname()) or "host"


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def _marker(folder: Path) -> tuple[str, dict] | None:
    """The name and content of the marker file of ``OUTPUT_MARKERS`` that ``folder`` holds, if any."""
    for name, fmt in OUTPUT_MARKERS.items():
        marker = folder / name
        if marker.is_file() and not marker.is_symlink():
            try:
                doc = load_json(marker.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                continue
            if isinstance(doc, dict) and doc.get("format") == fmt:
                return name, doc
    return None


def surgery_output(folder: Path) -> bool:
    """True when ``folder`` holds a marker file of ``OUTPUT_MARKERS`` with its format."""
    return _marker(folder) is not None


def _unlisted(folder: Path, listed: set[str]) -> list[str]:
    """What ``folder`` holds beyond the ``listed`` relative paths: files (links too, never followed)
    and empty folders (``plots/``), sorted."""
    extra = []
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        for d in dirs:
            path = Path(root, d)
            if path.is_symlink() or not any(path.iterdir()):  # os.walk lists a link to a folder here
                extra.append(f"{(rel / d).as_posix()}{'' if path.is_symlink() else '/'}")
        extra += [p for f in files if (p := (rel / f).as_posix()) not in listed]
    return sorted(extra)


def _few(names: list[str], shown: int = 3) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _check_replaceable(dest: Path, target: Path, replaceable: Replaceable | None) -> None:
    """What ``--force`` may remove: an empty folder, a surgery output holding only the files its
    marker lists, or what ``replaceable`` accepts."""
    try:
        empty = not any(target.iterdir())
    except OSError:  # unreadable: not known to be empty
        empty = False
    if empty:
        return
    found = _marker(target)
    if found is not None:
        name, doc = found
        listed = doc.get("files")
        if not isinstance(listed, (dict, list)) or not all(isinstance(n, str) for n in listed):
            raise DestinationError(
                f"{dest} was written by an earlier surgery whose {name} does not list its files, so "
                "--force cannot tell them from files added since: remove it yourself or choose another --out"
            )
        extra = _unlisted(target, {name, *listed})
        if not extra:
            return
        raise DestinationError(
            f"{dest} holds {len(extra)} file{'s' if len(extra) > 1 else ''} that surgery did not write "
            f"({_few(extra)}); --force would delete {'them' if len(extra) > 1 else 'it'}: move "
            f"{'them' if len(extra) > 1 else 'it'} out of the folder, or choose another --out"
        )
    if replaceable is not None and replaceable(target):
        return
    raise DestinationError(
        f"{dest} exists and was not written by surgery (no {' / '.join(OUTPUT_MARKERS)} "
        "in it); {force} replaces only surgery's own outputs or an empty folder: remove it "
        "yourself or choose another {out}",
        "out",
        switches=("force",),
    )


def check_outside(dest: Path, protected: Iterable[Path]) -> Path:
    """Refuse a destination that is, contains, or sits inside a protected (source) folder (a link
    is followed here: writing through it would reach the source). Returns the resolved path."""
    target = dest.expanduser().resolve()
    for src in protected:
        src = Path(src).resolve()
        if _inside(target, src):
            raise DestinationError(
                f"--out {dest} is {'the source' if target == src else 'inside the source'} "
                f"{src}; the source is never written: choose a folder outside it"
            )
        if _inside(src, target):
            raise DestinationError(f"--out {dest} contains the source {src}; choose another folder")
    return target


def check_container(dest: Path, protected: Iterable[Path]) -> Path:
    """A folder that outputs are written into, never replaced itself (a sweep's folder): only
    :func:`check_outside`, and it must be a folder if it exists. Returns the resolved path."""
    target = check_outside(dest, protected)
    if target.exists() and not target.is_dir():
        raise DestinationError(f"{dest} exists and is not a folder; remove it or choose another --out")
    return target


def check_free(dest: Path, protected: Iterable[Path], force: bool, replaceable: Replaceable | None = None) -> Path:
    """:func:`check_outside`; then refuse a destination that is a symbolic link, or that is taken
    (without ``force``; with it, anything but an empty folder or one surgery wrote, see
    :func:`surgery_output`). Its parent may not exist yet. Returns the resolved destination."""
    target = check_outside(dest, protected)
    link = dest.expanduser()
    if link.is_symlink():
        raise DestinationError(
            f"--out {dest} is a symbolic link (to {os.readlink(link)}); surgery never writes "
            "through or replaces a link: give the folder itself or another --out"
        )
    if target.exists():
        if not force:
            raise _exists(dest)
        if not target.is_dir():
            raise DestinationError(f"{dest} exists and is not a folder; remove it or choose another --out")
        _check_replaceable(dest, target, replaceable)
    return target


def check_destination(
    dest: Path, protected: Iterable[Path], force: bool, replaceable: Replaceable | None = None
) -> Path:
    """:func:`check_free`, and the parent folder must exist and be writable."""
    target = check_free(dest, protected, force, replaceable)
    parent = target.parent
    if not parent.is_dir():
        raise DestinationError(f"the parent folder of {dest} does not exist; create {parent} first")
    if not os.access(parent, os.W_OK | os.X_OK):
        why = "read-only filesystem" if os.statvfs(parent).f_flag & os.ST_RDONLY else "permission denied"
        raise DestinationError(f"cannot write into {parent} ({why}); choose another --out")
    return target


def _exists(dest: Path) -> DestinationError:
    return DestinationError(
        f"{dest} already exists; pass {{force}} to replace it, or choose another {{out}}", "out", switches=("force",)
    )


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
    may replace (see :func:`check_free`).
    """
    target = check_destination(Path(dest), protected, force, replaceable)
    with _lock(target):
        restored = _recover(target, report)
        _clear_parent(target, report)
        if target.exists() or target.is_symlink():
            if not force:
                raise _exists(Path(dest))  # restored by _recover just now, or made since the check
            if restored:  # checked like any taken destination (it was not there at the check)
                _check_replaceable(Path(dest), target, replaceable)
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


def check_free_file(dest: Path, protected: Iterable[Path], force: bool, replaceable: Replaceable | None = None) -> Path:
    """:func:`check_outside` for a single-file output; then refuse a link, or a taken ``dest``
    (without ``force``; with it, unless ``replaceable(dest)`` says it is surgery's own). Its parent
    may not exist yet (a sweep's folder is made after every value is checked). Returns the resolved path."""
    target = check_outside(dest, protected)
    if dest.expanduser().is_symlink():
        raise DestinationError(
            f"--out {dest} is a symbolic link; surgery never writes through or replaces a link: give another --out"
        )
    if target.exists():
        if not force:
            raise _exists(dest)
        if not target.is_file() or replaceable is None or not replaceable(target):
            raise DestinationError(
                f"{dest} exists and was not written by surgery; {{force}} replaces only "
                "surgery's own outputs: remove it yourself or choose another {out}",
                "out",
                switches=("force",),
            )
    return target


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
    if not target.parent.is_dir():
        raise DestinationError(f"the parent folder of {dest} does not exist; create {target.parent} first")
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
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) atomically, as :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))
