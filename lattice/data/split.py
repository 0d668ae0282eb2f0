"""The train / validation / test split, the same for every model (teacher, student, baselines).

The split is decided once per example by the feature stage and stored in the consolidated
table's `split` column (`training.split` says how: a hash of the example id, a time cutoff, a
column of the user's data, or one split per source). Readers take that column; they never
recompute it. `hash_split` is the rule of kind `hash`, shared by the Spark stage
(`hash_split_sql`), the pandas twin and tables written before the column existed: the first
13 hex digits of sha256(example_id) as a fraction u in [0, 1); u < test_fraction -> test, the
next validation_fraction -> validation, the rest -> train. A hash does not depend on how the
table is partitioned or ordered, and a re-run on more data keeps every old example in its split.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Literal

import numpy as np

from lattice.config import PlatformConfig

Split = Literal["train", "validation", "test", "all"]
SPLITS = ("train", "validation", "test", "all")
_DIGITS = 13  # 52 bits: the fraction is exact in a double, in Python and in Spark


def hash_fraction(example_ids: Iterable[str]) -> np.ndarray:
    """example_id -> u in [0, 1), stable across processes, machines and Python versions."""
    return np.fromiter(
        (int(hashlib.sha256(str(e).encode()).hexdigest()[:_DIGITS], 16) / 16**_DIGITS for e in example_ids),
        dtype=np.float64,
    )


def hash_split(config: PlatformConfig, example_ids: Iterable[str]) -> np.ndarray:
    """The split names of kind `hash` for these ids."""
    u = hash_fraction(example_ids)
    test = config.training.test_fraction
    val = config.training.validation_fraction
    return np.where(u < test, "test", np.where(u < test + val, "validation", "train")).astype(object)


def hash_fraction_sql(id_sql: str = "example_id") -> str:
    """Spark SQL twin of `hash_fraction`: the same u in [0, 1) for the same id."""
    return f"(CAST(conv(substr(sha2(CAST({id_sql} AS STRING), 256), 1, {_DIGITS}), 16, 10) AS DOUBLE) / {float(16**_DIGITS)!r})"


def hash_split_sql(config: PlatformConfig, id_sql: str = "example_id") -> str:
    """Spark SQL twin of `hash_split`."""
    u = hash_fraction_sql(id_sql)
    test = config.training.test_fraction
    val = config.training.validation_fraction
    return f"CASE WHEN {u} < {test!r} THEN 'test' WHEN {u} < {test + val!r} THEN 'validation' ELSE 'train' END"


def describe(config: PlatformConfig) -> str:
    """One line for reports: which split every model was trained and judged on."""
    sp = config.training.split
    if sp.kind == "hash":
        t, v = config.training.test_fraction, config.training.validation_fraction
        return f"hash of example_id: {1 - t - v:.0%} train, {v:.0%} validation, {t:.0%} test"
    if sp.kind == "time":
        return f"time: train before {sp.validation_start}, validation until {sp.test_start}, test after"
    if sp.kind == "column":
        return f"column {sp.column!r} of the data ({', '.join(f'{k}: {v}' for k, v in sp.values.items())})"
    return "per source: " + ", ".join(f"{s.name}: {s.split}" for s in config.sources)


def split_mask(config: PlatformConfig, example_ids: Iterable[str], split: Split, splits: Iterable[str] | None = None) -> np.ndarray:
    """Boolean mask of the rows of `split`. `splits` is the table's stored `split` column; a
    table without one (written before the column existed) falls back to the hash rule."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
    values = np.asarray(list(splits), dtype=object) if splits is not None else hash_split(config, example_ids)
    if split == "all":
        return np.ones(len(values), dtype=bool)
    return values == split
