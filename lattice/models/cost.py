"""Parameters and forward FLOPs per example of a model (the distillation budget: the student
must stay at or below 1/5 of the teacher on both)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from torchrec import EmbeddingBagCollection

from lattice.config import PlatformConfig
from lattice.data.batch import kjt_from_ids


def _ebcs(model: nn.Module) -> list[EmbeddingBagCollection]:
    return [m for m in model.modules() if isinstance(m, EmbeddingBagCollection)]


def model_cost(model: nn.Module, config: PlatformConfig, n_dense: int, batch: int = 64) -> dict[str, float]:
    emb_params = sum(p.numel() for e in _ebcs(model) for p in e.parameters())
    total = sum(p.numel() for p in model.parameters())
    # one id per sparse feature: pooling reads d values per lookup (counted as d FLOPs)
    lookup_flops = sum(c.embedding_dim for e in _ebcs(model) for c in e.embedding_bag_configs())
    names = [f.name for f in config.features.sparse]
    kjt = kjt_from_ids(names, [np.arange(batch, dtype=np.int64) for _ in names], [np.ones(batch, bool) for _ in names])
    counter = FlopCounterMode(display=False)
    model.eval()
    with torch.no_grad(), counter:
        model(torch.zeros(batch, n_dense), kjt, torch.zeros(batch, dtype=torch.int64))
    dense_flops = counter.get_total_flops() / batch
    return {
        "params": int(total),
        "embedding_params": int(emb_params),
        "dense_params": int(total - emb_params),
        "flops_per_example": float(dense_flops + lookup_flops),
        "dense_flops_per_example": float(dense_flops),
    }
