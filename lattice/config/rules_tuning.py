"""Checks of the config's `tune.space` against the config itself: every key names one value, and
a numeric range fits that value's type. `PlatformConfig.problems` runs `space_problems`, so a bad
key is reported by `lattice config check` like any other config error (file, key, fix).

Kept in the config package so config validation imports no tuning code; `lattice.tuning.space`
builds the search on these (and re-exports them)."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lattice.config.schema import PlatformConfig, TuneRange

_MISSING = object()


def _children(node: Any) -> list[str]:
    if isinstance(node, dict):
        return list(node)
    if isinstance(node, list):
        return [x["name"] for x in node if isinstance(x, dict) and "name" in x]
    return []


def resolve(data: dict, key: str) -> tuple[Any, str | None]:
    """The value `key` names in a dumped config (named list entries by name, as `--set` does),
    or (_MISSING, what went wrong)."""
    node: Any = data
    parts = key.split(".")
    for i, part in enumerate(parts):
        here = ".".join(parts[:i])
        if isinstance(node, list):
            nxt = next((x for x in node if isinstance(x, dict) and x.get("name") == part), _MISSING)
        elif isinstance(node, dict):
            nxt = node.get(part, _MISSING)
        else:
            return _MISSING, f"{here!r} is a value, not a section"
        if nxt is _MISSING:
            valid = _children(node)
            near = difflib.get_close_matches(".".join([*parts[:i], part]) if i else part,
                                             [".".join([*parts[:i], v]) if i else v for v in valid], n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}? " if near else ""
            where = f"under {here!r}" if here else "at the top level"
            return _MISSING, f"no key {part!r} {where}; {hint}(valid: {', '.join(map(str, valid))})"
        node = nxt
    if isinstance(node, (dict, list)):
        return _MISSING, "names a whole section or list; name one value inside it (e.g. models.teacher.dropout)"
    return node, None


def is_int_key(current: Any, spec: "TuneRange") -> bool:
    """An integer config value is searched over integers (and so is a None one whose bounds are ints)."""
    if isinstance(current, bool):
        return False
    if isinstance(current, int):
        return True
    return current is None and isinstance(spec.low, int) and isinstance(spec.high, int)


def space_problems(config: "PlatformConfig") -> list[tuple[str, object, str]]:
    """(key path, bad value, fix) for every `tune.space` key that names no value of this config,
    or whose range cannot hold that value's type."""
    out: list[tuple[str, object, str]] = []
    if not config.tune.space:
        return out
    data = config.model_dump(mode="json")
    for key, spec in config.tune.space.items():
        where = f"tune.space.{key}"
        if key.split(".")[0] == "tune":
            out.append((where, key, "the search cannot tune its own settings; search training, models or "
                        "feature keys"))
            continue
        current, why = resolve(data, key)
        if why is not None:
            out.append((where, key, f"not a key of this config: {why}; fix the key (it is written like "
                        "`--set` takes it, e.g. training.lr_dense) or remove it from tune.space"))
            continue
        if spec.choices is None:
            if isinstance(current, bool) or not (current is None or isinstance(current, (int, float))):
                out.append((where, current, f"{key} holds {type(current).__name__} {current!r}, which a numeric "
                            "range cannot set; give `choices: [...]` instead"))
            elif is_int_key(current, spec) and any(v is not None and float(v) != int(v) for v in (spec.low, spec.high, spec.step)):
                out.append((where, {"low": spec.low, "high": spec.high}, f"{key} is an integer; give integer "
                            "bounds (and step)"))
    return out
