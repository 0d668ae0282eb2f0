"""Load a platform YAML into a `PlatformConfig`, reporting every problem as
`FILE: KEY.PATH: bad value X: what to do`."""

from __future__ import annotations

import copy
import difflib
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from lattice.config.schema import PlatformConfig

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class Problem:
    path: str
    value: object
    message: str

    def render(self, file: str) -> str:
        shown = repr(self.value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return f"{file}: {self.path or '<root>'}: bad value {shown}: {self.message}"


class ConfigError(ValueError):
    def __init__(self, file: str, problems: list[Problem]):
        self.file = file
        self.problems = problems
        super().__init__("\n".join(p.render(file) for p in problems))


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "DomainFromColumn") or str(part).startswith("function-"):
            continue  # union-branch markers pydantic puts in the location
        else:
            out += ("." if out else "") + str(part)
    return out


def _narrow(tp: object) -> object:
    """`X | None` -> X; a union with one model branch (`str | DomainFromColumn`) -> that model."""
    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        models = [a for a in args if _is_model(a)]
        if len(models) == 1:
            return models[0]
        if len(args) == 1:
            return args[0]
    return tp


def _is_model(tp: object) -> typing.TypeGuard[type[BaseModel]]:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _walk(loc: tuple) -> tuple[object | None, FieldInfo | None]:
    """The type at a pydantic error location inside `PlatformConfig`, and the field it is (None
    when the location ends in a list index or a map key): names walk into models, indices into a
    list's item type, keys into a map's value type; union-branch markers are skipped."""
    tp: object = PlatformConfig
    field: FieldInfo | None = None
    for part in loc:
        tp = _narrow(tp)
        if isinstance(part, str) and (part.startswith("function-") or part == getattr(tp, "__name__", None)):
            continue
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if _is_model(tp) and isinstance(part, str) and part in tp.model_fields:
            field = tp.model_fields[part]
            tp = field.annotation
        elif origin in (list, set, frozenset) and isinstance(part, int):
            tp, field = args[0], None
        elif origin is tuple and isinstance(part, int):
            tp, field = (args[0] if len(args) == 2 and args[1] is Ellipsis else args[part] if part < len(args) else None), None
        elif origin is dict and args:
            tp, field = args[1], None
        else:
            return None, None
    return _narrow(tp), field


def _unknown_key(loc: tuple) -> str:
    key = str(loc[-1])
    model, _ = _walk(loc[:-1])
    if not _is_model(model):
        return f"unknown key {key!r}; remove it or fix its spelling"
    valid = list(typing.cast(type[BaseModel], model).model_fields)
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"did you mean {near[0]!r}?" if near else "remove it or fix its spelling"
    return f"unknown key {key!r}; {hint} (valid keys: {', '.join(valid)})"


def _fix_for(err: dict) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return _unknown_key(tuple(err["loc"]))
    if kind == "missing":
        return "required key is missing; add it"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind == "string_pattern_mismatch":
        return "names use lower-case letters, digits and '_' and start with a letter"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return err["msg"].lower()
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return err["msg"]


def _expand_env(text: str) -> str:
    return _ENV_RE.sub(lambda m: os.environ.get(m.group(1), m.group(2) or ""), text)


def _collapse_union(errors: list[dict]) -> list[dict]:
    """A `str | DomainFromColumn` field fails once per branch; keep the dict branch's errors when
    the input was a mapping and the str branch's otherwise, so users see one reason."""
    keep = []
    for e in errors:
        loc = e["loc"]
        if "str" in loc and isinstance(e.get("input"), dict):
            continue
        if "DomainFromColumn" in loc and loc[-1] == "DomainFromColumn" and not isinstance(e.get("input"), dict):
            continue
        keep.append(e)
    return keep


# Field names the cross-field rules (`PlatformConfig.problems`) read. A value under one of them is
# never patched to let those rules run, since the patch could invent or hide a cross-field problem;
# keep this in step with the rules.
_RULE_FIELDS = frozenset({"name", "domains", "domain", "map", "default", "given", "labels", "truth", "columns",
                          "expressions", "split", "passthrough", "column", "entity", "objective", "kind", "teacher", "student"})


def _patched(data: dict, errors: list[dict]) -> dict | None:
    """A copy of `data` in which every failing value is one the cross-field rules never read,
    patched: an unknown key dropped, a bad value replaced by the field's default or by the first
    allowed choice. None when some failure is not like that (a missing required key, a bad name)."""
    fixed = copy.deepcopy(data)
    for e in errors:
        loc = tuple(e["loc"])
        parent: object = None
        key: object = None
        node: object = fixed
        for part in loc:
            if isinstance(node, dict) and part in node or isinstance(node, list) and isinstance(part, int) and part < len(node):
                parent, key, node = node, part, node[part]  # type: ignore[index]
            elif isinstance(part, str) and (part.startswith("function-") or part[:1].isupper() or part == "str"):
                continue  # a union-branch marker, not a key of the data
            else:
                return None
        if parent is None:
            return None
        if e["type"] == "extra_forbidden" and isinstance(parent, dict):
            del parent[key]  # an unknown key: no rule reads it
            continue
        if any(isinstance(part, str) and part in _RULE_FIELDS for part in loc):
            return None
        tp, field = _walk(loc)
        if tp is None or _is_model(tp):
            return None  # a whole section's defaults could change what the rules read inside it
        if field is not None and not field.is_required() and isinstance(parent, dict):
            del parent[key]
        elif typing.get_origin(tp) is typing.Literal:
            parent[key] = typing.get_args(tp)[0]  # type: ignore[index]
        else:
            return None
    return fixed


