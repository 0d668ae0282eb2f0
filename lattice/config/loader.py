"""Load a platform YAML into a `PlatformConfig`, reporting every problem as
`FILE: KEY.PATH: bad value X: what to do`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

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


def _fix_for(err: dict) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key; remove it or fix its spelling (see configs/demo.yaml for every key)"
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


def parse_config(data: object, file: str = "<memory>") -> PlatformConfig:
    if not isinstance(data, dict):
        raise ConfigError(file, [Problem("", type(data).__name__, "the file must hold a YAML mapping of sections")])
    try:
        cfg = PlatformConfig.model_validate(data)
    except ValidationError as exc:
        problems = [Problem(_loc(e["loc"]), e.get("input"), _fix_for(e)) for e in _collapse_union(exc.errors())]
        raise ConfigError(file, problems) from None
    problems = [Problem(p, v, m) for p, v, m in cfg.problems()]
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


def load_config(path: str | os.PathLike, overrides: list[str] | None = None) -> PlatformConfig:
    """The validated config in `path`, with `overrides` (KEY.PATH=VALUE, see `apply_overrides`)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(str(p), [Problem("", str(p), "config file not found; pass a path like configs/demo.yaml")])
    try:
        # the C loader parses ~10x faster; DAG files load every config at parse time
        data = yaml.load(_expand_env(p.read_text()), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        raise ConfigError(str(p), [Problem(where, None, f"not valid YAML ({getattr(exc, 'problem', exc)}); fix the syntax there")]) from None
    if overrides and isinstance(data, dict):
        data = apply_overrides(data, overrides, str(p))
    cfg = parse_config(data, str(p))
    cfg._source_file = str(p.resolve())
    return cfg
