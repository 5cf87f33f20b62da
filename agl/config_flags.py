"""Command-line flags made from a config dataclass, so that a new config field is a new flag with no other change.

A program's parser gets one flag per scalar field of the config, nested dataclasses included, named by a prefix and
the field's path as the config spells it (``--rl.update.lr``, ``--rl.grpo.group_by``: dots between levels, the
field's own underscores kept, so a flag reads exactly like the attribute it sets and like the errors ``__post_init__``
raises). The flag's help is the field's entry in its class docstring, and its checks are the config's own
``__post_init__``: the program builds its base config (its own defaults) and :func:`apply_flags` replaces what the
user gave, turning a refused value into ``parser.error`` naming the flag.

Scalar fields are ``int``, ``float``, ``str``, ``bool`` (``--x`` / ``--no-x``), ``Literal[...]`` (choices) and any
of these ``| None`` (the value ``none`` gives None). Other fields (dicts, lists, unions such as ``str | Path``,
callables, optional dataclasses such as ``UpdateConfig.lora``) get no flag. A flag not given is absent from the
parsed namespace (``argparse.SUPPRESS``), so a given ``none`` and "not given" stay distinct. Stdlib only.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

T = TypeVar("T")

#: A docstring entry: ``name: text`` or ``a / b / c: text`` (the text may continue on more-indented lines).
_ENTRY = re.compile(r"^(\s*)([A-Za-z_]\w*(?:\s*/\s*[A-Za-z_]\w*)*):\s+(\S.*)$")


@dataclasses.dataclass(frozen=True)
class ConfigFlag:
    """One config field's flag: ``path`` in the config (``"update.lr"``), its ``options`` (the first is
    ``--<prefix>.<path>``, then the caller's aliases) and the namespace attribute it parses into (``dest``)."""

    path: str
    options: tuple[str, ...]
    dest: str

    @property
    def name(self) -> str:
        """How messages name the flag: every spelling, e.g. ``--rl.rounds/--rl-rounds``."""
        return "/".join(self.options)


def field_docs(cls: type) -> dict[str, str]:
    """Each field's entry in the class docstring (whitespace collapsed, ``double backquotes`` removed)."""
    docs: dict[str, str] = {}
    names: list[str] = []
    indent = -1
    for line in inspect.cleandoc(cls.__doc__ or "").splitlines():
        depth = len(line) - len(line.lstrip())
        match = _ENTRY.match(line)
        if match and (not names or depth <= indent):
            names, indent = [n.strip() for n in match[2].split("/")], depth
            shared = f"({' / '.join(names)}) " if len(names) > 1 else ""
            docs.update(dict.fromkeys(names, shared + match[3]))
        elif names and line.strip() and depth > indent:
            docs.update({n: f"{docs[n]} {line.strip()}" for n in names})
        else:
            names = []
    return {n: " ".join(text.replace("``", "").split()) for n, text in docs.items()}


def add_config_flags(
    parser: argparse._ActionsContainer,
    config_type: type,
    *,
    prefix: str,
    exclude: Iterable[str] = (),
    aliases: Mapping[str, Sequence[str]] | None = None,
    base: Any = None,
) -> dict[str, ConfigFlag]:
    """Add a flag to ``parser`` (or an argument group) for every scalar field of ``config_type`` and of its nested
    dataclasses; returns them by field path. ``exclude``: paths (a nested config's path excludes all of it) the
    program sets itself. ``aliases``: more option strings per path (flags a program had before). ``base``: the
    program's own defaults, shown in each help as ``[here: value]``."""
    skip, aliases = tuple(exclude), aliases or {}
    flags: dict[str, ConfigFlag] = {}

    def walk(cls: type, path: str, here: Any) -> None:
        hints, docs = typing.get_type_hints(cls), field_docs(cls)
        for f in dataclasses.fields(cls):
            full = f"{path}{f.name}"
            if any(full == e or full.startswith(f"{e}.") for e in skip):
                continue
            value = getattr(here, f.name, None) if here is not None else None
            kind, optional = _unwrap(hints[f.name])
            if isinstance(kind, type) and dataclasses.is_dataclass(kind) and not optional:
                walk(kind, f"{full}.", value)
                continue
            spec = _argument(kind, optional)
            if spec is None:
                continue
            text = docs.get(f.name, f"{cls.__name__}.{f.name}")
            if here is not None:
                text += f" [here: {value}]"
            flag = ConfigFlag(full, (f"--{prefix}.{full}", *aliases.get(full, ())), f"{prefix}.{full}")
            parser.add_argument(
                *flag.options, dest=flag.dest, default=argparse.SUPPRESS, help=text.replace("%", "%%"), **spec
            )
            flags[full] = flag

    walk(config_type, "", base)
    return flags


