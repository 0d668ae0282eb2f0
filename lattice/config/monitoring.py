"""Config of operating what is served: the prediction log serving writes and the rules the
`monitor` stage evaluates over its per-cell series (`monitoring:` in the platform config).

Kept apart from schema.py (which holds one field for it) so that the section grows here."""

from __future__ import annotations

from typing import Annotated, Literal, Union  # noqa: F401

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    # the same strictness as schema.Strict (not imported: schema.py imports this module)
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class PredictionLog(_Strict):
    enabled: bool = True
    """Serving appends every scored request to `<workdir>/prediction_log/` (parquet, one folder
    per hour) from a background thread; a request never waits on it or fails because of it."""
    queue_records: int = Field(default=100_000, ge=1)
    """Most records waiting to be written; beyond it a record is dropped and counted (in /healthz
    and /metrics), so a slow or full disk bounds the server's memory instead of growing it."""
    flush_seconds: float = Field(default=1.0, gt=0)
    """Longest a record waits in memory before it is written: what a killed server (SIGKILL) can
    lose. A clean stop writes everything acknowledged."""
    flush_records: int = Field(default=5_000, ge=1)
    """Records that trigger a write before `flush_seconds` has passed."""
    part_format: Literal["arrow", "parquet"] = "arrow"
    """How serving writes its parts. `arrow`: Arrow IPC files, Arrow's buffers as they are with lz4
    on each: 0.45 us a row of the demo's 31 columns written as new files (the kernel's share
    included), against 0.75 us for parquet lz4 on the cores that score; about 30% larger on disk
    until the `monitor` stage rewrites each hour's parts as one parquet file (`compression`) and
    deletes them. `parquet`: parts encoded by serving itself, nothing left to compact. Readers see
    both alike (docs/monitoring.md)."""
    compression: Literal["lz4", "zstd", "snappy", "none"] = "lz4"
    """Parquet codec of the log's parquet files: the monitor's compacted ones, `lattice predict`'s,
    and serving's own parts under `part_format: parquet`. The writer's CPU is taken from the scoring it runs
    beside: for 5,120 rows of the demo's schema lz4 took 0.73 us a row against zstd's 1.11 (a
    third less), for parts 20% larger (190 against 158 kB); `zstd` where disk matters more than
    the serving cores (docs/bench/serving.md)."""
    features: bool = True
    """Log the feature values the model used (request features and online aggregates), which
    the monitor's drift check reads; off: ids, keys and scores only."""


class CalibrationRule(_Strict):
    kind: Literal["calibration"]
    """Trips when a cell's online calibration (sum p / sum y) stays outside [low, high]."""
    low: float = Field(default=0.9, gt=0)
    """Lowest calibration accepted."""
    high: float = Field(default=1.1, gt=0)
    """Highest calibration accepted."""
    min_positives: int = Field(default=200, ge=1)
    """A period counts only when the cell had at least this many positive labels in it (fewer
    positives make the ratio noise)."""
    periods: int = Field(default=2, ge=1)
    """Consecutive periods (each with enough positives) the cell must be outside the bounds."""
    confidence: float = Field(default=0.95, ge=0, lt=1)
    """A period counts as outside only when this two-sided interval of its calibration (the
    positive count off by z standard deviations of a sum of Bernoullis under the served
    probabilities, as the gate's) lies wholly outside [low, high]: with 100-300 positives a day
    the ratio moves by ±10-20% on noise alone, which a plain band reads as drift. 0 compares the
    point estimate alone."""
    pooled: bool = False
    """Judge the sums pooled over the last `periods` consecutive periods (one interval over all
    their labels; `min_positives` then applies to the pooled count) instead of each period on its
    own. A cell with about 100 positives a day cannot show a steady 20% miscalibration in one day's
    interval; three days of them can (docs/monitoring.md). Pooled, `periods` is the window, e.g.
    3: the series restarts with each model version, so a long window never fills after a retrain."""

    @model_validator(mode="after")
    def _ordered(self) -> "CalibrationRule":
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


class DriftRule(_Strict):
    kind: Literal["drift"]
    """Trips when a dense feature's PSI against the training window passes `max_psi`."""
    feature: str
    """Dense feature column (canonical name) whose drift is watched; `*` watches every one."""
    max_psi: float = Field(default=0.2, gt=0)
    """Largest population stability index accepted (0.1: a small shift; 0.25: a large one)."""
    periods: int = Field(default=1, ge=1)
    """Consecutive periods the PSI must be above the bound."""


class NeRegressionRule(_Strict):
    kind: Literal["ne_regression"]
    """Trips when a cell's online NE is worse than its reference by more than `max_increase`."""
    max_increase: float = Field(default=0.05, gt=0)
    """Largest relative increase of NE accepted (0.05: 5% worse than the reference). The
    reference is the model version's NE in its first monitored period."""
    min_positives: int = Field(default=200, ge=1)
    """A period counts only when the cell had at least this many positive labels."""
    periods: int = Field(default=1, ge=1)
    """Consecutive periods the NE must be worse than the bound."""


Rule = Annotated[Union[CalibrationRule, DriftRule, NeRegressionRule], Field(discriminator="kind")]


class Monitoring(_Strict):
    prediction_log: PredictionLog = Field(default_factory=PredictionLog)
    """The log of what serving predicted, which the monitor joins with labels."""
    metrics: bool = True
    """Serving counts requests, latencies and per-cell predictions and exposes them at
    `GET /metrics` in Prometheus' text format; off: no counters and no /metrics route."""
    rules: list[Rule] = Field(default_factory=list)
    """Checks over the per-cell series; one that trips is listed in the monitor's `tripped`."""
    cooldown_hours: float = Field(default=24.0, ge=0)
    """After a rule trips for a cell, the same rule and cell is not reported again for this long."""
    retrain_validation_share: float = Field(default=1.0, gt=0, le=1)
    """With `training.window`: the share of the window's newest day that a retrain a rule started
    holds out for validation (a hash of the example id); its teacher and student train on the rest.
    That newest day is the day the rule tripped on, so below 1 the retrain learns what changed
    instead of only fitting its calibration map to it. A scheduled or manual run keeps
    `training.window_validation`. See docs/monitoring.md."""
