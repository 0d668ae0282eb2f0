"""The moving synthetic market: new ids appear on later days, conversions arrive after the declared
delays, the drift and the shock are in the truth, and the demo config's output is unchanged."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lattice.config import load_config
from lattice.config.timing import ConversionDelay, Market, Shock
from lattice.data.synth import generate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    return cfg.model_copy(update={"synthetic": cfg.synthetic.model_copy(update={"chunk_rows": 5_000, "users": 2_000, "ads": 500})})


def _market(demo, **kw):
    m = Market(**{"new_users_per_day": 400, "new_ads_per_day": 60, "ctr_drift": 0.0, "partition_by_date": True, **kw})
    return demo.model_copy(update={"synthetic": demo.synthetic.model_copy(update={"days": 10, "market": m})})


def _read(p: Path) -> pd.DataFrame:
    return pd.read_csv(p) if p.suffix == ".csv" else pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_json(p, lines=True)


def test_default_config_output_is_unchanged(demo, tmp_path: Path) -> None:
    """Without `market` the generator writes what it wrote before the market existed: this digest
    of the files' contents was taken from the generator before the change (pandas' row hash, not
    file bytes, so a parquet writer's version string cannot move it)."""
    generate(demo, 12_000, tmp_path, progress=False)
    h = hashlib.sha256()
    for p in sorted(tmp_path.rglob("part-*")):
        df = _read(p)
        h.update(str(p.relative_to(tmp_path)).encode())
        h.update(",".join(df.columns).encode())
        h.update(pd.util.hash_pandas_object(df, index=False).values.tobytes())
    assert h.hexdigest() == "db9db8ffa576aee9bdabf9a51ea5d1b48b784a04f8bbafec7fb63136d9f4cb8f"


def test_new_ids_appear_on_later_days_only(demo, tmp_path: Path) -> None:
    cfg = _market(demo)
    man = generate(cfg, 30_000, tmp_path, progress=False)
    feed = pd.concat(_read(p).assign(day=p.parent.name) for p in sorted((tmp_path / "feed").rglob("*.csv")))
    assert sorted(feed.day.unique())[0] == "date=2026-01-01" and feed.day.nunique() == 10
    first_seen = feed.groupby("uid").day.min()
    for entry in man["market"]["new_ids"][1:]:
        lo, hi = entry["users"]
        day = f"date={(dt.date(2026, 1, 1) + dt.timedelta(days=entry['day'])).isoformat()}"
        ids = first_seen[(first_seen.index > lo) & (first_seen.index <= hi)]  # logged ids are index + 1
        assert len(ids) > 20, entry
        assert (ids >= day).all(), entry  # never seen before their day
        assert (ids == day).mean() > 0.5, entry  # most first appear on it (the rest later, by popularity)
        today = feed[feed.day == day]
        share = ((today.uid > lo) & (today.uid <= hi)).mean()
        assert 0.05 < share < 0.15, share  # new_id_share 0.1 of the day's impressions
    # the first day holds only the base id space
    base_users = man["market"]["new_ids"][0]["users"][0]
    assert feed[feed.day == "date=2026-01-01"].uid.max() <= base_users