def given_values(args: argparse.Namespace, flags: Mapping[str, ConfigFlag]) -> dict[str, Any]:
    """The values of the flags given on the command line, by field path."""
    return {path: getattr(args, flag.dest) for path, flag in flags.items() if hasattr(args, flag.dest)}


def replace_fields(config: T, values: Mapping[str, Any]) -> T:
    """A copy of ``config`` with ``values`` (by field path) replaced, nested configs by ``dataclasses.replace`` so
    that every level's ``__post_init__`` checks the result; ``config`` itself is left as it was. A refused value
    raises the config's ``ValueError``."""
    own: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for path, value in values.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            own[head] = value
    for head, inner in nested.items():
        own[head] = replace_fields(getattr(config, head), inner)
    return dataclasses.replace(config, **own) if own else config  # type: ignore[type-var]


def apply_flags(
    parser: argparse.ArgumentParser, base: T, values: Mapping[str, Any], flags: Mapping[str, ConfigFlag]
) -> T:
    """``replace_fields(base, values)``, a refused value ending the program with ``parser.error`` naming the flag
    (the given flags whose field the config's message names, else every flag given)."""
    try:
        return replace_fields(base, values)
    except ValueError as err:
        message = str(err)
        named = [flags[p] for p in values if p in flags and re.search(rf"\b{p.rsplit('.', 1)[-1]}\b", message)]
        named = named or [flags[p] for p in values if p in flags]
        if len(named) == 1:  # the message's own "field:" prefix repeats the flag
            message = re.sub(rf"^[\w.]*\b{named[0].path.rsplit('.', 1)[-1]}: ", "", message)
        parser.error(f"argument {', '.join(f.name for f in named)}: {message}")


def config_from_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace, base: T, flags: Mapping[str, ConfigFlag]
) -> T:
    """``base`` with the flags given in ``args`` applied (:func:`apply_flags`)."""
    return apply_flags(parser, base, given_values(args, flags), flags)


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """``X | None`` → ``(X, True)``; any other type → ``(type, False)`` (other unions stay unions)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) == 1 and len(inner) < len(typing.get_args(hint)):
            return inner[0], True
    return hint, False


def _argument(kind: Any, optional: bool) -> dict[str, Any] | None:
    """``add_argument`` keywords of a scalar field's type; None for a type that gets no flag."""
    if kind is bool and not optional:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(kind) is Literal:
        choices = [*typing.get_args(kind), *([None] if optional else [])]
        return {"type": _parser(str, optional), "choices": choices, "metavar": "{" + ",".join(map(str, choices)) + "}"}
    if kind in (int, float, str):
        return {"type": _parser(kind, optional), "metavar": kind.__name__.upper() + ("|none" if optional else "")}
    return None


def _parser(kind: type, optional: bool) -> Any:
    """Parse a flag's text as ``kind``; with ``optional``, ``none`` is None."""
    if not optional:
        return kind

    def parse(text: str) -> Any:
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = kind.__name__  # argparse's "invalid int value" message
    return parse
