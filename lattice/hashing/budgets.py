"""Which row budgets a fit must cover, and which config keys a fit depends on.

Every model of a config (teacher, student, baselines) builds its table for a feature with
`max(2, round(num_embeddings · table_scale))` rows (`lattice.models.sparse.table_shape`); a fitted
map is looked up by that row count, so the fit makes one map per distinct count. The formula is
restated here, without torch, because the fit stage and `config check` must not pay the
torch/TorchRec import; `tests/unit/test_hashing_fit.py` holds the two formulas equal.
"""

from __future__ import annotations

from lattice.config import PlatformConfig
from lattice.config.schema import HASHING_NEEDS_FIT, ModelSize, SparseFeature

# keys whose change makes an existing fit wrong (the map would differ); the others (qr_*,
# mixed_alpha, zch_*, embedding_dim, entity) act in the model, after the fitted lookup
FIT_KEYS = ("column", "hashing", "num_embeddings", "min_count", "learned_frequent_share", "learned_unseen_share")


def model_sizes(config: PlatformConfig) -> dict[str, ModelSize]:
    """The network sizes a config trains, by role."""
    m = config.models
    return {"teacher": m.teacher, "student": m.student, "baselines": m.baselines.size}


def table_rows(feature: SparseFeature, size: ModelSize) -> int:
    """Rows of `feature`'s table in a model of `size`: the one formula, in lattice.hashing.layout."""
    from lattice.hashing.layout import budget_rows

    return budget_rows(feature, size)


def row_budgets(config: PlatformConfig, feature: SparseFeature) -> list[int]:
    """Every table row count some model of the config uses for `feature`, ascending."""
    return sorted({table_rows(feature, s) for s in model_sizes(config).values()})


def needs_fit(config: PlatformConfig) -> list[SparseFeature]:
    """The sparse features whose hashing scheme is fitted on the training window."""
    return [f for f in config.features.sparse if f.hashing in HASHING_NEEDS_FIT]


def fit_keys(feature: SparseFeature) -> dict[str, object]:
    """The feature's keys a fit depends on (part of the fit's fingerprint)."""
    return {k: feature.fit_min_count() if k == "min_count" else getattr(feature, k) for k in FIT_KEYS}
