"""The hash-fit stage (`lattice hashing fit`): fitted id maps of vocab, mixed and learned hashing on
a tiny consolidated table built here, with the shared Spark session."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lattice.config import PlatformConfig, load_config
from lattice.hashing.budgets import row_budgets
from lattice.hashing.collisions import collision_note, expected_colliding_pairs
from lattice.hashing.fit import fit_hashing
from lattice.hashing.store import FitMissingError, FitStaleError, content_version, load_fitted, lookup, read_fitted
from lattice.paths import Paths
from lattice.training.tiny import tiny

ROOT = Path(__file__).resolve().parents[2]
GROUP_RATES = (0.02, 0.15, 0.4, 0.7)  # click rate of each group of ad ids
IDS_PER_GROUP = 40
HUGE = 2**62


def _config(tmp: Path, **ad) -> PlatformConfig:
    """The demo's structure, tiny; ad_id learned (20 rows: 10 for the student), user_id vocab,
    device mixed."""
    cfg = tiny(load_config(ROOT / "configs" / "demo.yaml"), data_root=str(tmp / "raw"))
    keys = {"ad_id": {"hashing": "learned", "num_embeddings": 20, "learned_frequent_share": 0.1, **ad},
            "user_id": {"hashing": "vocab", "num_embeddings": 64},
            "device": {"hashing": "mixed", "num_embeddings": 16}}
    sparse = [f.model_copy(update=keys.get(f.name, {})) for f in cfg.features.sparse]
    return cfg.model_copy(update={"features": cfg.features.model_copy(update={"sparse": sparse})})


def _groups(seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Ad ids scattered over a large range (so id mod rows knows nothing of the groups) and the
    group of each; two of them negative and one huge, as raw int64 ids can be."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(2**40, size=len(GROUP_RATES) * IDS_PER_GROUP, replace=False).astype(np.int64)
    ids[:2] = -ids[:2]
    ids[2] = HUGE
    return ids, np.repeat(np.arange(len(GROUP_RATES)), IDS_PER_GROUP)


def write_table(paths: Paths, cfg: PlatformConfig, rows_per_id: int = 150, extra_train: int = 0, seed: int = 0) -> Path:
    """A consolidated table in the pipeline's layout (date=/domain=/part.parquet) whose ad ids
    come in groups of equal click behaviour; users and devices are noise."""
    rng = np.random.default_rng(seed)
    ids, group = _groups()
    per_id = rng.poisson(rows_per_id, len(ids)) + 1
    order = rng.permutation(int(per_id.sum()))
    ad, g = np.repeat(ids, per_id)[order], np.repeat(group, per_id)[order]
    base = len(ad)
    extra = rng.integers(0, len(ids), extra_train)  # more training rows of the same ids
    ad, g = np.concatenate([ad, ids[extra]]), np.concatenate([g, group[extra]])
    n = len(ad)
    click = (rng.random(n) < np.asarray(GROUP_RATES)[g]).astype(np.int8)
    user = rng.zipf(1.5, n).astype(np.int64) % 500
    user_null = rng.random(n) < 0.05
    domain = rng.choice(cfg.domain_names, n)
    split = np.where(np.arange(n) < base, rng.choice(["train", "train", "train", "validation", "test"], n), "train")
    date = rng.choice(["2026-01-01", "2026-01-02", "2026-01-03"], n)
    conv_mask = np.isin(domain, ["feed", "search"]).astype(np.int8)
    cols = {
        "example_id": np.array([f"e{i}" for i in range(n)]), "split": split,
        "user_id": pa.array(user, mask=user_null), "ad_id": ad, "user_segment": user % 64, "ad_category": ad % 128,
        "device": rng.integers(0, 9, n).astype(np.int64), "position": rng.integers(0, 5, n).astype(np.int64),
        "query_category": rng.integers(0, 40, n).astype(np.int64),
        "price": rng.random(n), "price_present": np.ones(n, np.int8), "activity": rng.random(n),
        "activity_present": np.ones(n, np.int8),
        "label_click": click, "mask_click": np.ones(n, np.int8),
        "label_conversion": (click * (rng.random(n) < 0.2) * conv_mask).astype(np.int8), "mask_conversion": conv_mask,
    }
    tbl = pa.table({k: v if isinstance(v, pa.Array) else pa.array(v) for k, v in cols.items()})
    for d, dom in itertools.product(np.unique(date), cfg.domain_names):
        keep = np.flatnonzero((date == d) & (domain == dom))
        f = paths.consolidated / f"date={d}" / f"domain={dom}" / "part-00000.parquet"
        f.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(tbl.take(pa.array(keep)), f)
    return paths.consolidated


@pytest.fixture(scope="module")
def fitted_table(tmp_path_factory, spark):
    base = tmp_path_factory.mktemp("hashing")
    cfg = _config(base)
    paths = Paths.for_config(cfg, base / "work")
    write_table(paths, cfg)
    summary = fit_hashing(cfg, paths)
    return cfg, paths, summary, load_fitted(cfg, paths)


def test_budgets_are_the_model_tables_rows(fitted_table) -> None:
    from lattice.models.sparse import table_shape

    cfg, _, _, fitted = fitted_table
    for f in cfg.features.sparse:
        rows = [dict((n, r) for n, r, _ in table_shape(cfg, size))[f.name]
                for size in (cfg.models.teacher, cfg.models.student, cfg.models.baselines.size)]
        assert row_budgets(cfg, f) == sorted(set(rows))
    assert sorted(fitted) == ["ad_id", "device", "user_id"]  # every feature that needs a fit, nothing else
    assert sorted(fitted["ad_id"]) == [10, 20]  # teacher 20 rows, student table_scale 0.5


def test_contract_keys_and_every_id_maps_into_the_table(fitted_table) -> None:
    _, _, _, fitted = fitted_table
    ids, _ = _groups()
    probe = np.concatenate([ids, [HUGE, HUGE + 1, -1, -(2**63), 2**63 - 1, 0, 123456789]]).astype(np.int64)
    for feature, by_budget in fitted.items():
        for budget, m in by_budget.items():
            assert set(m) == {"feature", "scheme", "version", "table_rows", "budget", "ids", "rows_of", "counts",
                              "oov_start", "oov_rows", "frequent", "window", "stats"}
            assert m["budget"] == budget and 2 <= m["table_rows"] <= budget and m["version"] == content_version(m)
            assert m["ids"].dtype == np.int64 and np.all(np.diff(m["ids"]) > 0)
            assert m["window"]["split"] == "train" and m["window"]["start"] == "2026-01-01" and m["window"]["end"] == "2026-01-03"
            rows = lookup(m, probe)
            assert rows.min() >= 0 and rows.max() < m["table_rows"], (feature, budget)
            assert np.all(lookup(m, m["ids"]) == m["rows_of"])


def test_frequent_ids_get_rows_of_their_own(fitted_table) -> None:
    _, _, _, fitted = fitted_table
    for feature, by_budget in fitted.items():
        for m in by_budget.values():
            own = m["rows_of"] < m["frequent"]
            assert own.sum() == m["frequent"] and len(np.unique(m["rows_of"][own])) == m["frequent"]
            # they are the most frequent ids
            if m["frequent"] < len(m["ids"]):
                assert m["counts"][own].min() >= m["counts"][~own].max()
            # and no unseen id lands on one of them
            assert m["oov_start"] >= m["frequent"]


def test_vocab_gives_distinct_ids_distinct_rows_and_one_oov_row(fitted_table) -> None:
    _, _, _, fitted = fitted_table
    for budget, m in fitted["user_id"].items():
        n = len(m["ids"])
        assert n == min(m["stats"]["distinct"], budget - 1) and m["table_rows"] == n + 1
        assert sorted(m["rows_of"].tolist()) == list(range(n)) and (m["oov_start"], m["oov_rows"]) == (n, 1)
        by_rank = m["counts"][np.argsort(m["rows_of"])]
        assert np.all(np.diff(by_rank) <= 0)  # row 0 is the most frequent id
    mixed = fitted["device"][16]
    assert mixed["scheme"] == "mixed" and sorted(mixed["rows_of"].tolist()) == list(range(len(mixed["ids"])))


def test_fit_sees_the_ids_the_model_sees(fitted_table) -> None:
    from lattice.data.loader import BatchLoader, find_table, fit_dense_stats

    cfg, paths, _, fitted = fitted_table
    root = find_table(paths)
    seen: dict[str, set[int]] = {"ad_id": set(), "user_id": set()}
    rows = 0
    for b in BatchLoader(cfg, root, fit_dense_stats(cfg, root), "train", shuffle=False):
        rows += len(b.example_ids)
        for k in seen:
            seen[k] |= set(b.sparse[k].values().tolist())
    ad = fitted["ad_id"][20]
    assert ad["window"]["rows"] == rows
    assert seen["ad_id"] == set(ad["ids"].tolist())  # min_count 1: every id the model meets was fitted
    users = fitted["user_id"][64]
    assert set(users["ids"].tolist()) <= seen["user_id"] and users["stats"]["distinct"] == len(seen["user_id"])


def _same_group_share(rows: np.ndarray, group: np.ndarray) -> float:
    """Among pairs of ids sharing a row, the share that belong to the same group."""
    same = total = 0
    for r in np.unique(rows):
        g = group[rows == r]
        k = len(g)
        total += k * (k - 1) // 2
        same += sum(c * (c - 1) // 2 for c in np.bincount(g))
    return same / total if total else 1.0


def test_learned_groups_similar_ids_more_than_the_hashing_trick(fitted_table) -> None:
    _, _, _, fitted = fitted_table
    ids, group = _groups()
    for budget, m in fitted["ad_id"].items():
        shared = ~np.isin(lookup(m, ids), np.arange(m["frequent"]))  # the clustered ids
        learned = _same_group_share(lookup(m, ids)[shared], group[shared])
        trick = _same_group_share(np.remainder(ids, m["table_rows"])[shared], group[shared])
        assert learned > 0.8 and learned > trick + 0.3, (budget, learned, trick)


def test_fit_is_deterministic_for_a_seed(fitted_table, tmp_path) -> None:
    cfg, paths, summary, fitted = fitted_table
    again = Paths(tmp_path / "again", paths.data_root)
    # the same table read from another workdir: same counts, same maps
    again_table = again.consolidated
    again_table.parent.mkdir(parents=True)
    again_table.symlink_to(paths.consolidated, target_is_directory=True)
    fit_hashing(cfg, again)
    other = {f: {r: m["version"] for r, m in b.items()} for f, b in load_fitted(cfg, again).items()}
    assert other == {f: {r: m["version"] for r, m in b.items()} for f, b in fitted.items()}
    fit_hashing(cfg, again, seed=7)
    seeded = load_fitted(cfg, again)["ad_id"][20]
    assert len(seeded["ids"]) == len(fitted["ad_id"][20]["ids"])  # another seed may cluster differently, same ids


def test_missing_fit_names_the_command(tmp_path) -> None:
    cfg = _config(tmp_path)
    with pytest.raises(FitMissingError, match=r"'ad_id'.*lattice hashing fit"):
        load_fitted(cfg, Paths.for_config(cfg, tmp_path / "work"))


def test_stale_fit_is_detected(fitted_table, tmp_path, spark) -> None:
    cfg, paths, _, _ = fitted_table
    # other hashing keys than the fit's
    changed = _config(tmp_path, min_count=4)
    with pytest.raises(FitStaleError, match=r"ad_id.*min_count.*lattice hashing fit"):
        load_fitted(changed, paths)
    # a model size that needs another row budget
    student = cfg.models.student.model_copy(update={"table_scale": 0.25})
    resized = cfg.model_copy(update={"models": cfg.models.model_copy(update={"student": student})})
    with pytest.raises(FitStaleError, match=r"row budgets"):
        load_fitted(resized, paths)
    # the table was rebuilt with more training rows
    work = Paths.for_config(cfg, tmp_path / "work")
    write_table(work, cfg)
    fit_hashing(cfg, work)
    load_fitted(cfg, work)
    write_table(work, cfg, extra_train=50)
    with pytest.raises(FitStaleError, match=r"training split now has .* rows.*lattice hashing fit"):
        load_fitted(cfg, work)


def test_saved_files_and_summary(fitted_table) -> None:
    _, paths, summary, fitted = fitted_table
    fits, meta = read_fitted(paths, "ad_id")
    assert meta["fingerprint"]["train_rows"] == fits[20]["window"]["rows"]
    assert meta["fingerprint"]["keys"]["hashing"] == "learned"
    line = summary["features"]["ad_id"][20]
    assert line["kept"] == len(fitted["ad_id"][20]["ids"]) and 0.99 < line["coverage"] <= 1.0
    json.dumps(summary)  # a stage summary is JSON (XCom, the CLI)


def test_staged_model_runs_read_their_homes_fits(tmp_path) -> None:
    from lattice.orchestration.run_paths import RunPaths

    home = Paths(tmp_path, tmp_path)
    staged = RunPaths.make(home, staged="teacher")
    assert staged.hashing == home.hashing == Paths(staged.workdir, tmp_path).hashing  # the ranks' plain Paths


def test_modulo_collision_note() -> None:
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    uid = next(f for f in cfg.features.sparse if f.name == "user_id")
    assert expected_colliding_pairs(20_000, 200_000) == pytest.approx(20_000 * 19_999 / 400_000)
    note = collision_note(uid, 20_000, 200_000)
    assert note and "about 1,000 pairs" in note and "hashing: vocab" in note
    assert collision_note(uid, 100, 200_000) is None  # 0.02 expected pairs
    assert collision_note(uid.model_copy(update={"hashing": "vocab"}), 20_000, 200_000) is None


def test_teacher_dag_fits_only_when_a_feature_needs_it(tmp_path) -> None:
    from lattice.orchestration.spec import dag_specs

    def tasks(cfg: PlatformConfig, family: str = "train_teacher") -> list[str]:
        return [t.task_id for t in next(s for s in dag_specs(cfg) if s.family == family).airflow_tasks]

    assert "fit_hashing" not in tasks(load_config(ROOT / "configs" / "demo.yaml"))
    ids = tasks(_config(tmp_path))
    assert ids[0] == "fit_hashing" and "train_teacher" in ids  # its own task: the Spark steps are the features DAG's
    assert not any("fit_hashing" in t for t in tasks(_config(tmp_path), "features"))


def test_cli_registers_hashing_fit() -> None:
    from lattice.cli import build_parser

    args = build_parser().parse_args(["hashing", "fit", "configs/demo.yaml", "--workdir", "/tmp/x"])
    assert args.config == "configs/demo.yaml" and args.workdir == "/tmp/x"


def test_cluster_rows_beyond_the_centre_cap_fill_every_row_deterministically() -> None:
    from lattice.hashing.cluster import MAX_CLUSTERS, _allocate, cluster_rows

    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = rng.integers(1, 50, rng.integers(1, 30)).astype(np.int64)
        rows = int(rng.integers(len(sizes), sizes.sum() + 1))
        alloc = _allocate(sizes, rows)
        assert alloc.sum() == rows and (alloc >= 1).all() and (alloc <= sizes).all()
    x = rng.normal(size=(3000, 4))
    rows = 2 * MAX_CLUSTERS + 88
    got = cluster_rows(x, np.ones(len(x)), rows, seed=1)
    assert got.min() == 0 and got.max() == rows - 1 and len(np.unique(got)) == rows
    assert np.array_equal(got, cluster_rows(x, np.ones(len(x)), rows, seed=1))


def test_the_models_torch_lookup_agrees_with_the_reference(fitted_table) -> None:
    import torch

    from lattice.hashing.base import lookup_from_map

    cfg, _, _, fitted = fitted_table
    ids, _ = _groups()
    probe = np.concatenate([ids, [HUGE + 1, -7, -(2**63), 2**63 - 1, 0]]).astype(np.int64)
    for f in cfg.features.sparse:
        for budget, m in fitted.get(f.name, {}).items():
            got = lookup_from_map(f, m, budget)(torch.from_numpy(probe)).numpy()
            assert np.array_equal(got, lookup(m, probe)), (f.name, budget)


def test_rare_ids_rows_never_follow_their_own_few_labels() -> None:
    """Grouping rare ids by the labels they have leaks those training labels into shared rows:
    below MIN_LIFT_ROWS labelled rows an id's label lift is 0, whatever its labels."""
    from lattice.hashing.cluster import MIN_LIFT_ROWS, representation
    from lattice.hashing.id_stats import IdStats, Window

    rows = np.array([3, 3, MIN_LIFT_ROWS, MIN_LIFT_ROWS])  # two rare ids, two with enough rows
    pos = np.array([3, 0, MIN_LIFT_ROWS // 2, 0])  # one of each clicked every time, one never
    stats = IdStats("x", np.arange(4), rows, rows[:, None], rows[:, None, None], pos[:, None], int(rows.sum()), 0.0)
    window = Window(int(rows.sum()), None, None, True, np.array([[1000]]), np.array([[100]]))
    lift = representation(stats, window, np.arange(4))[:, 0]
    assert lift[0] == lift[1] == 0.0  # 3 of 3 clicks and 0 of 3 look alike
    assert lift[2] > 0 > lift[3]  # from MIN_LIFT_ROWS on, the lift counts


def test_rare_ids_stay_out_of_the_map_and_train_the_unseen_range() -> None:
    """`learned` keeps ids seen fewer than min_count (3 unless set) out of its map: they hash
    into the range unseen ids are served from, so that range is trained, and it gets the rows of
    the traffic it serves outside the frequent head."""
    from lattice.config.schema import LEARNED_MIN_COUNT, SparseFeature
    from lattice.hashing.id_stats import IdStats, Window
    from lattice.hashing.maps import learned_map

    counts = np.array([1000] * 10 + [20] * 40 + [1, 2] * 100)  # head, mid, 200 rare ids
    n = len(counts)
    ids = np.arange(n, dtype=np.int64) * 7919 + 5
    stats = IdStats("x", ids, counts, counts[:, None], counts[:, None, None], (counts // 10)[:, None],
                    int(counts.sum()), 0.0)
    window = Window(int(counts.sum()), None, None, True, np.array([[int(counts.sum())]]), np.array([[int(counts.sum()) // 10]]))
    feature = SparseFeature(name="x", column="x", hashing="learned", num_embeddings=40, learned_frequent_share=0.25)
    assert feature.fit_min_count() == LEARNED_MIN_COUNT == 3
    m = learned_map(feature, 40, stats, window)
    rare, kept = ids[50:], ids[:50]
    assert set(m["ids"].tolist()) == set(kept.tolist())
    in_range = lambda r: (r >= m["oov_start"]) & (r < m["oov_start"] + m["oov_rows"])  # noqa: E731
    assert in_range(lookup(m, rare)).all() and in_range(lookup(m, np.array([-1, 2**62, 123456789]))).all()
    # rows outside the head: 30; rare ids carry 300 of the 1,100 rows there, so 8 rows (not 5% of 40 = 2)
    assert m["frequent"] == 10 and m["oov_rows"] == round(30 * 300 / 1100)
    assert m["table_rows"] <= 40 and len(np.unique(lookup(m, rare))) > 2
    # a budget the kept ids fit: a row each, and the rare ids share the 5% range (20 of 400 rows)
    roomy = learned_map(feature, 400, stats, window)
    assert len(roomy["ids"]) == 50 and (roomy["oov_start"], roomy["oov_rows"], roomy["table_rows"]) == (50, 20, 70)
    # min_count 1 maps every seen id and keeps the 5% range, which no training row then reaches
    every = learned_map(feature.model_copy(update={"min_count": 1}), 40, stats, window)
    assert len(every["ids"]) == n and every["oov_rows"] == 2


def test_a_windowed_fit_counts_only_the_windows_train_rows_and_training_refuses_maps_of_other_days(
        fitted_table, tmp_path, spark) -> None:
    """Under training.window the maps fit on the window's train days (and the part of its newest
    day a run trains on), the same rows as the loader's rule, never the test day's; a run refuses
    maps of another window, of the stored split, or that held out less of the newest day."""
    from lattice.data.loader import read_unit, scan_units
    from lattice.data.window import resolve, row_dates
    from lattice.hashing.store import check_window
    from lattice.training.stages import train

    cfg, paths, _, _ = fitted_table
    m = cfg.models
    windowed = cfg.model_copy(update={
        "training": cfg.training.model_copy(update={"window": "2d"}),
        "models": m.model_copy(update={"leaves": m.leaves.model_copy(update={"models": []})})})
    work = Paths.for_config(windowed, tmp_path / "work")
    work.consolidated.parent.mkdir(parents=True)
    work.consolidated.symlink_to(paths.consolidated, target_is_directory=True)
    dates, ids, users, stored = [], [], [], []
    for u in scan_units(paths.consolidated):
        tbl, part = read_unit(u, ["example_id", "user_id", "split"])
        dates += row_dates(tbl, part)
        ids += tbl.column("example_id").to_pylist()
        users += [-1 if v is None else v for v in tbl.column("user_id").to_pylist()]
        stored += tbl.column("split").to_pylist()
    users, stored = np.asarray(users), np.asarray(stored)
    end = "2026-01-03"  # train 2026-01-01, validation 2026-01-02, test 2026-01-03 (the table's newest day)
    window = resolve(windowed, work.consolidated, end)
    assert (window.train, window.validation, window.test) == (("2026-01-01",), "2026-01-02", "2026-01-03")
    for share in (1.0, 0.5):
        summary = fit_hashing(windowed, work, end=end, validation_share=share)
        rows = window.splits(validation_share=share).split_of(dates, ids, "train")
        assert summary["window"]["rows"] == int(rows.sum()) and summary["days"]["validation_share"] == share
        assert not (rows & (np.asarray(dates) == "2026-01-03")).any()
        # the stored split marks rows of the test day train: the old fit counted them
        assert int(((stored == "train") & (np.asarray(dates) == "2026-01-03")).sum()) > 0
        vocab = load_fitted(windowed, work)["user_id"]
        for fitted in vocab.values():  # each kept id's count is its rows among the window's train rows
            want = {int(i): int(c) for i, c in zip(*np.unique(users[rows & (users >= 0)], return_counts=True))}
            assert {int(i): int(c) for i, c in zip(fitted["ids"], fitted["counts"])}.items() <= want.items()
            assert len(fitted["ids"]) > 0
        check_window(windowed, work, window, share)  # its own window
    with pytest.raises(FitStaleError, match=r"holding out 0.5 of its newest day \(this run: 1\).*--end 2026-01-03"):
        check_window(windowed, work, window, 1.0)
    later = resolve(windowed, work.consolidated, "2026-01-04")
    with pytest.raises(FitStaleError, match=r"window 2026-01-01\.\.2026-01-02.*--end 2026-01-04"):
        check_window(windowed, work, later, 0.5)
    with pytest.raises(FitStaleError, match=r"training.window is unset"):
        check_window(cfg, work, None)
    with pytest.raises(FitStaleError, match=r"stored split \(no window\).*lattice hashing fit .* --end 2026-01-03"):
        check_window(windowed, paths, window)  # the fixture's fit: the stored split
    with pytest.raises(FitStaleError, match=r"stored split \(no window\)"):  # training refuses it before anything moves
        train(windowed, paths, "teacher", end=end)
    assert not paths.model_dir("teacher").exists()


@pytest.mark.parametrize("mode", ["mask", "naive"])
def test_the_spark_labels_at_a_cutoff_agree_with_the_loaders(spark, mode) -> None:
    """`id_stats.known_labels` (the hashing fit's labels under training.window) gives each delayed
    objective the labels and masks `label_time.mask_at_cutoff` gives the loader, on rows whose
    conversion arrived before, after, or never; the click (no window) passes through."""
    import datetime as dt

    import pandas as pd

    from lattice.data import schema as S
    from lattice.data.label_time import mask_at_cutoff
    from lattice.hashing.id_stats import known_labels

    market = load_config(ROOT / "bench" / "configs" / "demo_market.yaml")
    cfg = market.model_copy(update={"training": market.training.model_copy(update={"label_delay": mode})})
    t0 = pd.Timestamp("2026-01-05 12:00", tz="UTC")
    log = pd.DataFrame({
        "example_id": ["late", "never", "prompt", "old"],
        "event_timestamp": [t0, t0, t0, t0 - pd.Timedelta(days=8)],
        S.label_column("click"): np.array([1, 0, 1, 1], np.int8), S.mask_column("click"): np.ones(4, np.int8),
        S.label_column("conversion"): np.array([1, 0, 1, 1], np.int8), S.mask_column("conversion"): np.ones(4, np.int8),
        S.known_column("conversion"): [t0 + pd.Timedelta(days=2), pd.NaT, t0 + pd.Timedelta(minutes=30),
                                       t0 - pd.Timedelta(days=7)]})
    for cutoff in (dt.datetime(2026, 1, 6), dt.datetime(2026, 1, 8), dt.datetime(2026, 1, 13)):
        want = mask_at_cutoff(log, cutoff, cfg)
        got = known_labels(spark.createDataFrame(log), cfg, cutoff).toPandas().set_index("example_id").loc[log.example_id]
        for col in (S.label_column("conversion"), S.mask_column("conversion"), S.label_column("click")):
            assert got[col].astype(int).tolist() == want[col].astype(int).tolist(), (mode, cutoff, col)
    assert want[S.mask_column("conversion")].tolist() == [1, 1, 1, 1]  # every window closed by the last cutoff
