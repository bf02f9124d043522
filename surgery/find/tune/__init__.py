"""surgery tune: a multi-objective search over an edit's parameters, confirmed on held-out prompts."""
