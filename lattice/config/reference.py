"""The config reference (docs/config-reference.md), generated from the schema itself: every model
reachable from `PlatformConfig`, one Markdown table per model with each key's type, default and
docstring. Generated rather than written, so it cannot drift from what the loader accepts
(tests/unit/test_config_reference.py fails when the committed page is stale)."""

from __future__ import annotations

import datetime as dt
import inspect
import types
import typing

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from lattice.config.schema import PlatformConfig

HEADER = """# Config reference

<!-- Generated from lattice/config/schema.py by `lattice config reference --output docs/config-reference.md`;
     edit the docstrings there, not this page. -->

Every key a platform config YAML may hold, section by section. Unknown keys are errors, so a
misspelt key is reported instead of silently ignored. `${VAR:-default}` in any value expands
environment variables. Check a config with `lattice config check FILE`.
"""


def _is_model(tp: object) -> typing.TypeGuard[type[BaseModel]]:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _args(tp: object) -> tuple:
    return typing.get_args(tp)


def _is_union(tp: object) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def models(root: type[BaseModel] = PlatformConfig) -> list[tuple[type[BaseModel], list[str]]]:
    """Every model reachable from `root`, depth first in field order (a section is followed by
    its own sub-sections), each with the key paths it appears at (`sources[]`, `models.teacher`)."""
    order: dict[type[BaseModel], list[str]] = {}

    def visit(model: type[BaseModel], where: str) -> None:
        if model in order:
            order[model].append(where)
            return
        order[model] = [where]
        for name, field in model.model_fields.items():
            for sub, suffix in _nested(field.annotation):
                visit(sub, f"{where}.{name}{suffix}" if where else f"{name}{suffix}")

    visit(root, "")
    return list(order.items())


def _nested(tp: object, suffix: str = "") -> list[tuple[type[BaseModel], str]]:
    """The models inside an annotation, with how their key path continues (`[]` for a list
    item, `.<key>` for a map value)."""
    if _is_model(tp):
        return [(tp, suffix)]
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:  # e.g. a union tagged by a discriminator
        return _nested(_args(tp)[0], suffix)
    if _is_union(tp):
        return [m for a in _args(tp) for m in _nested(a, suffix)]
    if origin in (list, set, frozenset, tuple):
        return [m for a in _args(tp) if a is not Ellipsis for m in _nested(a, suffix + "[]")]
    if origin is dict:
        return _nested(_args(tp)[1], suffix + ".<key>")
    return []


_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", dt.date: "date (YYYY-MM-DD)",
            dt.datetime: "datetime (YYYY-MM-DDTHH:MM:SS)", type(None): "null"}


def type_name(tp: object) -> str:
    """An annotation as a reader of YAML thinks of it: `list of string`, `one of `a`, `b``."""
    if _is_model(tp):
        return f"[{tp.__name__}](#{tp.__name__.lower()})"
    if tp in _SCALARS:
        return _SCALARS[tp]  # type: ignore[index]
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return type_name(_args(tp)[0])
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in _args(tp))
    if _is_union(tp):
        return " or ".join(type_name(a) for a in _args(tp))
    if origin in (list, set, frozenset):
        return f"list of {_inner(_args(tp)[0])}"
    if origin is tuple:
        return "[" + ", ".join(type_name(a) for a in _args(tp)) + "]"
    if origin is dict:
        k, v = _args(tp)
        return f"map of {_inner(k)} to {type_name(v)}"
    return str(tp)


def _inner(tp: object) -> str:
    """A list item or map key: choices read as `a`, `b` or `c` there ("list of one of" does not)."""
    if typing.get_origin(tp) is typing.Literal:
        *rest, last = (f"`{a}`" for a in _args(tp))
        return f"{', '.join(rest)} or {last}" if rest else last
    return type_name(tp)


def _constraints(field: FieldInfo) -> str:
    out = []
    for m in field.metadata:
        for cls, sign, attr in ((at.Gt, ">", "gt"), (at.Ge, "≥", "ge"), (at.Lt, "<", "lt"), (at.Le, "≤", "le")):
            if isinstance(m, cls):
                out.append(f"{sign} {getattr(m, attr)}")
        if isinstance(m, at.MinLen):
            out.append(f"at least {m.min_length}")
        if getattr(m, "pattern", None):
            out.append(f"matching `{m.pattern}`")
    return ", ".join(out)


def yaml_inline(v: object) -> str:
    """A value as it would be written in a config (flow style)."""
    if isinstance(v, BaseModel):
        return yaml_inline(v.model_dump(exclude_defaults=True))
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {yaml_inline(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_inline(x) for x in v) + "]"
    if isinstance(v, (dt.date, dt.datetime)):
        return v.isoformat()
    if isinstance(v, str):
        return v if v and v.strip() == v and not v.startswith(("@", "{", "[", "*", "&", "!", "'", '"')) else f'"{v}"'
    return str(v)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    v = field.get_default(call_default_factory=True)
    if isinstance(v, BaseModel) and not v.model_dump(exclude_defaults=True):
        return "its section's defaults"
    return f"`{yaml_inline(v)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_model(model: type[BaseModel], where: list[str]) -> str:
    lines = [f"## {model.__name__}", ""]
    at_keys = ", ".join(f"`{w}`" for w in where if w) or "the top level of the file"
    lines += [f"At {at_keys}.", ""]
    doc = inspect.cleandoc(model.__dict__.get("__doc__") or "")
    for paragraph in doc.split("\n\n") if doc else []:
        lines += [" ".join(paragraph.split()), ""]
    lines += ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        kind = type_name(field.annotation)
        limits = _constraints(field)
        kind += f" ({limits})" if limits else ""
        lines.append(f"| `{name}` | {_cell(kind)} | {_cell(_default(field))} | {_cell(field.description or '')} |")
    return "\n".join(lines) + "\n"


def render_reference(root: type[BaseModel] = PlatformConfig) -> str:
    return HEADER + "".join("\n" + render_model(m, where) for m, where in models(root))
