"""Brute-force ground truth for the planted expert: each expert silenced, each expert neuron zeroed.

The metrics are bias_brute's (bias gap, absolute gap, capability margin on the task's pairs); an
expert neuron is zeroed with surgery's run-time hook (``NeuronScale(layer, neuron, 0, expert)``),
an expert is silenced by zeroing all its neurons in every layer. Nothing of surgery's scoring is used.
"""

from __future__ import annotations

from dataclasses import asdict

from tests.planted.bias_brute import BiasProbe, Metrics, effects
from tests.planted.bias_train import log_odds

Neuron = tuple[int, int, int]  # (layer, expert, neuron)


def measure(model, tokenizer, probe: BiasProbe, zeroed: list[Neuron]) -> Metrics:
    """The probe's metrics with the expert neurons ``zeroed`` silenced at run time."""
    from surgery.core.edits import NeuronScale
    from surgery.model.hooks import applied

    with applied(model, [NeuronScale(layer, i, 0.0, expert) for layer, expert, i in zeroed]):
        return probe.metrics_of(log_odds(model, tokenizer, probe.texts))


def expert_neurons(model, expert: int) -> list[Neuron]:
    """Every neuron of ``expert`` in every layer."""
    cfg = model.config
    return [(layer, expert, i) for layer in range(cfg.num_hidden_layers) for i in range(cfg.intermediate_size)]


def brute_force(model, tokenizer, probe: BiasProbe) -> dict:
    """The intact metrics, every expert silenced in every layer, and every expert neuron zeroed alone
    (largest bias effect first); effects in % of the intact model's, as ground_truth.json holds them."""
    cfg = model.config
    base = measure(model, tokenizer, probe, [])

    def effect_of(zeroed: list[Neuron]) -> dict[str, float]:
        bias, abs_bias, capability = effects(base, measure(model, tokenizer, probe, zeroed))
        return {"bias": bias, "abs_bias": abs_bias, "capability": capability}

    experts = [{"expert": e, **effect_of(expert_neurons(model, e))} for e in range(cfg.num_local_experts)]
    neurons = [
        {"layer": layer, "expert": e, "neuron": i, **effect_of([(layer, e, i)])}
        for layer in range(cfg.num_hidden_layers)
        for e in range(cfg.num_local_experts)
        for i in range(cfg.intermediate_size)
    ]
    return {
        "pairs": len(probe.pairs),
        "intact": asdict(base),
        "experts": experts,
        "neurons": sorted(neurons, key=lambda r: -r["bias"]),
    }
