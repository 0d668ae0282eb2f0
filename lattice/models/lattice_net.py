"""The Lattice MDMO network: sparse and dense features as tokens, a domain token, a stack of
Wukong interaction layers (the last one optionally untied per domain), optionally a shared stack
or gated experts over every layer's tokens, and one head per objective. Teacher and student are
this class at different `ModelSize`s."""

from __future__ import annotations

from typing import Dict, List

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lattice.config import PlatformConfig
from lattice.config.schema import ModelSize
from lattice.data.zipper import head_key
from lattice.models.chain import apply_chains, chained_logit, chains, conditional_rates
from lattice.models.gemm import Linear
from lattice.models.interaction import DomainFM, DomainUntied, WukongLayer, mlp, trunk
from lattice.models.leaves import LeafArch, LeafMargin, leaf_key, split_leaves
from lattice.models.mods import Mods
from lattice.models.numeric import NumericEncoder
from lattice.models.sparse import SparseArch

DENSE_TOKENS = 2  # the dense tokens of every model saved before ModelSize.dense_tokens existed


def set_head_bias(heads: nn.ModuleDict, rates: dict[str, float]) -> None:
    with torch.no_grad():
        for o, head in heads.items():
            r = min(max(rates.get(o, 0.5), 1e-4), 1 - 1e-4)
            head[-1].bias.fill_(float(torch.logit(torch.tensor(r))))


class DenseArch(nn.Module):
    """(B, n_dense) -> (B, T, D) tokens."""

    def __init__(self, n_dense: int, dim: int, tokens: int = DENSE_TOKENS, size: ModelSize | None = None):
        super().__init__()
        self.tokens, self.dim = tokens, dim
        mods, w = Mods.of(size), tokens * dim
        # numeric: none builds no encoder (the model, its init and its state dict as before)
        kind = size.numeric if size is not None else "none"
        self.encode = NumericEncoder(n_dense, kind, size.numeric_bins) if kind != "none" else None
        n_in = self.encode.out_dim if self.encode is not None else n_dense
        self.net = nn.Sequential(Linear(n_in, w, bias=mods.bias), *mods.after_hidden(w), Linear(w, w, bias=mods.bias))

    @property
    def code_dim(self) -> int:
        """Width of `code`'s output."""
        return self.encode.out_dim if self.encode is not None else self.net[0].in_features

    def code(self, dense: torch.Tensor) -> torch.Tensor:
        """(B, n_dense) -> the encoded columns, (B, n_dense * bins) or (B, n_dense)."""
        return self.encode(dense) if self.encode is not None else dense

    def forward(self, dense: torch.Tensor, code: torch.Tensor | None = None) -> torch.Tensor:
        x = self.code(dense) if code is None else code
        return self.net(x).view(dense.shape[0], self.tokens, self.dim)  # (B, T, D)


