"""Table layouts of the compressed-embedding schemes, without torch.

How each scheme spends a feature's row budget R (its `num_embeddings` times the model's
`table_scale`) and width d (min of the feature's and the model's `embedding_dim`):

  - `qr`: a quotient table of q rows and a remainder table of r rows with q + r = R
    (`qr_split`); `concat` splits the width d between them (`qr_widths`).
  - `mixed`: frequency blocks whose widths follow the α-power rule, within R·d parameters
    counting the block tables and their projections to d (`mixed_layout`).
  - the others: one table of R rows (vocab and learned: the fitted map's `table_rows` <= R).

The rules that read only the config (budgets, widths, the `qr` split and `hashing_problems`)
live in `lattice.config.rules_hashing` so config validation imports no hashing code; they are
re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The config-level rules live with the config (validation imports no hashing code); they are
# re-exported here so callers that think of them as layout rules keep one import.
from lattice.config.rules_hashing import (  # noqa: F401 (re-exported)
    INT64_BYTES,
    budget_rows,
    embedding_params,
    feature_width,
    hashing_problems,
    lookup_bytes,
    qr_split,
    qr_widths,
)

MIXED_TAIL_BLOCKS = 3
"""`mixed`: the tail after the head is cut into up to this many blocks, each 4x the rows of the
one before (popularity falls fastest at the top of the ranking, so the near-head block is small)."""


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
