"""Evaluation suites: retention, KL, BBQ, DiffAware/CtxtAware, lm-eval; result files."""
