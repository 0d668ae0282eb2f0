"""The synthetic generator: deterministic, multi-schema, labels consistent with their truth."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lattice.config import load_config
from lattice.data.synth import generate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    # small chunks so even a tiny run streams several part files
    return cfg.model_copy(update={"synthetic": cfg.synthetic.model_copy(update={"chunk_rows": 5_000, "users": 2_000, "ads": 500})})


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_same_seed_is_byte_identical(demo, tmp_path: Path) -> None:
    generate(demo, 12_000, tmp_path / "a", progress=False)
    generate(demo, 12_000, tmp_path / "b", progress=False)
    a, b = _digest(tmp_path / "a"), _digest(tmp_path / "b")
    assert len(a) >= 3 * 3 + 1  # 3 chunks x 3 domains + manifest
    assert a == b


def test_other_seed_differs(demo, tmp_path: Path) -> None:
    other = demo.model_copy(update={"synthetic": demo.synthetic.model_copy(update={"seed": 7})})
    generate(demo, 5_000, tmp_path / "a", progress=False)
    generate(other, 5_000, tmp_path / "b", progress=False)
    assert _digest(tmp_path / "a") != _digest(tmp_path / "b")


def _read(folder: Path) -> dict[str, pd.DataFrame]:
    return {
        "feed": pd.concat(pd.read_csv(p) for p in sorted((folder / "feed").glob("*.csv"))),
        "search": pd.concat(pd.read_parquet(p) for p in sorted((folder / "search").glob("*.parquet"))),
        "video": pd.concat(pd.read_json(p, lines=True) for p in sorted((folder / "video").glob("*.jsonl"))),
    }


def test_schemas_follow_the_config(demo, tmp_path: Path) -> None:
    generate(demo, 6_000, tmp_path, progress=False)
    frames = _read(tmp_path)
    for source in demo.sources:
        df = frames[source.domain]
        raw_needed = set(source.columns) | {source.event_time.column} | {l.column for l in source.labels.values()} | set(source.truth.values())
        assert raw_needed <= set(df.columns), (source.name, raw_needed - set(df.columns))
    # the schemas really differ: names, a missing feature, a missing label
    assert set(frames["feed"].columns) != set(frames["search"].columns)
    assert "query_cat" in frames["search"].columns and "query_cat" not in frames["feed"].columns
    # the ad server's match flag is exactly "the query names the ad's category", on both values
    search = frames["search"]
    assert (search.query_match == (search.query_cat == search.category).astype(int)).all()
    assert set(search.query_match.unique()) == {0, 1}
    assert not any("price" in c for c in frames["video"].columns)
    assert not any("conv" in c for c in frames["video"].columns)
    # a conversion only follows a click
    feed = frames["feed"]
    assert ((feed.converted == 1) <= (feed.clicked == 1)).all()
    assert (feed.p_conversion <= feed.p_click + 1e-9).all()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert sum(manifest["rows_per_domain"].values()) == 6_000


def test_label_rate_matches_truth(demo, tmp_path: Path) -> None:
    generate(demo, 60_000, tmp_path, progress=False)
    frames = _read(tmp_path)
    pairs = {"feed": [("clicked", "p_click"), ("converted", "p_conversion")],
             "search": [("click", "true_click"), ("conversion", "true_conversion")],
             "video": [("is_click", "truth_click")]}
    for domain, cols in pairs.items():
        df = frames[domain]
        for label, truth in cols:
            p = df[truth].to_numpy()
            observed, expected = df[label].sum(), p.sum()
            sd = np.sqrt((p * (1 - p)).sum())
            assert abs(observed - expected) < 4 * sd + 1, (domain, label, observed, expected, sd)


def test_timestamps_span_days_and_ids_are_zipf(demo, tmp_path: Path) -> None:
    generate(demo, 20_000, tmp_path, progress=False)
    feed = _read(tmp_path)["feed"]
    days = pd.to_datetime(feed.ts, unit="s").dt.date.nunique()
    assert days >= 7
    counts = feed.uid.value_counts()
    # heavy head: the most popular user is seen far more often than the median user
    assert counts.iloc[0] > 20 * counts.median()


def test_world_and_click_logit_recompute_the_logged_truth(demo, tmp_path: Path) -> None:
    """bench/oracle_gap.py rebuilds the world from the config and the row count and recomputes
    the truth with parts withheld: with nothing withheld it must give back what was logged."""
    from lattice.data.synth import World, _sigmoid, click_logit, id_space

    generate(demo, 6_000, tmp_path, progress=False)
    s = pd.concat(pd.read_parquet(p) for p in sorted((tmp_path / "search").glob("*.parquet")))
    world = World.draw(demo.synthetic, *id_space(demo.synthetic, 6_000))
    u, a = s.user.to_numpy() - 1, s.ad.to_numpy() - 1
    p = _sigmoid(click_logit(world, np.ones(len(s), int), world.user_vec[u], world.ad_vec[a], world.user_bias[u],
                             world.ad_bias[a], s["rank"].to_numpy(), s.device.to_numpy(),
                             (s.query_cat == s.category).to_numpy(), s.activity.to_numpy()))
    assert np.abs(p - s.true_click.to_numpy()).max() < 1e-4  # the log rounds truth to 6 decimals, activity to 4
    # the segment centres are what the users' vectors scatter around
    seg = world.user_segment
    assert np.abs(world.user_vec - world.segment_centers[seg]).std() < 0.5 < world.segment_centers.std()
