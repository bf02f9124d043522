"""The `surgery` command: the click group, options generated from typed parameters, console output, one module per command family."""

from .main import main

__all__ = ["main"]
