"""Command-line flags derived from dataclass fields (after Vidur's ``config.py`` + ``flat_dataclass.py``).

A config dataclass declares each option once: its name, type, default and help text sit on
the field, ``field(default=..., metadata={"help": ...})``. :func:`add_arguments` turns the
fields into argparse flags (``max_num_seqs`` -> ``--max-num-seqs``) and
:func:`from_namespace` turns the parsed namespace back into the dataclass, so two commands
that share fields share their flags, defaults and help.

Field metadata:

* ``help``: the flag's help text (required for a field to become a flag).
* ``flag``: the flag when it is not ``--`` + the field name with dashes (``--tp``).
* ``parse``: converts the command-line string (e.g. :func:`traces.arguments.parse_list`);
  a ``ValueError`` becomes an argparse error that names the flag.
* ``action`` (``"append"``), ``metavar``, ``choices``, ``required``: passed to argparse.

A dataclass may group its flags in the help: a class attribute ``FLAG_GROUPS`` maps a title to
the field names listed under it (fields in no group stay with the parser's own options).

A ``bool`` field is a ``--flag/--no-flag`` pair. The argparse destination is the field name;
the help shows the default unless it is ``None`` or already mentions one.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Callable, Collection, TypeVar

T = TypeVar("T")

_SCALARS: dict[type, Callable[[str], Any]] = {int: int, float: float, str: str}


def flag_name(f: dataclasses.Field) -> str:
    """The command-line flag of a field: its ``flag`` metadata or ``--field-name``."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def field_default(f: dataclasses.Field) -> Any:
    """A field's default value (calling its ``default_factory``), or ``None`` when it has none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _value_type(annotation: Any) -> type | None:
    """``int`` for ``int`` or ``int | None``; ``None`` for anything that is not one scalar type."""
    if isinstance(annotation, type):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and isinstance(args[0], type):
            return args[0]
    return None


def _checked(parse: Callable[[str], Any], flag: str) -> Callable[[str], Any]:
    """``parse`` with its ``ValueError`` shown by argparse (after ``argument FLAG:``) as the
    message it carries."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            if parse in (int, float):
                kind = "an integer" if parse is int else "a number"
                raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{flag}: ")) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _flag_fields(cls: type, only: Collection[str] | None, exclude: Collection[str]) -> list[dataclasses.Field]:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = (set(only or ()) | set(exclude)) - names
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata
            and (only is None or f.name in only) and f.name not in exclude]


def add_arguments(parser: Any, cls: type, only: Collection[str] | None = None,
                  exclude: Collection[str] = (), unset_defaults: bool = False) -> None:
    """Add one flag per field of the dataclass ``cls`` that carries ``help`` metadata
    (restricted to ``only``, minus ``exclude``) to ``parser`` (a parser or an argument group).

    ``unset_defaults``: a flag not given leaves ``None`` in the namespace (the help still shows
    the field's default, which :func:`from_namespace` fills in), so a command can tell the
    flags given on the command line from the others (e.g. to let them override a scenario file)."""
    hints = typing.get_type_hints(cls)
    group_of = {name: title for title, names in getattr(cls, "FLAG_GROUPS", {}).items() for name in names}
    groups: dict[str, Any] = {}
    for f in _flag_fields(cls, only, exclude):
        md = f.metadata
        default = field_default(f)
        help_text = md["help"].replace("%", "%%")
        if default not in (None, False, [], ()) and "default" not in help_text:
            help_text += f" (default: {default})"
        kwargs: dict[str, Any] = {"dest": f.name, "help": help_text}
        for key in ("metavar", "choices", "required"):
            if key in md:
                kwargs[key] = md[key]
        value_type = _value_type(hints[f.name])
        if unset_defaults:
            default = None
        if value_type is bool and "parse" not in md:
            kwargs.update(action=argparse.BooleanOptionalAction, default=default)
        else:
            parse = md.get("parse") or _SCALARS.get(value_type)  # type: ignore[arg-type]
            if parse is None:
                raise TypeError(f"{cls.__name__}.{f.name}: give a 'parse' function for type {hints[f.name]}")
            kwargs.update(type=_checked(parse, flag_name(f)), default=default)
            if "action" in md:
                kwargs["action"] = md["action"]
        if kwargs.get("required"):
            kwargs.pop("default")
        title = group_of.get(f.name)
        if title is not None and isinstance(parser, argparse.ArgumentParser):
            if title not in groups:
                groups[title] = parser.add_argument_group(title)
            groups[title].add_argument(flag_name(f), **kwargs)
        else:
            parser.add_argument(flag_name(f), **kwargs)


def given_values(cls: type, namespace: argparse.Namespace, exclude: Collection[str] = ()) -> dict[str, Any]:
    """The fields of ``cls`` the namespace holds a value for (not ``None``: a flag left unset)."""
    return {f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls)
            if f.init and f.name not in exclude and getattr(namespace, f.name, None) is not None}


def from_namespace(cls: type[T], namespace: argparse.Namespace, exclude: Collection[str] = (),
                   **overrides: Any) -> T:
    """An instance of the dataclass ``cls`` from the parsed ``namespace``: each field takes the
    namespace's value of the same name when present and not ``None`` (and not in ``exclude``),
    else its default; ``overrides`` win over both."""
    values = given_values(cls, namespace, exclude)
    values.update(overrides)
    return cls(**values)