def _cross_field_despite(data: dict, errors: list[dict]) -> list[Problem]:
    """The cross-field problems of a config that also fails validation, where its failures can be
    set aside (see `_patched`), so one run lists every problem instead of the first layer."""
    fixed = _patched(data, errors)
    if fixed is None:
        return []
    try:
        cfg = PlatformConfig.model_validate(fixed)
    except ValidationError:
        return []
    return every_problem(cfg)


def every_problem(cfg: PlatformConfig) -> list[Problem]:
    """The cross-field problems of a validated config: the schema's own, then the rules that
    hashing layouts and the tuning space put on it (kept in their modules, which read the schema's
    types, so the schema imports neither of them)."""
    from lattice.config.rules_hashing import hashing_problems
    from lattice.config.rules_tuning import space_problems

    found = [*cfg.problems(), *hashing_problems(cfg), *space_problems(cfg)]
    return [Problem(p, v, m) for p, v, m in found]


def parse_config(data: object, file: str = "<memory>") -> PlatformConfig:
    if not isinstance(data, dict):
        raise ConfigError(file, [Problem("", type(data).__name__, "the file must hold a YAML mapping of sections")])
    try:
        cfg = PlatformConfig.model_validate(data)
    except ValidationError as exc:
        errors = _collapse_union([dict(e) for e in exc.errors()])
        problems = [Problem(_loc(e["loc"]), e.get("input"), _fix_for(e)) for e in errors]
        raise ConfigError(file, problems + _cross_field_despite(data, errors)) from None
    problems = every_problem(cfg)
    if problems:
        raise ConfigError(file, problems)
    return cfg


def apply_overrides(data: dict, overrides: list[str], file: str) -> dict:
    """`KEY.PATH=VALUE` edits of the parsed YAML (VALUE is YAML: `2`, `[128, 64]`, `null`). A list
    of named entries (domains, objectives, sources, features.sparse...) is indexed by name:
    `objectives.conversion.given=click`. Lets a run try a variant without editing the file."""
    for item in overrides:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(file, [Problem(f"--set {item}", item, "write an override as KEY.PATH=VALUE, e.g. training.epochs=1")])
        node: object = data
        parts = key.strip().split(".")
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, list):
                node = next((x for x in node if isinstance(x, dict) and x.get("name") == part), None)
            elif isinstance(node, dict):
                node = node.setdefault(part, {}) if part not in node else node[part]
            if not isinstance(node, (dict, list)):
                where = ".".join(parts[: i + 1])
                raise ConfigError(file, [Problem(f"--set {key}", where, "no such section or named entry in the config; "
                                                 "check the spelling (see configs/demo.yaml)")])
        if not isinstance(node, dict):
            raise ConfigError(file, [Problem(f"--set {key}", key, "the key must end in a field name, not a list")])
        node[parts[-1]] = yaml.safe_load(text)
    return data


_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.YAMLError):
    """A mapping gives one key twice. `found` holds (key path, key, the repeated value as written,
    its line, the line of the first), lines 1-based."""

    def __init__(self, found: list[tuple[str, str, str, int, int]]):
        self.found = found
        super().__init__("; ".join(f"line {line}: duplicate key {key!r} at {where}" for where, key, _, line, _ in found))


# the C parser builds the node tree ~10x faster than the Python one (DAG files load every
# config at parse time); only the duplicate check below walks the nodes in Python
_SafeBase: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UniqueKeyLoader(_SafeBase):  # type: ignore[misc, valid-type]
    """A safe loader that refuses a key given twice in one mapping. Plain YAML keeps the last
    value, so a block pasted below an earlier one would silently override it. Every duplicate in
    the document is reported at once, each with its key path and lines."""

    def get_single_data(self) -> object:
        node = self.get_single_node()
        if node is None:
            return None
        found: list[tuple[str, str, str, int, int]] = []
        _find_duplicates(node, "", found, set())
        if found:
            raise DuplicateKeyError(found)
        return self.construct_document(node)


def _find_duplicates(node: yaml.Node, where: str, found: list, seen: set[int]) -> None:
    if id(node) in seen:  # an alias: its anchor was checked where it was defined
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _find_duplicates(item, f"{where}[{i}]", found, seen)
    elif isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            path = f"{where}.{key}" if where else key
            line = key_node.start_mark.line + 1
            if key in first:
                shown = (value_node.value if isinstance(value_node, yaml.ScalarNode)
                         else "{...}" if isinstance(value_node, yaml.MappingNode) else "[...]")
                found.append((path, key, shown, line, first[key]))
            else:
                first[key] = line
            _find_duplicates(value_node, path, found, seen)


def load_config(path: str | os.PathLike, overrides: list[str] | None = None) -> PlatformConfig:
    """The validated config in `path`, with `overrides` (KEY.PATH=VALUE, see `apply_overrides`)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(str(p), [Problem("", str(p), "config file not found; pass a path like configs/demo.yaml")])
    try:
        data = yaml.load(_expand_env(p.read_text()), Loader=UniqueKeyLoader)
    except DuplicateKeyError as exc:
        raise ConfigError(str(p), [
            Problem(where, value, f"line {line}: duplicate key {key!r} (first given at line {first}); YAML would keep "
                    "only the last value and silently drop the other: keep one")
            for where, key, value, line, first in exc.found
        ]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        raise ConfigError(str(p), [Problem(where, None, f"not valid YAML ({getattr(exc, 'problem', exc)}); fix the syntax there")]) from None
    if overrides and isinstance(data, dict):
        data = apply_overrides(data, overrides, str(p))
    cfg = parse_config(data, str(p))
    cfg._source_file = str(p.resolve())
    return cfg
