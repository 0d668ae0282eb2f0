"""The search space of `lattice tune` (config section `tune.space`): dotted config keys, as
`--set` takes them, each with a range or a list of choices.

The checks of the space against the config (`space_problems`, `resolve`) live in
`lattice.config.rules_tuning`, so config validation imports no tuning code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Key resolution and the config-level check live with the config (validation imports no tuning
# code); re-exported so the search and its callers keep one import.
from lattice.config.rules_tuning import _MISSING, is_int_key, resolve, space_problems  # noqa: F401

if TYPE_CHECKING:
    from lattice.config.schema import TuneRange


def suggest(trial, space: dict[str, "TuneRange"], data: dict) -> dict[str, Any]:
    """One value per key from an Optuna trial (a key's parameter name is the key itself)."""
    chosen: dict[str, Any] = {}
    for key, spec in space.items():
        if spec.choices is not None:
            chosen[key] = trial.suggest_categorical(key, list(spec.choices))
        elif is_int_key(resolve(data, key)[0], spec):
            chosen[key] = trial.suggest_int(key, int(spec.low), int(spec.high), step=int(spec.step or 1), log=spec.log)
        else:
            chosen[key] = trial.suggest_float(key, float(spec.low), float(spec.high), step=spec.step, log=spec.log)
    return chosen


def as_sets(values: dict[str, Any]) -> list[str]:
    """`--set KEY=VALUE` items (VALUE written as YAML reads it back)."""
    import json

    return [f"{k}={json.dumps(v) if isinstance(v, (bool, str)) else _float(v) if isinstance(v, float) else v}"
            for k, v in values.items()]


def _float(v: float) -> str:
    """A float YAML reads back as a float: PyYAML wants a dot in the mantissa (`1.0e-05`, not `1e-05`)."""
    text = repr(v)
    mantissa, e, exponent = text.partition("e")
    if e and "." not in mantissa:
        text = f"{mantissa}.0e{exponent}"
    return text


def as_overlay(values: dict[str, Any]) -> dict:
    """The chosen keys as a nested mapping (a partial config; named list entries stay by name)."""
    out: dict = {}
    for key, value in values.items():
        node = out
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out
