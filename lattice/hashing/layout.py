"""Table layouts of the compressed-embedding schemes, without torch.

How each scheme spends a feature's row budget R (its `num_embeddings` times the model's
`table_scale`) and width d (min of the feature's and the model's `embedding_dim`):

  - `qr`: a quotient table of q rows and a remainder table of r rows with q + r = R
    (`qr_split`); `concat` splits the width d between them (`qr_widths`).
  - `mixed`: frequency blocks whose widths follow the α-power rule, within R·d parameters
    counting the block tables and their projections to d (`mixed_layout`).
  - the others: one table of R rows (vocab and learned: the fitted map's `table_rows` <= R).

`config check` (`hashing_problems`) and the config summary read these too, so the rules live
in one place and the check stays free of the torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from lattice.config.schema import ModelSize, PlatformConfig, SparseFeature

INT64_BYTES = 8
MIXED_TAIL_BLOCKS = 3
"""`mixed`: the tail after the head is cut into up to this many blocks, each 4x the rows of the
one before (popularity falls fastest at the top of the ranking, so the near-head block is small)."""


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


@dataclass(frozen=True)
class MixedLayout:
    """Frequency blocks of a `mixed` feature: block k holds rows [bounds[k], bounds[k+1]) of the
    popularity-ranked row space at width widths[k]; rows from `bounds[-1]` on (ids the budget
    cannot hold at these widths) fold into the last block by modulo."""

    bounds: tuple[int, ...]
    widths: tuple[int, ...]
    dim: int
    rows: int
    """Rows of the fitted row space before folding (seen ids + the unseen range)."""

    @property
    def params(self) -> int:
        """Block tables plus the projections of the narrower blocks to `dim`."""
        return sum((b - a) * w + (w * self.dim if w < self.dim else 0)
                   for a, b, w in zip(self.bounds, self.bounds[1:], self.widths))

    @property
    def folded(self) -> bool:
        return self.bounds[-1] < self.rows


def _mixed_candidate(pop_cumsum: np.ndarray, rows: int, budget_rows: int, dim: int, alpha: float) -> tuple[list[int], list[int]]:
    """Blocks and α-power widths over the first `rows` ranked rows (pop_cumsum: (T+1,) prefix
    sums of the per-row popularity, descending)."""
    head = max(1, min(rows - 1, budget_rows // 2, (rows + 1) // 2))
    tail = rows - head
    k = min(MIXED_TAIL_BLOCKS, tail)
    shares = [4**j for j in range(k)]
    sizes = [max(1, tail * s // sum(shares)) for s in shares[:-1]]
    sizes.append(tail - sum(sizes))
    bounds = [0, head]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    means = [(pop_cumsum[b] - pop_cumsum[a]) / (b - a) for a, b in zip(bounds, bounds[1:])]
    p0 = max(means[0], 1e-12)
    widths = [dim] + [_even(dim * (max(m, 0.0) / p0) ** alpha, dim) for m in means[1:]]
    return bounds, widths


def _even(width: float, dim: int) -> int:
    """A block width in [1, dim]: a multiple of 4 from dim 4 on (fbgemm's fused table kernels, which
    the planner picks for big tables, take only column counts divisible by 4), else even where dim
    allows (INT8 row-wise export packs a row into whole 2-byte words)."""
    if dim < 2:
        return 1
    if dim < 4:
        return int(min(dim, max(2, 2 * round(width / 2))))
    return int(min(dim, max(4, 4 * round(width / 4))))


def mixed_layout(popularity: np.ndarray, budget_rows: int, dim: int, alpha: float) -> MixedLayout:
    """Blocks of a `mixed` feature whose fitted row space has `len(popularity)` rows ranked by
    decreasing popularity (the ids' training counts; the unseen range counts as the rarest id).

    The rule: the head (the top min(R/2, T/2) rows) is full width d; the tail is cut into up to 3
    blocks (`MIXED_TAIL_BLOCKS`), block k of width d · (p_k / p_head)^α rounded to a multiple of 4
    in [4, d] (fbgemm's fused kernels; from d < 4 on an even number, for INT8 export; 1 when d is 1), p the block's mean popularity. The
    parameter budget is the full-width table of the row budget: R·d, counting the block tables
    and each narrower block's d x w projection. Where the whole row space does not fit at those
    widths, the tail keeps as many rows as fit (the largest row count T' whose layout costs
    <= R·d) and the rarer rows share the last block's rows by modulo; at the smallest budgets
    (when not even two narrow blocks fit) every block is full width over R rows."""
    pop = np.asarray(popularity, dtype=np.float64)
    rows = int(pop.shape[0])
    if rows < 2:
        raise ValueError("a mixed layout needs a row space of at least 2 rows (one fitted id and the unseen range)")
    cum = np.concatenate([[0.0], np.cumsum(pop)])
    budget = budget_rows * dim

    def cost(n: int) -> tuple[int, list[int], list[int]]:
        b, w = _mixed_candidate(cum, n, budget_rows, dim, alpha)
        return MixedLayout(tuple(b), tuple(w), dim, rows).params, b, w

    c, b, w = cost(rows)
    if c > budget:
        # the widths barely move with the row count; the cost grows with it: bisect the largest fitting count
        lo, hi = 2, rows
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cost(mid)[0] <= budget:
                lo = mid
            else:
                hi = mid - 1
        c, b, w = cost(lo)
        if c > budget:
            n = min(budget_rows, rows)
            b, w = _mixed_candidate(cum, n, budget_rows, dim, 0.0)
            w = [dim] * len(w)
    return MixedLayout(tuple(b), tuple(w), dim, rows)


# ---------------------------------------------------------------- config level


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
