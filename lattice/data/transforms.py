"""Dense feature transforms: configured transform (log1p / clip / none) then a z-score with the
train split's mean and std. The stats are fitted once per model, saved with its checkpoint and
reused for scoring and serving, so a prediction never depends on the batch it arrives in."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lattice.config import PlatformConfig
from lattice.data import schema as S

Z_CLIP = 10.0  # z-scores beyond this are outliers that would only destabilise training
TAIL = 0.001  # each column is clipped to its train quantiles [TAIL, 1 - TAIL] before the z-score
QUANTILE_GRID = 128  # DenseStats.quantiles: each column's quantiles at k / QUANTILE_GRID, k = 0..QUANTILE_GRID


@dataclass(frozen=True)
class DenseColumn:
    column: str
    transform: str  # none | log1p | clip
    clip: tuple[float, float] | None = None


def dense_spec(config: PlatformConfig, available: set[str]) -> list[DenseColumn]:
    """Model dense inputs in a fixed order: configured dense features, their presence flags, then
    the aggregate columns the table holds (missing aggregates are ignored: the model adapts)."""
    out: list[DenseColumn] = []
    seen: set[str] = set()
    for f in config.features.dense:
        if f.column in seen:
            continue
        seen.add(f.column)
        t = "log1p" if f.transform == "log1p" else "clip" if f.transform == "clip" else "none"
        out.append(DenseColumn(f.column, t, tuple(f.clip) if f.clip else None))
    for f in config.features.dense:
        pc = S.present_column(f.column)
        if pc in available and pc not in seen:
            seen.add(pc)
            out.append(DenseColumn(pc, "none"))
    for c in S.aggregate_columns(config):
        if c in available:
            # counts are heavy-tailed; rates are already in [0, 1]
            out.append(DenseColumn(c, "none" if "_rate_" in c else "log1p"))
    return out


def _pre(col: DenseColumn, x: np.ndarray) -> np.ndarray:
    x = np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    if col.transform == "log1p":
        return np.log1p(np.maximum(x, 0.0))
    if col.transform == "clip" and col.clip is not None:
        return np.clip(x, col.clip[0], col.clip[1])
    return x


def _pre_matrix(cols: list[DenseColumn], x: np.ndarray) -> np.ndarray:
    """`_pre` for every column of x (n, len(cols)) at once; same results column by column."""
    x = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    logs = [k for k, c in enumerate(cols) if c.transform == "log1p"]
    if logs:
        x[:, logs] = np.log1p(np.maximum(x[:, logs], 0.0))
    for k, c in enumerate(cols):
        if c.transform == "clip" and c.clip is not None:
            x[:, k] = np.clip(x[:, k], c.clip[0], c.clip[1])
    return x


@dataclass
class DenseStats:
    columns: list[DenseColumn]
    mean: list[float]
    std: list[float]
    label_rates: dict[str, float] | None = None  # objective -> train positive rate where labelled
    distinct_ids: dict[str, int] | None = None  # sparse feature -> distinct ids in the train split
    low: list[float] | None = None  # per column: the train split's 0.1% quantile (after the transform)
    high: list[float] | None = None  # ... and its 99.9% quantile; values are clipped to [low, high]
    merged_ids: dict[str, int] | None = None
    """sparse feature -> train-split ids that id mod num_embeddings puts on a row another id already
    has (exact: small integer ids below the row count never merge, whatever n(n-1)/2R says)."""
    quantiles: list[list[float]] | None = None
    """per column: the train split's quantiles at k / QUANTILE_GRID (after the transform and the
    clip to [low, high]); the numeric encoders' bin edges come from these (lattice.models.numeric)."""

    def apply(self, raw: dict[str, np.ndarray], n: int) -> np.ndarray:
        """raw column arrays -> (n, n_dense) float32. One vectorised pass over all columns (this
        runs per serving request, where per-column numpy calls would dominate)."""
        out = np.zeros((n, len(self.columns)), dtype=np.float32)
        have = [j for j, col in enumerate(self.columns) if col.column in raw]
        if not have or n == 0:
            return out  # absent columns stay at the train mean (z = 0)
        x = np.empty((n, len(have)), dtype=np.float64)
        for k, j in enumerate(have):
            x[:, k] = raw[self.columns[j].column]
        x = _pre_matrix([self.columns[j] for j in have], x)
        if self.low is not None and self.high is not None:
            x = np.clip(x, np.asarray([self.low[j] for j in have]), np.asarray([self.high[j] for j in have]))
        mean = np.asarray([self.mean[j] for j in have])
        std = np.asarray([self.std[j] for j in have])
        out[:, have] = np.clip((x - mean) / std, -Z_CLIP, Z_CLIP)
        return out

    def to_json(self) -> dict:
        return {"columns": [asdict(c) for c in self.columns], "mean": self.mean, "std": self.std, "label_rates": self.label_rates,
                "distinct_ids": self.distinct_ids, "low": self.low, "high": self.high, "merged_ids": self.merged_ids,
                "quantiles": self.quantiles}

    @classmethod
    def from_json(cls, d: dict) -> "DenseStats":
        cols = [DenseColumn(c["column"], c["transform"], tuple(c["clip"]) if c.get("clip") else None) for c in d["columns"]]
        # stats saved before the bounds existed carry none: no clip, as those models were trained
        return cls(cols, list(d["mean"]), list(d["std"]), d.get("label_rates"), d.get("distinct_ids"), d.get("low"), d.get("high"),
                   d.get("merged_ids"), d.get("quantiles"))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: Path) -> "DenseStats":
        return cls.from_json(json.loads(Path(path).read_text()))


