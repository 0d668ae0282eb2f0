"""The compressed-embedding rules that only read the config's own values: row budgets, widths,
the `qr` split, and the checks `config check` runs on them.

They live in the config package so that validating a config imports no hashing code (the arrows
run one way: `lattice.hashing` builds on these, never the reverse). `lattice.hashing.layout`
re-exports them beside the `mixed` layout, which needs the fitted popularity and so stays there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lattice.config.schema import ModelSize, PlatformConfig, SparseFeature

INT64_BYTES = 8


def budget_rows(feature: "SparseFeature", size: "ModelSize") -> int:
    """Row budget of `feature` in a model of `size` (the same formula as `table_shape`)."""
    return max(2, int(round(feature.num_embeddings * size.table_scale)))


def feature_width(feature: "SparseFeature", size: "ModelSize") -> int:
    """Width of the feature's embedding before the projection to the model's token width."""
    return min(feature.embedding_dim, size.embedding_dim)


def qr_split(feature: "SparseFeature", rows: int) -> tuple[int, int]:
    """(quotient rows, remainder rows) of a `qr` feature whose budget is `rows`; q + r == rows.

    `qr_buckets` is given at the config's full budget: a model with a smaller `table_scale`
    scales it by the same ratio. Both tables keep at least one row (config check refuses a
    budget that leaves fewer than two)."""
    if feature.qr_buckets is None:
        r = rows // 2
    elif rows == feature.num_embeddings:
        r = feature.qr_buckets
    else:
        r = int(round(feature.qr_buckets * rows / feature.num_embeddings))
    r = min(max(r, 1), rows - 1)
    return rows - r, r


def qr_widths(feature: "SparseFeature", width: int) -> tuple[int, int]:
    """(quotient width, remainder width): the full width each, or two halves for `concat`: both
    multiples of 4 from width 8 on (fbgemm's fused kernels for big tables need them; 16 -> 8 + 8),
    even from width 4 on (INT8 row-wise export needs even widths; 6 -> 4 + 2)."""
    if feature.qr_combine == "concat":
        r = (width // 8) * 4 if width >= 8 else (width // 4) * 2 if width >= 4 else width // 2
        return width - r, r
    return width, width

def _sizes(config: "PlatformConfig") -> dict[str, "ModelSize"]:
    m = config.models
    return {"teacher": m.teacher, "student": m.student, "baselines": m.baselines.size}


def embedding_params(feature: "SparseFeature") -> int:
    """Parameters of the feature's embedding at the config's full budget and `embedding_dim`
    (vocab and learned: the upper bound, their fitted `table_rows` <= the budget; mixed: its
    parameter budget, which its blocks never exceed)."""
    n, d = feature.num_embeddings, feature.embedding_dim
    if feature.hashing == "qr":
        q, r = qr_split(feature, n)
        dq, dr = qr_widths(feature, d)
        return q * dq + r * dr
    return n * d


def lookup_bytes(feature: "SparseFeature") -> int | None:
    """Bytes of the lookup buffers the artifact carries for the feature at its full budget: 0 for
    schemes that compute rows (none, modulo, qr without a fit), 16 per row for zch (its sorted
    raw ids and their rows), None for fitted schemes (16 per fitted id, known after the fit)."""
    if feature.hashing == "zch":
        return 2 * INT64_BYTES * feature.num_embeddings
    if feature.hashing in ("vocab", "mixed", "learned"):
        return None
    return 0


def hashing_problems(config: "PlatformConfig") -> list[tuple[str, object, str]]:
    """(key path, bad value, what to do) for every compressed-embedding setting no model of the
    config could build: `config check` reports them instead of training failing later."""
    out: list[tuple[str, object, str]] = []
    sizes = _sizes(config)
    for i, f in enumerate(config.features.sparse):
        key = f"features.sparse[{i}]"
        if f.hashing == "qr":
            if f.num_embeddings < 4:
                out.append((f"{key}.num_embeddings", f.num_embeddings,
                            "hashing qr splits the row budget into a quotient and a remainder table of at least 2 rows "
                            "each: give num_embeddings >= 4"))
            elif f.qr_buckets is not None and f.qr_buckets > f.num_embeddings - 2:
                out.append((f"{key}.qr_buckets", f.qr_buckets,
                            f"the remainder table must leave the quotient table at least 2 of the {f.num_embeddings:,}-row "
                            f"budget (num_embeddings): give qr_buckets <= {f.num_embeddings - 2:,}, or unset it (half each)"))
            else:
                small = {role: budget_rows(f, s) for role, s in sizes.items() if budget_rows(f, s) < 4}
                for role, rows in small.items():
                    out.append((f"{key}.num_embeddings", f.num_embeddings,
                                f"the {role} model's table_scale leaves {rows} rows, too few for a quotient and a "
                                f"remainder table of 2 rows each: raise num_embeddings or models.{role}.table_scale"))
            if f.qr_combine == "concat" and f.embedding_dim < 2:
                out.append((f"{key}.qr_combine", f.qr_combine,
                            "concat joins two half-width embeddings: give embedding_dim >= 2 or qr_combine mul/add"))
        if f.hashing == "learned" and f.learned_frequent_share + f.learned_unseen_share >= 1:
            out.append((f"{key}.learned_unseen_share", f.learned_unseen_share,
                        f"learned_frequent_share ({f.learned_frequent_share}) and learned_unseen_share leave no rows for "
                        "the clustered ids: make them sum to less than 1"))
    return out
