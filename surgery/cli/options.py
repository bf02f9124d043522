"""Click options generated from typed parameter objects (see surgery.core.options).

``@typed_options(FindParams, into="params")`` adds one option per option field of FindParams, with
the field's default, bounds and help, and calls the command with ``params=FindParams(...)`` instead
of one keyword per option.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from ..api.params import RUN_FIELDS, LoadSpec
from ..core.options import CliOption, cli_fields


def _click_type(field: dataclasses.Field, spec: CliOption) -> Any:
    if spec.choices is not None:
        return click.Choice(list(spec.choices))
    kind = spec.kind or type(field.default).__name__
    bounded = spec.minimum is not None or spec.maximum is not None
    if kind == "int":
        return click.IntRange(spec.minimum, spec.maximum, max_open=spec.max_open) if bounded else int
    if kind == "float":
        return click.FloatRange(spec.minimum, spec.maximum, max_open=spec.max_open) if bounded else float
    return str


def _shown_default(field: dataclasses.Field, spec: CliOption) -> Any:
    """The default as the user types it (the choice's name when choices map to values)."""
    if isinstance(spec.choices, Mapping):
        return next(name for name, value in spec.choices.items() if value == field.default)
    return field.default


def _option(field: dataclasses.Field, spec: CliOption, help: str | None = None) -> Callable:
    """The click option of ``field``; ``help``: this command's own words for it (default: the field's)."""
    flag = spec.flag or "--" + field.name.replace("_", "-")
    help = help or spec.help
    if spec.is_flag:
        return click.option(flag, field.name, is_flag=True, default=bool(field.default), help=help)
    shown = _shown_default(field, spec)
    return click.option(
        flag,
        field.name,
        type=_click_type(field, spec),
        default=shown,
        multiple=spec.multiple,
        show_default=shown not in (None, ()),
        metavar=spec.metavar,
        help=help,
    )


def given(name: str) -> bool:
    """Whether the running command's option ``name`` was given (on the command line or by its
    environment variable), not left at its default."""
    ctx = click.get_current_context()
    return ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)


def _value(spec: CliOption, raw: Any) -> Any:
    if isinstance(spec.choices, Mapping):
        return spec.choices[raw]
    return tuple(raw) if spec.multiple else raw


def typed_options(
    cls: type,
    *,
    into: str,
    only: Sequence[str] | None = None,
    skip: Sequence[str] = (),
    optional: bool = False,
    helps: Mapping[str, str] | None = None,
) -> Callable[[Callable], Callable]:
    """Add the options of ``cls``'s fields (``only`` / ``skip`` choose); the command gets ``into=cls(…)``,
    or with ``optional`` None when none of them was given (the library then applies its rule for
    options not chosen, e.g. amplify-heads' newest cached findings). ``helps``: a field's help in this
    command's words (verify's --revision is SOURCE's)."""
    specs = cli_fields(cls, only, skip)

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            raw = {field.name: kwargs.pop(field.name) for field, spec in specs}
            if optional and not any(given(name) for name in raw):
                return f(*args, **{into: None}, **kwargs)
            values = {field.name: _value(spec, raw[field.name]) for field, spec in specs}
            return f(*args, **{into: cls(**values)}, **kwargs)

        for field, spec in reversed(specs):
            command = _option(field, spec, (helps or {}).get(field.name))(command)
        return command

    return decorate


RECOMPUTE = click.option("--recompute", is_flag=True, help="Ignore cached findings and compute them again.")


def findings_options(kind: str) -> Callable[[Callable], Callable]:
    """--findings, --transfer and --recompute of a command that bakes from ``kind`` findings (a
    finder family, surgery.find.finders), handed to the command as one ``source: FindingsSource``."""
    from ..api.params import finder

    family = finder(kind)

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def command(*args: Any, findings_file: Path | None, transfer: bool, recompute: bool, **kwargs: Any) -> Any:
            from ..api.findings_source import FindingsSource

            source = FindingsSource(findings=findings_file, transfer=transfer, recompute=recompute)
            return f(*args, source=source, **kwargs)

        command = RECOMPUTE(command)
        command = click.option(
            "--transfer",
            is_flag=True,
            help="Accept --findings from another checkpoint of the same architecture (instruct → base).",
        )(command)
        return click.option(
            "--findings",
            "findings_file",
            type=click.Path(path_type=Path),
            default=None,
            help=f"A {kind} findings file (default: the cached findings of the {family.find_command} options "
            "given here, if any, else the newest cached findings for MODEL; computed if there are none).",
        )(command)

    return decorate


