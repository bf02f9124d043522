"""Cultural binding heads: benchmark, pairs, prompts, attention features and edge edits, S/K scores, discovery, causal tests, findings."""
