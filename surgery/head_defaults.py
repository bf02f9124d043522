"""find-heads' defaults, in a module without torch: the CLI shows them in --help at start-up, and
head_findings.FindParams uses the same values (one source of truth)."""

from __future__ import annotations

# How many heads are selected, knocked out together and reported as the finding (the paper found
# 2–3 binding heads per model).
DEFAULT_KNOCKOUT_HEADS = 3
# How many of discovery's top heads are knocked out one at a time to confirm the selection: the
# paper keeps the top 10 |coef| heads per fold, so these are the heads discovery itself considers.
DEFAULT_CONFIRM = 10
# Random head sets of the selection's size: the knockout baseline.
DEFAULT_RANDOM_SETS = 20
# Pairs per forward pass.
DEFAULT_BATCH_SIZE = 8
