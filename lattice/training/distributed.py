"""Sharding on TorchRec: the training device, process groups, the EmbeddingShardingPlanner plan,
DistributedModelParallel, and moving sharded state in and out (clones of the sharded state for the
best weights, a full unsharded state dict for serving). Checkpoints: lattice/training/checkpoint.py."""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import fields, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torchrec import EmbeddingBagCollection
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.model_parallel import DataParallelWrapper
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import ShardingPlan

CPU_SHARDING = ("table_wise", "column_wise", "table_column_wise", "data_parallel")
GPU_ONLY_SHARDING = ("row_wise", "table_row_wise")  # reduce-scatter: nccl has it, gloo does not

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


def choose_device(choice: str = "auto") -> torch.device:
    """`training.device`: auto = cuda when torch sees a GPU, else cpu. Under torchrun each rank
    takes the GPU of its LOCAL_RANK."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("training.device is cuda but torch.cuda.is_available() is False: install the GPU "
                           "stack (LATTICE_GPU=1 infra/setup.sh) or set training.device to auto or cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(device: torch.device | None = None, timeout_s: float = 600) -> tuple[int, int, bool]:
    """Join torchrun's group, or make a private world of one. Returns (rank, world, created).
    `timeout_s` bounds a collective whose peer has gone (a killed rank), so the survivors fail
    instead of waiting gloo's default 30 minutes."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    device = device or torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend, timeout = backend_for(device), timedelta(seconds=timeout_s)
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return dist.get_rank(), dist.get_world_size(), True


def sharding_types(requested: list[str], device: torch.device | str | None = None) -> list[str]:
    """The requested kinds the device can run: row-wise kinds need CUDA (gloo lacks
    reduce-scatter); on CPU keep the rest. `device` None: cuda if torch sees one (the old rule)."""
    on_cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    if on_cuda:
        return list(requested)
    kept = [t for t in requested if t in CPU_SHARDING]
    return kept or ["table_wise", "data_parallel"]


def to_device(batch: Any, device: torch.device) -> Any:
    """The batch's tensors (and its KeyedJaggedTensor) on `device`; a no-op on CPU."""
    if device.type == "cpu":
        return batch

    def move(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: move(x) for k, x in v.items()}
        return v.to(device, non_blocking=True) if hasattr(v, "to") and not isinstance(v, (str, bytes)) else v

    return replace(batch, **{f.name: move(getattr(batch, f.name)) for f in fields(batch) if f.name != "example_ids"})


def table_names(model: nn.Module) -> list[str]:
    return [c.name for m in model.modules() if isinstance(m, EmbeddingBagCollection) for c in m.embedding_bag_configs()]


def planner_for(model: nn.Module, world: int, types: list[str], device: torch.device | str = "cpu",
                pinned: dict[str, str] | None = None, local_world: int | None = None) -> EmbeddingShardingPlanner:
    """The planner for `world` ranks of `device`. `pinned` (table -> sharding type, from a
    checkpoint's plan) keeps each table's kind on a resume at another world size: a table's
    optimizer state has the layout of its kind (Adam on a data-parallel copy, a row-wise momentum
    on a sharded one), and DCP reshards within one layout, not across them."""
    on_cpu = torch.device(device).type == "cpu"
    # a GPU run's row-wise table resumes table-wise on CPU: both keep one momentum row per table row
    pinned = {t: "table_wise" if on_cpu and k in GPU_ONLY_SHARDING else k for t, k in (pinned or {}).items()}
    constraints = {t: ParameterConstraints(sharding_types=[pinned[t]] if t in pinned else types) for t in table_names(model)}
    topology = Topology(world_size=world, compute_device=torch.device(device).type,
                        local_world_size=local_world or int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    return EmbeddingShardingPlanner(topology=topology, constraints=constraints)


def make_plan(model: nn.Module, world: int, types: list[str], device: torch.device | str = "cpu",
              pinned: dict[str, str] | None = None) -> ShardingPlan:
    planner = planner_for(model, world, types, device, pinned)
    return planner.collective_plan(model, [EmbeddingBagCollectionSharder()], dist.GroupMember.WORLD)


class _NoDataParallel(DataParallelWrapper):
    """One rank: the dense part stays as it is. DDP around it would all-reduce every gradient
    with no peer to reduce with, copying each into a bucket and back; without it (with its
    forward hooks) one process trained 0-9% faster on the Avazu sample and demo 200k rows."""

    def wrap(self, dmp: DistributedModelParallel, env, device: torch.device) -> None:
        return None


def wrap(model: nn.Module, plan: ShardingPlan, device: torch.device | str = "cpu") -> DistributedModelParallel:
    single = not dist.is_initialized() or dist.get_world_size() == 1
    return DistributedModelParallel(model, device=torch.device(device), plan=plan, sharders=[EmbeddingBagCollectionSharder()],
                                    data_parallel_wrapper=_NoDataParallel() if single else None)


def plan_types(plan_json: dict[str, Any]) -> dict[str, str]:
    """table -> sharding type, from `plan_to_json`'s output (keys are module.table)."""
    return {k.rsplit(".", 1)[-1]: v["sharding_type"] for k, v in plan_json.items()}


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


def clone_state(state: dict[str, Any]) -> dict[str, Any]:
    """A detached copy of a model state dict that keeps each ShardedTensor a ShardedTensor (its
    local shards cloned, its global metadata shared), so it can go into a DCP checkpoint."""
    out: dict[str, Any] = {}
    for k, v in state.items():
        if isinstance(v, ShardedTensor):
            shards = [Shard(s.tensor.detach().clone(), s.metadata) for s in v.local_shards()]
            out[k] = ShardedTensor._init_from_local_shards_and_global_metadata(
                shards, v.metadata(), process_group=v._process_group)
        elif isinstance(v, torch.Tensor):
            out[k] = v.detach().clone()
        else:
            out[k] = v
    return out


def copy_state(live: dict[str, Any], saved: dict[str, Any]) -> None:
    """In-place copy of a `clone_state` copy back into a live state dict (whose tensors are views
    of the parameters)."""
    missing = set(live) - set(saved)
    if missing:
        raise ValueError(f"saved weights lack {sorted(missing)[:5]}: they belong to another model or plan")
    for k, v in live.items():
        if isinstance(v, ShardedTensor):
            for shard, src in zip(v.local_shards(), saved[k].local_shards()):
                shard.tensor.detach().copy_(src.tensor)
        elif isinstance(v, torch.Tensor):
            v.detach().copy_(saved[k])


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The unsharded state dict on rank 0 (None on other ranks). Collective: every rank calls it."""
    rank = dist.get_rank()
    # nccl gathers into GPU memory only
    here = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    out: dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        if isinstance(v, ShardedTensor):
            full = torch.empty(v.size(), dtype=v.dtype, device=here) if rank == 0 else None
            v.gather(dst=0, out=full)
            if rank == 0:
                out[k] = full.cpu()
        elif isinstance(v, torch.Tensor):
            out[k] = v.detach().cpu().clone()
    return out if rank == 0 else None
