"""The foundations both pipelines share: the architecture table, edits and their sites, checkpoints on disk, staging, errors, typed options, progress."""
