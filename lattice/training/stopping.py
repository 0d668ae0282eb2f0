"""The early-stopping rule and the words a run's record uses for it.

One rule for the trainer, its tests and the benchmark that chose its defaults
(bench/bench_early_stopping.py replays it on recorded validation curves): a validation that
beats the best macro NE so far becomes the kept one and resets the count; any other adds one;
training stops once the count exceeds the patience. Ties count as no gain, so a curve that has
gone flat stops instead of running on for rounding noise."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    best: bool  # this validation is the best so far: its weights are the ones kept
    bad_evals: int  # validations in a row without a better macro NE, this one included
    stop: bool  # patience ran out: training ends here


def observe(best_ne: float, bad_evals: int, value: float, patience: int) -> Step:
    """The rule applied to one more validation macro NE (`best_ne` inf before the first)."""
    if value < best_ne:  # a nan NE never wins: it compares False
        return Step(best=True, bad_evals=0, stop=False)
    bad = bad_evals + 1
    return Step(best=False, bad_evals=bad, stop=bad > patience)


def replay(curve: list[float], patience: int) -> tuple[int, int | None]:
    """(index of the kept validation, index where training stops or None when it never does) on
    a whole validation curve: what a run with these validations would do."""
    best_ne, bad, kept = math.inf, 0, -1
    for i, value in enumerate(curve):
        step = observe(best_ne, bad, value, patience)
        bad = step.bad_evals
        if step.best:
            best_ne, kept = value, i
        if step.stop:
            return kept, i
    return kept, None


def point(entry: dict, evals_per_epoch: int) -> str:
    """A validation as a reader finds it: 'the end of epoch 2' or 'epoch 2, validation 3 of 4'."""
    k = entry.get("validation", evals_per_epoch)
    if k >= evals_per_epoch:
        return f"the end of epoch {entry['epoch']}"
    return f"epoch {entry['epoch']}, validation {k} of {evals_per_epoch}"


def reason(evals: list[dict], best_step: int, stopped: bool, patience: int, evals_per_epoch: int,
           epochs_planned: int) -> str:
    """Why the run ended and which validation's weights it kept, in one sentence."""
    kept = next((e for e in evals if e["step"] == best_step), None)
    keeps = (f"kept {point(kept, evals_per_epoch)} (step {kept['step']}, validation macro NE {kept['val_macro_ne']:.4f})"
             if kept else "no validation gave a finite macro NE: kept the last weights")
    if stopped and evals:
        last = evals[-1]
        without = sum(1 for e in evals if e["step"] > best_step) if kept else len(evals)
        return (f"patience ran out at {point(last, evals_per_epoch)} (step {last['step']}): {without} validation(s) in a row "
                f"without a better validation macro NE (training.early_stopping_patience {patience}); {keeps}")
    return f"all {epochs_planned} planned epoch(s) ran; {keeps}"
