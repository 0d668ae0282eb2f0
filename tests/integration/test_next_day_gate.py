"""Two daily rounds through train -> distill -> promote with a 3-day window and warm starts: the
gate judges each challenger on the day after its window, the champion on the same rows; lineage
reaches the registry and the export; the next-day cells form MLflow series over day indices."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from lattice.distill.stages import distill
from lattice.promotion.next_day import SERIES_RUN
from lattice.promotion.stages import promote
from lattice.registry import CHALLENGER, ModelRegistry
from lattice.training.stages import train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tiny_demo):
    cfg, paths = tiny_demo("gate", 8_000)
    # calibration maps applied in every cell: with one epoch over 8k rows the raw student's
    # search/click calibration swings from one day to the next (inside the gate's bounds on the
    # validation day, 0.54 on the day after), and this test is about next-day judgment, not about
    # which maps the validated choice keeps (tests/unit/test_calibration_choice.py)
    tr = cfg.training.model_copy(update={"window": "3d", "epochs": 1, "warm_start": "last", "calibration_choice": "always"})
    return cfg.model_copy(update={"training": tr}), paths


def _day_rows(paths, day: str) -> int:
    t = pd.read_parquet(paths.consolidated, columns=["example_id", "date"])
    return int((t["date"].astype(str) == day).sum())


def test_two_rounds_are_judged_on_their_next_days(setup) -> None:
    cfg, paths = setup
    reg = ModelRegistry(cfg, paths)
    decisions = []
    for end, judged in (("2026-01-04", "2026-01-04"), ("2026-01-05", "2026-01-05")):
        train(cfg, paths, "teacher", nproc=1, end=end, progress=False)
        distill(cfg, paths, progress=False)  # the student takes the teacher's window
        ch = reg.by_alias(CHALLENGER)
        assert ch.tags["lattice.lineage.judged_on"] == judged
        decisions.append(promote(cfg, paths))
        assert decisions[-1]["judged_on"] == judged
        assert decisions[-1]["measurements"]["window_rows"] == _day_rows(paths, judged)
        assert decisions[-1]["day_index"] == int(judged[-2:]) - 1

    # round 2 warm-started teacher and student from round 1, and says so everywhere
    student = json.loads((paths.model_dir("student") / "lineage.json").read_text())
    assert student["parent"] is not None and student["trained_days"] == ["2026-01-03"]
    export_meta = json.loads((paths.model_dir("student") / "export" / "metadata.json").read_text())
    assert export_meta["lineage"]["days_seen"] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    latest = reg.by_alias(CHALLENGER) or reg.version(decisions[-1]["challenger_version"])
    assert latest.tags["lattice.lineage.parent_checksum"] == student["parent"]["checksum"]
    teacher = reg.latest("teacher")
    assert json.loads(teacher.tags["lattice.lineage.days_seen"]) == ["2026-01-01", "2026-01-02", "2026-01-03"]

    # the challenger's cells are series over days, and the second gate scored the champion too
    run = decisions[-1]["next_day_run_id"]
    assert run == decisions[0]["next_day_run_id"]
    cell = next(iter(cfg.cells()))
    key = f"next_day.challenger.{cell[0]}.{cell[1]}.ne"
    history = reg.client.get_metric_history(run, key)
    assert [m.step for m in history] == [3, 4]
    assert decisions[0]["passed"], [r["message"] for r in decisions[0]["reasons"] if not r["passed"]]
    assert decisions[1]["champion_before"] == decisions[0]["challenger_version"]
    champion = reg.client.get_metric_history(run, f"next_day.champion.{cell[0]}.{cell[1]}.ne")
    assert [m.step for m in champion] == [4]  # no champion on day 3 (the first model); on day 4, round 1's

    # the champion is a warm-start source too: its registered folder, verified, with its lineage
    from lattice.registry import CHAMPION
    from lattice.training.warm_start import find_parent

    parent = find_parent(cfg, paths, "student", "champion")
    champion = reg.by_alias(CHAMPION)
    assert parent.version == champion.version and (parent.folder / "model.pt").exists()
    assert parent.to_json()["days_seen"] == json.loads(champion.tags["lattice.lineage.days_seen"])
