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
    """`embedding_params` counts the tables and what the compressed schemes add to them (mixed
    blocks' projections); `lookup_bytes` the id-lookup buffers (fitted maps, zch ids), which are
    no parameters but part of the model and its artifact."""
    from lattice.hashing.base import compressions, lookup_buffer_bytes

    from lattice.models.leaves import LeafArch, LeafMargin

    comp = compressions(model)
    emb_params = (sum(p.numel() for e in _ebcs(model) for p in e.parameters())
                  + sum(p.numel() for c in comp for p in c.parameters()))
    total = sum(p.numel() for p in model.parameters())
    # one id per sparse feature: pooling reads d values per lookup (counted as d FLOPs); a
    # compressed feature reads its tables' widths (qr: both, mixed: one block's)
    trees = [m for m in model.modules() if isinstance(m, (LeafArch, LeafMargin))]
    forests = {id(m.ebc) for m in trees if isinstance(m, LeafArch)}
    lookup_flops = sum(c.lookup_width() for c in comp) if comp else sum(
        c.embedding_dim for e in _ebcs(model) if id(e) not in forests for c in e.embedding_bag_configs())
    # the tree part reads one row per tree: d values for the leaf tokens, 1 for the frozen margin
    leaf_flops = sum(m.lookups * (m.ebc.embedding_bag_configs()[0].embedding_dim if isinstance(m, LeafArch) else 1)
                     for m in trees)
    names = [f.name for f in config.features.sparse]
    kjt = kjt_from_ids(names, [np.arange(batch, dtype=np.int64) for _ in names], [np.ones(batch, bool) for _ in names])
    from lattice.models.leaves import add_empty_leaves

    kjt = add_empty_leaves(kjt, model)
    counter = FlopCounterMode(display=False)
    model.eval()
    with torch.no_grad(), counter:
        model(torch.zeros(batch, n_dense), kjt, torch.zeros(batch, dtype=torch.int64))
    dense_flops = counter.get_total_flops() / batch
    return {
        "params": int(total),
        "embedding_params": int(emb_params),
        "dense_params": int(total - emb_params),
        "lookup_bytes": int(lookup_buffer_bytes(model)),
        "flops_per_example": float(dense_flops + lookup_flops + leaf_flops),
        "dense_flops_per_example": float(dense_flops),
        "leaf_lookup_flops_per_example": float(leaf_flops),
    }
