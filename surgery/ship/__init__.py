"""Shipping results: LoRA export, model card, Hub push, report and its figures."""
