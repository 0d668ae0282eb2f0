"""The consolidated example table: the contract between the feature pipeline and the models.

One row per impression, every domain in one table (DESIGN.md):

    example_id        string   the source's declared `key`, hashed; without one, a hash of the source
                               and the raw row (its n-th identical copy gets its own id)
    event_timestamp   timestamp (UTC, microseconds)
    date              string   yyyy-MM-dd of event_timestamp (partition)
    domain            string   (partition)
    split             string   train | validation | test, decided once here (`training.split`)
    <pass-through>    string   the sources' `passthrough` columns, untouched (null where a source lacks one)
    <sparse column>   int64    null where the domain lacks the feature
    <dense column>    double   0.0 where the domain lacks the feature ...
    <dense>_present   int8     ... and then 0 here
    label_<objective> int8     0 where masked
    mask_<objective>  int8     1 where the domain carries the label
    truth_<objective> double   true probability (synthetic data only; never a model input)
    known_<objective> timestamp when the positive was logged (objectives whose source declares
                               `known_at`; null on negatives): a training cutoff reads it
                               (`lattice.data.label_time`)

Aggregate features join this table in the training set as `<aggregate>_<statistic>_<window>`.
"""

from __future__ import annotations

import hashlib

from lattice.config import PlatformConfig
from lattice.config.schema import AggregateFeature
from lattice.config.timing import known_at_objectives


def sparse_columns(config: PlatformConfig) -> list[str]:
    return list(dict.fromkeys(f.column for f in config.features.sparse))


def dense_columns(config: PlatformConfig) -> list[str]:
    return list(dict.fromkeys(f.column for f in config.features.dense))


def present_column(dense_column: str) -> str:
    return f"{dense_column}_present"


def label_column(objective: str) -> str:
    return f"label_{objective}"


def mask_column(objective: str) -> str:
    return f"mask_{objective}"


def truth_column(objective: str) -> str:
    return f"truth_{objective}"


def known_column(objective: str) -> str:
    return f"known_{objective}"


def aggregate_feature_columns(agg: AggregateFeature) -> list[tuple[str, str]]:
    """(column, kind) of one aggregate, kind 'int' or 'rate': the one naming rule that the
    aggregates job, the Feast views and the training set all follow."""
    return [(f"{agg.name}_{stat}_{w}", "rate" if stat == "rate" else "int") for w in agg.windows for stat in agg.statistics]


def aggregate_columns(config: PlatformConfig) -> list[str]:
    return [c for a in config.features.aggregates for c, _ in aggregate_feature_columns(a)]


def passthrough_columns(config: PlatformConfig) -> list[str]:
    """Every source's pass-through columns, in config order (a union: sources may differ)."""
    return list(dict.fromkeys(c for s in config.sources for c in s.passthrough))


def consolidated_columns(config: PlatformConfig) -> list[str]:
    objs = config.objective_names
    dense = dense_columns(config)
    return (
        ["example_id", "event_timestamp", "date", "domain", "split"]
        + passthrough_columns(config)
        + sparse_columns(config)
        + dense
        + [present_column(c) for c in dense]
        + [label_column(o) for o in objs]
        + [mask_column(o) for o in objs]
        + [truth_column(o) for o in objs]
        + [known_column(o) for o in known_at_objectives(config)]
    )


# text that means "no value" in exported logs (lower-cased); read as a missing value, never an id
NULL_LIKE = ("null", "none", "nan", "n/a", "nil", "\\n")


def is_null_like(value: str) -> bool:
    return value.strip().lower() in NULL_LIKE or not value.strip()


def stable_id(value: str) -> int:
    """Sparse raw value -> int64 id: integers stay as they are, anything else (hex hashes,
    names) becomes the first 15 hex digits of its MD5. Spark computes the same with
    `conv(substr(md5(v), 1, 15), 16, 10)`, so both implementations agree."""
    try:
        return int(value)
    except ValueError:
        return int(hashlib.md5(value.encode()).hexdigest()[:15], 16)
