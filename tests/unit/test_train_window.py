"""Training windows, day splits, lineage records and the next-day series, without training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lattice.config import load_config
from lattice.config.schema import PlatformConfig
from lattice.data.window import DaySplits, resolve, window_days
from lattice.paths import Paths
from lattice.promotion.gate import CellMetrics
from lattice.promotion.next_day import day_index, judged_day, series
from lattice.training import lineage
from lattice.training.warm_start import config_changes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config() -> PlatformConfig:
    return load_config(ROOT / "configs" / "demo.yaml")


def _windowed(config: PlatformConfig, window: str | None = "3d", **training) -> PlatformConfig:
    return config.model_copy(update={"training": config.training.model_copy(update={"window": window, **training})})


def _table(tmp_path: Path, dates: list[str]) -> Path:
    root = tmp_path / "consolidated"
    for d in dates:
        f = root / f"date={d}" / "domain=feed" / "part-0.parquet"
        f.parent.mkdir(parents=True)
        pd.DataFrame({"example_id": [f"{d}-{i}" for i in range(4)]}).to_parquet(f)
    return root


def test_window_ends_at_the_interval_end_and_tests_on_it(config, tmp_path) -> None:
    table = _table(tmp_path, ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"])
    w = resolve(_windowed(config, "3d"), table, "2026-01-04")
    assert w.train == ("2026-01-01", "2026-01-02") and w.validation == "2026-01-03" and w.test == "2026-01-04"
    # default end: the table's latest day + 1, whose test day is still in the future
    w = resolve(_windowed(config, "2d"), table)
    assert (w.train, w.validation, w.test) == (("2026-01-03",), "2026-01-04", "2026-01-05")
    assert resolve(_windowed(config, None), table) is None


def test_window_config_is_checked(config) -> None:
    data = config.model_dump(mode="json")
    with pytest.raises(ValueError, match="window"):
        PlatformConfig.model_validate({**data, "training": {**data["training"], "window": "14"}})
    assert PlatformConfig.model_validate({**data, "training": {**data["training"], "window": "14d"}}).training.window == "14d"
    with pytest.raises(ValueError, match="whole number of days"):
        window_days("2w")
    with pytest.raises(ValueError, match="at least 2 days"):
        resolve(_windowed(config, "1d"), Path("."), "2026-01-05")


def test_day_splits_and_replay_are_deterministic(config) -> None:
    w = resolve(_windowed(config, "4d"), Path("."), "2026-01-05")
    plain = w.splits()
    assert plain.days == {"2026-01-01": "train", "2026-01-02": "train", "2026-01-03": "train",
                          "2026-01-04": "validation", "2026-01-05": "test"}
    warm = w.splits(trained_before=["2026-01-01", "2026-01-02"], replay_share=0.3)
    assert warm.days["2026-01-03"] == "train" and "2026-01-01" not in warm.days
    dates = ["2026-01-01"] * 2000 + ["2026-01-03"] * 10 + ["2026-01-06"] * 5
    ids = [f"e{i}" for i in range(len(dates))]
    mask = warm.split_of(dates, ids, "train")
    assert mask[2000:2010].all() and not mask[2010:].any()  # every new-day row; never a day outside
    share = mask[:2000].mean()
    assert 0.25 < share < 0.35  # ~30% of the old day: 2000 hashed ids, binomial sd ~1%
    np.testing.assert_array_equal(mask, DaySplits.from_json(warm.to_json()).split_of(dates, ids, "train"))
    assert not warm.split_of(dates, ids, "validation").any()


def test_rotating_replay_takes_another_share_each_run_and_the_same_on_a_rerun(config) -> None:
    """`replay_rows: rotating` salts the replay hash with the run's test day: two daily runs replay
    about the same share of an old day, but mostly other rows (a fixed share would train the same
    30% of rows once a run for the whole window); re-resolving a run gives its own rows again."""
    def replayed(end: str, rotate: bool) -> np.ndarray:
        w = resolve(_windowed(config, "4d"), Path("."), end)
        split = w.splits(trained_before=["2026-01-02", "2026-01-03"], replay_share=0.3, rotate_replay=rotate)
        assert DaySplits.from_json(split.to_json()) == split
        return split.split_of(dates, ids, "train")

    dates = ["2026-01-03"] * 3000
    ids = [f"e{i}" for i in range(len(dates))]
    a, b = replayed("2026-01-06", True), replayed("2026-01-07", True)
    assert 0.27 < a.mean() < 0.33 and 0.27 < b.mean() < 0.33  # 3000 hashed ids: binomial sd ~0.8%
    both = (a & b).mean() / a.mean()
    assert 0.2 < both < 0.4  # independent draws overlap by ~30%, never all (fixed: 100%)
    np.testing.assert_array_equal(a, replayed("2026-01-06", True))
    fixed_a, fixed_b = replayed("2026-01-06", False), replayed("2026-01-07", False)
    np.testing.assert_array_equal(fixed_a, fixed_b)
    assert not np.array_equal(a, fixed_a)


def test_a_validation_share_trains_on_the_rest_of_the_newest_day(config) -> None:
    w = resolve(_windowed(config, "3d"), Path("."), "2026-01-04")
    days = w.splits(validation_share=0.25)
    dates = ["2026-01-01"] * 10 + ["2026-01-03"] * 2000 + ["2026-01-04"] * 10
    ids = [f"e{i}" for i in range(len(dates))]
    train, val = days.split_of(dates, ids, "train"), days.split_of(dates, ids, "validation")
    newest = slice(10, 2010)
    assert train[:10].all() and not val[:10].any()  # an older day trains whole
    assert not (train[newest] & val[newest]).any() and (train[newest] | val[newest]).all()  # the newest day: one or the other
    assert 0.22 < val[newest].mean() < 0.28  # ~25% held out: 2000 hashed ids, sd ~1%
    assert not train[2010:].any() and days.split_of(dates, ids, "test")[2010:].all()  # the test day untouched
    # the same rows after a round trip (a resumed run, the scorer reading the lineage)
    np.testing.assert_array_equal(val, DaySplits.from_json(days.to_json()).split_of(dates, ids, "validation"))
    whole = w.splits()
    assert whole.split_of(dates, ids, "validation")[newest].all() and not whole.split_of(dates, ids, "train")[newest].any()
    # the newest day counts as trained: a warm start after it does not train on it again
    lin = lineage.build("none", None, w, days)
    assert lin["trained_days"] == ["2026-01-01", "2026-01-02", "2026-01-03"] and "2026-01-03" in lin["days_seen"]
    assert lineage.build("none", None, w, whole)["trained_days"] == ["2026-01-01", "2026-01-02"]
    data = config.model_dump(mode="json")
    with pytest.raises(ValueError, match="training.window is unset"):
        PlatformConfig.model_validate({**data, "training": {**data["training"], "window": None, "window_validation": 0.2}})
    with pytest.raises(ValueError, match="refresh_every 7d .*training.window is unset"):
        PlatformConfig.model_validate({**data, "training": {**data["training"], "window": None, "refresh_every": "7d"}})


def test_lineage_records_parent_days_and_judged_day(config) -> None:
    w = resolve(_windowed(config, "3d"), Path("."), "2026-01-05")
    parent = {"mode": "last", "path": "/m/parent/model.pt", "version": None, "checksum": "ab" * 32,
              "days_seen": ["2026-01-01", "2026-01-02"]}
    lin = lineage.build("last", parent, w, w.splits(parent["days_seen"]))
    assert lin["days_seen"] == ["2026-01-01", "2026-01-02", "2026-01-03"] and lin["trained_days"] == ["2026-01-03"]
    assert lin["judged_on"] == "2026-01-05" and lin["parent"]["checksum"] == "ab" * 32
    tags = lineage.tags(lin)
    assert tags["lattice.lineage.judged_on"] == "2026-01-05" and tags["lattice.lineage.parent_checksum"] == "ab" * 32
    assert json.loads(tags["lattice.lineage.days_seen"]) == lin["days_seen"]
    assert judged_day(tags) == "2026-01-05"
    first = lineage.build("last", None, w, w.splits())
    assert first["warm_start"] == "none" and first["parent"] is None


def test_next_day_series_steps_are_day_indices(config) -> None:
    m = CellMetrics(ne=0.9, auc=0.7, calibration=1.02)
    s = series(config, "2026-01-05", {"challenger": {("feed", "click"): m}, "champion": None})
    assert day_index(config, "2026-01-05") == 4
    assert s == {"next_day.challenger.feed.click.ne": [0.9, 4], "next_day.challenger.feed.click.auc": [0.7, 4],
                 "next_day.challenger.feed.click.calibration": [1.02, 4]}


def test_config_changes_name_the_key(config) -> None:
    old = config.model_dump(mode="json")
    sparse = [f.model_copy(update={"num_embeddings": 7}) if f.name == "ad_id" else f for f in config.features.sparse]
    new = config.model_copy(update={"features": config.features.model_copy(update={"sparse": sparse})}).model_dump(mode="json")
    assert config_changes(old, new) == ["features.sparse.ad_id.num_embeddings: 50000 -> 7"]


def test_load_window_by_day(config, tmp_path) -> None:
    from lattice.export.window import load_window

    paths = Paths(workdir=tmp_path, data_root=tmp_path)
    _table(tmp_path, ["2026-01-01", "2026-01-02"])
    frame = load_window(config, paths, day="2026-01-02")
    assert sorted(frame.example_id) == [f"2026-01-02-{i}" for i in range(4)]
    with pytest.raises(ValueError, match="2026-01-03.*features stage"):
        load_window(config, paths, day="2026-01-03")


def test_a_new_head_is_a_partial_warm_start_and_a_removed_one_is_refused(config) -> None:
    from lattice.config.schema import Objective
    from lattice.models import build_model
    from lattice.training.tiny import tiny
    from lattice.training.warm_start import WarmStartError, check_compatible

    base = tiny(config)
    parent = build_model(base, "teacher", 4)
    blob = {"kind": "teacher", "config": base.model_dump(mode="json"), "state_dict": parent.state_dict()}
    more = base.model_copy(update={"objectives": [*base.objectives, Objective(name="deep_click", domains=["feed"])]})
    fresh = check_compatible(build_model(more, "teacher", 4), blob, more, "teacher")
    assert fresh and all("deep_click" in k for k in fresh)  # only the new objective's parameters start fresh
    fewer = base.model_copy(update={"objectives": [o for o in base.objectives if o.name != "conversion"]})
    with pytest.raises(WarmStartError, match=r"objectives\.conversion.*warm_start: none"):
        check_compatible(build_model(fewer, "teacher", 4), blob, fewer, "teacher")
    assert check_compatible(build_model(base, "teacher", 4), blob, base, "teacher") == []


def test_a_windowed_run_trains_on_the_labels_known_at_its_cutoff() -> None:
    """Train and validation read labels as known at midnight after the window's newest day (an open
    attribution window is masked); the test day is judged on matured labels; a config without
    delayed labels reads the stored labels as before."""
    import datetime as dt

    from lattice.training.loop import Trainer

    days = DaySplits({"2026-01-03": "train", "2026-01-04": "train", "2026-01-05": "validation", "2026-01-06": "test"})
    assert days.cutoff() == dt.datetime(2026, 1, 6)
    market = load_config(ROOT / "bench" / "configs" / "demo_market.yaml")
    trainer = Trainer.__new__(Trainer)  # only the attributes the rule reads
    trainer.config, trainer.days = market, days
    assert trainer._label_cutoff("train") == trainer._label_cutoff("validation") == dt.datetime(2026, 1, 6)
    assert trainer._label_cutoff("test") is None
    trainer.days = None
    assert trainer._label_cutoff("train") is None  # no window: the table's labels as they are
    trainer.config, trainer.days = load_config(ROOT / "configs" / "demo.yaml"), days
    assert trainer._label_cutoff("train") is None  # no label with a delay
