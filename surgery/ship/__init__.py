"""Shipping results: an evaluation onto a model card, Hub push, report and its figures."""
