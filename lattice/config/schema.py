"""Typed platform config: one YAML file declares sources, domains, objectives, features, models,
training, distillation, FP8, hashing, promotion, feature store and schedules.

Every model forbids unknown keys, so a misspelled key is an error that names it instead of a
setting that silently does nothing. Cross-field rules live in `PlatformConfig` validators;
`lattice.config.load` turns pydantic errors into messages naming the file, key path and fix.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from lattice.config.monitoring import Monitoring
from lattice.config.serving_limits import ClientLimits
from lattice.config.strict import Strict  # noqa: F401 (re-exported: sections import it from here)

NAME_RE = r"^[a-z][a-z0-9_]*$"
_TTL_RE = re.compile(r"^([1-9][0-9]*)([smhd])$")
_WINDOW_RE = re.compile(r"^(\d+)([hd])$")


# ---------------------------------------------------------------- sources


class DomainFromColumn(Strict):
    """The domain is read from a raw column (or a Spark SQL expression over raw columns) and
    mapped value -> domain name."""

    column: str | None = None
    """Raw column whose value picks the domain (give this or `expr`)."""
    expr: str | None = None
    """Spark SQL expression over raw columns whose value picks the domain, e.g. `substr(site_id, 1,
    2)` (give this or `column`)."""
    map: dict[str, str] = Field(min_length=1)
    """Value (compared as text) -> domain name."""
    default: str | None = None
    """Domain for values not in `map`; without it such rows are quarantined."""

    @model_validator(mode="after")
    def _one_of(self) -> "DomainFromColumn":
        if (self.column is None) == (self.expr is None):
            raise ValueError("give exactly one of 'column' or 'expr' to read the domain from")
        return self


NAMED_TIME_FORMATS = ("unix_seconds", "unix_millis", "iso", "constant")
_PATTERN_LETTERS = re.compile(r"[yMdHhmsSaXxZzVOEDkKuQLG]")


class EventTime(Strict):
    """How to read the event time. Logs without one (Criteo, MIND) use `format: constant` and
    `value`, so every row gets the same time (point-in-time aggregates then see no history)."""

    column: str | None = None
    """Raw column holding the event time (not used with `format: constant`)."""
    format: str = "iso"
    """`unix_seconds`, `unix_millis`, `iso` (ISO 8601 text), `constant` (every row at `value`), or
    any Spark datetime pattern such as `yyyyMMddHH`, `yyMMddHH`, `dd/MM/yyyy HH:mm` (see Spark's
    "Datetime Patterns for Formatting and Parsing"); times without a zone are UTC."""
    value: dt.datetime | None = None
    """The time of every row when `format` is `constant`."""

    @field_validator("format")
    @classmethod
    def _format(cls, v: str) -> str:
        if v in NAMED_TIME_FORMATS:
            return v
        if not _PATTERN_LETTERS.search(v) or "'" in v.replace("''", "") and v.count("'") % 2:
            raise ValueError(f"format {v!r} is neither one of {list(NAMED_TIME_FORMATS)} nor a Spark datetime "
                             "pattern (e.g. 'yyyyMMddHH' or 'yyyy-MM-dd HH:mm:ss')")
        return v

    @model_validator(mode="after")
    def _column_or_constant(self) -> "EventTime":
        if self.format == "constant":
            if self.value is None:
                raise ValueError("format 'constant' needs 'value' (e.g. 2026-01-01T00:00:00)")
        elif self.column is None:
            raise ValueError(f"format {self.format!r} needs 'column' (the raw time column)")
        return self


class LabelSpec(Strict):
    """A label is either a raw column holding 0/1 or a Spark SQL boolean/0-1 expression."""

    column: str | None = None
    """Raw column holding the label as 0/1. A row with an empty value is quarantined as
    `null_label`, one with any other value as `bad_label`."""
    expr: str | None = None
    """Spark SQL boolean or 0/1 expression over raw columns, e.g. `dwell_ms > 30000` (true counts as
    1)."""
    known_at: str | None = None
    """Raw column with the time the positive event happened (a conversion's own timestamp), read
    in the source's `event_time` format; empty on negatives. With the objective's `attribution`
    window, a training cutoff counts a positive only once it is known (`training.label_delay`). A
    positive without it, or with it before its impression, is quarantined (`label_time_missing`,
    `label_before_event`)."""

    @model_validator(mode="after")
    def _one_of(self) -> "LabelSpec":
        if (self.column is None) == (self.expr is None):
            raise ValueError("give exactly one of 'column' (a raw 0/1 column) or 'expr' (a Spark SQL expression)")
        return self


class Source(Strict):
    """One raw log of one or more domains."""

    name: str = Field(pattern=NAME_RE)
    """Names the source in errors, quarantined rows and the schema-drift record. It is also hashed
    into every example id, so renaming a source changes its examples' ids (and so their hash split)."""
    path: str
    """File, folder or glob; relative paths resolve against the config's `data_root`."""
    format: Literal["csv", "tsv", "parquet", "jsonl"]
    """`csv` (comma-separated), `tsv` (tab-separated), `parquet`, or `jsonl` (one JSON object per
    line); every file of the source has it."""
    header: bool = True
    """csv/tsv: the first line names the columns; with `false`, name them in `schema_columns`.
    Parquet and jsonl files name their own columns."""
    schema_columns: list[str] | None = None
    """Column names in file order, required for csv/tsv files without a header."""
    domain: str | DomainFromColumn
    """A domain name (constant) or {column, map, default}."""
    columns: dict[str, str] = Field(default_factory=dict)
    """Raw column name -> canonical name (feature columns and entity keys)."""
    event_time: EventTime
    """How each row's event time is read (see `EventTime`)."""
    labels: dict[str, LabelSpec] = Field(default_factory=dict)
    """Objective name -> how to read its label from this source."""
    truth: dict[str, str] = Field(default_factory=dict)
    """Objective name -> raw column with the true probability (synthetic data only; never trained on)."""
    expressions: dict[str, str] = Field(default_factory=dict)
    """Canonical column -> Spark SQL expression over this source's raw columns, for values a
    rename cannot give (strip an id prefix, derive a category, cast a type), e.g.
    `{ad_id: "regexp_replace(creative, '^cr-', '')"}`. A column may be in `columns` or here, not both."""
    key: list[str] = Field(default_factory=list)
    """Raw columns that identify one event (an impression id, a request id + ad). Rows of this
    source that share a key are one event logged twice: the first is kept, the rest are
    quarantined as `duplicate_key`. Empty (the default): every raw row is its own event, and
    identical rows stay distinct examples (they are counted in the stage summary)."""
    passthrough: list[str] = Field(default_factory=list)
    """Raw columns that are not features (row id, event id, request id) carried as text to the
    consolidated table, the training set and every predictions file, so scores join back."""
    split: Literal["train", "validation", "test"] | None = None
    """With `training.split.kind: source`: the split every row of this source belongs to."""

    @model_validator(mode="after")
    def _headerless_needs_schema(self) -> "Source":
        if self.format in ("csv", "tsv") and not self.header and not self.schema_columns:
            raise ValueError("a csv/tsv source without a header needs 'schema_columns' (column names in file order)")
        both = sorted(set(self.expressions) & set(self.columns.values()))
        if both:
            raise ValueError(f"canonical column(s) {both} are given both by 'columns' and by 'expressions'; keep one")
        return self

    def domains(self) -> list[str]:
        if isinstance(self.domain, str):
            return [self.domain]
        names = list(dict.fromkeys(self.domain.map.values()))
        if self.domain.default and self.domain.default not in names:
            names.append(self.domain.default)
        return names

    def canonical_columns(self) -> set[str]:
        return set(self.columns.values()) | set(self.expressions)


# ---------------------------------------------------------------- domains and objectives


class Domain(Strict):
    name: str = Field(pattern=NAME_RE)
    """The domain (ad surface) that objectives and sources refer to; written to the `domain` column
    and used in every per-domain report."""
    description: str = ""
    """Free text for people reading the config; no stage reads it."""
    min_rows: int = Field(default=1, ge=0)
    """Validation: the consolidated table must hold at least this many rows of the domain."""


class Objective(Strict):
    name: str = Field(pattern=NAME_RE)
    """Names the label (the `label_<name>` and `mask_<name>` columns), the model head, and what
    sources' `labels`, aggregates and `given` refer to."""
    loss_weight: float = Field(default=1.0, gt=0)
    """Multiplies this objective's terms (label and teacher soft-label) in the training loss; above
    1 favours it over the others."""
    domains: list[str] = Field(min_length=1)
    """Domains whose logs carry this label; elsewhere the label is masked, never a fake negative."""
    label_rate: tuple[float, float] = (0.0, 1.0)
    """Validation bounds on the observed label rate per domain."""
    given: str | None = None
    """Another objective this one can only follow (a conversion follows a click). Multi-objective
    models then predict P(this | given) and output P(given) · P(this | given), trained on every
    impression (ESMM, Ma et al. 2018), instead of an unrelated head for a rare label."""
    attribution: str | None = None
    """Attribution window (`7d`, `12h`): a positive counts only if it happens within this time of
    its impression, and at a training cutoff an impression whose window is still open is not yet a
    negative (`training.label_delay`). Unset: the label is known at the impression's time."""

    @field_validator("attribution")
    @classmethod
    def _attribution(cls, v: str | None) -> str | None:
        if v is not None:
            from lattice.config.timing import parse_duration

            parse_duration(v)
        return v

    @field_validator("label_rate")
    @classmethod
    def _rate_bounds(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0.0 <= v[0] <= v[1] <= 1.0:
            raise ValueError("label_rate must be [low, high] with 0 <= low <= high <= 1")
        return v


# ---------------------------------------------------------------- features

Hashing = Literal["none", "vocab", "modulo", "qr", "mixed", "zch", "learned"]
HASHING_NEEDS_FIT = ("vocab", "mixed", "learned")
"""Schemes whose id -> row map is fitted on the training window (`lattice hashing fit`)."""
LEARNED_MIN_COUNT = 3
"""`min_count` of a `learned` feature that sets none (see `SparseFeature.min_count`)."""


class SparseFeature(Strict):
    name: str = Field(pattern=NAME_RE)
    """Names the embedding table and the feature in reports; `--set
    features.sparse.<name>.KEY=VALUE` addresses it."""
    column: str
    """Canonical column (after a source's column mapping)."""
    embedding_dim: int = Field(default=16, ge=1, le=1024)
    """Width of this feature's embedding table; a model uses min(this, its own `embedding_dim`) and
    projects it to its token width."""
    num_embeddings: int = Field(default=100_000, ge=2)
    """Row budget of this feature's embedding table(s) (before a model's `table_scale`). A raw value
    becomes an integer id (an integer as it is, other text hashed to 60 bits) and `hashing` maps
    the id to a row; compressed schemes spend this budget across their tables."""
    hashing: Hashing = "modulo"
    """How an id picks a row. `modulo`: id mod rows (ids beyond the table share rows). `none`: the
    id is the row (an id outside [0, num_embeddings) is refused). `vocab`: every id seen at least
    `min_count` times in the training window gets its own row, the rest one out-of-vocabulary row.
    `qr`: a quotient and a remainder table combined by `qr_combine` (no two ids of the id space share
    both rows). `mixed`: the frequent ids get full-width rows, the tail narrower rows (α-power
    rule, `mixed_alpha`), both projected to the token width. `zch`: TorchRec's managed-collision
    table (LFU eviction). `learned`: frequent ids get rows of their own, the rest are clustered so
    that similar ids share a row, unseen ids fall into a reserved hashed range. `vocab`, `mixed`
    and `learned` need `lattice hashing fit CONFIG` after the features stage (the teacher DAG's
    first task; under training.window, on the teacher's train days)."""
    min_count: int | None = Field(default=None, ge=1)
    """`vocab`, `mixed`, `learned`: an id must appear this many times in the training window to be
    in the fitted map; rarer ids are treated as unseen. Unset: 1 for `vocab` and `mixed` (every
    seen id), `LEARNED_MIN_COUNT` (3) for `learned`, whose ids seen once or twice then train the
    hashed range that ids never seen are served from (with every seen id in the map, that range
    got no training row and served unseen ids from its initial weights). Chosen on the Taobao
    sample (3 seeds, 16x: mean test NE 0.9186 with 1, 0.9148 with 2, 0.9079 with 3, 0.9131 with
    5); checked on the demo at 1M rows (0.9465 -> 0.9459, 2 seeds) and Avazu (0.9578 -> 0.9501, 3
    seeds) (bench/README.md, "Learned hashing: ids seen fewer than 3 times")."""
    qr_combine: Literal["mul", "add", "concat"] = "mul"
    """`qr`: how the quotient and remainder embeddings combine: element-wise product (the paper's
    best), sum, or concatenation of two half-width embeddings."""
    qr_buckets: int | None = Field(default=None, ge=2)
    """`qr`: rows of the remainder table (ids mod this), at most `num_embeddings` - 2; the quotient
    table gets the rest of the budget. A model with a smaller `table_scale` scales it alike. Unset:
    half the budget each."""
    learned_frequent_share: float = Field(default=0.5, gt=0, lt=1)
    """`learned`: share of the row budget given to the most frequent ids, one row each."""
    learned_unseen_share: float = Field(default=0.05, gt=0, lt=1)
    """`learned`: least share of the row budget reserved for ids outside the map (never seen, or
    seen fewer than `min_count` times), hashed into it. When such ids carry a larger share of the
    rows outside the frequent head, the range grows to that share of the rows there."""
    mixed_alpha: float = Field(default=0.3, ge=0, le=1)
    """`mixed`: exponent of the α-power rule; a block's width scales with its ids' popularity to
    this power (0: every block full width)."""
    zch_eviction_interval: int = Field(default=1000, ge=1)
    """`zch`: training steps between the managed-collision table's LFU evictions and inserts."""
    entity: bool = False
    """An entity key (user, ad, ...): aggregates and Feast entities can join on it."""

    def fit_min_count(self) -> int:
        """`min_count`, or the scheme's default when unset."""
        if self.min_count is not None:
            return self.min_count
        return LEARNED_MIN_COUNT if self.hashing == "learned" else 1


class DenseFeature(Strict):
    name: str = Field(pattern=NAME_RE)
    """Names the feature in reports; `--set features.dense.<name>.KEY=VALUE` addresses it."""
    column: str
    """Canonical numeric column (after a source's column mapping). An empty value reads as 0 with
    `<column>_present` = 0 (the models see both); non-numeric text is quarantined as `bad_value`."""
    transform: Literal["none", "log1p", "standardize", "clip"] = "none"
    """Applied before standardizing: `log1p` (log(1 + max(x, 0)), for heavy-tailed counts and
    prices), `clip` (to `clip`) or `none`. Every dense input is then z-scored with the train split's
    mean and std, so `standardize` is the same as `none`."""
    clip: tuple[float, float] | None = None
    """[low, high] bounds for `transform: clip`; without them `clip` leaves values as they are."""
    valid_range: tuple[float | None, float | None] | None = None
    """[low, high] of plausible raw values (either may be null: unbounded), e.g. `[0, null]` for a
    price. A value outside is quarantined as `value_out_of_range`, never trained on. NaN and ±inf
    are always quarantined (`bad_value`), and so are values `log1p` cannot take (<= -1)."""


class AggregateFeature(Strict):
    """Point-in-time counts and rates of an objective per entity over trailing windows."""

    name: str = Field(pattern=NAME_RE)
    """Prefix of its columns (`<name>_<statistic>_<window>`) and the name of its Feast feature view."""
    entity: str
    """Name of a sparse feature with `entity: true`."""
    objective: str
    """Objective whose labelled events of the entity are counted."""
    windows: list[str] = Field(min_length=1)
    """Trailing windows in hours or days ('12h', '7d'). Each counts the entity's events in [t -
    window, t), strictly before the example's own time, so no example sees its own label."""
    statistics: list[Literal["count", "positives", "rate"]] = Field(default_factory=lambda: ["count", "positives", "rate"])
    """Columns per window, named `<name>_<statistic>_<window>`: `count` (labelled events),
    `positives` (those with label 1), `rate` (positives / count, 0 with no events)."""

    @field_validator("windows")
    @classmethod
    def _windows(cls, v: list[str]) -> list[str]:
        for w in v:
            if not _WINDOW_RE.match(w):
                raise ValueError(f"window {w!r} must look like '12h' or '7d'")
        return v

    def window_hours(self) -> list[int]:
        out = []
        for w in self.windows:
            n, unit = _WINDOW_RE.match(w).groups()  # type: ignore[union-attr]
            out.append(int(n) * (24 if unit == "d" else 1))
        return out


class Features(Strict):
    sparse: list[SparseFeature] = Field(min_length=1)
    """Categorical features, one embedding table each; entity keys are among them."""
    dense: list[DenseFeature] = Field(default_factory=list)
    """Numeric features, fed to the models after `transform` and z-scoring."""
    aggregates: list[AggregateFeature] = Field(default_factory=list)
    """Point-in-time counts and rates of an objective per entity, computed by Spark and served
    through Feast."""


# ---------------------------------------------------------------- models


class ModelSize(Strict):
    """One Lattice network; teacher and student are the same code at different sizes."""

    embedding_dim: int = Field(default=16, ge=2)
    """Token width: every embedding and dense projection is mapped to this width. It also caps
    each table's width: a table is min(feature.embedding_dim, embedding_dim) wide."""
    table_scale: float = Field(default=1.0, gt=0, le=1)
    """Fraction of each table's rows this model uses (ids are re-hashed into the smaller table)."""
    num_layers: int = Field(default=2, ge=0)
    """Wukong-style interaction layers (FM block + linear compression block)."""
    num_tokens: int = Field(default=8, ge=1)
    """Tokens each interaction layer outputs."""
    fm_rank: int = Field(default=8, ge=1)
    """Rank k of each interaction layer's factorization-machine block: the N tokens interact with k
    learned mixes of themselves, O(N·k·D) instead of O(N²·D)."""
    head_dims: list[int] = Field(default_factory=lambda: [64])
    """Hidden layer widths of each objective's head (an MLP ending in one logit)."""
    shared_dims: list[int] = Field(default_factory=list)
    """Hidden layers shared by every objective's head, between the interaction stack and the
    heads (empty: each head reads the tokens alone). A rare objective (conversion) then reuses
    what the frequent one (click) teaches the shared layers."""
    experts: int = Field(default=1, ge=1)
    """With `shared_dims`: more than 1 makes that many shared stacks (experts), mixed per
    objective by a softmax gate (MMoE on top of the interaction stack)."""
    domain_token: bool = True
    """Add a learned embedding of the example's domain as one more input token, so every interaction
    can depend on the domain."""
    domain_untied: bool = False
    """Give every domain its own final interaction layer (parameter untying)."""
    domain_fm: int = Field(default=0, ge=0)
    """Channels of domain-weighted pairwise interactions: for each channel c, every pair of input
    tokens contributes x_i · diag(s[domain, c]) · x_j, with a learned weight vector per (domain,
    channel). A dot product of embeddings is one fixed bilinear form; these give each domain its
    own (a domain-specific interaction metric, as STAR's domain-times-shared weights do for MLPs).
    0: off."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout probability after every hidden layer of the interaction blocks, shared stacks and
    heads (0: off)."""
    bias: Literal["all", "final"] = "all"
    """Mod: `final` drops the bias of every layer (LayerNorms included) except each head's last
    (its prediction layer); fewer operands for FP8 GEMMs and their scales."""
    block_norm: int = Field(default=0, ge=0)
    """Mod: parameter-free grouped RMS normalisation over fixed blocks of this many features after
    every hidden activation (keeps FP8 inputs in range); a width that is not a multiple ends in
    one shorter block; 0: off."""
    activation: Literal["relu", "hardswish"] = "relu"
    """Mod: the hidden layers' activation."""
    numeric: Literal["none", "ple", "quantile", "periodic"] = "ple"
    """Encoding of each dense column before the dense MLP (lattice.models.numeric): `ple`
    piecewise-linear over the column's train quantile bins, `quantile` a learned embedding of its
    quantile bucket, `periodic` learned-frequency sin/cos then Linear + ReLU; `none` the z-score
    alone. Every one clamps NaN, ±inf and huge inputs into the train range first. `ple` by
    default: chosen on the Criteo sample's heavy-tailed counts (test NE -1.24%, better at each of
    4 seeds), confirmed neutral-or-better on the synthetic demo (100k: -0.01% / -0.75%; 1M, mean
    of 2 seeds: -0.01% / +0.02%) at the same training time (bench/bench_numeric.py)."""
    numeric_bins: int = Field(default=16, ge=2, le=128)
    """Quantile bins of `ple` and `quantile` (edges fitted on the train split), and the width of
    each column's encoded vector (for `periodic` too: its frequencies and output width)."""
    dense_tokens: int = Field(default=4, ge=1)
    """Tokens the encoded dense columns become (the dense MLP's output, `dense_tokens` x
    `embedding_dim`), next to one token per sparse feature. 4 by default, chosen on the Taobao
    (12 aggregate columns) and Criteo (26) samples over 2, 3, 6, 8 and one per column (3-seed
    means, test NE: Taobao engage -0.26%, buy -0.9%, Criteo -1.1% against 2); on the demo (200k
    rows, 2 seeds) and Avazu (3 columns, 3 seeds) it was within +-0.2% of 2 (bench/README.md).
    Models saved before this key existed were built with 2, and rebuild so."""
    dense_context: bool = False
    """The encoded dense columns (the `numeric` encoding, before the dense MLP) also join the
    context the heads (or the experts and their gates) read, next to every layer's tokens. The
    tokens squeeze them through the dense MLP; a monotone effect of one column (price on
    conversion) reads more easily from its piecewise-linear code. Off by default: on the Criteo
    and Taobao samples it was within noise (3 seeds, test NE Criteo 0.8753 against 0.8755, Taobao
    engage / buy 0.9362 / 0.8419 against 0.9349 / 0.8422); on the synthetic demo it took the
    validation NE of conversion from 0.9852 to 0.9783 at 150k rows (3 seeds) and from 0.9653 to
    0.9616 at 600k (2 seeds), where the MMoE baseline is at 0.9775 and 0.9614 (bench/README.md,
    "Dense codes in the context")."""


class Gbdt(Strict):
    """LightGBM settings of the gradient-boosted-trees baselines (`gbdt`, `gbdt_cell`). They read
    the same split and features as the deep models: the dense columns after the platform's
    transform, the sparse ids encoded from the train split alone."""

    num_leaves: int = Field(default=15, ge=2)
    """Leaves per tree (LightGBM `num_leaves`). The defaults here are regularised for ad logs, where
    the rare objectives (conversions) have few positives per cell: on the demo's validation split
    15 leaves, 100 rows per leaf and an L2 of 10 beat LightGBM's own defaults in every setting tried."""
    learning_rate: float = Field(default=0.05, gt=0, le=1)
    """Shrinkage of every tree (LightGBM `learning_rate`)."""
    max_rounds: int = Field(default=1000, ge=1)
    """Most boosting rounds (trees) per booster; early stopping on the validation split usually ends
    sooner."""
    early_stopping_rounds: int = Field(default=50, ge=1)
    """Stop when the validation split's log loss has not improved for this many rounds; the booster
    keeps its best round. A booster without validation rows runs `max_rounds`."""
    min_data_in_leaf: int = Field(default=100, ge=1)
    """Fewest training rows per leaf (LightGBM `min_data_in_leaf`): small cells overfit without it."""
    lambda_l2: float = Field(default=10.0, ge=0)
    """L2 penalty on leaf values (LightGBM `lambda_l2`): shrinks the leaves fitted on few positives."""
    max_categories: int = Field(default=100, ge=0)
    """A sparse feature with at most this many distinct ids in the train split is a LightGBM
    categorical; one with more is count-encoded (its id's number of train rows), because
    categorical splits over a large id space fit the noise of rare ids. 0: count-encode every one."""
    max_train_rows: int | None = Field(default=None, ge=1)
    """Fit on a seeded uniform sample of at most this many train rows (the validation and test
    splits stay whole); unset: every train row. Bounds memory on large tables."""
    num_threads: int | None = Field(default=None, ge=1)
    """LightGBM threads; unset: the cores this process may run on. Set it lower where other jobs
    share the cores (an Airflow worker running tasks side by side): OpenMP threads that spin on
    an oversubscribed machine make each round several times slower."""


class Baselines(Strict):
    separate: bool = True
    """One model per (domain, objective): the world before Lattice."""
    pooled: bool = True
    """One single-task model per objective on all domains."""
    multitask: Literal["none", "shared_bottom", "mmoe"] = "mmoe"
    """The multi-task baseline: `mmoe` (4 experts mixed per objective by a gate), `shared_bottom`
    (one shared bottom MLP) or `none`."""
    size: ModelSize = Field(default_factory=lambda: ModelSize(num_layers=1))
    """Network size shared by every baseline model."""
    gbdt: bool = True
    """Gradient-boosted trees (LightGBM) pooled per objective, model `gbdt`: one booster per
    objective over every domain, the domain a categorical feature. The reference every deep model
    must beat on the user's data."""
    gbdt_cell: bool = True
    """Gradient-boosted trees per (domain, objective) cell, model `gbdt_cell`: one booster per cell."""
    trees: Gbdt = Field(default_factory=Gbdt)
    """LightGBM settings of `gbdt` and `gbdt_cell`."""


class TreeLeaves(Strict):
    """Leaf features (He et al. 2014): a LightGBM fitted on the train split turns each row into
    one leaf id per tree, and the ids of each objective's forest enter the teacher or the student
    as one more sparse feature (one token per objective: a pooled bag of one id per tree, in a
    table of `num_trees * num_leaves` rows; `pooling`). On for both networks by default. `lattice trees fit` fits the trees (one
    booster per objective, `num_trees` and `num_leaves` here, the other LightGBM settings of
    `baselines.trees`); a model listed here refuses to train without that fit, and carries it in
    its model.pt (boosters, encodings, fit identity) and lineage; its export carries the fit as
    `trees.json`, and the predictor computes each request's leaf ids with LightGBM from the raw
    columns (docs/bench/tree-leaves.md: figures, latency and why on by default)."""

    models: list[Literal["teacher", "student"]] = Field(default_factory=lambda: ["teacher", "student"])
    """The networks that read leaf ids (empty: none). Default: both, the student also on the
    trees' margin (`margin`), the fit's share chosen by `fit_share: auto`. Chosen on the demo at
    200k rows and Bank Marketing's random split, confirmed on Bank's time split, Taobao and Criteo
    (2 seeds each): against the same networks without leaves, the served student was better beyond
    noise on Bank (both splits), Criteo and demo click, within noise on demo conversion and Taobao,
    and never worse beyond noise; the teacher better beyond noise on Bank, within noise elsewhere
    (docs/bench/tree-leaves.md, "On by default"). Costs: the `fit_trees` task (seconds; the teacher
    DAG's first, on the teacher's days), LightGBM in the serving process, about 0.15 ms of CPU per
    single request. Before training outside the pipeline: `lattice trees fit CONFIG [--end DATE]`
    after `lattice features`."""
    num_trees: int = Field(default=50, ge=1)
    """Most trees fitted per objective (early stopping on validation may keep fewer), hence leaf
    ids per row and objective."""
    num_leaves: int = Field(default=15, ge=2)
    """Leaves per tree (LightGBM `num_leaves`): the id space of each tree's feature. 15 (the
    `gbdt` baseline's size) against 31 on Bank Marketing, 3 seeds: teacher test NE 0.8242 against
    0.8286 on a random split, level on the time-ordered one; on Taobao buy it cost the teacher
    less (docs/bench/tree-leaves.md)."""
    pooling: dict[Literal["teacher", "student"], Literal["mean", "sum"]] = Field(
        default_factory=lambda: {"teacher": "mean", "student": "mean"})
    """How each network pools a forest's leaf rows (one per tree) into its token: `mean` keeps the
    token on the scale of one feature's embedding; `sum` (the booster's additive form) makes it up
    to `num_trees` times larger and, under the sparse optimizer's per-row steps, moves it that
    much faster. One word (`pooling: mean`) sets both. Default: `mean` for both. For the teacher,
    chosen on the demo (sum cost it NE on both objectives) and Bank Marketing (level), confirmed
    on Taobao and Criteo (sum's cost there gone). For the student, Bank preferred `sum` (it kept
    101% of its teacher's gain over separate models against 89%) and Taobao `mean` (buy 83%
    against 0%): `mean`, for the better worst case (docs/bench/tree-leaves.md, "Pooling"). A
    model saved before this key existed summed, and rebuilds so."""

    @field_validator("pooling", mode="before")
    @classmethod
    def _one_word_for_both(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"teacher": v, "student": v}
        if isinstance(v, dict):
            return {"teacher": "mean", "student": "mean", **v}
        return v

    fit_share: float | Literal["auto"] = "auto"
    """Cross-fitting: the share of the train split's rows the trees are fitted on, in (0, 1], or
    `auto`. A train row is in the share when the hash of its example id
    (`lattice.trees.leaves.fit_fraction`: sha256 of `<example_id>|trees-fit`, independent of the
    split's own hash) is below it, whatever the table's order or partitioning. Below 1, `lattice
    trees fit` reads only those rows (validation still stops it early) and records the share, the
    row counts and the rule in its manifest and lineage; while a network trains, those rows get an
    empty bag of leaf ids (a zero token under `mean` pooling), so the leaf embeddings learn only
    from train rows the trees never saw. Validation, test, scoring and serving rows keep their leaf
    ids, and so do the train rows of a network in `margin` (its margin needs every row's leaves). A
    model follows the fit it carries; a fit or model.pt made before this key existed is a share of
    1. `auto` (the default) fits on every train row, measures each booster's optimism ((validation
    NE - NE on its own rows) / validation NE) and refits on 0.7 of the rows when one exceeds 0.04;
    the manifest says which and why. Chosen on the demo at 200k rows (optimism 0.053;
    0.7 removes the leaves' cost there, conversion 0.9897 -> 0.9680, beyond noise) and Bank
    Marketing's random split (0.031; every share below 1 costs beyond noise), confirmed on Bank's
    time split (0.046: 0.7, better beyond noise), Taobao (0.038: 1) and Criteo (0.096: 0.7), both
    within noise either way; with the leaves in both networks and the student on their margin, the
    student at auto was better than at 1 on the demo (click, beyond noise) and Bank's time split,
    level on Criteo (docs/bench/tree-leaves.md, "fit_share: auto")."""
    margin: list[Literal["teacher", "student"]] = Field(default_factory=lambda: ["student"])
    """Of the networks in `models` (others are ignored), those whose logits also start at the
    boosters' raw score: the sum of a row's leaf values, kept frozen in the model and the
    artifact, so the heads learn the residual on top of the trees (boosting the network from the
    forest). Not for an objective
    chained by `given` (its head is conditional, the booster is not). Default: the student only.
    Chosen on Bank Marketing (random split, 2 seeds): the student with it keeps 96% of its
    teacher's gain over separate models (68% without; with the tokens pooled by mean, 89% against
    1%); confirmed on Taobao and Criteo (seed 0),
    where it is as good or better than the student without it. The teacher stays off: on Taobao
    the teacher with it stays at the trees' level, beyond noise behind the one without
    (docs/bench/tree-leaves.md)."""

    tokens: list[Literal["teacher", "student"]] = Field(default_factory=lambda: ["teacher", "student"])
    """Of the networks in `models`, those that turn each forest's leaf ids into a token (an
    embedding table of `num_trees * num_leaves` rows, one more input token per objective). A network
    in `margin` and not here reads the leaf ids for its margin only: no leaf table, no extra token,
    so its forward costs what it costs without the trees. Default: both. On the demo student, margin
    only cut the tree part's CPU per 256-row call from 1.67 to 1.29 ms (LightGBM and the boosters'
    matrix remain) but was behind the student with tokens on 5 of 7 objectives of five tables (by
    0.0015 to 0.0077 NE; better on Taobao engage) (docs/bench/tree-leaves.md, "The demo's student").
    A model saved before this key existed has its tokens."""

    @model_validator(mode="after")
    def _leaves_go_somewhere(self) -> "TreeLeaves":
        idle = [k for k in self.models if k not in self.tokens and k not in self.margin]
        if idle:
            raise ValueError(f"models.leaves.models lists {idle} but neither models.leaves.tokens nor models.leaves.margin "
                             f"does: such a network would read leaf ids for nothing. Add it to tokens or margin, or "
                             f"remove it from models")
        return self

    @field_validator("fit_share")
    @classmethod
    def _a_share(cls, v: float | str) -> float | str:
        if v != "auto" and not 0.0 < v <= 1.0:  # NaN too
            raise ValueError(f"models.leaves.fit_share is the share of the train split's rows the trees are fitted on, "
                             f"in (0, 1] (1: every train row), or auto; got {v}")
        return v


class Models(Strict):
    teacher: ModelSize = Field(default_factory=lambda: ModelSize(embedding_dim=32, num_layers=3, num_tokens=16, head_dims=[128]))
    """The large multi-domain multi-objective network; its scores are the student's soft labels."""
    student: ModelSize = Field(default_factory=lambda: ModelSize(embedding_dim=8, num_layers=1, num_tokens=4, head_dims=[32]))
    """The small network distilled from the teacher: the one exported, gated and served. No size key
    may exceed the teacher's."""
    baselines: Baselines = Field(default_factory=Baselines)
    """Reference models trained next to the teacher, to measure what sharing across domains and
    objectives gains."""
    leaves: TreeLeaves = Field(default_factory=TreeLeaves)
    """Leaf features from gradient-boosted trees for the deep models; on for both by default."""


# ---------------------------------------------------------------- training and later stages


class SplitSpec(Strict):
    """How examples are assigned to train / validation / test: decided once per example in the
    feature stage, stored in the `split` column of the consolidated table, and used by every
    model, evaluation and report."""

    kind: Literal["hash", "time", "column", "source"] = "hash"
    """`hash`: a hash of the example id (fractions `training.validation_fraction` and
    `training.test_fraction`); `time`: train before `validation_start`, validation until
    `test_start`, test after (how ads models are evaluated: no peeking at the future); `column`:
    a raw column every source carries (`column`, values mapped by `values`); `source`: each
    source's own `split`."""
    validation_start: dt.datetime | None = None
    """kind time: the first instant of the validation period (UTC)."""
    test_start: dt.datetime | None = None
    """kind time: the first instant of the test period (UTC)."""
    column: str | None = None
    """kind column: the raw column that names each row's split."""
    values: dict[Literal["train", "validation", "test"], list[str]] = Field(
        default_factory=lambda: {"train": ["train"], "validation": ["validation", "valid", "val", "dev"], "test": ["test"]})
    """kind column: raw values per split; a row with any other value is quarantined as `bad_split`."""

    @model_validator(mode="after")
    def _complete(self) -> "SplitSpec":
        if self.kind == "time":
            if self.validation_start is None or self.test_start is None:
                raise ValueError("split kind 'time' needs 'validation_start' and 'test_start' (e.g. 2026-01-12T00:00:00)")
            if self.test_start < self.validation_start:
                raise ValueError(f"test_start ({self.test_start}) must not be before validation_start ({self.validation_start})")
        if self.kind == "column" and not self.column:
            raise ValueError("split kind 'column' needs 'column' (the raw column holding train / validation / test)")
        return self


from lattice.config.timing import Zipper  # noqa: E402 (kept beside its first use)


class Training(Strict):
    split: SplitSpec = Field(default_factory=SplitSpec)
    """How examples are split into train / validation / test (see `SplitSpec`)."""
    label_delay: Literal["mask", "zipper", "naive"] = "mask"
    """How a training cutoff treats labels not yet known (objectives with `attribution`): `mask`
    leaves an impression out of that objective's loss while its attribution window is open at the
    cutoff; `zipper` gives the teacher and the student one head per window of `training.zipper`
    (each impression trains the head of its hashed window once that window has closed; the longest
    window's head is the one served); `naive` takes every conversion not yet seen as a negative
    (biased low; kept only to measure against, bench/bench_delayed_labels.py)."""
    zipper: Zipper | None = None
    """With `label_delay: zipper`: its windows and shares (see `Zipper`); refused otherwise."""
    batch_size: int = Field(default=1024, ge=1)
    """Examples per optimizer step over all ranks (each of N ranks loads batch_size / N)."""
    epochs: int = Field(default=2, ge=1)
    """Passes over the train split. The validation macro NE is measured `evals_per_epoch` times per
    epoch (always at its end) and the weights of the best evaluation are kept."""
    evals_per_epoch: int = Field(default=1, ge=1)
    """Validations per epoch, evenly spaced in optimizer steps (the last at the end of the epoch);
    1 validates at epoch ends only. A share of the epoch rather than a step count, so the same
    value fits a 10k-row sample and a 10M-row log: CTR models with id embeddings often peak inside
    their first or second pass and then over-fit, and the best of these points is the model kept.
    1 by default: 4 cost about a quarter more training time and kept the same model on the demo
    data (50k, 200k rows) and a worse one on Avazu, whose small validation split is noisy
    (bench/README.md). Measured again with early stopping (docs/bench/early_stopping.md, 3
    seeds): 2 or 4 kept a worse model on test than 1 on Avazu and MIND (+0.009 to +0.036 macro NE)
    and a better one on Douban (-0.011 to -0.015), so 1 was chosen; on Criteo, Taobao and the
    demo data 4 with `early_stopping_patience` 2 was better (-0.0012 to -0.0026). More pays where
    validation is large and the peak comes mid-epoch; raise the patience to 2 with it (at 0 or
    1 the noise between quarter-epoch points stopped runs too early)."""
    lr_dense: float = Field(default=1e-3, gt=0)
    """Adam learning rate of the dense parameters (interaction layers, MLPs, projections); see
    `lr_decay_to`."""
    lr_sparse: float = Field(default=0.05, gt=0)
    """Learning rate of the embedding tables' `sparse_optimizer`, applied inside the backward pass,
    for the first epoch (see `lr_sparse_after_first_epoch`)."""
    lr_sparse_after_first_epoch: float = Field(default=0.0, ge=0, le=1)
    """The tables' learning rate from the second epoch on, as a fraction of `lr_sparse` (0, the
    default, freezes them: later epochs fine-tune the dense part on the first epoch's embeddings).
    CTR models with id embeddings over-fit as soon as they see the training rows a second time
    (validation NE jumped 0.06-0.8 at epoch 2 on every set measured); with the tables frozen and
    `lr_dense_after_first_epoch` 0.1 the rise at epoch 2 stayed within noise (bench/README.md,
    "One-epoch collapse"). 1 keeps the rate constant."""
    lr_dense_after_first_epoch: float = Field(default=0.1, ge=0, le=1)
    """The dense learning rate from the second epoch on, as a fraction of the `lr_decay_to`
    schedule's rate (0 freezes the dense part after the first epoch; 1 keeps the schedule). With
    the tables frozen the dense part alone still over-fits a second full-rate pass on small data
    (Avazu, Criteo, MIND, Douban samples); a tenth of the rate lets later epochs refine it."""
    lr_decay_to: float = Field(default=1.0, gt=0, le=1)
    """The dense learning rate at the end of the last epoch, as a fraction of lr_dense: it falls
    linearly over the planned steps (epochs x training rows / batch_size). Below 1, training ends
    on an average of many batches rather than on the noise of the last few; 1 keeps it constant."""
    sparse_optimizer: Literal["adagrad", "sgd", "rowwise_adagrad"] = "rowwise_adagrad"
    """Optimizer of the embedding tables: `rowwise_adagrad` (one accumulator per row: Adagrad's
    per-row step size at 1/dim of its state), `adagrad` or `sgd`."""
    validation_fraction: float = Field(default=0.1, gt=0, lt=1)
    """With `split.kind: hash`: the share of examples in the validation split (early stopping and
    best-epoch choice). The train share, 1 - validation_fraction - test_fraction, also sizes the
    planned steps of the `lr_decay_to` schedule."""
    test_fraction: float = Field(default=0.1, gt=0, lt=1)
    """With `split.kind: hash`: the share of examples in the test split, held out from training and
    validation; reported metrics are measured on it."""
    early_stopping_patience: int = Field(default=0, ge=0)
    """Validations in a row (see `evals_per_epoch`; epochs at its default of 1) without a better
    validation macro NE that training tolerates: it stops after patience + 1 of them, so 0 (the
    default) stops at the first validation that does not beat the best so far (a tie is no gain).
    The best validation's weights are kept either way; the run's summary, metrics.json
    (`training`), `lattice train` and the report say which validation was kept and why training
    stopped. 0 by measurement (docs/bench/early_stopping.md): chosen on Avazu, MIND and Douban (3
    seeds, curves of 8 epochs), where a longer patience never kept a better model and 0 took
    0.67-0.78x the training time of a full 3-epoch run (2.0-2.3 epochs when 8 were allowed);
    confirmed on Criteo, Taobao and the demo data, with the same kept model. With the tables frozen
    after the first epoch a validation NE that has risen did not come back down. Raise it with
    `evals_per_epoch` above 1, or where later epochs still help after a worse one."""
    nproc: int = Field(default=0, ge=0)
    """Training processes (torchrun ranks) that share the embedding tables; 1 trains in the calling
    process without sharding. `--nproc` overrides it. 0 (the default) chooses from the machine: one
    rank per GPU when training runs on CUDA, else 1 process. The ranks of one CPU machine share its
    cores, so they add torchrun's launch and the tables' all-to-all without adding compute: on 2
    cores 1 process trained 1.5-1.8x faster end to end than 2 ranks at 200k demo rows and 4-6x faster
    on the 8k-row Avazu and MIND samples (bench/README.md). Multi-process sharding on CPU is for
    tables that outgrow one process, and for multi-node runs (the scale-out profile)."""
    threads: int = Field(default=0, ge=0)
    """Intra-op threads of each CPU training rank (torch.set_num_threads). 0 (the default) chooses
    from the model: one thread per 300 MFLOP of dense forward work per step and rank, at least 1,
    at most the rank's share of the cores (lattice.training.threads). The small networks of CTR
    models gain little from splitting each op: on 2 cores one thread trained 1.5-4.6x faster than
    two at 20-130 MFLOP per step (bench/README.md), two were faster at 715. Ignored on CUDA."""
    sharding_types: list[Literal["table_wise", "column_wise", "table_column_wise", "data_parallel", "row_wise",
                                 "table_row_wise"]] = Field(
        default_factory=lambda: ["table_wise", "column_wise", "data_parallel", "row_wise", "table_row_wise"]
    )
    """TorchRec sharding kinds the planner may choose from for each embedding table. On CPU
    (`device`) `row_wise` and `table_row_wise` are dropped: they need reduce-scatter, which gloo
    lacks; on CUDA (nccl) the planner may use them, so a table larger than one GPU's memory can be
    split by rows."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the ranks train: `cuda` (one GPU per rank, the nccl backend, batches moved to the GPU,
    fbgemm's fused GPU table kernels), `cpu` (gloo, CPU kernels) or `auto` (cuda when
    `torch.cuda.is_available()`, else cpu). A checkpoint written on one resumes on the other (a
    row-wise table resumes table-wise on CPU)."""
    collective_timeout_s: float = Field(default=600, gt=0)
    """Seconds a rank waits in one collective (all-reduce, all-to-all, barrier) before it fails.
    It bounds how long the surviving ranks of a multi-node run can hang on a peer that died
    without closing its connections (a lost node); a rank killed on a reachable host is noticed at
    once. Raise it if one step or one checkpoint save takes longer."""
    checkpoint_every: int = Field(default=1000, ge=0)
    """Optimizer steps between checkpoints inside an epoch (0: at epoch ends only), so a killed or
    interrupted run resumes (`--resume`) from its last step rather than its last epoch."""
    seed: int = 0
    """Seeds model initialization and the per-epoch shuffle of the train split, so a rerun with the
    same ranks and workers sees the same batches."""
    num_workers: int = Field(default=0, ge=0)
    """Data-loader worker processes per rank reading the training table (0, the default: read in
    the training process); at most one per parquet row group. Encoding a batch is vectorised and
    costs a few percent of a CPU training step, so on CPU a worker only competes with the step's
    threads: on 2 cores the teacher trained 10-35% faster with 0 than with 1 (MIND 9.0k against
    7.3k examples/s, Avazu 14k against 10.5k, demo 200k 23.5k against 20.7k; bench/README.md).
    The same batches either way. Raise it where steps are fast and cores are spare (a GPU)."""
    loader_cache_mb: int = Field(default=1024, ge=0)
    """Megabytes of encoded rows a rank's train and validation loaders each keep in memory between
    passes (0: none; loader worker processes keep none). A split whose rows fit is read from
    parquet and encoded once; later epochs and validations reshuffle the kept arrays (the same
    batches as without the cache). A larger split keeps what fits and reads the rest each pass.
    On MIND and Douban the teacher trained 9-18% more examples/s with it (bench/README.md)."""
    calibration: Literal["none", "platt", "isotonic", "histogram"] = "platt"
    """Post-hoc calibration stage, fitted per (domain, objective) cell on the validation split after
    training and saved in the model, so evaluation, distillation scores, the exported artifact and
    serving all output calibrated probabilities: `platt` (logistic regression on the logit, pulled
    toward the identity by priors worth ~30 positives on the slope, ~10 on the level; keeps every
    ranking), `isotonic` (pool-adjacent-violators, flat within blocks), `histogram` (equal-mass
    bins of ~50 positives made monotone), `none`. Every map is monotone; cells under
    `calibration_min_positives` get Platt. Platt is the default: the best test NE on every sample
    measured (bench/README.md), and no ties between rows the network ranked apart."""
    calibration_choice: Literal["validated", "always"] = "validated"
    """`validated`: a cell keeps its calibration map only where the map, fitted on one half of the
    cell's validation rows and judged on the other (both ways), improves validation NE beyond noise
    (the paired bootstrap's one-sided 90% bound below 0); elsewhere the cell scores uncalibrated, in
    every path. `always`: every cell's map applies (the step before: on the demo it moved 9 of 25
    test cells further from calibrated, on Taobao one beyond noise). See docs/bench/calibration.md."""
    calibration_min_positives: int = Field(default=200, ge=0)
    """Validation positives a cell needs for the isotonic or histogram map; below it the cell gets
    the two-parameter Platt map (a cell with no positives or no negatives keeps the identity)."""
    window: str | None = Field(default=None, pattern=r"^[1-9][0-9]*d$")
    """Train on the trailing window of this many days (`14d`) that ends at the run's interval end
    (the `end` stage keyword; default the table's latest event date + 1 day): the window's newest
    day is the validation split, the day after the window the test split (next-day judgment),
    whatever `split.kind` says. Unset: the whole table, split by `split` (see docs/living-over-days.md)."""
    window_validation: float = Field(default=1.0, gt=0, le=1)
    """With `window`: the share of the window's newest day held out for validation (a hash of the
    example id); the rest of that day trains. 1 holds out the whole day. Below 1 a run learns from
    the day just before its test day, so a retrain a shock started learns the shock a day sooner;
    early stopping and the calibration maps then see fewer rows. See docs/living-over-days.md."""
    warm_start: Literal["none", "last", "champion"] = "none"
    """`last`: continue from the previous model of the same name (its weights, embedding tables,
    optimizer state, dense statistics and id maps) on the window's days it has not trained on;
    `champion`: from the registry's champion (the student) or the latest registered version (other
    models). A first run with no parent trains from scratch. See docs/living-over-days.md."""
    refresh_every: str | None = Field(default=None, pattern=r"^[1-9][0-9]*d$")
    """With `warm_start`: a run trains from scratch once its chain of warm starts began this many
    days before the run's interval end (`7d`: a full retrain every week beside the daily warm
    starts). A warm-started model keeps its parent's leaf-feature trees, id maps and dense
    statistics, fitted at the chain's first run, so they age as the market moves; a refresh refits
    them on the run's window (the pipeline's fit steps). Unset: the chain goes on for ever. The
    lineage records when its chain began (`chain_started`) and why a run refreshed (`refreshed`).
    Unset by default: on the moving demo market with the leaf features on, `7d` made the warm
    teacher's next-day macro NE worse on every day after the first refresh, on two markets
    (0.9640 -> 0.9710, 0.9290 -> 0.9447; docs/bench/market-life.md). See docs/living-over-days.md."""
    warm_dense_stats: Literal["keep", "refit"] = "keep"
    """Warm start: `keep` the parent's dense statistics (z-score means, deviations, clip bounds and
    the numeric encoders' bin edges), which its layers learned on, or `refit` them on the run's
    new days. Measured on the demo market (bench/bench_warm_start.py, days 6-13): next-day macro NE
    0.9769 keep, 0.9768 refit; `keep` stays the default, as the weights were learned on those inputs."""
    replay: float = Field(default=0.0, ge=0, le=1)
    """Warm start: the share of the window's older training days (those the parent already
    trained on) replayed beside the new days, chosen by a hash of the example id (see
    `replay_rows`)."""
    replay_rows: Literal["fixed", "rotating"] = "rotating"
    """Which rows of the older days `replay` trains: `rotating`, the hash salted with the run's
    test day (another share each run, the same one when a day is re-run), or `fixed`, the same
    hashed share every run (a row in it trains once a run for as long as its day is in the
    window). Measured on the market bench (docs/bench/market-life.md, replay 0.3, 10-day window,
    `mask`): rotating was better in all five cells on the market it was chosen on (seed 42) and
    on the one that confirmed it (seed 43)."""

    @model_validator(mode="after")
    def _window_validation(self) -> "Training":
        if self.refresh_every is not None and self.window is None:
            raise ValueError(f"training.refresh_every {self.refresh_every} counts days from the interval end of a windowed "
                             "run, and training.window is unset: set training.window (e.g. '14d') or remove refresh_every")
        if self.window_validation < 1 and self.window is None:
            raise ValueError(f"training.window_validation {self.window_validation} holds out a share of a window's newest "
                             "day, and training.window is unset: set training.window (e.g. '14d') or remove window_validation")
        return self


class Distillation(Strict):
    label_weight: float = Field(default=1.0, ge=0)
    """Weight of the true-label loss when the student trains on teacher scores (without them the
    label loss weighs 1)."""
    soft_weight: float = Field(default=3.0, ge=0)
    """Weight of the teacher soft-label loss where the true label exists (the label's weighs
    `label_weight`). Default 3, measured against 1 with the leaves on in both networks (test macro
    NE, mean of 2-3 seeds; docs/distillation.md, "How much the student follows the teacher"):
    chosen on Bank Marketing's random split (0.8344 -> 0.8323, every seed better) and Taobao (buy
    0.8504 -> 0.8441, engage 0.9348 -> 0.9350), confirmed on the demo at 200k rows (conversion
    0.9744 -> 0.9680, better beyond noise; click level), Criteo and Bank's time split (level)."""
    unlabeled_weight: float = Field(default=0.5, ge=0)
    """Weight of the teacher soft-label loss where the label is absent (mask 0)."""
    temperature: float = Field(default=1.0, gt=0)
    """Softens the teacher: the target is sigmoid(logit(p) / T) and the student's logit is divided
    by T in the soft-label loss; 1 takes the teacher's probabilities as they are."""


FP8_RECIPES = ("e4m3_tensor", "e4m3_row", "mx_block32")
"""Forward FP8 recipes: e4m3 with one scale per tensor, e4m3 with one scale per row (of the input
and of the weight), MX-style blocks of 32 elements sharing a power-of-two scale."""


class FP8(Strict):
    enabled: bool = False
    """Train the models in `models` with FP8 GEMMs at the sites where the probe finds it safe
    (LoKA-style probe and dispatch); false trains the FP32 model bit for bit."""
    models: list[Literal["teacher", "student"]] = Field(default_factory=lambda: ["teacher", "student"])
    """Which models FP8 applies to when `enabled`."""
    recipes: list[Literal["e4m3_tensor", "e4m3_row", "mx_block32"]] = Field(
        default_factory=lambda: ["e4m3_tensor", "e4m3_row", "mx_block32"], min_length=1)
    """Forward recipes the dispatcher may choose, cheapest first: a site takes the first one whose
    estimated error is below `max_relative_error`."""
    backward: Literal["e5m2", "bf16"] = "e5m2"
    """Format of the output gradients in the backward GEMMs of an FP8 site."""
    max_relative_error: float = Field(default=0.05, gt=0)
    """A site runs in FP8 only if its mean relative error (sum |out - ref| / sum |ref|) on inputs
    drawn from the probed statistics stays below this."""
    min_speedup: float = Field(default=1.05, gt=0)
    """On a CUDA device with FP8 support, a site also needs this measured speed-up for its own GEMM
    shape; on CPU FP8 is emulated and judged on quality only."""
    probe_every: int = Field(default=20, ge=1)
    """Training steps between two updates of the probe's running statistics."""
    warmup_steps: int = Field(default=200, ge=1)
    """Steps trained in FP32 to learn the statistics; the plan is made then and FP8 starts."""


class Floors(Strict):
    max_ne: float = Field(default=0.99, gt=0)
    """First model only (no champion yet): every cell's NE on the evaluation window must be at most
    this; below 1 is better than predicting the base rate."""
    min_auc: float = Field(default=0.55, ge=0, le=1)
    """First model only: every cell's AUC on the evaluation window must be at least this (0.5 ranks
    at random)."""


class Promotion(Strict):
    max_ne_regression: float = Field(default=0.005, ge=0)
    """δ: a challenger cell's NE may exceed the champion's by at most this (relative), on the same
    rows. The cell fails only when the paired interval of the ratio (`calibration_confidence`)
    lies wholly above 1 + δ, so day-to-day noise in a small cell does not reject a retrain."""
    calibration: tuple[float, float] = (0.8, 1.25)
    """Bounds on each cell's calibration (sum of predictions / sum of labels). A challenger cell
    outside them still passes when the champion's calibration is further from 1 on the same rows."""
    calibration_confidence: float = Field(default=0.95, ge=0, lt=1)
    """A cell fails the calibration bounds (or the first model's floors, or δ against the champion)
    only when this two-sided confidence interval of its calibration (AUC, NE, or NE ratio to the
    champion) lies wholly outside them: small cells (a few hundred positives) are noisy by
    ±2/sqrt(positives). 0 checks the point estimates alone."""
    teacher_epsilon: float = Field(default=0.03, ge=0)
    """ε: the student's macro NE may exceed its teacher's by at most this (relative)."""
    max_latency_ms: float = Field(default=10.0, gt=0)
    """Budget for the exported student's single-request p99 latency in milliseconds (encoding +
    forward, measured over 200 one-row requests when promoting). Judged on CPU time, which other
    jobs on the machine do not inflate; the wall-clock p50/p99 are recorded beside it."""
    max_artifact_mb: float = Field(default=200.0, gt=0)
    """Budget for the exported student's size on disk, in MiB."""
    floors: Floors = Field(default_factory=Floors)
    """Absolute bars for the first model, when there is no champion to compare with."""
    int8_embeddings: bool = False
    """Export the student with INT8 row-wise quantized embedding tables (smaller artifact)."""
    export_tolerance: float = Field(default=1e-4, gt=0)
    """Max |Δp| between the exported artifact and the training model (FP32 export). Not zero: the
    artifact pools its tables with aten's embedding_bag and may fold projections into the rows, so
    its float32 sums run in another order than the eager model's (a few float32 steps, about 1e-7,
    depending on the CPU); 1e-4 is far above that and far below a wrong row or a missing map."""
    int8_tolerance: float = Field(default=0.02, gt=0)
    """Max |Δp| allowed when the embeddings are INT8 (quantization error is expected)."""
    fp8_tolerance: float = Field(default=0.002, ge=0)
    """A student with FP8 sites: in every cell its artifact's NE may exceed the NE of the same
    weights run in FP32 by at most this share (relative)."""


class FeatureStore(Strict):
    offline_store: Literal["spark", "file"] = "spark"
    """Where `get_historical_features` runs: Spark (the session the pipeline already has) or
    Feast's file store (dask, single process; slower, kept as a fallback)."""
    online_store: Literal["sqlite", "redis"] = "sqlite"
    """Where serving reads features: `sqlite` (a file in the workdir's Feast repo; one machine) or
    `redis` (at `redis_url`)."""
    redis_url: str = "localhost:6379"
    """Feast's Redis `connection_string`, `host:port` optionally followed by `,db=0,password=...`;
    read only with `online_store: redis`."""
    ttl: str = "1d"
    """Feast feature-view TTL ('30s', '15m', '1h', '7d'): how far back `get_historical_features`
    looks for an entity's latest row. The training set never needs a look-back (the aggregate
    tables hold a row at the instant of every event); online reads do not use it."""
    training_check_rows: int = Field(default=500, ge=0)
    """Training-set rows re-fetched through Feast `get_historical_features` and compared value by
    value with the bulk join (0: skip). Feast's join is quadratic per entity, hence a sample."""

    @field_validator("ttl")
    @classmethod
    def _ttl(cls, v: str) -> str:
        if not _TTL_RE.match(v):
            raise ValueError(f"ttl {v!r} must be a number with a unit s, m, h or d, e.g. '1s' or '1h'")
        return v

    def ttl_timedelta(self) -> dt.timedelta:
        n, unit = _TTL_RE.match(self.ttl).groups()  # type: ignore[union-attr]
        return dt.timedelta(seconds=int(n) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit])


class Serving(Strict):
    feature_cache_seconds: float = Field(default=30.0, ge=0)
    """How long the server keeps an entity's online features before reading the store again
    (0: read the store on every request). Aggregates change when the feature stage
    materializes (daily by default), so a short cache loses nothing and spares hot entities
    (the Zipf head of users and ads) a store round trip per request."""
    feature_cache_entries: int = Field(default=200_000, ge=1)
    """Most entity entries the feature cache holds; when full it is emptied (as when
    `feature_cache_seconds` runs out), which bounds the server's memory."""
    online_mirror_entities: int = Field(default=1_000_000, ge=0)
    """SQLite online store: when every feature view holds at most this many entities, the server
    keeps the whole store in memory (about 8 bytes per entity and feature), loads it at startup
    and reloads it in the background when a materialization commits, so a lookup never waits on
    SQLite and no value is older than the last materialization. Larger stores, other online
    stores and 0 here read entities on demand through the cache above."""
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    """Largest `POST /predict` body the server reads, in bytes (default 1 MiB, about 5,000
    requests). A larger one is answered 413 before it is read (from its Content-Length, or as soon
    as the stream passes the limit), so an oversized upload costs the server almost nothing."""
    max_batch: int = Field(default=1024, ge=1)
    """Most requests in one `{"requests": [...]}` batch; a larger batch is answered 413 naming the
    limit, before any request in it is validated or scored. Split bigger workloads, or score them
    offline with `lattice predict`."""
    auth_token_env: str | None = None
    """Name of an environment variable (e.g. `LATTICE_SERVING_TOKEN`) holding the token that
    `POST /predict` and `GET /metadata` require, sent as `Authorization: Bearer <token>` or
    `X-API-Key: <token>` (401 otherwise).
    `GET /healthz` stays open for load balancers. The server does not start when the variable is
    unset or empty. Unset here: no authentication. Never put the token itself in the config."""
    access_log: bool = True
    """One log line per request on the `lattice.serving.access` logger at INFO: method, path,
    status, duration (ms), batch size and client address; never bodies or credentials."""
    limits: ClientLimits = Field(default_factory=ClientLimits)
    """Per-client limits (by client address) and read timeouts: see lattice/config/serving_limits.py."""


class Registry(Strict):
    tracking_uri: str | None = None
    """MLflow tracking server URL; default is a SQLite file in the workdir."""
    model_name: str | None = None
    """Registered model name of the student (the served model); teachers and baselines register as
    `<model_name>_<kind>`. Unset: `<name>_ranker`."""


class Deployment(Strict):
    profile: Literal["embedded", "scale-out"] = "embedded"
    """Which engines the same DAGs and stages run on. `embedded`: everything on this machine in
    files (Airflow and MLflow on SQLite, Spark `local[2]`, Feast's SQLite online store and file
    registry, single-node `torchrun`, one uvicorn worker). `scale-out`: the services named in
    `profile_file` (PostgreSQL, Redis, a Spark standalone master, an MLflow tracking server,
    multi-node `torchrun`, several uvicorn workers), as `infra/scale-out up` starts them on loopback
    or as an operator fills it in for a real cluster. No code changes between the two."""
    profile_file: str = "~/.lattice/scale-out/profile.json"
    """The scale-out profile (JSON; endpoints and credentials, owner-only permissions, outside the
    repository): written by `infra/scale-out up`. `LATTICE_PROFILE_FILE` overrides it. Read only
    with `profile: scale-out`."""


class Schedule(Strict):
    cron: str | None = None
    """Airflow schedule: a cron expression (`0 3 * * *`) or a preset (`@daily`). Give this or
    `asset`; with neither the DAG runs on manual triggers only."""
    asset: Literal["features", "teacher", "student"] | None = None
    """Run when this asset is updated: `features` (the features DAG materialized), `teacher` (a
    teacher was registered) or `student` (a student was registered)."""

    @model_validator(mode="after")
    def _one_of(self) -> "Schedule":
        if self.cron is not None and self.asset is not None:
            raise ValueError("a schedule is either 'cron' or 'asset', not both")
        return self


class Schedules(Strict):
    features: Schedule = Field(default_factory=lambda: Schedule(cron="@daily"))
    """The features DAG: consolidate (ingest and validate), aggregates, Feast apply, training set,
    materialize; a synthetic config first generates its logs."""
    train_teacher: Schedule = Field(default_factory=lambda: Schedule(asset="features"))
    """The teacher DAG: train, evaluate, register."""
    distill: Schedule = Field(default_factory=lambda: Schedule(asset="teacher"))
    """The student DAG: distill, export, register as challenger."""
    promote: Schedule = Field(default_factory=lambda: Schedule(asset="student"))
    """The promotion DAG: gate the challenger against the champion and move the champion alias."""
    monitor: Schedule = Field(default_factory=lambda: Schedule(cron="@daily"))
    """The monitoring DAG: the served model's prediction log joined with the labels that arrived,
    per-cell health and the `monitoring.rules`; a rule that trips emits the `retrain` asset, which
    starts the teacher DAG when the config has rules."""
    tune: Schedule = Field(default_factory=Schedule)
    """The tuning DAG (`lattice tune`: hyperparameter search on the validation split); manual
    triggers only by default."""


class TimeRange(Strict):
    start: dt.date
    """First event date (inclusive, UTC); earlier events are quarantined as out of range. The
    synthetic generator starts its logs here."""
    end: dt.date
    """Exclusive. Events outside [start, end) are quarantined as out of range."""

    @model_validator(mode="after")
    def _ordered(self) -> "TimeRange":
        if self.end <= self.start:
            raise ValueError(f"end ({self.end}) must be after start ({self.start})")
        return self


from lattice.config.timing import Market  # noqa: E402 (kept beside its first use)


class Synthetic(Strict):
    """Parameters of the built-in generator (demo config only)."""

    users: int = Field(default=200_000, ge=10)
    """Distinct users, at least: the generator uses max(users, rows / 4), so the id space grows with
    the log."""
    ads: int = Field(default=50_000, ge=10)
    """Distinct ads, at least: the generator uses max(ads, rows / 40)."""
    zipf_exponent: float = Field(default=1.1, gt=1)
    """Skew of user and ad popularity (Zipf): larger gives the most popular ids more of the
    impressions."""
    days: int = Field(default=7, ge=1)
    """Days the logs span, from `time_range.start`."""
    seed: int = 42
    """Seed of the generator: the same seed and row count give the same logs."""
    chunk_rows: int = Field(default=200_000, ge=1000)
    """Rows per written part file; the generator's memory stays flat in the total row count."""
    rows: int = Field(default=200_000, ge=100)
    """Impressions to generate when a run does not say: the `synth` task of scheduled and
    asset-triggered features DAG runs, and the default of the form's "Synthetic rows"; the logs
    are regenerated only when they hold a different count. `lattice demo --rows` overrides it."""
    market: Market | None = None
    """A market that moves over the days: new ids, click-rate drift, a shock, late conversions in
    a `conversion_ts` column (see `Market`). Absent: static logs, as before."""


# ---------------------------------------------------------------- hyperparameter search


class TuneRange(Strict):
    """One searched config key of `lattice tune`: a range (`low`, `high`, optionally `log` or
    `step`) or a list of `choices`. A key whose config value is an integer is searched over
    integers, any other range over real numbers."""

    low: int | float | None = None
    """Smallest value tried (give it with `high`, or give `choices`)."""
    high: int | float | None = None
    """Largest value tried (inclusive)."""
    log: bool = False
    """Sample the range on a log scale (learning rates); needs `low` > 0 and no `step`."""
    step: int | float | None = Field(default=None, gt=0)
    """Spacing of the values tried between `low` and `high`; unset: any value (1 for integers)."""
    choices: list[int | float | bool | str] | None = Field(default=None, min_length=1)
    """The values tried, instead of a range, e.g. embedding widths `[16, 32, 64]`."""

    @model_validator(mode="after")
    def _range_or_choices(self) -> "TuneRange":
        has_range = self.low is not None or self.high is not None
        if has_range == (self.choices is not None):
            raise ValueError("give either 'low' and 'high' (a range) or 'choices' (a list), not both or neither")
        if self.choices is not None and (self.log or self.step is not None):
            raise ValueError("'log' and 'step' apply to a range, not to 'choices'")
        if has_range:
            if self.low is None or self.high is None:
                raise ValueError("a range needs both 'low' and 'high'")
            if self.low > self.high:
                raise ValueError(f"low ({self.low}) must be at most high ({self.high})")
            if self.log and (self.low <= 0 or self.step is not None):
                raise ValueError("a 'log' range needs low > 0 and no 'step'")
        return self


def _default_space() -> dict[str, TuneRange]:
    return {
        "training.lr_dense": TuneRange(low=3e-4, high=1e-2, log=True),
        "training.lr_sparse": TuneRange(low=0.01, high=0.2, log=True),
        "models.teacher.dropout": TuneRange(low=0.0, high=0.3),
        "models.teacher.embedding_dim": TuneRange(choices=[16, 32, 64]),
    }


class Tune(Strict):
    """`lattice tune`: an Optuna search over config keys, each trial a short training run judged
    by its validation macro NE alone (the test split is never read), stored in a study under
    `<workdir>/tune/<study>/` so a rerun continues it."""

    trials: int = Field(default=20, ge=1)
    """Trials a study holds in total when `--trials` does not say; a rerun runs only the missing ones."""
    epochs: int = Field(default=1, ge=1)
    """Training epochs of every trial (`training.epochs` of the trial's run; `--epochs` overrides)."""
    sampler: Literal["tpe", "random"] = "tpe"
    """Optuna sampler: `tpe` (tree-structured Parzen estimator, learns from earlier trials) or `random`."""
    seed: int = 0
    """Seed of the sampler, so a fresh study of the same space proposes the same trials."""
    space: dict[str, TuneRange] = Field(default_factory=_default_space)
    """Dotted config key (as `--set` takes it: `training.lr_dense`, `models.teacher.dropout`,
    `features.sparse.<name>.embedding_dim`) -> what to try. Each key must name a value of this
    config; the search overrides only these keys."""


# ---------------------------------------------------------------- the platform config


class PlatformConfig(Strict):
    name: str = Field(pattern=NAME_RE)
    """Names the platform: the default workdir, the Feast project, the DAG ids and the registered
    models (`<name>_ranker`)."""
    description: str = ""
    """One line shown by `lattice config check` and in the DAG docs."""
    data_root: str = "."
    """Folder raw source paths are relative to; `${VAR:-default}` expands environment variables."""
    workdir: str = ".lattice/{name}"
    """Where every stage writes (tables, models, registry, reports); `{name}` is the config's name.
    `LATTICE_WORKDIR` overrides it; a relative path starts at the current directory."""
    time_range: TimeRange
    """The event dates the pipeline consolidates."""
    domains: list[Domain] = Field(min_length=1)
    """Ad surfaces (feed, search, ...): one axis of every (domain, objective) cell."""
    objectives: list[Objective] = Field(min_length=1)
    """What the models predict (click, conversion, ...), one head each: the other axis of the cells."""
    sources: list[Source] = Field(min_length=1)
    """Raw logs, and how each maps to domains, columns, event times and labels."""
    features: Features
    """The model inputs: sparse, dense and aggregate features."""
    models: Models = Field(default_factory=Models)
    """Network sizes of the teacher, the student and the baselines."""
    training: Training = Field(default_factory=Training)
    """How examples are split and how models train."""
    distillation: Distillation = Field(default_factory=Distillation)
    """How the student learns from the teacher's scores."""
    fp8: FP8 = Field(default_factory=FP8)
    """FP8 GEMMs where the probe finds them safe, for the teacher and the student."""
    promotion: Promotion = Field(default_factory=Promotion)
    """The gate a challenger must pass to become the champion."""
    feature_store: FeatureStore = Field(default_factory=FeatureStore)
    """Feast's offline and online stores."""
    serving: Serving = Field(default_factory=Serving)
    """The model server's feature cache."""
    monitoring: Monitoring = Field(default_factory=Monitoring)
    """The prediction log serving writes and the rules the monitor stage checks."""
    registry: Registry = Field(default_factory=Registry)
    """MLflow tracking server and registered model names."""
    schedules: Schedules = Field(default_factory=Schedules)
    """When each Airflow DAG runs."""
    deployment: Deployment = Field(default_factory=Deployment)
    """Embedded (one machine, files) or scale-out (PostgreSQL, Redis, Spark standalone, MLflow
    server, multi-node torchrun), chosen here with no code change."""
    tune: Tune = Field(default_factory=Tune)
    """The hyperparameter search of `lattice tune`: trials, epochs per trial and the searched keys."""
    synthetic: Synthetic | None = None
    """Parameters of the built-in log generator (`lattice synth`, `lattice demo`); absent for real
    data."""
    _source_file: str | None = PrivateAttr(default=None)
    # the deployment profile's engines, resolved once for a run (lattice.deploy.profile.services):
    # every stage of the run reads this value, none reads the profile file itself
    _services: Any = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _moved_sections(cls, data):
        if isinstance(data, dict) and "hashing" in data:
            raise ValueError(
                "the top-level `hashing` section was replaced by keys of each sparse feature: move "
                "qr_collisions/learned_clusters/frequency_threshold to features.sparse[].qr_buckets, "
                "learned_frequent_share and min_count (see docs/config-reference.md) and delete `hashing:`")
        return data

    @property
    def source_file(self) -> str | None:
        """The YAML file this config was loaded from (None when built in code)."""
        return self._source_file

    # -- lookups used everywhere
    @property
    def domain_names(self) -> list[str]:
        return [d.name for d in self.domains]

    @property
    def objective_names(self) -> list[str]:
        return [o.name for o in self.objectives]

    @property
    def entity_features(self) -> list[SparseFeature]:
        return [f for f in self.features.sparse if f.entity]

    def carries(self, domain: str, objective: str) -> bool:
        return domain in next(o for o in self.objectives if o.name == objective).domains

    def cells(self) -> list[tuple[str, str]]:
        """Every (domain, objective) pair that has labels: the portfolio the models are judged on."""
        return [(d, o.name) for o in self.objectives for d in self.domain_names if d in o.domains]

    # -- cross-field rules; the loader reports each as (key path, bad value, what to do)
    def problems(self) -> list[tuple[str, object, str]]:
        out: list[tuple[str, object, str]] = []
        domains = self.domain_names
        objectives = self.objective_names
        for section, names in (
            ("domains", domains),
            ("objectives", objectives),
            ("sources", [s.name for s in self.sources]),
            ("features", [f.name for f in self.features.sparse + self.features.dense + self.features.aggregates]),
        ):
            for n in sorted({n for n in names if names.count(n) > 1}):
                out.append((section, n, f"duplicate name {n!r}: names must be unique within '{section}'"))
        for i, o in enumerate(self.objectives):
            for j, d in enumerate(o.domains):
                if d not in domains:
                    out.append((f"objectives[{i}].domains[{j}]", d, f"unknown domain; declare it under 'domains' or use one of {domains}"))
            if o.given is not None:
                g = next((x for x in self.objectives if x.name == o.given), None)
                if g is None or g.name == o.name or g.given is not None:
                    out.append((f"objectives[{i}].given", o.given, "must name another objective that is not itself 'given' one "
                                f"(one level of chaining); use one of {[x.name for x in self.objectives if x.name != o.name]}"))
                elif not set(o.domains) <= set(g.domains):
                    out.append((f"objectives[{i}].given", o.given, f"{o.given!r} is not labelled in every domain of {o.name!r} "
                                f"(missing {sorted(set(o.domains) - set(g.domains))}); add them to its domains or drop 'given'"))
        provided: set[str] = set()
        with_source: set[str] = set()
        for i, s in enumerate(self.sources):
            provided |= s.canonical_columns()
            for d in s.domains():
                with_source.add(d)
                if d not in domains:
                    out.append((f"sources[{i}].domain", d, f"unknown domain; declare it under 'domains' or use one of {domains}"))
            for section in ("labels", "truth"):
                for key in getattr(s, section):
                    if key not in objectives:
                        out.append((f"sources[{i}].{section}.{key}", key, f"unknown objective; declare it under 'objectives' or use one of {objectives}"))
        for i, d in enumerate(domains):
            if d not in with_source:
                out.append((f"domains[{i}]", d, "no source feeds this domain; add a source whose 'domain' is it, or remove it"))
        feature_columns = {f.column for kind in ("sparse", "dense") for f in getattr(self.features, kind)}
        for i, s in enumerate(self.sources):
            for raw, canon in s.columns.items():
                if canon not in feature_columns:
                    # nothing downstream reads a canonical column that no feature declares: it would vanish
                    out.append((f"sources[{i}].columns.{raw}", canon,
                                f"{canon!r} is not a feature column, so it would be dropped: to carry raw column {raw!r} "
                                f"to the consolidated table and every predictions file, list it under this source's "
                                f"'passthrough: [{raw}]' instead; to train on it, declare a feature whose column is {canon!r}"))
        for kind in ("sparse", "dense"):
            for i, f in enumerate(getattr(self.features, kind)):
                if f.column not in provided:
                    out.append((f"features.{kind}[{i}].column", f.column,
                                f"no source maps a raw column to it; add it to a source's 'columns' (provided: {sorted(provided)})"))
        entities = [f.name for f in self.entity_features]
        for i, a in enumerate(self.features.aggregates):
            if a.entity not in entities:
                out.append((f"features.aggregates[{i}].entity", a.entity, f"not a sparse feature with 'entity: true'; use one of {entities}"))
            if a.objective not in objectives:
                out.append((f"features.aggregates[{i}].objective", a.objective, f"unknown objective; use one of {objectives}"))
        for i, o in enumerate(self.objectives):
            if not any(o.name in s.labels for s in self.sources):
                out.append((f"objectives[{i}].name", o.name, "no source gives this label; add it to some source's 'labels'"))
            for d in o.domains:
                srcs = [s for s in self.sources if d in s.domains()]
                if srcs and not any(o.name in s.labels for s in srcs):
                    out.append((f"objectives[{i}].domains", d, f"no source of domain {d!r} has a label for {o.name!r}; "
                                "add it to that source's 'labels' or drop the domain from this objective"))
        from lattice.config.timing import label_time_problems

        out += label_time_problems(self)
        sp = self.training.split
        reserved = {"example_id", "event_timestamp", "date", "domain", "split"} | provided
        for i, s in enumerate(self.sources):
            if sp.kind == "source" and s.split is None:
                out.append((f"sources[{i}].split", None, "training.split.kind is 'source': give every source "
                            "'split: train', 'validation' or 'test'"))
            if sp.kind != "source" and s.split is not None:
                out.append((f"sources[{i}].split", s.split, f"only read with training.split.kind 'source' (it is "
                            f"{sp.kind!r}); remove it or set training.split.kind: source"))
            for j, c in enumerate(s.passthrough):
                if c in reserved or c.startswith(("label_", "mask_", "truth_")):
                    out.append((f"sources[{i}].passthrough[{j}]", c, "collides with a column the platform writes; "
                                "rename it in the data or map it as a feature instead"))
        if sp.kind == "source":
            have = {s.split for s in self.sources}
            for need in ("train", "test"):
                if need not in have:
                    out.append(("training.split.kind", "source", f"no source has 'split: {need}'; "
                                "add one, or use another split kind"))
        share = self.monitoring.retrain_validation_share
        if share < 1 and self.training.window is None:
            out.append(("monitoring.retrain_validation_share", share, "holds out a share of a window's newest day, and "
                        "training.window is unset: set training.window (e.g. '14d') or remove retrain_validation_share"))
        t, st = self.models.teacher, self.models.student
        bigger = [k for k in ("embedding_dim", "table_scale", "num_layers", "num_tokens", "fm_rank", "domain_fm") if getattr(st, k) > getattr(t, k)]
        if bigger or sum(st.head_dims) > sum(t.head_dims):
            bigger = bigger or ["head_dims"]
            out.append((f"models.student.{bigger[0]}", getattr(st, bigger[0]),
                        f"the student is larger than its teacher ({bigger[0]}: teacher has {getattr(t, bigger[0])}); make it at most the teacher's"))
        return out
