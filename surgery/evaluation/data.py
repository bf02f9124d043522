"""Evaluation inputs and outputs: shipped and external data sets, limits, result JSON, card rows.

Shipped data (surgery/data/, written for this project): ``retention_passages.jsonl`` (original
passages for perplexity), ``mcq_general.jsonl`` (four-option general-knowledge questions) and
``retention_prompts.jsonl`` (neutral prompts for KL, in English and Spanish: ``language``). External
data is read at run time from the paths the user gives: BBQ-format JSONL files (or a folder of
them) and an N4-format JSONL file.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import SurgeryError
from ..core.evaluation_table import Evaluation, EvaluationRow
from ..core.staging import atomic_write_text
from ..core.strict_files import DuplicateKey, load_json

DATA = Path(__file__).resolve().parents[1] / "data"  # surgery/data: the shipped sets
RESULT_FORMAT = "surgery-eval"
RESULT_VERSION = 1
# Defaults for external data sets when --limit is not given (their full size takes long on CPU).
EXTERNAL_DEFAULT_LIMIT = 100

# key: (label, better, retention). "retention" metrics are also reported as % of the source.
METRICS: dict[str, tuple[str, str, bool]] = {
    "perplexity": ("Perplexity, shipped passages", "lower", True),
    "mcq_accuracy": ("General-knowledge MCQ accuracy", "higher", True),
    "kl_mean": ("KL(source ‖ model), neutral prompts", "lower", False),
    "first_token_kl_mean": ("First-token KL(source ‖ model), neutral prompts, mean", "lower", False),
    "first_token_kl_p95": ("First-token KL, neutral prompts, 95th percentile", "lower", False),
    "first_token_kl_p99": ("First-token KL, neutral prompts, 99th percentile", "lower", False),
    "top1_agreement": ("Top-1 agreement with source", "higher", False),
    "bbq_acc_ambig": ("BBQ accuracy, ambiguous", "higher", False),
    "bbq_acc_disambig": ("BBQ accuracy, disambiguated", "higher", False),
    "bbq_bias_ambig": ("BBQ bias score, ambiguous", "zero", False),
    "bbq_bias_disambig": ("BBQ bias score, disambiguated", "zero", False),
    "diffaware": ("DiffAware (N4 ≠)", "higher", False),
    "ctxtaware": ("CtxtAware (N4 =)", "higher", False),
    "marker_rate": ("Answers with a marker, your prompts", "lower", False),
}


def metric_info(key: str) -> tuple[str, str, bool]:
    """Label, direction and retention flag; lm-eval metrics are retention metrics."""
    if key in METRICS:
        return METRICS[key]
    if key.startswith("lm_eval/"):
        _, task, name = key.split("/", 2)
        lower = name in ("word_perplexity", "byte_perplexity", "bits_per_byte", "perplexity")
        return f"lm-eval {task} {name}", "lower" if lower else "higher", True
    return key, "higher", False


def read_jsonl(path: Path, what: str) -> list[dict[str, Any]]:
    """Records of a JSONL file; a clear error names the file and line that is wrong."""
    path = Path(path)
    if not path.is_file():
        raise SurgeryError(f"{what} file {path} does not exist")
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
    records = read_jsonl(path, "N4")
    return [r for split in ("diff", "equal") for r in subsample([r for r in records if r.get("split") == split], n)]


def clean(value: Any) -> Any:
    """NaN → null (JSON has no NaN), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def new_result(
    model: Mapping[str, Any], against: Mapping[str, Any] | None, settings: Mapping[str, Any]
) -> dict[str, Any]:
    from .. import __version__

    return {
        "format": RESULT_FORMAT,
        "version": RESULT_VERSION,
        "tool_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": dict(model),
        "against": dict(against) if against else None,
        "settings": dict(settings),
        "metrics": {"model": {}, "against": {}},
        "retained_pct": {},
        "details": {"model": {}, "against": {}},
    }


def save_result(result: Mapping[str, Any], path: Path) -> None:
    atomic_write_text(Path(path), json.dumps(clean(result), indent=1, ensure_ascii=False) + "\n")


def load_result(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = load_json(path.read_text(encoding="utf-8"))
    except DuplicateKey as exc:
        raise SurgeryError(
            f"eval result {path}: {exc.what}; surgery writes each key once, so the file was "
            "edited: rerun `surgery eval … --out FILE`"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SurgeryError(
            f"cannot read the eval result {path} ({type(exc).__name__}); write it with `surgery eval … --out FILE`"
        ) from None
    if not isinstance(data, dict) or data.get("format") != RESULT_FORMAT:
        raise SurgeryError(f'{path} is not a surgery eval result (no "format": "{RESULT_FORMAT}")')
    if data.get("version") != RESULT_VERSION:
        raise SurgeryError(f"{path} has eval result version {data.get('version')!r}; rerun surgery eval")
    return data


def retained(key: str, before: float | None, after: float | None) -> float | None:
    """``after`` as % of ``before`` (inverted for lower-is-better metrics); None when undefined."""
    _, better, is_retention = metric_info(key)
    if not is_retention or before is None or after is None:
        return None
    if not (math.isfinite(before) and math.isfinite(after)) or before == 0 or after == 0:
        return None
    return 100.0 * (before / after if better == "lower" else after / before)


def card_summary(result: Mapping[str, Any]) -> Evaluation:
    """The rows of a model card's before/after table (rendered by surgery/bake/card.py)."""
    model, against = result["metrics"]["model"], result["metrics"].get("against") or {}
    rows = []
    for key, after in model.items():
        label, _, _ = metric_info(key)
        rows.append(
            EvaluationRow(
                metric=key,
                label=label,
                before=against.get(key),
                after=after,
                retained_pct=(result.get("retained_pct") or {}).get(key),
            )
        )
    settings = result.get("settings") or {}
    note = (
        f"Measured with `surgery eval` on {result.get('created', '?')[:10]}; limit per data set: "
        f'{settings.get("limit") or "none (shipped sets in full)"}. "Retained" is the edited '
        "model's score as % of the source's (perplexity inverted, so 100% = unchanged)."
    )
    return Evaluation(rows=rows, note=note, settings=dict(settings))
