"""The module that gets exported: (dense, KJT, domain) -> {objective: probability}.

Two swaps make the training network traceable by `torchrec.fx` and scriptable, without
changing its numbers for in-range inputs:
  - `KJTRemap` splits values by key with a Python zip over a list whose length TorchScript
    cannot know; `ScriptableRemap` walks the remap ModuleList instead;
  - `IdentityRemap` checks ids with a data-dependent branch (no graph can hold it); in the
    artifact it becomes `InRangeRemap` (ids mod rows: identical for every id the check accepts).
  - `ZCHRemap` (hashing zch) trains TorchRec's managed-collision module; in the artifact it
    becomes its frozen map (`FittedLookup` over the sorted raw ids and their rows), the same
    lookup the eval-mode module runs. The other compression modules (lattice.hashing) trace as
    they are.
Every GEMM site the FP8 plan switched (`recipe` set) becomes its inference form, a float8
weight with its scales (lattice.export.fp8_serving): the autograd Function it trains with is not
scriptable. Optionally the embedding tables become INT8 row-wise (torchrec `quantize_embeddings`).
"""

# no `from __future__ import annotations`: FX codegen and TorchScript need real annotation objects

import copy
import warnings
from typing import Dict, List

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lattice.export.fp8_serving import SERVING_TYPES, serving_form
from lattice.models.gemm import GemmSite
from lattice.models.leaves import BAG_MODE, stacked_bags
from lattice.hashing.single import IdentityRemap, ModuloRemap
from lattice.hashing.zch import ZCHRemap
from lattice.models.remap import KJTRemap
from lattice.models.sparse import SparseArch


class ScriptableRemap(nn.Module):
    def __init__(self, src: KJTRemap):
        super().__init__()
        self.keys: List[str] = list(src.keys)
        self.remaps = src.remaps

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        parts = torch.split(kjt.values(), kjt.length_per_key())  # one (n_k,) id tensor per key
        outs: List[torch.Tensor] = []
        i = 0
        for remap in self.remaps:
            outs.append(remap(parts[i]))
            i += 1
        return KeyedJaggedTensor(keys=self.keys, values=torch.cat(outs), lengths=kjt.lengths(), stride=kjt.stride())


class InRangeRemap(nn.Module):
    def __init__(self, rows: int):
        super().__init__()
        self.rows = rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (N,) -> (N,)
        return torch.remainder(ids, self.rows)


class FusedSparse(nn.Module):
    """A `SparseArch` whose features all take one table through a modulo remap (`hashing: modulo`
    or `none`, the defaults), as one lookup: every table's rows stacked in one weight, each narrow
    table's projection to the token width folded into its rows (the tables are sum-pooled and the
    projections linear without bias, so projecting the rows equals projecting their sum), each id
    taken mod its table's rows and shifted to the table's first row, and one `embedding_bag` over
    all F x B bags. At batch 1 the collection's per-table calls, its KJT bookkeeping and the
    per-feature projections were most of the exported student's forward, which decides single-request
    latency; this is a dozen ops in their place. Export compares the artifact with the eager model
    (`lattice.export.stages`), which covers the folding's rounding."""

    def __init__(self, arch: nn.Module, remaps: List[nn.Module]):
        super().__init__()
        weights: List[torch.Tensor] = []
        for key, compression in zip(arch.keys, arch.compress.compressions()):
            w = arch.ebc.embedding_bags[f"t_{compression.sub_keys[0]}"].weight.detach()
            if key in arch.proj:
                w = w @ arch.proj[key].weight.detach().t()  # (rows, d) -> (rows, D)
            weights.append(w)
        self.n_keys = len(weights)
        self.weight = nn.Parameter(torch.cat(weights), requires_grad=False)
        rows = torch.tensor([int(m.rows) for m in remaps], dtype=torch.int64)
        self.register_buffer("rows", rows)
        self.register_buffer("starts", torch.cumsum(rows, 0) - rows)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        values, lengths = kjt.values(), kjt.lengths()
        per_key = lengths.view(self.n_keys, -1).sum(1)  # ids of each feature
        ids = torch.remainder(values, torch.repeat_interleave(self.rows, per_key)) + torch.repeat_interleave(self.starts, per_key)
        offsets = torch.cat([torch.zeros(1, dtype=lengths.dtype), torch.cumsum(lengths, 0)])
        # the aten op itself (mode 0 = sum, include_last_offset): F.embedding_bag's Python wrapper
        # is inlined by the FX trace into code TorchScript rejects
        pooled = torch.embedding_bag(self.weight, ids, offsets, False, 0, False, None, True)[0]  # (F*B, D)
        return pooled.view(self.n_keys, -1, pooled.shape[1]).transpose(0, 1)  # (B, F, D)


