"""Errors that the CLI turns into one line: ``Error: <what is wrong>; <what to do>``."""

from __future__ import annotations


class SurgeryError(Exception):
    """Base class: its message is shown to the user as is, so it says what to do."""


class CheckpointError(SurgeryError):
    """The checkpoint on disk cannot be read, is unsafe, or is not what we need."""


class UnsupportedArchitecture(SurgeryError):
    """The model_type has no row in the architecture table."""


class OptionError(SurgeryError):
    """A parameter (a command-line option) is outside its bounds or not one of its choices."""


class RecipeError(SurgeryError):
    """A recipe or an edit does not fit the model it is applied to."""


class FindingsError(SurgeryError):
    """A findings file is malformed or belongs to another model."""


class DestinationError(SurgeryError):
    """The output location is unsafe or already taken."""


class VerificationError(SurgeryError):
    """A baked checkpoint does not match its source and recipe."""


class EvaluationError(SurgeryError):
    """An evaluation result is used for a model it did not measure."""


class ParameterError(SurgeryError):
    """A parameter's value is wrong. The message names each parameter as a ``{name}`` placeholder:
    Python callers read the parameter's name, the command line its flag (``{n}`` → ``--n``)."""

    def __init__(self, template: str, *names: str) -> None:
        self.template, self.names = template, names
        super().__init__(self.spelled(lambda name: name))

    def spelled(self, spell) -> str:
        """The message with every parameter written by ``spell(name)``."""
        return self.template.format(**{name: spell(name) for name in self.names})