class LatticeNet(nn.Module):
    def __init__(self, config: PlatformConfig, size: ModelSize, n_dense: int, objectives: list[str] | None = None,
                 domain_token: bool | None = None, domain_untied: bool | None = None, fitted: dict | None = None,
                 leaves: dict | None = None, margin: bool = False, leaf_pooling: str = "mean", leaf_tokens: bool = True):
        super().__init__()
        self.objectives = list(objectives or config.objective_names)
        d = size.embedding_dim
        n_domains = len(config.domain_names)
        self.sparse = SparseArch(config, size, fitted)
        self.dense = DenseArch(n_dense, d, tokens=size.dense_tokens, size=size) if n_dense else None
        use_domain = size.domain_token if domain_token is None else domain_token
        self.domain = nn.Embedding(n_domains, d) if use_domain else None
        # leaves: LeafForest.spec() of the tree fit whose leaf ids this model reads (lattice.models.leaves)
        # (leaf_tokens false: the leaf ids feed the margin only, models.leaves.tokens)
        self.leaves = LeafArch(leaves, d, leaf_pooling) if leaves and leaf_tokens else None
        self.leaf_keys: List[str] = [leaf_key(o) for o in sorted(leaves["trees"])] if leaves else []
        # margin (models.leaves.margin): each unchained objective's logit starts at its booster's raw score
        # (frozen) and the heads learn the residual; a chained head is conditional, the booster is not
        given = {o.name for o in config.objectives if o.given}
        self.margin = LeafMargin(leaves) if leaves and margin and "values" in leaves else None
        self.margin_index: Dict[str, int] = ({o: i for i, o in enumerate(self.margin.objectives)
                                              if o in self.objectives and o not in given} if self.margin is not None else {})
        self.n_sparse = self.sparse.num_tokens  # the features' keys come first in the KJT, the forests' after
        n = (self.sparse.num_tokens + (size.dense_tokens if n_dense else 0) + (1 if use_domain else 0)
             + (self.leaves.num_tokens if self.leaves is not None else 0))
        context = n  # tokens the heads see: the input tokens and every layer's output (below)
        # domain-weighted pairwise interactions of the input tokens, next to them in the context
        self.domain_fm = DomainFM(n, d, n_domains, size.domain_fm) if size.domain_fm else None
        untied = size.domain_untied if domain_untied is None else domain_untied
        layers: list[nn.Module] = []
        for i in range(size.num_layers):
            make = (lambda n_in=n: WukongLayer(n_in, size.num_tokens, d, size.fm_rank, size.dropout, size))
            last = i == size.num_layers - 1
            layers.append(DomainUntied(make, n_domains) if (untied and last) else make())
            n = size.num_tokens
            context += n
        self.interaction = nn.ModuleList(layers)
        # the encoded dense columns next to the tokens (size.dense_context), as the heads' inputs
        self.dense_context = bool(size.dense_context and self.dense is not None)
        n_flat = (context * d + (self.domain_fm.out_dim if self.domain_fm is not None else 0)
                  + (self.dense.code_dim if self.dense_context else 0))
        head_in = size.shared_dims[-1] if size.shared_dims else n_flat
        # between the tokens and the heads: nothing, one shared stack, or experts mixed per objective
        self.experts = nn.ModuleList([trunk(n_flat, size.shared_dims, size.dropout, size)
                                      for _ in range(size.experts if size.shared_dims else 1)])
        self.gates = (nn.ModuleDict({o: Linear(n_flat, len(self.experts), bias=Mods.of(size).bias) for o in self.objectives})
                      if len(self.experts) > 1 else None)
        self.heads = nn.ModuleDict({o: mlp(head_in, size.head_dims, 1, size.dropout, size) for o in self.objectives})
        # Zipper (training.label_delay: zipper): the K-1 shorter windows' heads of each delayed
        # objective; its own head above is the longest window's, the one evaluated and served
        z = config.training.zipper if config.training.label_delay == "zipper" else None
        delayed = [o.name for o in config.objectives if o.attribution and o.name in self.objectives] if z else []
        self.zipper = (nn.ModuleDict({o: nn.ModuleList([mlp(head_in, size.head_dims, 1, size.dropout, size)
                                                        for _ in range(len(z.windows) - 1)]) for o in delayed})
                       if delayed else None)
        self.chains = chains(config, self.objectives)  # (objective, given): see chain.py

    def set_output_bias(self, rates: dict[str, float]) -> None:
        """Start every head at its objective's base rate, so early steps learn structure instead
        of the (very skewed) label prior."""
        rates = conditional_rates(rates, self.chains)
        # a head on top of the trees' margin starts at 0: the margin already holds the base rate
        rates.update({o: 0.5 for o in self.margin_index})
        set_head_bias(self.heads, rates)
        for o, heads in (self.zipper or {}).items():  # a shorter window's rate is lower; this is a start
            set_head_bias(nn.ModuleDict({str(k): h for k, h in enumerate(heads)}), {str(k): rates.get(o, 0.5) for k in range(len(heads))})

    def tokens(self, dense: torch.Tensor, sparse: KeyedJaggedTensor, domain: torch.Tensor,
               code: torch.Tensor | None = None, leaf_kjt: KeyedJaggedTensor | None = None) -> torch.Tensor:
        """`code`: the dense columns already encoded (DenseArch.code), when the caller has them;
        `leaf_kjt`: the forests' keys already split from `sparse` (which then holds the features' only)."""
        if len(self.leaf_keys) > 0 and leaf_kjt is None:
            sparse, leaf_kjt = split_leaves(sparse, self.n_sparse, self.leaf_keys)
        parts = [self.sparse(sparse)]  # (B, F, D)
        if self.dense is not None:
            parts.append(self.dense(dense) if code is None else self.dense(dense, code))  # (B, T, D)
        if self.domain is not None:
            parts.append(self.domain(domain).unsqueeze(1))  # (B, 1, D)
        if self.leaves is not None and leaf_kjt is not None:
            parts.append(self.leaves(leaf_kjt))  # (B, O, D)
        return torch.cat(parts, dim=1)  # (B, N, D)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor, domain: torch.Tensor) -> dict[str, torch.Tensor]:
        code = self.dense.code(dense) if self.dense_context else None  # encoded once, for both uses
        leaf_kjt = None
        if len(self.leaf_keys) > 0:  # split once: the leaf tokens and the trees' margin both read it
            sparse, leaf_kjt = split_leaves(sparse, self.n_sparse, self.leaf_keys)
        x = self.tokens(dense, sparse, domain, code, leaf_kjt)
        # heads read every layer's tokens (Lattice's extended context: DenseNet-style residuals),
        # so low-order signals in the inputs reach them without passing every interaction layer
        context = [x.flatten(1)]
        if self.dense_context:
            context.append(code)  # (B, code_dim)
        if self.domain_fm is not None:
            context.append(self.domain_fm(x, domain))
        for layer in self.interaction:
            x = layer(x, domain) if isinstance(layer, DomainUntied) else layer(x)
            context.append(x.flatten(1))
        flat = torch.cat(context, dim=1)  # (B, sum_l N_l*D)
        if self.gates is None:
            h = self.experts[0](flat)  # (B, shared_dims[-1]); the tokens themselves without shared_dims
            inputs = {o: h for o in self.heads}
        else:
            e = torch.stack([ex(flat) for ex in self.experts], dim=1)  # (B, E, H)
            # the expert mix is not an FP8 site: a (1, E) x (E, H) product per example (gemm.py)
            inputs = {o: torch.einsum("be,beh->bh", torch.softmax(self.gates[o](flat), -1), e) for o in self.heads}
        out = {o: head(inputs[o]).squeeze(-1) for o, head in self.heads.items()}  # objective -> (B,) logits
        if self.margin is not None and leaf_kjt is not None:
            margins = self.margin(leaf_kjt)  # (B, O)
            for o, i in self.margin_index.items():
                out[o] = out[o] + margins[:, i]
        out = apply_chains(out, self.chains)
        if self.training and self.zipper is not None:
            out.update(self.zipper_logits(inputs, out))
        return out

    def zipper_logits(self, inputs: dict[str, torch.Tensor], out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Training only: the shorter Zipper heads' logits (lattice.data.zipper.head_key), chained
        like their objective's own head. Evaluation, export and serving never see them."""
        given = dict(self.chains)
        z = {}
        for o, heads in self.zipper.items():
            for k, head in enumerate(heads):
                logit = head(inputs[o]).squeeze(-1)
                z[head_key(o, k)] = chained_logit(out[given[o]], logit) if o in given else logit
        return z
