"""An eval result file (``surgery eval --out``): its format, the labels of its metrics, what it
records about each model it measured, and the rows a model card's before/after table takes from it.

The evaluation writes it; the card (surgery/ship/card.py), the report (surgery/ship/report.py) and
the library's records read it. It lives below them all, so that reading a result never imports the
evaluation that made it.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .checkpoint import Checkpoint
from .container import open_container
from .errors import SurgeryError
from .evaluation_table import Evaluation, EvaluationRow
from .finite_json import dumps, finite
from .staging import atomic_write_text
from .strict_files import DuplicateKey, load_json

RESULT_FORMAT = "surgery-eval"
RESULT_VERSION = 1

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


def clean(value: Any) -> Any:
    """NaN → null (JSON has no NaN), recursively (surgery.core.finite_json)."""
    return finite(value)


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
    atomic_write_text(Path(path), dumps(result, indent=1, ensure_ascii=False) + "\n")


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


def measured(path: Path, fingerprint: str | None = None) -> dict[str, Any]:
    """What a result records about a model it measured: its path and fingerprint (computed when not
    given) and, for a bake, the sha256 of its weight files (null for any other model; surgery card
    checks them: see surgery.ship.card.check_evaluated); the bake's container reads them from its record."""
    return {
        "path": str(path),
        "fingerprint": fingerprint or Checkpoint(path, allow_remote_code=True).fingerprint(),
        "weights_sha256": open_container(path).recorded_weights(),
    }
