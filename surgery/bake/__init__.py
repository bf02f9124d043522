"""Writing edits into checkpoints: provenance, byte patches, bake, undo, verify."""
