"""Gradient-boosted trees (LightGBM): the feature matrix the boosters read and one booster's fit.

The boosters see what every deep model sees (lattice.data.loader.RowEncoder's arrays): the dense
columns after the platform's transform (lattice.data.transforms) and the sparse ids. Ids are not
embedded, so each sparse feature is encoded from the train split alone:

- at most `Gbdt.max_categories` distinct train ids: a LightGBM categorical (the id's rank among
  the sorted train ids); an id unseen in train, or absent, is missing (NaN);
- more: count encoding, the id's number of train rows (0 for an id unseen in train, NaN when
  absent). Categorical splits over a large id space fit the labels of rare ids; a count needs
  no label, so it cannot leak the target, and it still tells head ids from tail ids.

The pooled model (`gbdt`) adds the domain as a categorical feature; the per-cell one
(`gbdt_cell`) has one domain per booster and does without it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import lightgbm as lgb
import numpy as np

from lattice.config import PlatformConfig
from lattice.config.schema import Gbdt

Encoding = Literal["categorical", "count"]


def _safe(name: str) -> str:
    # LightGBM refuses feature names with JSON punctuation (',', ':', '"', brackets, braces)
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


@dataclass(frozen=True)
class SparseEncoding:
    """One sparse feature's encoding, fitted on the train rows where the feature is present."""

    name: str
    kind: Encoding
    ids: np.ndarray  # sorted distinct train ids (int64)
    counts: np.ndarray  # train rows per id, aligned with `ids`

    @classmethod
    def fit(cls, name: str, ids: np.ndarray, present: np.ndarray, max_categories: int) -> "SparseEncoding":
        values, counts = np.unique(ids[present], return_counts=True)
        kind: Encoding = "categorical" if 0 < len(values) <= max_categories else "count"
        return cls(name, kind, values.astype(np.int64), counts.astype(np.int64))

    def apply(self, ids: np.ndarray, present: np.ndarray) -> np.ndarray:
        """(n,) float64: category code or train count; NaN where LightGBM should see a missing value."""
        out = np.full(len(ids), np.nan)
        if not len(self.ids):
            return out
        pos = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        seen = present & (self.ids[pos] == ids)
        if self.kind == "categorical":
            out[seen] = pos[seen]
        else:
            out[present] = 0.0
            out[seen] = self.counts[pos[seen]]
        return out


