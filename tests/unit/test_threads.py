"""Intra-op threads of a CPU training rank: chosen from the model's dense work per step, bounded by
the rank's share of the cores, set by `training.threads` when given, and handed back to the caller
after an in-process run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lattice.config import load_config
from lattice.training.threads import FLOPS_PER_THREAD, intra_op_threads
from lattice.training.tiny import tiny

ROOT = Path(__file__).resolve().parents[2]


def test_small_steps_take_one_thread_and_large_ones_the_ranks_share_of_the_cores() -> None:
    per_example = 1e5  # 0.1 MFLOP: a small CTR network
    assert intra_op_threads(0, per_example, 512, ranks_on_node=1, cores=2)[0] == 1  # 51 MFLOP per step
    big = 4 * FLOPS_PER_THREAD / 1024
    assert intra_op_threads(0, big, 1024, ranks_on_node=1, cores=2)[0] == 2  # capped at the cores
    assert intra_op_threads(0, big, 1024, ranks_on_node=1, cores=16)[0] == 4  # one per FLOPS_PER_THREAD
    assert intra_op_threads(0, big, 1024, ranks_on_node=2, cores=2)[0] == 1  # two ranks share 2 cores
    assert intra_op_threads(0, 0.0, 1, ranks_on_node=8, cores=2)[0] == 1  # never 0
    n, why = intra_op_threads(3, per_example, 512, ranks_on_node=1, cores=2)
    assert (n, why) == (3, "training.threads")  # the setting wins, even beyond the cores


@pytest.mark.parametrize("setting", [0, 2])
def test_an_in_process_run_sets_its_threads_and_restores_the_callers(tmp_path, setting) -> None:
    from lattice.data.local_table import write_local_table
    from lattice.data.synth import generate
    from lattice.paths import Paths
    from lattice.training.stages import train

    cfg = tiny(load_config(ROOT / "configs" / "demo.yaml"), data_root=str(tmp_path / "raw"))
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"threads": setting})})
    generate(cfg, 3000, tmp_path / "raw", progress=False)
    paths = Paths.for_config(cfg, tmp_path / "work")
    write_local_table(cfg, paths)
    seen: list[int] = []
    real = torch.set_num_threads
    mp = pytest.MonkeyPatch()
    mp.setattr(torch, "set_num_threads", lambda n: (seen.append(n), real(n))[1])
    before = torch.get_num_threads()
    try:
        summary = train(cfg, paths, model="teacher", nproc=1, epochs=1, progress=False)
    finally:
        mp.undo()
    want = setting or 1  # the tiny teacher is far below FLOPS_PER_THREAD per step
    assert summary["threads"] == want
    assert seen == [want, before]  # set for the run, then the caller's count back
    assert torch.get_num_threads() == before


def test_the_gates_latency_runs_on_the_serving_thread_count_and_restores_the_callers() -> None:
    import pandas as pd

    from lattice.export.window import latency_ms

    seen: list[int] = []

    class Predictor:
        def predict_table(self, table) -> None:
            assert table.num_rows == 1
            seen.append(torch.get_num_threads())

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = latency_ms(Predictor(), pd.DataFrame({"x": range(5)}), iterations=20)
        assert set(seen) == {1} and len(seen) == 30  # 10 warm-up rows, then 20 timed
        assert torch.get_num_threads() == 2
        assert out["cpu_p99_ms"] >= out["cpu_p50_ms"] >= 0
    finally:
        torch.set_num_threads(before)
