"""Chained objectives (`objectives[].given`): P(o) = P(given) · P(o | given), as logits.

A conversion can only follow a click. Rather than a head that learns the rare unconditional
rate from scratch, the conversion head predicts P(conversion | click) and the model outputs the
product with the click head's probability (ESMM, Ma et al. 2018): every impression trains both,
and the click signal is reused where conversions are few. The output stays a logit per objective,
so losses, metrics, distillation and export need no change.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F

from lattice.config import PlatformConfig


def chains(config: PlatformConfig, objectives: List[str]) -> List[Tuple[str, str]]:
    """(objective, given) pairs a model with these heads can chain (both heads present)."""
    return [(o.name, o.given) for o in config.objectives if o.given and o.name in objectives and o.given in objectives]


def chained_logit(given: torch.Tensor, conditional: torch.Tensor) -> torch.Tensor:
    """logit of sigmoid(given) · sigmoid(conditional), computed in log space (rare events stay exact)."""
    log_p = (F.logsigmoid(given) + F.logsigmoid(conditional)).clamp(max=-1e-7)  # log P(o) < 0
    return log_p - torch.log(-torch.expm1(log_p))  # log P - log(1 - P)


def apply_chains(out: Dict[str, torch.Tensor], pairs: List[Tuple[str, str]]) -> Dict[str, torch.Tensor]:
    """Replace each chained objective's conditional logit in `out` by its unconditional one."""
    for o, given in pairs:
        out[o] = chained_logit(out[given], out[o])
    return out


def conditional_rates(rates: dict[str, float], pairs: List[Tuple[str, str]]) -> dict[str, float]:
    """Base rates for the heads: a chained head starts at P(o) / P(given)."""
    out = dict(rates)
    for o, g in pairs:
        if o in rates and rates.get(g):
            out[o] = rates[o] / rates[g]
    return out
