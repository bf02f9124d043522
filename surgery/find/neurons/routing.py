"""Expert-level findings of a mixture of experts: how routing differs between the sides of the pairs.

Per category, layer and expert (of the layers that route) the capture measured the mean routing
share (fraction of a prompt's tokens whose top-k includes the expert) of the stereotyped side minus
the other side's. An expert that one side reaches more often is bias at the routing level, before
any neuron is looked at.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .scores import DIGITS, NeuronScores

TOP_EXPERTS = 5


def _r(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def expert_report(scores: NeuronScores, top: int = TOP_EXPERTS) -> dict[str, Any]:
    """Neurons left unscored (their expert reached by no pair), and per category the experts whose
    routing share differs most between the sides (signed: stereotyped − other; abs: mean |Δ|)."""
    count, width, shared = scores.experts
    routing = {}
    for c in scores.categories:
        signed, absolute = scores.routing[c]["signed"].ravel(), scores.routing[c]["abs"].ravel()
        routed = np.flatnonzero(np.isfinite(signed))  # a dense layer routes nothing (NaN)
        order = routed[np.argsort(-np.abs(signed[routed]), kind="stable")][:top]
        routing[c] = [
            {"layer": int(i) // count, "expert": int(i) % count, "signed": _r(signed[i]), "abs": _r(absolute[i])}
            for i in order
        ]
    report = {
        "experts": count,
        "expert_width": width,
        "shared_width": shared,
        "unscored_neurons": scores.unscored(),
        "routing": routing,
    }
    if scores.dense_layers:
        report.update(dense_layers=list(scores.dense_layers), dense_width=scores.dense_width)
    return report
