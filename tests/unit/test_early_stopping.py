"""The early-stopping rule (lattice.training.stopping) on constructed validation curves, and the
sentence a run records about its end."""

from __future__ import annotations

import pytest

from lattice.training.stopping import observe, point, reason, replay

# falls to its best at index 3, then rises: an over-fitting run
FALLS_THEN_RISES = [0.990, 0.960, 0.945, 0.940, 0.944, 0.951, 0.963, 0.980, 0.995]
# the same curve mirrored about its best value after the best: it keeps improving
MIRROR = FALLS_THEN_RISES[:4] + [2 * 0.940 - v for v in FALLS_THEN_RISES[4:]]


@pytest.mark.parametrize("patience", [0, 1, 2, 3])
def test_stops_after_patience_plus_one_worse_validations_and_keeps_the_best(patience: int) -> None:
    kept, stopped = replay(FALLS_THEN_RISES, patience)
    assert kept == 3
    assert stopped == 3 + patience + 1


@pytest.mark.parametrize("patience", [0, 1, 2, 3])
def test_the_mirror_keeps_improving_and_never_stops(patience: int) -> None:
    assert all(b < a for a, b in zip(MIRROR, MIRROR[1:]))  # the construction: strictly falling
    kept, stopped = replay(MIRROR, patience)
    assert stopped is None
    assert kept == len(MIRROR) - 1


def test_a_patience_longer_than_the_rise_does_not_stop() -> None:
    kept, stopped = replay(FALLS_THEN_RISES, patience=len(FALLS_THEN_RISES) - 4)
    assert (kept, stopped) == (3, None)


def test_a_tie_or_a_nan_is_no_gain() -> None:
    assert observe(0.9, 0, 0.9, patience=0).stop
    assert not observe(0.9, 0, float("nan"), patience=0).best
    step = observe(0.9, 2, 0.89, patience=0)
    assert step.best and step.bad_evals == 0 and not step.stop


def test_the_issue_curve_stops_a_three_epoch_run_at_the_default() -> None:
    """Issue 40's four-domain log: validation NE 0.921, 0.950, 0.963 at the epoch ends. With the
    shipped defaults the run ends before its third epoch and keeps the first."""
    from lattice.config.schema import Training

    tr = Training()
    assert tr.evals_per_epoch == 1  # the curve is one validation per epoch
    kept, stopped = replay([0.921, 0.950, 0.963], tr.early_stopping_patience)
    assert kept == 0 and stopped is not None and stopped < 2


def _evals(curve: list[float], per_epoch: int) -> list[dict]:
    return [{"step": 10 * (i + 1), "epoch": i // per_epoch + 1, "validation": i % per_epoch + 1, "val_macro_ne": v}
            for i, v in enumerate(curve)]


def test_reason_names_where_patience_ran_out_and_what_was_kept() -> None:
    evals = _evals(FALLS_THEN_RISES[:6], per_epoch=2)  # stops at index 5 with patience 1
    text = reason(evals, best_step=40, stopped=True, patience=1, evals_per_epoch=2, epochs_planned=5)
    assert text.startswith("patience ran out at the end of epoch 3 (step 60): 2 validation(s) in a row")
    assert "training.early_stopping_patience 1" in text
    assert text.endswith("kept the end of epoch 2 (step 40, validation macro NE 0.9400)")


def test_reason_of_a_run_that_used_every_epoch() -> None:
    evals = _evals(MIRROR, per_epoch=3)
    text = reason(evals, best_step=90, stopped=False, patience=2, evals_per_epoch=3, epochs_planned=3)
    assert text.startswith("all 3 planned epoch(s) ran; kept the end of epoch 3 (step 90")


def test_point_inside_an_epoch() -> None:
    assert point({"epoch": 2, "validation": 1}, 4) == "epoch 2, validation 1 of 4"
    assert point({"epoch": 2, "validation": 4}, 4) == "the end of epoch 2"
    assert point({"epoch": 1}, 1) == "the end of epoch 1"  # entries written before the field existed


def test_the_report_page_shows_the_kept_validation_and_the_reason() -> None:
    from lattice.demo.report import render_html

    why = reason(_evals(FALLS_THEN_RISES[:6], per_epoch=2), best_step=40, stopped=True, patience=1,
                 evals_per_epoch=2, epochs_planned=5)
    stop = {"stopped_early": True, "stop_reason": why, "epochs_run": 3, "epochs_planned": 5,
            "kept": {"epoch": 2, "validation": 2, "step": 40, "val_macro_ne": 0.94}}
    page = render_html({"models": {"teacher": {"history": {"stop": stop}}, "gbdt": {"history": None}}})
    assert "the validation kept and why each run stopped" in page
    assert "<td>teacher</td><td>3 of 5</td><td>early stop</td><td>2</td><td>2</td><td>0.9400</td>" in page
    assert "patience ran out at the end of epoch 3" in page
    assert "<td>gbdt</td>" not in page.split("why each run stopped")[1].split("</table>")[0]
