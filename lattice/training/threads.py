"""Intra-op threads of a CPU training rank (`training.threads`; 0 chooses from the model).

A recommendation model's step is hundreds of small ops (GEMMs of a few hundred rows, LayerNorms,
lookups). Splitting one of them over threads pays only when it holds enough arithmetic to cover
the threads' hand-offs, so the choice follows the dense work of one step, measured the way the
distillation budget is (lattice.models.cost): one thread per `FLOPS_PER_THREAD` of forward FLOPs
per rank and step, at least 1, at most the rank's share of the machine's cores.

Measured on 2 cores (bench/README.md, "Intra-op threads"): at 20-130 MFLOP per step (the teachers
and MMoE baselines of the Taobao, MIND and Avazu samples, batches of 128-512) one thread trained
1.5-4.6x faster end to end than two, and torch-rechub's models too; at 715 MFLOP (the demo teacher,
batch 1024) two threads were faster (1.1x over two epochs). The threshold lies between the two.
"""

from __future__ import annotations

import os

FLOPS_PER_THREAD = 300e6


def machine_threads() -> int:
    """Cores this process may run on (the affinity mask, not the host's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def intra_op_threads(setting: int, dense_flops_per_example: float, batch_per_rank: int, ranks_on_node: int,
                     cores: int | None = None) -> tuple[int, str]:
    """(threads, why) for one CPU rank. `setting`: training.threads (0: choose)."""
    if setting:
        return setting, "training.threads"
    cores = cores or machine_threads()
    share = max(1, cores // max(1, ranks_on_node))
    step = dense_flops_per_example * batch_per_rank
    n = max(1, min(share, int(step // FLOPS_PER_THREAD)))
    return n, (f"chosen from the model: {step / 1e6:,.0f} MFLOP of dense work per step, one thread per "
               f"{FLOPS_PER_THREAD / 1e6:.0f}, at most {share} ({cores} cores / {ranks_on_node} rank(s)); "
               "training.threads sets it")
