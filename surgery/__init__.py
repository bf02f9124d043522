"""surgery: find the heads and neurons behind a behaviour, bake the edit into a checkpoint."""

__version__ = "0.1.0"
