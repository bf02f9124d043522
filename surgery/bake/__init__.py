"""Writing edits into checkpoints (and into an exact LoRA adapter): provenance, byte patches, bake, undo, verify."""