# --push-to / --private are read through the click context, so commands decorated with
# bake_options need no extra parameters for them.
PUSH_KEY = "surgery.push_to"
REQUANTIZE_KEY = "surgery.requantize"
PRIVATE_KEY = "surgery.private"


def _remember(key: str):
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        ctx.meta[key] = value
        return value

    return callback


def context_value(key: str) -> Any:
    """An option value remembered in the running command's click context (None outside a command)."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(key) if ctx is not None else None


def load_options(f: Callable | None = None, *, runs_model: bool = True, revision: str | None = None) -> Callable:
    """--revision, --trust-remote-code and (for commands that run a model) --device, --dtype,
    --device-map, --max-memory and --offload-folder, handed to the command as one ``load: LoadSpec``
    so that every model load of the command gets all of them. ``revision``: --revision's help where
    the command reads two models (whose revision it is)."""
    helps = {"revision": revision} if revision else None
    decorate = typed_options(LoadSpec, into="load", skip=() if runs_model else RUN_FIELDS, helps=helps)
    return decorate(f) if f is not None else decorate


def model_argument(f: Callable | None = None, *, runs_model: bool = True, revision: str | None = None) -> Callable:
    """MODEL (local folder or Hub id) plus the load options (see :func:`load_options`)."""

    def decorate(f: Callable) -> Callable:
        return click.argument("model")(load_options(f, runs_model=runs_model, revision=revision))

    return decorate(f) if f is not None else decorate


def push_options(f: Callable) -> Callable:
    """--push-to and --private; the baking commands read them from the click context (cli.baking.bake_settings)."""
    f = click.option(
        "--private",
        is_flag=True,
        expose_value=False,
        callback=_remember(PRIVATE_KEY),
        help="With --push-to: create the Hub repo as private.",
    )(f)
    return click.option(
        "--push-to",
        metavar="NAMESPACE/NAME",
        default=None,
        expose_value=False,
        callback=_remember(PUSH_KEY),
        help="After the bake, push the checkpoint to this Hub repo (sweeps: one branch per value).",
    )(f)


def requantize_option(f: Callable) -> Callable:
    """--requantize, remembered in the click context (surgery.cli.baking.bake_settings reads it)."""
    return click.option(
        "--requantize",
        is_flag=True,
        expose_value=False,
        callback=_remember(REQUANTIZE_KEY),
        help="GGUF MODEL: requantize blocks an edit cannot change exactly (Q4_0/1, Q5_0/1, Q8_0, MXFP4), "
        "recording the error; without it such an edit is refused.",
    )(f)


def bake_options(f: Callable) -> Callable:
    """--out, --force, --no-verify, --json, --requantize, --push-to, --private."""
    f = requantize_option(push_options(f))
    f = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(f)
    f = click.option(
        "--verify/--no-verify",
        default=True,
        show_default=True,
        help="Before publishing, run the source once in transformers (where its weights fit in memory; "
        "remembered per source) and check each edited weight map against the run-time edit.",
    )(f)
    f = click.option("--force", is_flag=True, help="Replace --out if it exists.")(f)
    return click.option(
        "--out",
        "out_dir",
        required=True,
        type=click.Path(path_type=Path),
        help="Output checkpoint folder, or a .gguf file when MODEL is a GGUF file (written "
        "atomically); a sweep writes OUT/<label> per value (OUT/<label>.gguf from a GGUF).",
    )(f)


def baking_command(f: Callable) -> Callable:
    """Decorate a command that ends in a bake with MODEL and the bake options."""
    return model_argument(bake_options(functools.wraps(f)(f)))


def flag_of(name: str) -> str:
    """The command-line flag of a library parameter: a typed option's own spelling (``rule`` →
    ``--select``), else ``--`` and the name with dashes (``allow_zero`` → ``--allow-zero``)."""
    from ..api.params import option_types

    for cls in option_types():
        for field, spec in cli_fields(cls):
            if field.name == name and spec.flag:
                return spec.flag
    return "--" + name.replace("_", "-")