class StatsAccumulator:
    """Robust dense statistics without holding the table: a uniform reservoir sample of train rows
    (seeded, `cap` rows) gives each column's 0.1% / 99.9% quantiles after its transform, and the
    mean and std of the values clipped to them. One absurd value (a 1e308 price, a counter that
    wrapped) then moves neither the mean nor the scale, where plain sums would turn every row's
    input into a constant."""

    def __init__(self, columns: list[DenseColumn], cap: int = 200_000, seed: int = 0):
        self.columns = columns
        self.cap = cap
        self.n = 0
        self.sample = np.zeros((0, len(columns)))
        self.rng = np.random.default_rng(seed)

    def add(self, raw: dict[str, np.ndarray], n: int) -> None:
        if n == 0:
            return
        x = np.zeros((n, len(self.columns)))  # a column a unit lacks counts as 0, as `apply` sees it
        for j, col in enumerate(self.columns):
            if col.column in raw:
                x[:, j] = _pre(col, raw[col.column])
        room = max(self.cap - len(self.sample), 0)
        if room:
            self.sample = np.concatenate([self.sample, x[:room]])
        rest = x[room:]
        if len(rest):  # reservoir sampling (Algorithm R), vectorised over the unit
            seen = self.n + room + np.arange(len(rest))
            slot = (self.rng.random(len(rest)) * (seen + 1)).astype(np.int64)
            take = slot < self.cap
            self.sample[slot[take]] = rest[take]
        self.n += n

    def finish(self) -> DenseStats:
        k = len(self.columns)
        if not len(self.sample):
            return DenseStats(self.columns, [0.0] * k, [1.0] * k)
        low, high = np.quantile(self.sample, [TAIL, 1 - TAIL], axis=0)
        x = np.clip(self.sample, low, high)
        mean, std = x.mean(axis=0), x.std(axis=0)
        std = np.where(std > 1e-6, std, 1.0)  # a constant column stays constant (z = 0)
        grid = np.quantile(x, np.linspace(0.0, 1.0, QUANTILE_GRID + 1), axis=0).T  # (k, QUANTILE_GRID + 1)
        return DenseStats(self.columns, mean.tolist(), std.tolist(), low=low.tolist(), high=high.tolist(), quantiles=grid.tolist())
