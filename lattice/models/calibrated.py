"""Calibration as a stage of the model: per (domain, objective) monotone maps logit -> logit.

`CellCalibration` holds one piecewise-linear map per cell as buffers (knots padded to one width,
indexed by the row's domain) and `Calibrated(net, calibration)` applies it to the network's
logits. `lattice.models.saved.rebuild` wraps every model saved with maps, so evaluation,
distillation scoring, export (TorchScript through torchrec.fx) and serving all output calibrated
logits through this one module, and the trainer calibrates its test predictions with the same
module it saves. The maps are fitted by `lattice.training.calibration` on the validation split.

A map is given by knots x_0 < ... < x_{K-1} (raw logits), values y_0 <= ... <= y_{K-1}
(calibrated logits) and two tail slopes: linear between knots, linear with slope `lo` below x_0
and `hi` above x_{K-1}. Identity is x = y = [-1, 1] with both slopes 1.

A cell without a map (none fitted, or its map dropped by the per-cell choice of
`lattice.training.calibration`: `method` "none" or "identity") passes its logits through exactly:
the identity's knots would return them up to float32 rounding only, and a cell the platform
decided not to calibrate scores the raw network's probability bit for bit in every path.
"""

# no `from __future__ import annotations`: FX codegen and TorchScript need real annotation objects

from typing import Any, Dict, List

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

IDENTITY: Dict[str, Any] = {"method": "identity", "x": [-1.0, 1.0], "y": [-1.0, 1.0], "lo": 1.0, "hi": 1.0}
PASS_THROUGH = ("identity", "none")
"""A cell's `method` that means no map: its logits pass through unchanged."""


def piecewise(z: torch.Tensor, domain: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor, lo: torch.Tensor,
              hi: torch.Tensor) -> torch.Tensor:
    """z (B,) raw logits, domain (B,) ids; xs, ys (n_domains, K) knots; lo, hi (n_domains,) tail
    slopes -> (B,) mapped logits."""
    x = xs[domain]  # (B, K): each row's own cell's knots
    y = ys[domain]
    k = x.shape[1]
    zc = z.unsqueeze(1)  # (B, 1)
    j = torch.searchsorted(x, zc).clamp(1, k - 1)  # the segment [x_{j-1}, x_j] that holds z
    x0, x1 = x.gather(1, j - 1), x.gather(1, j)
    y0, y1 = y.gather(1, j - 1), y.gather(1, j)
    inner = y0 + (zc - x0) * ((y1 - y0) / (x1 - x0))
    below = y[:, :1] + (zc - x[:, :1]) * lo[domain].unsqueeze(1)
    above = y[:, -1:] + (zc - x[:, -1:]) * hi[domain].unsqueeze(1)
    return torch.where(zc < x[:, :1], below, torch.where(zc > x[:, -1:], above, inner)).squeeze(1)


def _padded(cell: Dict[str, Any], width: int) -> tuple:
    """A cell's knots extended to `width` along its upper tail (the function is unchanged)."""
    x, y, hi = [float(v) for v in cell["x"]], [float(v) for v in cell["y"]], float(cell["hi"])
    for step in range(1, width - len(x) + 1):
        x.append(float(cell["x"][-1]) + step)
        y.append(float(cell["y"][-1]) + hi * step)
    return x, y


class CellCalibration(nn.Module):
    """{objective: (B,) logits}, domain (B,) -> {objective: (B,) calibrated logits}."""

    domains: List[str]
    objectives: List[str]
    method: str

    def __init__(self, maps: Dict[str, Any]):
        """`maps`: what `lattice.training.calibration.fit_maps` returns (json-able): "domains",
        "objectives" and "cells" {"domain/objective": {"x", "y", "lo", "hi", ...}}; a cell
        without a map passes through unchanged."""
        super().__init__()
        self.domains = list(maps["domains"])
        self.objectives = list(maps["objectives"])
        self.method = str(maps.get("method", "none"))
        cells = maps.get("cells", {})
        grid = [[cells.get(f"{d}/{o}", IDENTITY) for d in self.domains] for o in self.objectives]
        width = max(2, max((len(c["x"]) for row in grid for c in row), default=2))
        xs = torch.tensor([[_padded(c, width)[0] for c in row] for row in grid], dtype=torch.float32)
        ys = torch.tensor([[_padded(c, width)[1] for c in row] for row in grid], dtype=torch.float32)
        # (n_objectives, n_domains, K) and (n_objectives, n_domains): buffers travel with
        # deepcopy, state_dict and the TorchScript artifact, and are never trained
        self.register_buffer("xs", xs)
        self.register_buffer("ys", ys)
        self.register_buffer("lo", torch.tensor([[float(c["lo"]) for c in row] for row in grid], dtype=torch.float32))
        self.register_buffer("hi", torch.tensor([[float(c["hi"]) for c in row] for row in grid], dtype=torch.float32))
        self.register_buffer("applied", torch.tensor([[c.get("method") not in PASS_THROUGH for c in row] for row in grid],
                                                     dtype=torch.bool))

    def forward(self, logits: Dict[str, torch.Tensor], domain: torch.Tensor) -> Dict[str, torch.Tensor]:
        out: Dict[str, torch.Tensor] = {}
        for name, z in logits.items():
            out[name] = z
        for i, o in enumerate(self.objectives):
            if o in logits:
                mapped = piecewise(logits[o], domain, self.xs[i], self.ys[i], self.lo[i], self.hi[i])
                out[o] = torch.where(self.applied[i][domain], mapped, logits[o])
        return out


class Calibrated(nn.Module):
    """A trained network followed by its calibration stage; the same inputs and outputs as the
    network (dense, KJT, domain -> {objective: logits}), calibrated."""

    def __init__(self, net: nn.Module, calibration: CellCalibration):
        super().__init__()
        self.net = net
        self.calibration = calibration

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor, domain: torch.Tensor) -> Dict[str, torch.Tensor]:
        return self.calibration(self.net(dense, sparse, domain), domain)
