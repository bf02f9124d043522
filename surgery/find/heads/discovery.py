"""Head discovery (docs/methods/binding-heads.md): L1 logistic regression on per-head binding features.

Rows are prompts (match y = 1, mismatch y = 0), columns the flattened layers × heads grid of
bind features. Standardised, then ``LogisticRegression(penalty="l1", solver="liblinear")``; C is
chosen by an inner GroupKFold AUC, the outer GroupKFold (grouped by item, so no item is in both a
training and a test fold) gives the CV AUC. Heads are ranked by stability (share of outer folds
in whose top-k |coef| they appear) and then by |coef| of a final fit on all rows.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...core.counted import counted
from ...core.errors import SurgeryError

C_GRID = (0.001, 0.01, 0.1, 1.0, 10.0)


def _model(c: float):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    # liblinear is deterministic for a fixed random_state; l1 keeps few heads.
    clf = LogisticRegression(penalty="l1", solver="liblinear", C=c, random_state=0)
    return make_pipeline(StandardScaler(), clf)


def _fit(x: np.ndarray, y: np.ndarray, c: float):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn ≥ 1.8 deprecates 'penalty' in favour of l1_ratio
        return _model(c).fit(x, y)


def _auc(model, x: np.ndarray, y: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    if len(set(y)) < 2:
        return float("nan")
    return float(roc_auc_score(y, model.decision_function(x)))


def choose_c(x: np.ndarray, y: np.ndarray, groups: np.ndarray, folds: int, grid: Sequence[float]) -> float:
    """The C of ``grid`` with the best mean GroupKFold AUC (ties: the smaller, sparser C)."""
    from sklearn.model_selection import GroupKFold

    k = min(folds, len(set(groups)))
    if k < 2:
        return float(grid[len(grid) // 2])
    best, best_auc = grid[0], -np.inf
    for c in grid:
        aucs = [_auc(_fit(x[tr], y[tr], c), x[te], y[te]) for tr, te in GroupKFold(n_splits=k).split(x, y, groups)]
        mean = np.nanmean(aucs) if not all(np.isnan(aucs)) else -np.inf
        if mean > best_auc:
            best, best_auc = c, mean
    return float(best)


def _coefs(model) -> np.ndarray:
    return model[-1].coef_[0]


def discover(
    features: np.ndarray,
    y: np.ndarray,
    groups: Sequence[str],
    *,
    folds: int = 5,
    inner_folds: int = 3,
    grid: Sequence[float] = C_GRID,
    top: int = 10,
    layers: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Cross-validated L1 discovery on ``features`` (rows, layers, heads); see the module docstring.
    ``layers``: the model layer of each feature layer (a hybrid model's attention layers; default 0…n−1)."""
    from sklearn.model_selection import GroupKFold

    rows, n_layers, n_heads = features.shape
    layer_of = list(range(n_layers)) if layers is None else list(layers)
    x = features.reshape(rows, n_layers * n_heads).astype(np.float64)
    y = np.asarray(y)
    groups = np.asarray(groups)
    n_groups = len(set(groups.tolist()))
    if n_groups < 2 or len(set(y.tolist())) < 2:
        raise SurgeryError(
            f"discovery needs match and mismatch prompts of ≥ 2 items, got "
            f"{counted(n_groups, 'item')}; use more pairs (--max-pairs)"
        )
    k = min(folds, n_groups)
    top = min(top, x.shape[1])
    fold_aucs, fold_cs, counts, fold_coefs = [], [], np.zeros(x.shape[1]), []
    for tr, te in GroupKFold(n_splits=k).split(x, y, groups):
        c = choose_c(x[tr], y[tr], groups[tr], inner_folds, grid)
        model = _fit(x[tr], y[tr], c)
        fold_aucs.append(_auc(model, x[te], y[te]))
        fold_cs.append(c)
        coef = _coefs(model)
        fold_coefs.append(coef)
        chosen = np.argsort(-np.abs(coef), kind="stable")[:top]
        counts[chosen[np.abs(coef[chosen]) > 0]] += 1
    final_c = choose_c(x, y, groups, inner_folds, grid)
    coef = _coefs(_fit(x, y, final_c))
    stability = counts / k
    # Standardised mean difference (match − mismatch) per head: orders the heads that L1 zeroed.
    sd = np.sqrt((x[y == 1].var(0) + x[y == 0].var(0)) / 2)
    d = np.divide(x[y == 1].mean(0) - x[y == 0].mean(0), sd, out=np.zeros(x.shape[1]), where=sd > 0)
    order = sorted(range(x.shape[1]), key=lambda i: (-stability[i], -abs(coef[i]), -abs(d[i]), i))
    ranked = [
        {
            "layer": layer_of[i // n_heads],
            "head": i % n_heads,
            "coef": float(coef[i]),
            "mean_fold_coef": float(np.mean([fc[i] for fc in fold_coefs])),
            "stability": float(stability[i]),
            "effect_size": float(d[i]),
        }
        for i in order
    ]
    return {
        "auc": float(np.nanmean(fold_aucs)),
        "fold_aucs": [float(a) for a in fold_aucs],
        "fold_C": fold_cs,
        "final_C": final_c,
        "folds": k,
        "top_k": top,
        "heads": ranked,
        # "stable": in the top-k of most (more than half of the) outer folds, as in the paper.
        "stable_heads": [[h["layer"], h["head"]] for h in ranked if h["stability"] > 0.5],
        "coef_grid": coef.reshape(n_layers, n_heads).tolist(),
        # the model layer of each coef_grid row, where they are not 0…n−1 (a hybrid model's attention layers)
        **({"coef_grid_layers": layer_of} if layer_of != list(range(n_layers)) else {}),
    }


def rank_heads(result: dict[str, Any]) -> list[tuple[int, int]]:
    """(layer, head) in discovery order: stability, then |coef|."""
    return [(h["layer"], h["head"]) for h in result["heads"]]