def test_delays_follow_the_declared_distribution(demo, tmp_path: Path) -> None:
    delay = ConversionDelay(delayed_share=0.3, min_days=1, max_days=3, prompt_hours=1)
    cfg = _market(demo, conversion_delay=delay)
    cfg = cfg.model_copy(update={"synthetic": cfg.synthetic.model_copy(update={"days": 20})})
    man = generate(cfg, 120_000, tmp_path, progress=False)
    s = pd.concat(_read(p) for p in sorted((tmp_path / "search").rglob("*.parquet")))
    conv = s[s.conversion == 1]
    d = (pd.to_datetime(conv.conversion_time) - pd.to_datetime(conv.event_time)).dt.total_seconds() / 86400
    # only conversions whose whole delay range fits in the log: the censoring at its end is not a delay
    early = pd.to_datetime(conv.event_time) < pd.Timestamp("2026-01-17", tz="UTC")
    d = d[early]
    assert len(d) > 700
    prompt, late = d[d < 1 / 24 + 1e-6], d[d >= 1]
    assert len(prompt) + len(late) == len(d)  # nothing between an hour and a day
    assert abs(len(late) / len(d) - 0.3) < 0.05, len(late) / len(d)  # binomial sd ~0.017 at n > 700
    assert late.max() < 3 and abs(late.mean() - 2.0) < 0.1  # uniform on [1, 3)
    assert (s.conversion_time.isna() == (s.conversion == 0)).all()
    # conversions that would arrive after the log ends are not in the raw log; their truth is
    lost = man["label_sums"]["search"]["conversions_after_log_end"]
    assert lost > 0
    end = pd.Timestamp("2026-01-21", tz="UTC")
    assert (pd.to_datetime(conv.conversion_time) < end).all()
    # expected count lost: each impression's true rate times the chance its delay passes the end
    r = (end - pd.to_datetime(s.event_time)).dt.total_seconds().to_numpy()
    day = 86400.0
    p_past = 0.7 * np.clip(1 - r / 3600, 0, 1) + 0.3 * np.clip((3 * day - r) / (2 * day), 0, 1)
    expected = float((s.true_conversion.to_numpy() * p_past).sum())
    assert expected > 15 and abs(lost - expected) < 4 * np.sqrt(expected) + 1, (lost, expected)


def test_shock_and_drift_move_the_truth(demo, tmp_path: Path) -> None:
    cfg = _market(demo, ctr_drift=0.05, shock=Shock(day=5, domain="search", click_logit_shift=1.0))
    man = generate(cfg, 40_000, tmp_path, progress=False)
    shift = man["market"]["click_shift"]
    assert shift["search"][5] - shift["search"][4] > 0.8  # the shock plus one drift step (sd 0.05)
    assert shift["feed"][0] == 0.0 and any(abs(x) > 0.01 for x in shift["feed"][1:])
    s = pd.concat(_read(p).assign(day=p.parent.name) for p in sorted((tmp_path / "search").rglob("*.parquet")))
    before = s[s.day < "date=2026-01-06"].true_click.mean()
    after = s[s.day >= "date=2026-01-06"].true_click.mean()
    assert after > 1.5 * before, (before, after)


def test_market_is_deterministic(demo, tmp_path: Path) -> None:
    cfg = _market(demo, ctr_drift=0.02)
    generate(cfg, 8_000, tmp_path / "a", progress=False)
    generate(cfg, 8_000, tmp_path / "b", progress=False)
    digest = [{str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("part-*"))}
              for root in (tmp_path / "a", tmp_path / "b")]
    assert digest[0] == digest[1] and len(digest[0]) >= 3 * 10


def test_synth_stage_regenerates_when_the_market_changes(demo, tmp_path: Path) -> None:
    from lattice.data.synth_stage import synth
    from lattice.paths import Paths

    paths = Paths(tmp_path / "wd", tmp_path / "raw")
    static = synth(demo, paths, rows=3_000, progress=False)
    assert "skipped" not in static and synth(demo, paths, rows=3_000, progress=False)["skipped"]
    moving = _market(demo)
    first = synth(moving, paths, rows=3_000, progress=False)
    assert "skipped" not in first and first["market"]["days"] == 10
    assert synth(moving, paths, rows=3_000, progress=False)["skipped"]
    other = moving.model_copy(update={"synthetic": moving.synthetic.model_copy(
        update={"market": moving.synthetic.market.model_copy(update={"new_users_per_day": 5})})})
    assert "skipped" not in synth(other, paths, rows=3_000, progress=False)
    # and the static log (no part files left in date= folders of the market run)
    back = synth(demo, paths, rows=3_000, progress=False)
    assert "skipped" not in back and not list((tmp_path / "raw" / "feed").glob("date=*/part-*"))
