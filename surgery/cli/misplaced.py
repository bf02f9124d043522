"""A required option's value given as a positional argument (``surgery apply R.yaml MODEL``).

click checks required options before extra arguments, so that line said "Missing option '--model'"
while the model was right there. Every command of the group is a :class:`Command`, which says
instead where the extra argument goes, as the line to write.
"""

from __future__ import annotations

import shlex

import click


def _placeholder(option: click.Option) -> str:
    """What a still-missing option's value is called on the suggested line: its metavar, else its
    flag's name (``--out`` → OUT)."""
    return option.metavar or option.opts[0].lstrip("-").upper().replace("-", "_")


def _suggestion(command: click.Command, ctx: click.Context, given: list[str]) -> str | None:
    """The one-line fix when ``given`` holds extra positional arguments and required options are
    missing: the extras become those options' values in order. None when nothing to pair, or more
    extras than missing options (click's own message is then right)."""
    # a second parse of the same line: the first stopped at the missing option, before the extras
    opts, extras, _ = command.make_parser(ctx).parse_args(args=list(given))
    missing = [
        p
        for p in command.get_params(ctx)
        if isinstance(p, click.Option) and p.required and p.name not in opts and p.resolve_envvar_value(ctx) is None
    ]
    if not extras or len(extras) > len(missing):
        return None
    paired = list(zip(missing, extras))
    words = [shlex.quote(word) for word in given]
    place = len(given)
    for option, value in reversed(paired):  # from the end, so the earlier places do not move
        place = max(i for i in range(place) if given[i] == value)
        words[place : place + 1] = [option.opts[0], shlex.quote(value)]
    words += [f"{option.opts[0]} {_placeholder(option)}" for option in missing[len(paired) :]]
    values = " and ".join(shlex.quote(value) for _, value in paired)
    flags = " and ".join(option.opts[0] for option, _ in paired)
    verb = "goes" if len(paired) == 1 else "go"
    return f"{values} {verb} after {flags}: {ctx.command_path} {' '.join(words)}"


class Command(click.Command):
    """A click command that names a required option's value given positionally (see the module)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # click's parser consumes the list it is given
        try:
            return super().parse_args(ctx, args)
        except click.MissingParameter as exc:
            if not isinstance(exc.param, click.Option):
                raise
            suggestion = _suggestion(self, ctx, given)
            if suggestion is None:
                raise
            raise click.UsageError(suggestion, ctx) from None
