"""Labels at a training cutoff: masked exactly while the attribution window is open, labelled
after; the naive rule takes an unseen conversion as a negative; bad label times are refused."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from lattice.config import load_config
from lattice.config.loader import ConfigError
from lattice.data import schema as S
from lattice.data.label_time import apply_cutoff_arrow, mask_at_cutoff

ROOT = Path(__file__).resolve().parents[2]
MARKET = ROOT / "bench" / "configs" / "demo_market.yaml"
T0 = dt.datetime(2026, 1, 5, 12, 0)


@pytest.fixture(scope="module")
def market():
    return load_config(MARKET)


def _log() -> pd.DataFrame:
    """Three conversion-domain impressions at T0: one converts 2 days later, one 10 days later
    (outside the 7-day window, so its final label is already 0 in the table), one never."""
    ts = pd.Timestamp(T0, tz="UTC")
    return pd.DataFrame({
        "example_id": ["late", "never", "prompt"],
        "event_timestamp": [ts, ts, ts],
        "domain": ["feed"] * 3,
        S.label_column("click"): np.array([1, 0, 1], np.int8),
        S.mask_column("click"): np.array([1, 1, 1], np.int8),
        S.label_column("conversion"): np.array([1, 0, 1], np.int8),
        S.mask_column("conversion"): np.array([1, 1, 1], np.int8),
        S.known_column("conversion"): [ts + pd.Timedelta(days=2), pd.NaT, ts + pd.Timedelta(minutes=30)],
    })


def _at(df, cutoff, config, mode=None):
    out = mask_at_cutoff(df, cutoff, config, mode)
    return out[S.label_column("conversion")].tolist(), out[S.mask_column("conversion")].tolist()


def test_masked_exactly_while_the_window_is_open(market) -> None:
    df = _log()
    window = dt.timedelta(days=7)
    just_before, at_close = T0 + window - dt.timedelta(seconds=1), T0 + window
    # every impression is masked until its window closes (an early positive too: keeping it
    # without its still-open neighbours would bias the rate up) ...
    for cutoff in (T0, T0 + dt.timedelta(days=3), just_before):
        assert _at(df, cutoff, market) == ([0, 0, 0], [0, 0, 0]), cutoff
    # ... and labelled with its final value from the instant it closes
    assert _at(df, at_close, market) == ([1, 0, 1], [1, 1, 1])
    assert _at(df, at_close + dt.timedelta(days=30), market) == ([1, 0, 1], [1, 1, 1])
    # the click has no window: untouched at any cutoff
    out = mask_at_cutoff(df, T0, market)
    assert out[S.mask_column("click")].tolist() == [1, 1, 1] and out[S.label_column("click")].tolist() == [1, 0, 1]
    # pure: the input is not modified
    assert df[S.mask_column("conversion")].tolist() == [1, 1, 1]


def test_naive_takes_an_unseen_conversion_as_a_negative(market) -> None:
    df = _log()
    # 1 hour after: the prompt conversion is seen, the late one is not yet: a (fake) negative
    assert _at(df, T0 + dt.timedelta(hours=1), market, "naive") == ([0, 0, 1], [1, 1, 1])
    assert _at(df, T0 + dt.timedelta(days=2), market, "naive") == ([1, 0, 1], [1, 1, 1])
    assert _at(df, T0 + dt.timedelta(minutes=10), market, "naive") == ([0, 0, 0], [1, 1, 1])


def test_without_a_label_time_a_positive_is_known_when_its_window_closes(market) -> None:
    df = _log().drop(columns=[S.known_column("conversion")])
    assert _at(df, T0 + dt.timedelta(days=3), market, "naive") == ([0, 0, 0], [1, 1, 1])
    assert _at(df, T0 + dt.timedelta(days=7), market, "naive") == ([1, 0, 1], [1, 1, 1])


def test_no_cutoff_keeps_the_final_labels(market) -> None:
    df = _log()
    assert mask_at_cutoff(df, None, market) is df


def test_arrow_twin_agrees_with_pandas(market) -> None:
    df = _log()
    tbl = pa.Table.from_pandas(df, preserve_index=False)
    for cutoff in (T0 + dt.timedelta(days=1), T0 + dt.timedelta(days=8)):
        for mode in ("mask", "naive"):
            got = apply_cutoff_arrow(tbl, cutoff, market, mode)
            want = mask_at_cutoff(df, cutoff, market, mode)
            for c in (S.label_column("conversion"), S.mask_column("conversion")):
                assert got.column(c).to_pylist() == want[c].tolist(), (cutoff, mode, c)
            assert got.column(S.mask_column("conversion")).type == pa.int8()


def _load_edited(tmp_path: Path, old: str, new: str):
    text = MARKET.read_text()
    assert old in text
    path = tmp_path / "c.yaml"
    path.write_text(text.replace(old, new))
    return load_config(path)


CONVERSION = "label_rate: [0.0002, 0.2], attribution: 7d}"


def test_window_longer_than_the_time_range_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError) as e:
        _load_edited(tmp_path, CONVERSION, CONVERSION.replace("7d", "30d"))
    msg = str(e.value)
    assert "objectives[1].attribution" in msg and "shorten the window or widen time_range" in msg


def test_known_at_without_a_window_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError) as e:
        _load_edited(tmp_path, CONVERSION, CONVERSION.replace(", attribution: 7d", ""))
    assert "objectives[1].attribution" in str(e.value) and "attribution: 7d" in str(e.value)


def test_bad_duration_names_the_forms(tmp_path) -> None:
    with pytest.raises(ConfigError, match="30m, 12h or 7d"):
        _load_edited(tmp_path, CONVERSION, CONVERSION.replace("7d", "1w"))


def _feed_csv(tmp_path: Path, rows: list[str]) -> Path:
    folder = tmp_path / "raw" / "feed" / "date=2026-01-02"
    folder.mkdir(parents=True)
    header = "uid,aid,ts,device_type,slot,user_seg,ad_cat,price,user_activity,clicked,converted,p_click,p_conversion,conversion_ts"
    (folder / "part-0.csv").write_text("\n".join([header, *rows]) + "\n")
    return tmp_path / "raw"


def _feed_only(market):
    return market.model_copy(update={"sources": [s for s in market.sources if s.name == "feed_log"],
                                     "domains": [d for d in market.domains if d.name == "feed"],
                                     "objectives": [o.model_copy(update={"domains": ["feed"]}) for o in market.objectives]})


def test_local_consolidate_keeps_the_positive_time_inside_the_window(market, tmp_path: Path) -> None:
    from lattice.data.local_consolidate import consolidate
    from lattice.paths import Paths

    t = 1767312000  # 2026-01-02 00:00 UTC
    raw = _feed_csv(tmp_path, [f"1,1,{t},0,0,1,1,2.0,1.0,1,1,0.1,0.01,{t + 2 * 86400}",
                               f"2,1,{t + 60},0,0,1,1,2.0,1.0,1,1,0.1,0.01,{t + 9 * 86400}",  # outside the 7d window
                               f"3,1,{t + 120},0,0,1,1,2.0,1.0,0,0,0.1,0.01,"])
    df = consolidate(_feed_only(market), Paths(tmp_path / "wd", raw)).sort_values("event_timestamp")
    assert df[S.label_column("conversion")].tolist() == [1, 0, 0]
    known = df[S.known_column("conversion")]
    assert known.iloc[0] == pd.Timestamp(t + 2 * 86400, unit="s", tz="UTC") and known.iloc[1:].isna().all()


def test_local_consolidate_refuses_a_label_time_before_its_impression(market, tmp_path: Path) -> None:
    from lattice.data.local_consolidate import consolidate
    from lattice.paths import Paths

    t = 1767312000
    raw = _feed_csv(tmp_path, [f"1,1,{t},0,0,1,1,2.0,1.0,1,1,0.1,0.01,{t - 60}"])
    with pytest.raises(ValueError, match="before their impression"):
        consolidate(_feed_only(market), Paths(tmp_path / "wd", raw))


def test_the_loader_applies_the_cutoff(market, tmp_path: Path) -> None:
    """The training reader sees the same labels and masks as `mask_at_cutoff` on the same rows."""
    from lattice.data.loader import BatchLoader, fit_dense_stats
    from lattice.data.local_consolidate import consolidate, write_parquet
    from lattice.data.synth import generate
    from lattice.paths import Paths

    syn = market.synthetic.model_copy(update={"users": 500, "ads": 100, "chunk_rows": 1000, "days": 10})
    cfg = market.model_copy(update={"synthetic": syn})
    generate(cfg, 2_000, tmp_path / "raw", progress=False)
    df = consolidate(cfg, Paths(tmp_path / "wd", tmp_path / "raw"))
    root = tmp_path / "table"
    write_parquet(df, root / "part-0.parquet")
    stats = fit_dense_stats(cfg, root)
    cutoff = dt.datetime(2026, 1, 9)
    want = mask_at_cutoff(df, cutoff, cfg)
    for c, expected in ((None, df), (cutoff, want)):
        got_mask = got_label = 0.0
        for b in BatchLoader(cfg, root, stats, "all", batch_size=4096, shuffle=False, num_workers=0, label_cutoff=c):
            got_mask += float(b.masks["conversion"].sum())
            got_label += float((b.labels["conversion"] * b.masks["conversion"]).sum())
        assert got_mask == expected[S.mask_column("conversion")].sum()
        assert got_label == (expected[S.label_column("conversion")] * expected[S.mask_column("conversion")]).sum()
    # the cutoff left out the impressions of the last 7 days before it, and only those
    assert want[S.mask_column("conversion")].sum() < 0.6 * df[S.mask_column("conversion")].sum()


def test_the_loader_trains_a_matured_day_on_its_newly_known_labels(market, tmp_path: Path) -> None:
    """A warm start's train split holds its new day whole and, of a matured day, the rows whose
    conversion closed since the parent, with their click masked (the parent trained on it); a
    matured row with nothing newly known (a domain without conversions) is not read at all."""
    from lattice.data.loader import BatchLoader, fit_dense_stats
    from lattice.data.local_consolidate import consolidate, write_parquet
    from lattice.data.synth import generate
    from lattice.data.window import DaySplits
    from lattice.paths import Paths

    syn = market.synthetic.model_copy(update={"users": 500, "ads": 100, "chunk_rows": 1000, "days": 12})
    cfg = _masked(market.model_copy(update={"synthetic": syn}))
    generate(cfg, 3_000, tmp_path / "raw", progress=False)
    df = consolidate(cfg, Paths(tmp_path / "wd", tmp_path / "raw"))
    root = tmp_path / "table"
    write_parquet(df, root / "part-0.parquet")
    stats = fit_dense_stats(cfg, root)
    date = df["event_timestamp"].dt.strftime("%Y-%m-%d")
    new, matured = "2026-01-11", "2026-01-04"  # the parent trained to the Jan 11 cutoff, this run to Jan 12: Jan 4 closed between
    days = DaySplits({new: "train", "2026-01-12": "validation"}, matured=[matured],
                     parent_cutoff=dt.datetime(2026, 1, 11).isoformat())
    got = {"rows": 0, "click": 0.0, "conversion": 0.0}
    for b in BatchLoader(cfg, root, stats, "train", batch_size=4096, shuffle=False, num_workers=0,
                         label_cutoff=dt.datetime(2026, 1, 12), days=days):
        got["rows"] += len(b)
        got["click"] += float(b.masks["click"].sum())
        got["conversion"] += float(b.masks["conversion"].sum())
    on_new, on_matured = df[date == new], df[date == matured]
    closed_since = on_matured["event_timestamp"] + pd.Timedelta(days=7) > pd.Timestamp("2026-01-11", tz="UTC")
    teaching = int((closed_since & (on_matured[S.mask_column("conversion")] > 0)).sum())
    assert 0 < teaching < len(on_matured)  # the video domain logs no conversion
    assert got["rows"] == len(on_new) + teaching
    # clicks: the new day's only; conversions: the matured day's (the new day's windows are open)
    assert got["click"] == on_new[S.mask_column("click")].sum()
    assert got["conversion"] == teaching


def test_zipper_window_is_deterministic_and_follows_its_shares() -> None:
    from lattice.data.split import hash_split
    from lattice.data.zipper import window_index

    ids = [f"ex{i}" for i in range(40_000)]
    k = window_index(ids, [0.5, 0.3, 0.2])
    assert (k == window_index(ids, [0.5, 0.3, 0.2])).all()
    share = np.bincount(k, minlength=3) / len(ids)
    assert np.abs(share - [0.5, 0.3, 0.2]).max() < 0.012  # binomial sd at n=40k is 0.0025; 4.8 sd
    # independent of the split's own hash of the same ids: every window holds ~its test share
    cfg = load_config(MARKET)
    test = hash_split(cfg, ids) == "test"
    for j in range(3):
        assert abs(test[k == j].mean() - test.mean()) < 0.02
    with pytest.raises(ValueError, match="sum to 1"):
        window_index(ids[:3], [0.5, 0.4])


def test_zipper_head_labels_wait_for_their_window() -> None:
    from lattice.data.zipper import head_labels, window_index

    ts = pd.Timestamp(T0, tz="UTC")
    ids = [f"row{i}" for i in range(400)]
    k = window_index(ids, [0.5, 0.5])
    df = pd.DataFrame({"example_id": ids, "event_timestamp": ts,
                       S.label_column("conversion"): np.ones(400, np.int8),
                       S.mask_column("conversion"): np.ones(400, np.int8),
                       S.known_column("conversion"): ts + pd.Timedelta(days=2)})  # every row converts after 2 days
    windows = [dt.timedelta(days=1), dt.timedelta(days=7)]
    at3 = head_labels(df, "conversion", T0 + dt.timedelta(days=3), windows, [0.5, 0.5])
    # window 1 (1 day) has closed: its rows are labelled, negative (the conversion came after a day)
    assert (at3[0][1] == (k == 0)).all() and at3[0][0].sum() == 0
    assert at3[1][1].sum() == 0  # the 7-day window is still open
    at8 = head_labels(df, "conversion", T0 + dt.timedelta(days=8), windows, [0.5, 0.5])
    assert (at8[1][1] == (k == 1)).all() and (at8[1][0] == (k == 1)).all()  # positive within 7 days


def test_a_window_younger_than_the_attribution_window_leaves_an_objective_unlabelled():
    """label_delay mask: a train day counts for conversion (7d) only once 7 days have passed by the
    cutoff; a 4-day window (or a warm start on yesterday alone) has none, naive always has some."""
    import datetime as dt

    from lattice.config import load_config
    from lattice.data.label_time import never_known_in_window

    cfg = load_config(ROOT / "bench" / "configs" / "demo_market.yaml")
    cut = dt.datetime(2026, 1, 10)
    assert never_known_in_window(cfg, ["2026-01-06", "2026-01-07", "2026-01-08"], cut) == ["conversion"]
    assert never_known_in_window(cfg, ["2026-01-03", "2026-01-08"], cut) == []  # closed at the cutoff exactly
    assert never_known_in_window(cfg, ["2026-01-04"], cut) == ["conversion"]
    naive = cfg.model_copy(update={"training": cfg.training.model_copy(update={"label_delay": "naive"})})
    assert never_known_in_window(naive, ["2026-01-08"], cut) == []


# ---- a warm start under `mask`: each label trains once, when it becomes known


def _masked(market):
    return market.model_copy(update={"training": market.training.model_copy(update={"label_delay": "mask"})})


def test_the_days_whose_windows_closed_since_the_parent_come_back(market) -> None:
    from lattice.data.label_time import matured_days

    cfg = _masked(market)
    days = [f"2026-01-{d:02d}" for d in range(1, 11)]
    parent, now = dt.datetime(2026, 1, 10), dt.datetime(2026, 1, 11)
    # a day's impressions close 7 days later: Jan 3's between Jan 10 and Jan 11, the parent's
    # cutoff and this one; Jan 2's had closed by the parent's, Jan 4's close after this cutoff
    assert matured_days(cfg, days, parent, now) == ["2026-01-03"]
    # two days between the runs: two days mature
    assert matured_days(cfg, days, dt.datetime(2026, 1, 9), now) == ["2026-01-02", "2026-01-03"]
    # the parent's days only; no parent cutoff (a parent without a window) and the naive rule: none
    assert matured_days(cfg, ["2026-01-04"], parent, now) == []
    assert matured_days(cfg, days, None, now) == []
    assert matured_days(market.model_copy(update={"training": market.training.model_copy(
        update={"label_delay": "naive"})}), days, parent, now) == []


def test_a_matured_row_trains_on_the_labels_that_closed_since_the_parent_only(market) -> None:
    from lattice.data.label_time import train_newly_known

    cfg = _masked(market)
    df = _log()  # three impressions at T0 (Jan 5 12:00); the conversion window closes at Jan 12 12:00
    tbl = apply_cutoff_arrow(pa.Table.from_pandas(df, preserve_index=False), dt.datetime(2026, 1, 13), cfg)
    rows = np.array([True, True, False])  # the third row is not a matured row (e.g. chosen by replay)
    out = train_newly_known(tbl, rows, dt.datetime(2026, 1, 12), cfg).to_pandas()
    # the click was known at the impression: the parent trained on it, so it is masked here
    assert out[S.mask_column("click")].tolist() == [0, 0, 1]
    # the conversion closed after the parent's cutoff: it trains, with its final label
    assert out[S.mask_column("conversion")].tolist() == [1, 1, 1]
    assert out[S.label_column("conversion")].tolist() == [1, 0, 1]
    # a parent whose cutoff came after the close had trained on the conversion too: nothing new
    again = train_newly_known(tbl, rows, dt.datetime(2026, 1, 12, 13), cfg).to_pandas()
    assert again[S.mask_column("conversion")].tolist() == [0, 0, 1]


# ---- a warm start under `zipper`: each row trains its head once, when the head's window closes


def _zippered(market):
    from lattice.config.timing import Zipper

    return market.model_copy(update={"training": market.training.model_copy(
        update={"label_delay": "zipper", "zipper": Zipper(windows=["1d", "3d", "7d"])})})


def test_under_zipper_a_day_matures_once_per_head_window(market) -> None:
    from lattice.data.label_time import matured_days

    cfg = _zippered(market)
    days = [f"2026-01-{d:02d}" for d in range(1, 11)]
    # between the cutoffs Jan 10 and Jan 11 close: Jan 9's 1-day windows, Jan 7's 3-day, Jan 3's 7-day
    assert matured_days(cfg, days, dt.datetime(2026, 1, 10), dt.datetime(2026, 1, 11)) == [
        "2026-01-03", "2026-01-07", "2026-01-09"]


def test_a_matured_rows_zipper_head_trains_only_if_it_closed_since_the_parent(market) -> None:
    from lattice.data.label_time import teaches, train_newly_known
    from lattice.data.zipper import newly_known_heads, window_index, zipper_heads_arrow

    cfg = _zippered(market)
    ts = pd.Timestamp(T0, tz="UTC")  # Jan 5 12:00: the heads close Jan 6, Jan 8 and Jan 12 at 12:00
    ids = [f"row{i}" for i in range(300)]
    k = window_index(ids, cfg.training.zipper.share_list())
    df = pd.DataFrame({"example_id": ids, "event_timestamp": ts, "domain": "feed",
                       S.label_column("click"): np.ones(300, np.int8), S.mask_column("click"): np.ones(300, np.int8),
                       S.label_column("conversion"): np.ones(300, np.int8),
                       S.mask_column("conversion"): np.ones(300, np.int8),
                       S.known_column("conversion"): ts + pd.Timedelta(hours=2)})
    tbl = pa.Table.from_pandas(df, preserve_index=False)
    now, parent = dt.datetime(2026, 1, 9), dt.datetime(2026, 1, 8)  # only the 3-day head closed in between
    heads = zipper_heads_arrow(tbl, now, cfg)
    assert (heads["conversion"][1].any(axis=1) == (k < 2)).all()  # at Jan 9: the 1d and 3d heads are closed
    rows = np.ones(300, bool)
    rows[:10] = False  # not matured rows (e.g. replayed): they keep every closed head
    cut = train_newly_known(apply_cutoff_arrow(tbl, now, cfg), rows, parent, cfg)
    new = newly_known_heads(heads, cut, rows, parent, cfg)
    trains = new["conversion"][1].any(axis=1)
    assert (trains[10:] == (k[10:] == 1)).all() and (trains[:10] == (k[:10] < 2)).all()
    # on matured rows the click trained with the parent and the 7-day head is still open: only the
    # 3d head teaches; the other rows keep their click
    taught = teaches(cut, cfg, new)
    assert (taught[10:] == trains[10:]).all() and 0 < trains[10:].sum() < 290 and taught[:10].all()


def test_the_boosters_rows_carry_the_labels_a_windowed_run_knows_at_its_cutoff(market, tmp_path: Path) -> None:
    """The rows the leaf features' trees and the gbdt baselines fit on (`read_rows`): a windowed
    run's train and validation rows carry the labels known at its cutoff, as the deep models'
    loader gives them; its test rows keep their final labels."""
    from lattice.data.loader import fit_dense_stats
    from lattice.data.local_consolidate import consolidate, write_parquet
    from lattice.data.synth import generate
    from lattice.data.window import resolve
    from lattice.paths import Paths
    from lattice.training.gbdt_stage import read_rows

    syn = market.synthetic.model_copy(update={"users": 500, "ads": 100, "chunk_rows": 1000, "days": 10})
    cfg = market.model_copy(update={"synthetic": syn, "training": market.training.model_copy(update={"window": "8d"})})
    generate(cfg, 3_000, tmp_path / "raw", progress=False)
    df = consolidate(cfg, Paths(tmp_path / "wd", tmp_path / "raw"))
    root = tmp_path / "table"
    write_parquet(df, root / "part-0.parquet")
    days = resolve(cfg, root, "2026-01-10").splits()  # train 01-02..08, validation 01-09, test 01-10
    arrs, split = read_rows(cfg, root, fit_dense_stats(cfg, root, days), days)
    known = mask_at_cutoff(df, days.cutoff(), cfg)
    learn, test = np.isin(split, ["train", "validation"]), split == "test"
    for col, key in ((S.mask_column("conversion"), "mask:conversion"), (S.label_column("conversion"), "label:conversion")):
        np.testing.assert_array_equal(arrs[key][learn], known[col].to_numpy()[learn])
        np.testing.assert_array_equal(arrs[key][test], df[col].to_numpy()[test])
    final = df[S.mask_column("conversion")].to_numpy()
    # the windows still open at the cutoff are masked, the closed ones (the oldest train day) are not
    assert 0 < arrs["mask:conversion"][learn].sum() < final[learn].sum()
    np.testing.assert_array_equal(arrs["mask:click"], df[S.mask_column("click")].to_numpy())  # no window: unchanged
