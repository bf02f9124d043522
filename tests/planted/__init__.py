"""A planted binding circuit: a synthetic task, a tiny model trained on it, and brute-force truth.

The independent reference that surgery's binding analysis (heads, attention, causal) is checked
against: none of that code is used here. From surgery this package takes only the prompt text
(``surgery.core.mcq``, so that both sides read the same prompts) and, for whole-head α, the
run-time o_proj hook (``surgery.model.hooks.applied``, itself checked against the bake).
"""