@dataclass(frozen=True)
class TreeFeatures:
    """Columns of the boosters' matrix: dense, then one per sparse feature, then (pooled) the domain."""

    dense: list[str]
    sparse: list[SparseEncoding]
    with_domain: bool
    names: list[str] = field(init=False)
    categorical: list[int] = field(init=False)

    def __post_init__(self) -> None:
        names = [f"dense_{_safe(c)}" for c in self.dense]
        names += [f"{'cat' if e.kind == 'categorical' else 'count'}_{_safe(e.name)}" for e in self.sparse]
        names += ["domain"] if self.with_domain else []
        cats = [len(self.dense) + j for j, e in enumerate(self.sparse) if e.kind == "categorical"]
        cats += [len(names) - 1] if self.with_domain else []
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "categorical", cats)

    @classmethod
    def fit(cls, config: PlatformConfig, dense_columns: list[str], arrs: dict[str, np.ndarray], train: np.ndarray,
            max_categories: int, with_domain: bool) -> "TreeFeatures":
        """`arrs`: RowEncoder arrays of every row; `train`: boolean mask of the rows to fit on."""
        sparse = [SparseEncoding.fit(f.name, arrs[f"id:{f.name}"][train], arrs[f"has:{f.name}"][train], max_categories)
                  for f in config.features.sparse]
        return cls(list(dense_columns), sparse, with_domain)

    def matrix(self, arrs: dict[str, np.ndarray]) -> np.ndarray:
        """(n, len(names)) float64 for LightGBM."""
        n = len(arrs["domain"])
        x = np.empty((n, len(self.names)))
        k = len(self.dense)
        x[:, :k] = arrs["dense"]
        for j, e in enumerate(self.sparse):
            x[:, k + j] = e.apply(arrs[f"id:{e.name}"], arrs[f"has:{e.name}"])
        if self.with_domain:
            x[:, -1] = arrs["domain"]
        return x

    def describe(self) -> dict:
        return {"names": self.names, "categorical": [self.names[j] for j in self.categorical],
                "sparse": {e.name: {"encoding": e.kind, "train_ids": int(len(e.ids))} for e in self.sparse}}

    def save(self, path: Path) -> None:
        """The fitted vocabularies and counts, so a saved booster can score new rows."""
        arrays: dict[str, np.ndarray] = {f"ids__{e.name}": e.ids for e in self.sparse}
        arrays |= {f"counts__{e.name}": e.counts for e in self.sparse}
        np.savez_compressed(path, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as bool


def lgb_params(settings: Gbdt, seed: int, num_threads: int) -> dict:
    """LightGBM parameters of every booster. Deterministic: with the same rows, seed and threads,
    a refit gives the same trees (`force_row_wise` as LightGBM asks with `deterministic`)."""
    return {"objective": "binary", "metric": "binary_logloss", "num_leaves": settings.num_leaves,
            "learning_rate": settings.learning_rate, "min_data_in_leaf": settings.min_data_in_leaf,
            "lambda_l2": settings.lambda_l2,
            "seed": seed, "deterministic": True, "force_row_wise": True, "num_threads": num_threads, "verbosity": -1}


@dataclass
class Fitted:
    """One booster (or, for a cell that cannot be fitted, its train base rate)."""

    booster: lgb.Booster | None
    constant: float | None
    train_rows: int
    valid_rows: int
    best_round: int
    valid_logloss: list[float]

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.booster is None:
            return np.full(len(x), self.constant)
        return np.asarray(self.booster.predict(x, num_iteration=self.best_round), dtype=np.float64)

    def describe(self) -> dict:
        return {"train_rows": self.train_rows, "valid_rows": self.valid_rows, "best_round": self.best_round,
                "constant": self.constant, "leaves": self.leaves()}

    def leaves(self) -> int:
        if self.booster is None:
            return 0
        trees = self.booster.dump_model(num_iteration=self.best_round)["tree_info"]
        return int(sum(t["num_leaves"] for t in trees))


def fit_booster(params: dict, settings: Gbdt, features: TreeFeatures, x: np.ndarray, y: np.ndarray,
                x_valid: np.ndarray, y_valid: np.ndarray) -> Fitted:
    """Fit on (x, y), stop early on (x_valid, y_valid). A train set with one class only has
    nothing to split on: it predicts its base rate (0.5 without rows) instead of a booster."""
    if len(y) == 0 or y.min() == y.max():
        rate = float(y.mean()) if len(y) else 0.5
        return Fitted(None, rate, len(y), len(y_valid), 0, [])
    train = lgb.Dataset(x, y, feature_name=features.names, categorical_feature=features.categorical, free_raw_data=False)
    record: dict = {}
    kwargs: dict = {}
    if len(y_valid):
        valid = lgb.Dataset(x_valid, y_valid, reference=train, free_raw_data=False)
        kwargs = {"valid_sets": [valid], "valid_names": ["validation"],
                  "callbacks": [lgb.early_stopping(settings.early_stopping_rounds, verbose=False), lgb.record_evaluation(record)]}
    booster = lgb.train(params, train, num_boost_round=settings.max_rounds, **kwargs)
    best = booster.best_iteration if len(y_valid) and booster.best_iteration > 0 else booster.current_iteration()
    losses = [float(v) for v in record.get("validation", {}).get("binary_logloss", []) if math.isfinite(v)]
    return Fitted(booster, None, len(y), len(y_valid), int(best), losses)
