"""Evaluation inputs: shipped and external data sets, limits (the result file an evaluation writes:
surgery/core/evaluation_result.py).

Shipped data (surgery/data/, written for this project): ``retention_passages.jsonl`` (original
passages for perplexity), ``mcq_general.jsonl`` (four-option general-knowledge questions) and
``retention_prompts.jsonl`` (neutral prompts for KL, in English and Spanish: ``language``). External
data is read at run time from the paths the user gives: BBQ-format JSONL files (or a folder of
them) and an N4-format JSONL file.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import SurgeryError, not_a_file
from ..core.strict_files import DuplicateKey, load_json

DATA = Path(__file__).resolve().parents[1] / "data"  # surgery/data: the shipped sets
# Defaults for external data sets when --limit is not given (their full size takes long on CPU).
EXTERNAL_DEFAULT_LIMIT = 100


def read_jsonl(path: Path, what: str) -> list[dict[str, Any]]:
    """Records of a JSONL file; a clear error names the file and line that is wrong."""
    path = Path(path).expanduser()  # ~ as a shell would: a Python caller's string is not expanded
    if not path.is_file():
        raise SurgeryError(f"{what} file {path} {not_a_file(path)}")
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(load_json(line))
                except DuplicateKey as exc:
                    raise SurgeryError(f"{path}:{n}: {exc.key!r} is given twice in one record; keep one") from None
                except json.JSONDecodeError:
                    raise SurgeryError(
                        f"{path}:{n} is not valid JSON; {what} files hold one JSON object per line"
                    ) from None
    return out


def subsample(records: Sequence[Any], limit: int | None, seed: int = 0) -> list[Any]:
    """At most ``limit`` records: a fixed random subset in the original order (same every run)."""
    if limit is None or limit >= len(records):
        return list(records)
    keep = sorted(random.Random(seed).sample(range(len(records)), limit))
    return [records[i] for i in keep]


def shipped(name: str) -> list[dict[str, Any]]:
    return read_jsonl(DATA / name, "shipped data")


def retention_data(limit: int | None) -> dict[str, list[dict[str, Any]]]:
    return {
        "passages": subsample(shipped("retention_passages.jsonl"), limit),
        "mcq": subsample(shipped("mcq_general.jsonl"), limit),
        "prompts": subsample(shipped("retention_prompts.jsonl"), limit),
    }


def bbq_files(paths: Iterable[Path]) -> list[Path]:
    """BBQ JSONL files from files and folders (a folder contributes its *.jsonl)."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.jsonl"))
            if not found:
                raise SurgeryError(f"--bbq folder {p} has no *.jsonl files")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise SurgeryError(f"--bbq {p} does not exist; give BBQ-format JSONL files or a folder of them")
    return files


def bbq_data(paths: Iterable[Path], limit: int | None) -> list[dict[str, Any]]:
    """Up to ``limit`` items of each BBQ file (default ``EXTERNAL_DEFAULT_LIMIT``), half of them
    from ambiguous and half from disambiguated contexts, so both scores are always measured."""
    n = EXTERNAL_DEFAULT_LIMIT if limit is None else limit
    out = []
    for f in bbq_files(paths):
        items = read_jsonl(f, "BBQ")
        ambig = [it for it in items if it.get("context_condition") == "ambig"]
        rest = [it for it in items if it.get("context_condition") != "ambig"]
        out += subsample(ambig, (n + 1) // 2) + subsample(rest, n // 2)
    return out


def n4_data(path: Path, limit: int | None) -> list[dict[str, Any]]:
    """Up to ``limit`` questions of each N4 split ("diff", "equal")."""
    n = EXTERNAL_DEFAULT_LIMIT if limit is None else limit
    from .awareness import check_records

    # checked before the splits are taken: another file's items (no split) left none, and "—" without a word
    records = check_records(read_jsonl(path, "N4"))
    return [r for split in ("diff", "equal") for r in subsample([r for r in records if r["split"] == split], n)]
