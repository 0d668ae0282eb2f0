"""Notes `lattice config check` prints about settings the platform's own measurements show to be
slower on the machine the check runs on (not errors: the config is valid and may be meant for
another machine)."""

from __future__ import annotations

import os

from lattice.config.schema import PlatformConfig

# bench/README.md, "Training processes on one CPU machine" (2026-12-02, 2 cores): one epoch of the
# teacher with the same table and global batch, 2 torchrun ranks against 1 process
MEASURED_RANKS_ON_CPU = "1.5-1.8x slower end to end on the demo's 200k rows, 5-6x on MIND's 6k (2 cores, 2026-12-02)"


def speed_notes(config: PlatformConfig, cores: int | None = None, gpu: bool | None = None) -> list[str]:
    """What to change for speed on this machine, each with the figure it rests on."""
    cores = cores or os.cpu_count() or 1
    if gpu is None:
        import importlib.util

        gpu = False
        if importlib.util.find_spec("torch") is not None and config.training.device != "cpu":
            import torch

            gpu = torch.cuda.is_available()
    notes = []
    n = config.training.nproc
    if n > 1 and not gpu and config.deployment.profile == "embedded" and cores < 4 * n:
        notes.append(
            f"training.nproc: {n} runs {n} torchrun ranks on {cores} CPU cores; measured "
            f"{MEASURED_RANKS_ON_CPU}: the ranks split the same arithmetic and add the tables' all-to-all and "
            "torchrun's start. Use nproc: 0 (one process on CPU) unless the tables do not fit one process "
            "(bench/README.md, 'Training processes on one CPU machine')")
    return notes
