"""Where a command may write, and what ``--force`` may replace: the checks every output passes
before anything is written (and again when it is published, surgery/core/staging.py).

An output never lies in, nor holds, the source it was made from (:func:`check_outside`), is never a
symbolic link, and replaces an existing path only with ``--force`` and only when surgery can tell
it is its own: an empty folder, a folder holding one of the marker files of ``OUTPUT_MARKERS`` and
nothing but the files that marker lists (a file the user added since, an eval JSON or a plots/
folder, makes it refuse, naming it), or what a command's own ``replaceable`` accepts (undo's
earlier restore of the same bake). A destination that is a symbolic link is refused, never
followed: removing "the folder" would remove whatever the link points to.

The same checks run up front, before a command's long work (a finder's run, a study), so that a
taken or unwritable ``--out`` is refused in seconds rather than after hours: :func:`check_parent`
and :func:`check_makeable` for the folder an output goes into, :func:`check_out_file` for a
report file (findings, an eval result).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from .errors import DestinationError
from .strict_files import load_json

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


def check_replaceable(dest: Path, target: Path, replaceable: Replaceable | None) -> None:
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
                f"{src}; the source is never written: "
                # a file source (a GGUF) has no outside: name what to choose instead
                f"{'choose another file' if src.is_file() else 'choose a folder outside it'}"
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
        if not target.is_dir():  # first: --force replaces no file, so "pass --force" would not help
            raise DestinationError(f"{dest} exists and is not a folder; remove it or choose another --out")
        if not force:
            raise already_exists(dest)
        check_replaceable(dest, target, replaceable)
    return target


def check_destination(
    dest: Path, protected: Iterable[Path], force: bool, replaceable: Replaceable | None = None
) -> Path:
    """:func:`check_free`, and :func:`check_parent`."""
    target = check_free(dest, protected, force, replaceable)
    check_parent(dest, target)
    return target


def check_parent(dest: Path, target: Path | None = None) -> None:
    """The folder ``dest`` goes into must exist and be writable (``target``: ``dest`` resolved)."""
    parent = (target if target is not None else dest.expanduser().resolve()).parent
    if parent.exists() and not parent.is_dir():
        raise _below_file(dest, parent)
    if not parent.is_dir():
        raise DestinationError(f"the parent folder of {dest} does not exist; create {parent} first")
    _check_writable(parent)


def check_makeable(folder: Path, dest: Path) -> None:
    """``folder`` is made when missing, with its parents, and ``dest`` written into it (a sweep's
    folder, a report file's): the nearest existing path at or above it must be a writable folder."""
    folder = folder.expanduser().resolve()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise _below_file(dest, existing)
    _check_writable(existing)


def surgery_json(path: Path) -> bool:
    """True when ``path`` is a JSON file whose "format" is one of surgery's (``surgery-findings``,
    ``surgery-eval``, …): a file a command may replace without asking."""
    try:
        with open(path, "rb") as f:
            if f.read(1) != b"{":  # not JSON: no need to read a large file through
                return False
        doc = load_json(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("format"), str) and doc["format"].startswith("surgery-")


def check_out_file(dest: Path, example: str, replaceable: Replaceable = surgery_json) -> Path:
    """A report file written atomically at ``dest`` (findings, an eval result), its missing folders
    made: refuse a folder, a path below a file, a folder that cannot be written, or an existing non-empty
    file that ``replaceable`` does not accept (default: one surgery wrote), before the work (the write
    would fail or destroy the user's file only after it). ``example``: the file name a refused
    folder is offered with. Returns the resolved path."""
    dest = Path(dest)
    target = dest.expanduser().resolve()
    if target.is_dir():
        raise DestinationError(
            f"{{out}} {dest} is a folder; give the file to write, e.g. {{out}} {dest / example}", "out"
        )
    # an empty file holds nothing to lose: the file `mktemp` made for the report, say
    if target.exists() and target.stat().st_size > 0 and not replaceable(target):
        raise DestinationError(
            f"{{out}} {dest} exists and was not written by surgery, which replaces only its own files "
            "(findings, eval results): move it away or choose another {out}",
            "out",
        )
    check_makeable(target.parent, dest)
    return target


def _check_writable(folder: Path) -> None:
    if not os.access(folder, os.W_OK | os.X_OK):
        why = "read-only filesystem" if os.statvfs(folder).f_flag & os.ST_RDONLY else "permission denied"
        raise DestinationError(f"cannot write into {folder} ({why}); choose another {{out}}", "out")


def _below_file(dest: Path, file: Path) -> DestinationError:
    return DestinationError(f"{dest} lies below {file}, which is a file, not a folder; choose another {{out}}", "out")


def already_exists(dest: Path) -> DestinationError:
    """The refusal of a taken destination (without ``--force``)."""
    return DestinationError(
        f"{dest} already exists; pass {{force}} to replace it, or choose another {{out}}", "out", switches=("force",)
    )


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
            raise already_exists(dest)
        if not target.is_file() or replaceable is None or not replaceable(target):
            raise DestinationError(
                f"{dest} exists and was not written by surgery; {{force}} replaces only "
                "surgery's own outputs: remove it yourself or choose another {out}",
                "out",
                switches=("force",),
            )
    return target