def _modulo_remaps(arch: nn.Module) -> List[nn.Module] | None:
    """The per-feature modulo remaps of a SparseArch (after `_swap`), or None when any feature
    uses another scheme (vocab, qr, mixed, zch, learned: they keep the general path)."""
    from lattice.hashing.base import RemapCompression

    out = []
    for c in arch.compress.compressions():
        if type(c) is not RemapCompression or not isinstance(c.remap, (ModuloRemap, InRangeRemap)):
            return None
        out.append(c.remap)
    return out


class FusedLeaves(nn.Module):
    """A `LeafArch` (lattice.models.leaves) as one lookup, as `FusedSparse` does for the features:
    every forest's table stacked in one weight, each id shifted to its table's first row, one
    `embedding_bag` over the O x B bags of tree leaves. The collection's own call cost more than
    the trees at batch 1."""

    def __init__(self, arch: nn.Module):
        super().__init__()
        self.keys: List[str] = list(arch.keys)
        weights = [arch.ebc.embedding_bags[f"t_{k}"].weight.detach() for k in arch.keys]
        self.n_keys = len(weights)
        self.mode: int = BAG_MODE[arch.pooling]
        self.weight = nn.Parameter(torch.cat(weights), requires_grad=False)
        rows = torch.tensor([int(w.shape[0]) for w in weights], dtype=torch.int64)
        self.register_buffer("starts", torch.cumsum(rows, 0) - rows)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return stacked_bags(self.weight, self.starts, self.n_keys, kjt, self.mode)  # (B, O, D)


def fuse_sparse(module: nn.Module) -> None:
    """Swap every SparseArch made of modulo-remapped single tables for `FusedSparse`, every
    LeafArch for `FusedLeaves`."""
    from lattice.models.leaves import LeafArch

    for name, child in list(module.named_children()):
        if isinstance(child, LeafArch):
            setattr(module, name, FusedLeaves(child))
        elif isinstance(child, SparseArch):
            remaps = _modulo_remaps(child)
            if remaps is not None:
                setattr(module, name, FusedSparse(child, remaps))
        else:
            fuse_sparse(child)


class Probabilities(nn.Module):
    """Logits -> probabilities, so the artifact's output is what /predict returns."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor, domain: torch.Tensor) -> Dict[str, torch.Tensor]:
        logits = self.net(dense, sparse, domain)
        return {k: torch.sigmoid(v) for k, v in logits.items()}  # objective -> (B,)


def _swap(module: nn.Module) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, KJTRemap):
            setattr(module, name, ScriptableRemap(child))
        elif isinstance(child, IdentityRemap):
            setattr(module, name, InRangeRemap(child.rows))
        elif isinstance(child, ZCHRemap):
            setattr(module, name, child.frozen())
        elif isinstance(child, GemmSite) and child.recipe is not None:
            setattr(module, name, serving_form(child))
        else:
            _swap(child)
    if isinstance(module, nn.ModuleList):
        for i, child in enumerate(module):
            if isinstance(child, IdentityRemap):
                module[i] = InRangeRemap(child.rows)


def fp8_sites(model: nn.Module) -> List[str]:
    """Qualified names of the GEMM sites that run in FP8, in module order: sites with a recipe in
    a training model, or their inference forms in a serving module (before tracing: a traced
    artifact no longer knows which of its GEMMs were sites)."""
    return [name for name, m in model.named_modules()
            if (isinstance(m, GemmSite) and m.recipe is not None) or isinstance(m, SERVING_TYPES)]


def serving_module(model: nn.Module, int8: bool = False) -> nn.Module:
    """A traceable copy of a trained model (the original is untouched)."""
    m = copy.deepcopy(model).eval()
    _swap(m)
    if int8:
        from torchrec.inference.modules import quantize_embeddings

        m = quantize_embeddings(m, dtype=torch.qint8, inplace=True)
    else:
        fuse_sparse(m)
    return Probabilities(m).eval()


def script(model: nn.Module, int8: bool = False) -> torch.jit.ScriptModule:
    import torchrec.fx

    with warnings.catch_warnings():
        # TorchScript's notes on annotations inside torchrec's and torch's own types: nothing a
        # user (or we) can change, printed on every export
        warnings.filterwarnings("ignore", message="The TorchScript type system doesn't support instance-level annotations")
        warnings.filterwarnings("ignore", message="TorchScript will treat type annotations of Tensor dtype-specific subtypes")
        return torch.jit.script(torchrec.fx.symbolic_trace(serving_module(model, int8)))
