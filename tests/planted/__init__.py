"""A planted binding circuit: a synthetic task, a tiny model trained on it, and brute-force truth.

Nothing here uses surgery's analysis code (heads, attention, causal): this package is the
independent reference that those modules are checked against.
"""
