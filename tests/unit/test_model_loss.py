"""The masked MDMO loss and the distillation terms, on a tiny seeded batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lattice.config import load_config
from lattice.data.batch import Batch, kjt_from_ids
from lattice.models import build_model
from lattice.training.loss import mdmo_loss
from lattice.training.tiny import tiny

ROOT = Path(__file__).resolve().parents[2]
B = 12


@pytest.fixture(scope="module")
def cfg():
    return tiny(load_config(ROOT / "configs" / "demo.yaml"))


def _batch(cfg, seed: int = 0, teacher: bool = False) -> Batch:
    rng = np.random.default_rng(seed)
    names = [f.name for f in cfg.features.sparse]
    domain = torch.tensor([0, 1, 2] * (B // 3))  # feed, search, video
    video = domain == 2
    labels = {o: torch.from_numpy(rng.integers(0, 2, B).astype(np.float32)) for o in cfg.objective_names}
    masks = {"click": torch.ones(B), "conversion": (~video).float()}
    labels["conversion"] = labels["conversion"] * masks["conversion"]
    b = Batch(
        dense=torch.from_numpy(rng.normal(size=(B, 4)).astype(np.float32)),
        sparse=kjt_from_ids(names, [rng.integers(0, 16, B) for _ in names], [rng.uniform(size=B) < 0.8 for _ in names]),
        domain=domain, labels=labels, masks=masks, example_ids=np.array([str(i) for i in range(B)]),
    )
    if teacher:
        b.teacher = {o: torch.from_numpy(rng.uniform(0.05, 0.95, B).astype(np.float32)) for o in cfg.objective_names}
        b.teacher_mask = torch.ones(B)
    return b


def _conversion_grad(cfg, model, batch) -> torch.Tensor:
    logits = model(*batch.inputs())
    for v in logits.values():
        v.retain_grad()
    mdmo_loss(cfg, logits, batch).total.backward()
    return logits["conversion"].grad


def test_domain_without_conversion_labels_gives_no_conversion_gradient(cfg) -> None:
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", 4)
    batch = _batch(cfg)
    g = _conversion_grad(cfg, model, batch)
    video = batch.domain == 2
    assert torch.all(g[video] == 0)
    assert torch.all(g[~video] != 0)
    # whatever a masked label says, the loss is the same
    before = mdmo_loss(cfg, model(*batch.inputs()), batch).total
    batch.labels["conversion"] = torch.where(video, torch.ones(B), batch.labels["conversion"])
    assert torch.equal(mdmo_loss(cfg, model(*batch.inputs()), batch).total, before)


def test_objective_weights_scale_label_terms(cfg) -> None:
    torch.manual_seed(0)
    model = build_model(cfg, "student", 4)
    batch = _batch(cfg)
    parts = mdmo_loss(cfg, model(*batch.inputs()), batch)
    w = {o.name: o.loss_weight for o in cfg.objectives}
    assert parts.total.item() == pytest.approx(sum(w[o] * parts.label[o].item() for o in w), rel=1e-6)
    assert parts.distill == {}


def test_teacher_teaches_unlabelled_rows_with_its_own_weight(cfg) -> None:
    torch.manual_seed(0)
    model = build_model(cfg, "student", 4)
    batch = _batch(cfg, teacher=True)
    video = batch.domain == 2
    g = _conversion_grad(cfg, model, batch)
    assert torch.all(g[video] != 0)  # unlabeled_weight > 0 in the demo config
    off = cfg.model_copy(update={"distillation": cfg.distillation.model_copy(update={"unlabeled_weight": 0.0})})
    model.zero_grad()
    g = _conversion_grad(off, model, batch)
    assert torch.all(g[video] == 0)


def test_rows_without_teacher_score_fall_back_to_labels(cfg) -> None:
    torch.manual_seed(0)
    model = build_model(cfg, "student", 4)
    plain = _batch(cfg)
    with_teacher = _batch(cfg, teacher=True)
    logits = model(*plain.inputs())
    with_teacher.teacher_mask = torch.zeros(B)
    a = mdmo_loss(cfg, logits, plain)
    b = mdmo_loss(cfg, logits, with_teacher)
    # label_weight is 1 in the demo: no teacher score anywhere == labels only
    assert b.total.item() == pytest.approx(a.total.item(), rel=1e-6)
    assert all(v.item() == 0 for v in b.distill.values())
    # half the rows scored: only those carry a distillation term
    with_teacher.teacher_mask = (torch.arange(B) % 2 == 0).float()
    c = mdmo_loss(cfg, logits, with_teacher)
    assert c.total.item() > a.total.item()
