"""The MDMO loss: masked, weighted BCE per objective, plus teacher soft labels for distillation.

Every term is summed over examples and divided by the batch size (not by the number of labelled
examples), so an example with mask 0 contributes exactly zero to its objective's label loss and
gradient, and objectives stay comparable across batches with different domain mixes. With Zipper
heads (`training.label_delay: zipper`) an objective's label term is the sum over its K heads, each
on the examples of its window (lattice.data.zipper); distillation teaches the longest head only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lattice.config import PlatformConfig
from lattice.data.batch import Batch
from lattice.data.zipper import head_key


@dataclass
class LossParts:
    total: torch.Tensor
    label: dict[str, torch.Tensor]  # objective -> scalar
    distill: dict[str, torch.Tensor]  # objective -> scalar (empty without a teacher)


def _soft_target(p: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature == 1.0:
        return p
    p = p.clamp(1e-6, 1 - 1e-6)
    return torch.sigmoid(torch.logit(p) / temperature)


def mdmo_loss(config: PlatformConfig, logits: dict[str, torch.Tensor], batch: Batch) -> LossParts:
    n = max(len(batch), 1)
    weights = {o.name: o.loss_weight for o in config.objectives}
    dist = config.distillation
    has_teacher = batch.teacher is not None and batch.teacher_mask is not None
    label_scale = dist.label_weight if has_teacher else 1.0
    total = torch.zeros(())
    label_terms, distill_terms = {}, {}
    zl, zm = batch.zipper_labels or {}, batch.zipper_masks or {}
    for o, logit in logits.items():
        if o not in weights:
            continue  # a Zipper head's output (head_key): its loss is its objective's below
        y, m = batch.labels[o], batch.masks[o]  # (B,), (B,)
        if o in zm and head_key(o, 0) in logits:
            label_terms[o] = _zipper_term(o, logits, zl[o], zm[o], n)
        else:  # (a model without Zipper heads trains on the objective's label under `mask`)
            ll = F.binary_cross_entropy_with_logits(logit, y, reduction="none")  # (B,)
            label_terms[o] = (ll * m).sum() / n
        total = total + weights[o] * label_scale * label_terms[o]
        if has_teacher:
            t = dist.temperature
            target = _soft_target(batch.teacher[o], t)  # (B,)
            soft = F.binary_cross_entropy_with_logits(logit / t, target, reduction="none")  # (B,)
            # the teacher also teaches where the label is absent; examples it never scored fall back to labels
            w = batch.teacher_mask * (m * dist.soft_weight + (1 - m) * dist.unlabeled_weight)  # (B,)
            distill_terms[o] = (soft * w).sum() / n
            total = total + weights[o] * distill_terms[o]
    return LossParts(total, label_terms, distill_terms)


def _zipper_term(o: str, logits: dict[str, torch.Tensor], y: torch.Tensor, m: torch.Tensor, n: int) -> torch.Tensor:
    """Zipper: each example trains only the head of its hashed window, and only once that window
    has closed (`m`, (B, K), one 1 per row at most); head K-1 is the objective's own output."""
    k = y.shape[1]
    z = torch.stack([logits[head_key(o, j)] for j in range(k - 1)] + [logits[o]], dim=1)  # (B, K)
    ll = F.binary_cross_entropy_with_logits(z, y, reduction="none")
    return (ll * m).sum() / n
