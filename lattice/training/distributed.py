"""Sharding on TorchRec: process groups, the EmbeddingShardingPlanner plan, DistributedModelParallel,
and moving sharded state in and out (per-rank local state for checkpoints, a full unsharded
state dict for serving)."""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec import EmbeddingBagCollection
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import ShardingPlan

CPU_SHARDING = ("table_wise", "column_wise", "table_column_wise", "data_parallel")

# fbgemm's CPU kernel for data-parallel ("dense") tables runs its own autograd function under the
# CPU key, so PyTorch's fallback warns that no Autograd kernel is registered; the gradients are
# right all the same (tests/unit/test_dense_table_grad.py checks them against nn.EmbeddingBag).
warnings.filterwarnings("ignore", message=r"fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel")

for _name in ("torchrec.distributed.planner", "torchrec.distributed.utils", "torchrec.distributed.planner.types",
              "torchrec.distributed.planner.storage_reservations"):
    logging.getLogger(_name).setLevel(logging.ERROR)


def _quiet_torchrec_root(record: logging.LogRecord) -> bool:
    """Some torchrec modules log through the root logger itself (`logging.info`); drop those
    below ERROR without raising the root level, which would silence every other logger."""
    return record.levelno >= logging.ERROR or "torchrec" not in record.pathname


logging.getLogger().addFilter(_quiet_torchrec_root)


def init_process_group() -> tuple[int, int, bool]:
    """Join torchrun's group, or make a private world of one. Returns (rank, world, created)."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size(), True


def sharding_types(requested: list[str]) -> list[str]:
    """Row-wise kinds need CUDA (gloo lacks reduce-scatter); on CPU keep the rest."""
    if torch.cuda.is_available():
        return list(requested)
    kept = [t for t in requested if t in CPU_SHARDING]
    return kept or ["table_wise", "data_parallel"]


def make_plan(model: nn.Module, world: int, types: list[str]) -> ShardingPlan:
    tables = [c.name for m in model.modules() if isinstance(m, EmbeddingBagCollection) for c in m.embedding_bag_configs()]
    constraints = {t: ParameterConstraints(sharding_types=types) for t in tables}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"), constraints=constraints)
    return planner.collective_plan(model, [EmbeddingBagCollectionSharder()], dist.GroupMember.WORLD)


def wrap(model: nn.Module, plan: ShardingPlan) -> DistributedModelParallel:
    return DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=[EmbeddingBagCollectionSharder()])


def plan_to_json(plan: ShardingPlan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for module, params in plan.plan.items():
        for name, ps in params.items():
            shards = []
            spec = getattr(ps, "sharding_spec", None)
            for s in getattr(spec, "shards", []) or []:
                shards.append({"offsets": list(s.shard_offsets), "sizes": list(s.shard_sizes), "placement": str(s.placement)})
            out[f"{module}.{name}" if module else name] = {
                "sharding_type": ps.sharding_type, "compute_kernel": ps.compute_kernel,
                "ranks": list(ps.ranks) if ps.ranks is not None else None, "shards": shards,
            }
    return out


# ---------------------------------------------------------------- state in and out


def local_state(obj: Any) -> Any:
    """Copy of a (nested) state dict holding only this rank's data: a ShardedTensor becomes the
    list of its local shard tensors."""
    if isinstance(obj, ShardedTensor):
        return [s.tensor.detach().clone() for s in obj.local_shards()]
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: local_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(local_state(v) for v in obj)
    return obj


def copy_local_state(live: Any, saved: Any, where: str = "") -> None:
    """In-place copy of `local_state` output back into a live state dict (whose tensors are views
    of the parameters and fused optimizer states)."""
    if isinstance(live, ShardedTensor):
        for shard, t in zip(live.local_shards(), saved):
            shard.tensor.detach().copy_(t)
    elif isinstance(live, torch.Tensor):
        live.detach().copy_(saved)
    elif isinstance(live, dict):
        missing = set(live) - set(saved)
        if missing:
            raise ValueError(f"checkpoint lacks {sorted(missing)[:5]} at {where or 'top level'}: it belongs to another model or plan")
        for k in live:
            copy_local_state(live[k], saved[k], f"{where}.{k}")


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The unsharded state dict on rank 0 (None on other ranks). Collective: every rank calls it."""
    rank = dist.get_rank()
    out: dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        if isinstance(v, ShardedTensor):
            full = torch.empty(v.size(), dtype=v.dtype) if rank == 0 else None
            v.gather(dst=0, out=full)
            if rank == 0:
                out[k] = full
        elif isinstance(v, torch.Tensor):
            out[k] = v.detach().clone()
    return out if rank == 0 else None
