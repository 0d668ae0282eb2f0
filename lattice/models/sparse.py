"""Sparse arch: per-feature compression -> TorchRec EmbeddingBagCollection -> one token per feature.

Each sparse feature's `hashing` scheme is a compression module (lattice.hashing.registry): it
turns the feature's ids into one stream per EBC table it owns (one for none/modulo/vocab/
learned/zch, two for qr, one per frequency block for mixed), the EBC SUM-pools every table (the
planner shards them like any table), and the module combines its tables' pooled rows into the
feature's (B, d_f) embedding, projected to the token width when narrower.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lattice.config import PlatformConfig
from lattice.config.schema import ModelSize
from lattice.hashing.base import KJTCompress
from lattice.hashing.layout import budget_rows, feature_width
from lattice.hashing.registry import make_compression


def table_shape(config: PlatformConfig, size: ModelSize) -> list[tuple[str, int, int]]:
    """(feature name, row budget, dim) per sparse feature for a model size. The tables a scheme
    builds spend that budget (`SparseArch.tables` lists the real ones)."""
    return [(f.name, budget_rows(f, size), feature_width(f, size)) for f in config.features.sparse]


class SparseArch(nn.Module):
    """KJT (one key per sparse feature) -> (B, F, D) tokens of width `size.embedding_dim`."""

    def __init__(self, config: PlatformConfig, size: ModelSize, fitted: dict | None = None):
        super().__init__()
        # fitted: feature -> {row budget: fitted id map} (lattice.hashing) for the schemes that need one
        self.keys = [f.name for f in config.features.sparse]
        self.compress = KJTCompress(self.keys, [make_compression(config, f, size, fitted) for f in config.features.sparse])
        self.dims = [m.out_dim for m in self.compress.compressions()]
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(name=f"t_{t.sub_key}", embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.sub_key],
                                   pooling=PoolingType.SUM, init_fn=t.init_fn)
                for m in self.compress.compressions() for t in m.tables
            ],
            device=torch.device("cpu"),
        )
        # embeddings narrower than the token width get their own projection
        self.proj = nn.ModuleDict({n: nn.Linear(d, size.embedding_dim, bias=False) for n, d in zip(self.keys, self.dims)
                                   if d != size.embedding_dim})

    @property
    def num_tokens(self) -> int:
        return len(self.keys)

    def pooled(self, kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        tables = self.ebc(self.compress(kjt)).to_dict()  # sub-key -> (B, w)
        return self.compress.combine(tables)  # feature -> (B, d_f)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        emb = self.pooled(kjt)
        tokens = [self.proj[n](emb[n]) if n in self.proj else emb[n] for n in self.keys]  # F x (B, D)
        return torch.stack(tokens, dim=1)  # (B, F, D)
