"""training.lr_sparse_after_first_epoch: the tables' rate after the first epoch. At 0 every table
(whatever kernel the planner gave it) keeps its end-of-epoch-1 rows through epoch 2 while the dense
part keeps learning; at 1 (the old behaviour) the tables keep moving."""

from __future__ import annotations

import pytest
import torch

from lattice.training import distributed as D
from lattice.training import loop
from lattice.training.stages import train

pytestmark = pytest.mark.slow


def _epoch_ends(cfg, paths, name: str, factor: float, monkeypatch) -> list[dict[str, torch.Tensor]]:
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(
        update={"lr_sparse_after_first_epoch": factor, "early_stopping_patience": 5})})
    snapshots: list[dict[str, torch.Tensor]] = []
    real = loop.Trainer.validate

    def spy(self):
        snapshots.append({k: v.clone() for k, v in D.full_state_dict(self.model).items()})
        return real(self)

    monkeypatch.setattr(loop.Trainer, "validate", spy)
    train(cfg, paths, model=name, nproc=1, epochs=2, progress=False)
    monkeypatch.undo()
    assert len(snapshots) == 2
    return snapshots


def _split(state: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    tables = {k: v for k, v in state.items() if "embedding_bags" in k}
    return tables, {k: v for k, v in state.items() if k not in tables and v.is_floating_point()}


def test_frozen_tables_after_the_first_epoch(tiny_demo, monkeypatch) -> None:
    cfg, paths = tiny_demo("sparse_lr", 4_000)
    first, second = _epoch_ends(cfg, paths, "teacher@frozen", 0.0, monkeypatch)
    t1, d1 = _split(first)
    t2, d2 = _split(second)
    assert t1 and d1
    for k in t1:  # a frozen table is never written: the same bytes
        assert torch.equal(t1[k], t2[k]), k
    assert any(not torch.equal(d1[k], d2[k]) for k in d1)

    first, second = _epoch_ends(cfg, paths, "teacher@moving", 1.0, monkeypatch)
    t1, _ = _split(first)
    t2, _ = _split(second)
    assert all(not torch.equal(t1[k], t2[k]) for k in t1)
