"""Command-line flags generated from config dataclasses, so a new config field reaches the CLI by itself.

Each field becomes `--field-name` with its type (int / float / str; `X | None` parses an X), its choices (a
`Literal`), its help (the field's docstring) and its default (shown in the help; the flag itself defaults to
"not given", so the dataclass's own default applies and is never restated here). Booleans get `--x / --no-x`.
Any subcommand can use it: `add_config_args(parser, (SDEConfig, "sde"))`, then `config_from_args(SDEConfig, args)`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from ..core.model_source import MODEL_FLAGS, ModelSource

__all__ = ["add_config_args", "add_model_source_args", "config_from_args", "field_docs", "flag_name", "given_config_fields",
           "given_fields", "model_source_from_args"]


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass `cls` (the string literal right after its annotation)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # inherited fields first, overridden ones win
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _kind(tp: Any) -> tuple[type, tuple[Any, ...] | None]:
    """(scalar type, choices or None) of a field annotation; `X | None` is X (None stays the config's default)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _kind(rest[0])
    if typing.get_origin(tp) is Literal:
        return type(args[0]), tuple(args)
    if tp in (bool, int, float, str):
        return tp, None
    raise TypeError(f"cannot make a command-line flag for a field of type {tp!r}; exclude it or add support here")


def _fmt(value: Any) -> str:
    return str(value).replace("%", "%%")


def add_config_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *configs: tuple[type, str],
                    exclude: Iterable[str] = (), negative_aliases: Mapping[str, str] | None = None,
                    aliases: Mapping[str, str] | None = None, flags: Mapping[str, str] | None = None,
                    required: Iterable[str] = (), helps: Mapping[str, str] | None = None,
                    metavars: Mapping[str, str] | None = None) -> None:
    """Add one flag per field of each `(config class, label)`; a field shared by several classes is one flag whose
    help names each class's label (e.g. 'sde: ...; remask: ...' when their docstrings differ).

    exclude: field names that get no flag (set by the caller instead). negative_aliases: extra spellings that set a
    boolean field to False (e.g. {'truncate_at_eos': '--no-truncate'}), kept for existing command lines. aliases:
    a second spelling of a field's flag (e.g. {'noise_seed': '--seed'}). flags: a field's flag when it is not its
    own name (e.g. {'path': '--model'}). required: fields whose flag must be given (no default shown). helps: a
    field's whole help text instead of its docstring and default. metavars: a field's value name in the help.
    Hand-written options can be added to the same parser before or after; they only must not reuse a field's flag.
    """
    skip, must = set(exclude), set(required)
    merged: dict[str, list[tuple[str, Any, str, Any]]] = {}  # field -> [(label, type, doc, default)]
    for cls, label in configs:
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            if f.name in skip or f.name.startswith("_"):
                continue
            if f.name not in docs:
                raise TypeError(f"{cls.__name__}.{f.name} has no docstring; the CLI help is made from it")
            default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            merged.setdefault(f.name, []).append((label, hints[f.name], docs[f.name], default))
    for name, entries in merged.items():
        kinds = {_kind(tp) for _, tp, _, _ in entries}
        if len(kinds) > 1:
            raise TypeError(f"field {name!r} has different types in {[lbl for lbl, *_ in entries]}: {kinds}")
        (scalar, choices), = kinds
        texts = list(dict.fromkeys(doc for _, _, doc, _ in entries))
        defaults = list(dict.fromkeys(repr(default) for *_, default in entries))
        if len(defaults) == 1:
            text = texts[0] if len(texts) == 1 else "; ".join(f"{lbl}: {doc.rstrip('.')}" for lbl, _, doc, _ in entries)
            help_text = f"{_fmt(text)} (default: {_fmt(entries[0][3])})"
        else:
            help_text = "; ".join(f"{lbl}: {_fmt(doc)} (default: {_fmt(default)})" for lbl, _, doc, default in entries)
        labels = sorted({lbl for lbl, *_ in entries}, key=[lbl for _, lbl in configs].index)
        if len(labels) < len(configs):
            help_text = f"[{', '.join(labels)}] {help_text}"
        if name in must:
            help_text = help_text.rsplit(" (default: ", 1)[0]
        kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS,
                              "help": helps[name] if helps and name in helps else help_text}
        if name in must:
            kw["required"] = True
        spellings = [(flags or {}).get(name, _flag(name)), *([aliases[name]] if aliases and name in aliases else [])]
        if scalar is bool:
            parser.add_argument(*spellings, action=argparse.BooleanOptionalAction, **kw)
        else:
            metavar = None if choices else (metavars or {}).get(name, scalar.__name__.upper())
            parser.add_argument(*spellings, type=scalar, choices=choices, metavar=metavar, **kw)
        alias = (negative_aliases or {}).get(name)
        if alias:
            parser.add_argument(alias, dest=name, action="store_false", default=argparse.SUPPRESS,
                                help=f"same as --no-{name.replace('_', '-')}")


def given_fields(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields of `cls` given on the command line (flags that were not given are absent from `args`)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}


def flag_name(field: str) -> str:
    """The command-line flag of config field `field` ('block_length' -> '--block-length')."""
    return _flag(field)


def given_config_fields(cls: type, args: argparse.Namespace, *, others: Iterable[type] = ()) -> dict[str, Any]:
    """The fields of `cls` given on the command line; a field of one of `others` (config classes whose flags share
    the parser) that `cls` does not have is a ValueError naming the flag (it would otherwise be silently ignored)."""
    own = {f.name for f in dataclasses.fields(cls)}
    stray = sorted({n for other in others for n in given_fields(other, args)} - own)
    if stray:
        flags = ", ".join(_flag(n) for n in stray)
        raise ValueError(f"{flags} {'does' if len(stray) == 1 else 'do'} not apply here: {cls.__name__} has no such "
                         f"field (its flags: {', '.join(_flag(n) for n in sorted(own & set(field_docs(cls))))})")
    return given_fields(cls, args)


def config_from_args(cls: type, args: argparse.Namespace, *, others: Sequence[type] = (), **fixed: Any) -> Any:
    """`cls(**given flags, **fixed)`; the config's own defaults fill the rest and its __post_init__ validates.
    others: as `given_config_fields`."""
    return cls(**{**given_config_fields(cls, args, others=others), **fixed})


def add_model_source_args(parser: argparse.ArgumentParser, *, required: bool = True, path_help: str | None = None,
                          aliases: dict[str, str] | None = None) -> None:
    """One flag per ModelSource field, generated from the dataclass (`add_config_args`), in a 'model'
    argument group: `--model`, `--tokenizer`, `--device`, `--dtype`, `--quantize`, `--assume-released`,
    `--allow-download`. `--threads` is the shared flag of every computing command (`cli.add_threads_args`).
    `required`: `--model` must be given (else it may be left out: the command has a default model). `aliases`: a
    second spelling of a field's flag that a command kept from before (e.g. lm-eval's `--model-dir`)."""
    group = parser.add_argument_group("model", "the model to open (the same flags on every command that loads one)")
    add_config_args(group, (ModelSource, "model"), exclude=("threads",), flags=MODEL_FLAGS,
                    required=("path",) if required else (), helps={"path": path_help} if path_help else None,
                    metavars={"path": "FOLDER", "tokenizer": "FOLDER", "device": "DEVICE"}, aliases=aliases)


def model_source_from_args(args: argparse.Namespace) -> ModelSource:
    """The ModelSource of a parsed command line (its flags from `add_model_source_args`, `--threads` if any)."""
    return ModelSource(**{**given_fields(ModelSource, args), "threads": getattr(args, "threads", None)})
