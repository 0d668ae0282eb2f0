"""Learned encodings of the dense (numeric) input, in front of DenseArch's MLP.

The loader hands the model z-scores (lattice.data.transforms); a plain MLP on them is one linear
map of each value before the first activation, which fits a heavy-tailed count or a threshold
effect badly. `ModelSize.numeric` picks one encoder of every column:

  - `ple`: piecewise-linear encoding over the column's train quantile edges (Gorishniy et al.
    2022, "On Embeddings for Numerical Features"): one value per bin, 0 below it, 1 above it,
    linear inside; the MLP's first layer then reads a piecewise-linear function of each value;
  - `quantile`: the id of the value's quantile bucket, looked up in a learned table per column;
  - `periodic`: sin/cos of learned frequencies, then one Linear + ReLU shared by the columns
    ("PLR", the lite variant: a shared linear keeps it one GEMM site);
  - `none`: no encoder; the z-scores go to the MLP as before (bit for bit).

Each column's edges are buffers fitted from the train split's quantiles (`fit_numeric`, from
DenseStats.quantiles), so they travel in the state dict, the checkpoint and the exported model.
Every encoder first maps NaN to 0 and clamps each value into its column's edge range, so no
input (±inf, 1e30 from a broken upstream) reaches the network as anything but a finite edge.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from lattice.models.gemm import Linear

PERIODIC_SIGMA = 0.1
"""Std of the initial frequencies of `periodic` (cycles per unit z-score): small enough that the
first sin/cos are smooth over the bulk of a z-scored column; training moves them."""


class NumericEncoder(nn.Module):
    """(B, n) z-scored dense values -> (B, n * width) encoded values, per column `width` of them."""

    def __init__(self, n: int, kind: str, bins: int):
        super().__init__()
        if kind not in ("ple", "quantile", "periodic"):
            raise ValueError(f"unknown numeric encoding {kind!r}; use none, ple, quantile or periodic")
        self.n, self.kind, self.bins, self.width = n, kind, bins, bins
        # placeholder edges (standard-normal-ish) until fit_numeric sets the train quantiles;
        # a rebuilt model gets its fitted ones from the state dict
        self.register_buffer("edges", torch.linspace(-3.0, 3.0, bins + 1).repeat(n, 1))  # (n, bins + 1)
        if kind == "quantile":
            self.table = nn.Embedding(n * bins, bins)
            nn.init.normal_(self.table.weight, std=1.0 / math.sqrt(bins))
            self.register_buffer("offsets", torch.arange(n) * bins, persistent=False)  # (n,)
        elif kind == "periodic":
            k = bins  # frequencies per column: 2k sin/cos values, mapped to `width`
            self.freq = nn.Parameter(torch.randn(n, k).clamp(-3, 3) * PERIODIC_SIGMA)  # (n, k)
            self.linear = Linear(2 * k, bins)
            self.linear.rows_per_example = n  # one GEMM row per column

    @property
    def out_dim(self) -> int:
        return self.n * self.width

    def sanitize(self, x: torch.Tensor) -> torch.Tensor:
        """NaN -> 0, then every value clamped into its column's [first edge, last edge]."""
        x = torch.nan_to_num(x.float(), nan=0.0)
        return torch.clamp(x, self.edges[:, 0], self.edges[:, -1])  # (B, n): ±inf and 1e30 land on the edges

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        x = self.sanitize(dense)  # (B, n)
        b = x.shape[0]
        if self.kind == "ple":
            lo, hi = self.edges[:, :-1], self.edges[:, 1:]  # (n, bins)
            # a bin of zero width (a binary or mostly constant column) is a step at its edge
            out = ((x.unsqueeze(-1) - lo) / (hi - lo).clamp_min(1e-6)).clamp(0.0, 1.0)  # (B, n, bins)
        elif self.kind == "quantile":
            inner = self.edges[:, 1:-1].contiguous()  # (n, bins - 1)
            ids = torch.searchsorted(inner, x.t().contiguous(), right=True).t()  # (B, n) in [0, bins)
            out = self.table(ids + self.offsets)  # (B, n, bins)
        else:
            z = 2 * math.pi * x.unsqueeze(-1) * self.freq  # (B, n, k)
            out = torch.relu(self.linear(torch.cat([torch.sin(z), torch.cos(z)], dim=-1)))  # (B, n, bins)
        return out.reshape(b, self.out_dim)  # (B, n * bins)

    @torch.no_grad()
    def fit(self, edges: torch.Tensor) -> None:
        if edges.shape != self.edges.shape:
            raise ValueError(f"numeric edges of shape {tuple(edges.shape)} for an encoder of {tuple(self.edges.shape)}")
        self.edges.copy_(edges)


def quantile_edges(grid: list[list[float]], mean: list[float], std: list[float], bins: int, z_clip: float) -> torch.Tensor:
    """(n, bins + 1) z-space edges from each column's quantile grid (DenseStats.quantiles: values
    after the transform at equally spaced probabilities). The z-score is monotone, so quantiles of
    the z-scores are the z-scores of the quantiles; edges come out sorted."""
    rows = []
    for g, m, s in zip(grid, mean, std):
        g = np.asarray(g, dtype=np.float64)
        e = np.interp(np.linspace(0.0, 1.0, bins + 1), np.linspace(0.0, 1.0, len(g)), g)
        rows.append(np.clip((e - m) / s, -z_clip, z_clip))
    out = np.maximum.accumulate(np.stack(rows), axis=1) if rows else np.zeros((0, bins + 1))
    return torch.as_tensor(out, dtype=torch.float32)


def fit_numeric(model: nn.Module, stats) -> None:
    """Set every NumericEncoder's edges from the train split's dense stats (lattice.data.transforms
    .DenseStats). A no-op for a model without one (`numeric: none`). Every rank reads the same
    dense_stats.json, so every rank gets the same edges."""
    encoders = [m for m in model.modules() if isinstance(m, NumericEncoder)]
    if not encoders:
        return
    if not stats.quantiles:
        raise ValueError("the dense stats carry no quantiles (fitted before numeric encodings existed); "
                         "refit them: train without --resume")
    from lattice.data.transforms import Z_CLIP

    for enc in encoders:
        enc.fit(quantile_edges(stats.quantiles, stats.mean, stats.std, enc.bins, Z_CLIP))
