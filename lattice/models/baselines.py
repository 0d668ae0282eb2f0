"""Baselines trained through the same loader, loss, trainer and metrics as the teacher.

- Separate: one network per (domain, objective) cell, each fed only its domain's rows (the world
  before Lattice). Submodels share nothing, so one training run equals training them apart.
- Pooled: one single-task network per objective over all domains, domain-blind.
- MMoE / shared-bottom: a standard multi-task model with the domain as an input feature.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lattice.config import PlatformConfig
from lattice.config.schema import ModelSize
from lattice.models.chain import apply_chains, chains, conditional_rates
from lattice.models.gemm import Linear
from lattice.models.interaction import mlp
from lattice.models.lattice_net import LatticeNet, set_head_bias
from lattice.models.mods import Mods
from lattice.models.numeric import NumericEncoder
from lattice.models.sparse import SparseArch


def cell_key(domain: str, objective: str) -> str:
    return f"{domain}__{objective}"


class SeparateModels(nn.Module):
    def __init__(self, config: PlatformConfig, size: ModelSize, n_dense: int, fitted: dict | None = None):
        super().__init__()
        self.objectives = config.objective_names
        self.domains = config.domain_names
        self.cells = config.cells()
        self.nets = nn.ModuleDict({
            cell_key(d, o): LatticeNet(config, size, n_dense, [o], domain_token=False, domain_untied=False, fitted=fitted) for d, o in self.cells
        })

    def set_output_bias(self, rates: dict[str, float]) -> None:
        for net in self.nets.values():
            net.set_output_bias(rates)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor, domain: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {o: torch.zeros(domain.shape[0]) for o in self.objectives}  # (B,) logit 0 where no model owns the cell
        for d, o in self.cells:
            logit = self.nets[cell_key(d, o)](dense, sparse, domain)[o]  # (B,)
            # `where` routes gradients only from this domain's rows into this cell's model
            out[o] = torch.where(domain == self.domains.index(d), logit, out[o])
        return out


class PooledModels(nn.Module):
    def __init__(self, config: PlatformConfig, size: ModelSize, n_dense: int, fitted: dict | None = None):
        super().__init__()
        self.nets = nn.ModuleDict({
            o: LatticeNet(config, size, n_dense, [o], domain_token=False, domain_untied=False, fitted=fitted) for o in config.objective_names
        })

    def set_output_bias(self, rates: dict[str, float]) -> None:
        for net in self.nets.values():
            net.set_output_bias(rates)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor, domain: torch.Tensor) -> dict[str, torch.Tensor]:
        return {o: net(dense, sparse, domain)[o] for o, net in self.nets.items()}


class MultiTaskModel(nn.Module):
    """Embeddings + dense + domain embedding concatenated; MMoE experts with one gate per
    objective (n_experts > 1) or one shared bottom (n_experts == 1); one tower per objective."""

    def __init__(self, config: PlatformConfig, size: ModelSize, n_dense: int, n_experts: int = 4, expert_dim: int = 64,
                 fitted: dict | None = None):
        super().__init__()
        self.objectives = config.objective_names
        self.sparse = SparseArch(config, size, fitted)
        self.domain = nn.Embedding(len(config.domain_names), size.embedding_dim)
        self.encode = NumericEncoder(n_dense, size.numeric, size.numeric_bins) if size.numeric != "none" and n_dense else None
        n_in = (self.sparse.num_tokens + 1) * size.embedding_dim + (self.encode.out_dim if self.encode is not None else n_dense)
        mods = Mods.of(size)
        self.experts = nn.ModuleList([mlp(n_in, [expert_dim * 2], expert_dim, size.dropout, size, head=False)
                                      for _ in range(n_experts)])
        # the experts' outputs are hidden layers too: their activation (and block norm) follow the Mods
        self.expert_out = nn.Sequential(*mods.after_hidden(expert_dim))
        self.gates = (nn.ModuleDict({o: Linear(n_in, n_experts, bias=mods.bias) for o in self.objectives})
                      if n_experts > 1 else None)
        self.towers = nn.ModuleDict({o: mlp(expert_dim, size.head_dims, 1, size.dropout, size) for o in self.objectives})
        self.chains = chains(config, self.objectives)

    def set_output_bias(self, rates: dict[str, float]) -> None:
        set_head_bias(self.towers, conditional_rates(rates, self.chains))

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor, domain: torch.Tensor) -> dict[str, torch.Tensor]:
        dense = self.encode(dense) if self.encode is not None else dense  # (B, n_dense * bins) or (B, n_dense)
        x = torch.cat([self.sparse(sparse).flatten(1), self.domain(domain), dense], dim=1)  # (B, n_in)
        e = torch.stack([self.expert_out(ex(x)) for ex in self.experts], dim=1)  # (B, E, H)
        out = {}
        for o in self.objectives:
            # the expert mix is not an FP8 site: a (1, E) x (E, H) product per example (gemm.py)
            h = e[:, 0] if self.gates is None else torch.einsum("be,beh->bh", torch.softmax(self.gates[o](x), -1), e)  # (B, H)
            out[o] = self.towers[o](h).squeeze(-1)  # (B,)
        return apply_chains(out, self.chains)
