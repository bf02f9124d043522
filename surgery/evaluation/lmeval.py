"""Optional adapter to EleutherAI's lm-evaluation-harness (the ``lmeval`` extra of llm-surgery).

With network access it runs the standard retention benchmarks (mmlu, arc_challenge, hellaswag,
wikitext) on the already-loaded model; without the package, a clear message says what to install.
``include_path`` adds a folder of task YAML files (for local or custom tasks).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.counted import in_number
from ..core.errors import SurgeryError
from ..core.optional import require

# Result fields of lm-eval that are counts, not scores.
BOOKKEEPING = ("sample_len", "sample_count", "alias")


def run_lm_eval(
    model,
    tokenizer,
    tasks: Sequence[str],
    *,
    limit: int | None = None,
    batch_size: int = 8,
    include_path: str | Path | None = None,
) -> dict[str, Any]:
    """Run lm-eval ``tasks`` on ``model``; return flat metrics ``lm_eval/<task>/<metric>`` and raw results."""
    lm_eval = require("lm_eval")
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(include_path)) if include_path else TaskManager()
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise SurgeryError(
            f"lm-eval does not know the {in_number(len(unknown), 'task')} {', '.join(unknown)}; list them with "
            "`lm-eval ls tasks` (or give --lm-eval-include for a folder of task YAML files)"
        )
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    out = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), limit=limit, task_manager=manager, log_samples=False)
    metrics: dict[str, float] = {}
    for task, values in (out or {}).get("results", {}).items():
        for name, value in values.items():
            metric = name.split(",")[0]
            if metric in BOOKKEEPING or "stderr" in metric:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[f"lm_eval/{task}/{metric}"] = float(value)
    return {
        "metrics": metrics,
        "versions": (out or {}).get("versions", {}),
        "n_samples": {
            k: v.get("effective", v) if isinstance(v, dict) else v for k, v in (out or {}).get("n-samples", {}).items()
        },
    }
