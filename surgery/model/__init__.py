"""Loading models for computation (one LoadSpec), run-time twins of the edits (hooks), GGUF import."""
