"""The streaming loader: splits, determinism, rank sharding, worker processes, null features,
teacher scores joined by example_id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lattice.config import load_config
from lattice.data.loader import BatchLoader, NoTrainingData, find_table, fit_dense_stats
from lattice.data.split import split_mask
from lattice.paths import Paths

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def table(tiny_demo):
    cfg, paths = tiny_demo("loader", 6_000, row_group_size=700)  # several row groups per file: many units
    root = find_table(paths)
    return cfg, paths, root, fit_dense_stats(cfg, root)


def _ids(loader) -> list[str]:
    return [e for b in loader for e in b.example_ids.tolist()]


def test_missing_table_says_which_command_makes_it(tmp_path) -> None:
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    with pytest.raises(NoTrainingData, match="lattice features CONFIG"):
        find_table(Paths.for_config(cfg, tmp_path))


def test_splits_are_disjoint_cover_everything_and_match_fractions(table) -> None:
    cfg, _, root, stats = table
    seen = {s: set(_ids(BatchLoader(cfg, root, stats, s, shuffle=False))) for s in ("train", "validation", "test")}
    everything = set(_ids(BatchLoader(cfg, root, stats, "all", shuffle=False)))
    assert seen["train"] | seen["validation"] | seen["test"] == everything
    assert sum(len(v) for v in seen.values()) == len(everything)
    assert 0.06 < len(seen["test"]) / len(everything) < 0.14  # test_fraction 0.1
    ids = sorted(everything)
    assert np.array_equal(split_mask(cfg, ids, "test"), split_mask(cfg, ids, "test"))  # pure function of the id


def test_order_is_deterministic_for_a_seed_and_changes_with_seed_and_epoch(table) -> None:
    cfg, _, root, stats = table
    a = _ids(BatchLoader(cfg, root, stats, "train", seed=1))
    assert a == _ids(BatchLoader(cfg, root, stats, "train", seed=1))
    assert a != _ids(BatchLoader(cfg, root, stats, "train", seed=2))
    other = BatchLoader(cfg, root, stats, "train", seed=1)
    other.set_epoch(1)
    assert a != _ids(other) and sorted(a) == sorted(_ids(other))


def test_batches_mix_domains(table) -> None:
    cfg, _, root, stats = table
    first = next(iter(BatchLoader(cfg, root, stats, "train", seed=0)))
    assert len(set(first.domain.tolist())) == 3  # files are one domain each; the shuffle buffer mixes them


def test_ranks_get_disjoint_balanced_shards(table) -> None:
    cfg, _, root, stats = table
    whole = _ids(BatchLoader(cfg, root, stats, "train", seed=0))
    r0 = _ids(BatchLoader(cfg, root, stats, "train", seed=0, rank=0, world_size=2))
    r1 = _ids(BatchLoader(cfg, root, stats, "train", seed=0, rank=1, world_size=2))
    assert not set(r0) & set(r1)
    assert set(r0) | set(r1) == set(whole)
    assert abs(len(r0) - len(r1)) <= 20  # at most one row per unit apart


def test_worker_processes_deliver_the_same_examples_deterministically(table) -> None:
    cfg, _, root, stats = table
    one = _ids(BatchLoader(cfg, root, stats, "train", num_workers=0))
    two = _ids(BatchLoader(cfg, root, stats, "train", num_workers=2))
    assert sorted(one) == sorted(two)
    assert two == _ids(BatchLoader(cfg, root, stats, "train", num_workers=2))
    # a batch that crossed from a worker (packed) equals the one read in this process, field by field
    a = next(iter(BatchLoader(cfg, root, stats, "train", num_workers=0, shuffle=False)))
    b = next(iter(BatchLoader(cfg, root, stats, "train", num_workers=1, shuffle=False)))
    assert list(a.example_ids) == list(b.example_ids)
    assert torch.equal(a.dense, b.dense) and torch.equal(a.domain, b.domain)
    assert a.sparse.keys() == b.sparse.keys()
    assert torch.equal(a.sparse.values(), b.sparse.values()) and torch.equal(a.sparse.lengths(), b.sparse.lengths())
    for o in cfg.objective_names:
        assert torch.equal(a.labels[o], b.labels[o]) and torch.equal(a.masks[o], b.masks[o])


def test_null_features_are_empty_bags_and_masks_follow_domains(table) -> None:
    cfg, _, root, stats = table
    b = next(iter(BatchLoader(cfg, root, stats, "all", shuffle=False, batch_size=6000)))
    lengths = b.sparse["query_category"].lengths()
    search = b.domain == cfg.domain_names.index("search")
    assert (lengths[search] == 1).all() and (lengths[~search] == 0).all()  # only search logs a query
    video = b.domain == cfg.domain_names.index("video")
    assert (b.masks["conversion"][video] == 0).all() and (b.masks["conversion"][~video] == 1).all()
    assert b.dense.shape == (len(b), len(stats.columns))


def test_dense_stats_standardize_the_train_split(table) -> None:
    cfg, _, root, stats = table
    dense = np.concatenate([b.dense.numpy() for b in BatchLoader(cfg, root, stats, "train")])
    price = [c.column for c in stats.columns].index("price")
    assert abs(dense[:, price].mean()) < 1e-3 and abs(dense[:, price].std() - 1) < 1e-3
    assert 0 < stats.label_rates["conversion"] < stats.label_rates["click"] < 0.5


def test_dense_stats_count_the_distinct_ids_of_the_train_split(table) -> None:
    cfg, _, root, stats = table
    frame = pd.read_parquet(root)
    train = frame[split_mask(cfg, frame.example_id, "train")]
    for f in cfg.features.sparse:
        assert stats.distinct_ids[f.name] == train[f.column].dropna().nunique(), f.name
    assert stats.distinct_ids["user_id"] > stats.distinct_ids["user_segment"] > 1
    assert type(stats).from_json(stats.to_json()).distinct_ids == stats.distinct_ids


def test_teacher_scores_join_by_example_id(table, tmp_path) -> None:
    cfg, _, root, stats = table
    ids = sorted(set(_ids(BatchLoader(cfg, root, stats, "train", shuffle=False))))
    scored = ids[::2]
    t = pd.DataFrame({"example_id": scored, "p_click": 0.25, "p_conversion": 0.125})
    t.to_parquet(tmp_path / "scores.parquet")
    n_scored = 0
    for b in BatchLoader(cfg, root, stats, "train", teacher_scores=tmp_path / "scores.parquet"):
        has = np.isin(b.example_ids, scored)
        assert np.array_equal(b.teacher_mask.numpy() == 1, has)
        assert (b.teacher["click"].numpy()[has] == 0.25).all()
        n_scored += int(has.sum())
    assert n_scored == len(scored)
    t.drop(columns="p_conversion").to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"lack columns \['p_conversion'\]"):
        next(iter(BatchLoader(cfg, root, stats, "train", teacher_scores=tmp_path / "bad.parquet")))


def test_train_cli_without_data_names_the_command_that_makes_it(tmp_path, capsys) -> None:
    from lattice.cli import main

    rc = main(["train", str(ROOT / "configs" / "demo.yaml"), "--model", "teacher", "--workdir", str(tmp_path)])
    assert rc == 1
    assert "lattice features CONFIG" in capsys.readouterr().err


def test_every_reader_follows_the_stored_split_column(table, tmp_path) -> None:
    """The split is decided once (the `split` column); the loader, the dense stats and the gate's
    window read it, whatever the hash of the id would say."""
    import pyarrow.dataset as ds

    from lattice.data.local_consolidate import write_parquet
    from lattice.export.window import load_window

    cfg, _, root, _ = table
    frame = ds.dataset(str(root), format="parquet", partitioning="hive").to_table().to_pandas()
    frame["domain"] = frame["domain"].astype(str)
    assert set(frame.split) == {"train", "validation", "test"}  # the pandas twin writes it too
    # a time split written by hand: the newest fifth is test, the one before validation
    order = frame.event_timestamp.rank(method="first") / len(frame)
    frame["split"] = np.where(order > 0.8, "test", np.where(order > 0.6, "validation", "train"))
    paths = Paths.for_config(cfg, tmp_path / "work")
    write_parquet(frame, paths.consolidated / "part-0.parquet")
    stats = fit_dense_stats(cfg, paths.consolidated)
    want = {s: set(frame.example_id[frame.split == s]) for s in ("train", "validation", "test")}
    for s in want:
        assert set(_ids(BatchLoader(cfg, paths.consolidated, stats, s, shuffle=False))) == want[s], s
    assert set(load_window(cfg, paths, "test", max_rows=None).example_id) == want["test"]
    # the stats see the train rows only: the hand-made train split has other rows than the hash's
    assert stats.to_json() != fit_dense_stats(cfg, root).to_json()


def test_one_absurd_value_moves_neither_the_mean_nor_the_scale() -> None:
    """A single 1e308 among normal prices: plain sums would make the mean infinite and every
    row's input constant; the robust stats clip it to the train tail and keep the rest intact."""
    from lattice.data.transforms import DenseColumn, StatsAccumulator

    rng = np.random.default_rng(0)
    clean = rng.lognormal(1.0, 0.5, size=50_000)
    dirty = clean.copy()
    dirty[123] = 1e308
    cols = [DenseColumn("price", "none")]
    stats = {}
    for name, x in (("clean", clean), ("dirty", dirty)):
        acc = StatsAccumulator(cols, cap=20_000)
        for part in np.array_split(x, 7):  # several units: the reservoir path runs too
            acc.add({"price": part}, len(part))
        stats[name] = acc.finish()
    assert np.isfinite(stats["dirty"].mean[0]) and np.isfinite(stats["dirty"].std[0])
    assert stats["dirty"].mean[0] == pytest.approx(stats["clean"].mean[0], rel=0.02)
    assert stats["dirty"].std[0] == pytest.approx(stats["clean"].std[0], rel=0.05)
    z = stats["dirty"].apply({"price": np.array([1e308, clean[0], np.nan])}, 3)[:, 0]
    assert np.isfinite(z).all() and z[0] < 10 and abs(z[1]) < 5


def test_resume_without_a_checkpoint_is_an_error_not_a_fresh_start(table) -> None:
    from lattice.training.stages import train

    cfg, paths, _, _ = table
    with pytest.raises(FileNotFoundError, match="no checkpoint of 'teacher'.*without --resume"):
        train(cfg, paths, model="teacher", nproc=1, resume=True, progress=False)


def test_pack_round_trips_every_column() -> None:
    """A worker's batch crosses to the trainer packed (one stacked array per dtype): unpacking gives
    back every key with the same dtype and values, object and 2-D columns untouched."""
    from lattice.data.loader import pack, unpack

    rng = np.random.default_rng(0)
    arrs = {"example_id": np.array(["a", "b", "c"], dtype=object), "dense": rng.normal(size=(3, 4)).astype(np.float32),
            "domain": np.array([0, 2, 1], np.int64), "id:u": np.array([5, -(2**62), 2**62], np.int64),
            "has:u": np.array([True, False, True]), "label:click": np.array([1, 0, 1], np.float32),
            "mask:click": np.array([1, 1, 0], np.float32)}
    packed = pack(arrs)
    assert sum(isinstance(v, np.ndarray) for v in packed.values()) == 5  # object, dense, int64, bool, float32
    back = unpack({k: (torch.from_numpy(v) if isinstance(v, np.ndarray) and v.dtype != object else v)
                   for k, v in packed.items()})
    assert back.keys() == arrs.keys()
    for k, v in arrs.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k


def _batches(loader) -> list[dict[str, np.ndarray]]:
    out = []
    for b in loader:
        out.append({"id": b.example_ids.copy(), "dense": b.dense.clone(), "ids": b.sparse.values().clone(),
                    "domain": b.domain.clone(), "labels": {o: v.clone() for o, v in b.labels.items()}})
    return out


@pytest.fixture
def reads(monkeypatch) -> list[int]:
    """One entry per parquet unit the loader reads."""
    import lattice.data.loader as L

    seen: list[int] = []
    real = L.read_unit
    monkeypatch.setattr(L, "read_unit", lambda *a, **k: seen.append(1) or real(*a, **k))
    return seen


def test_a_cached_pass_gives_the_same_batches_without_reading_the_table(table, reads) -> None:
    cfg, _, root, stats = table
    cold = BatchLoader(cfg, root, stats, "train", seed=3, num_workers=0)  # reads the table every pass
    kept = BatchLoader(cfg, root, stats, "train", seed=3, num_workers=0, cache=True)
    units = len(kept.stream.units)
    assert kept.stream.cache_bytes > 0
    _batches(kept)  # the first pass fills the cache
    assert len(reads) == units
    for epoch in (0, 1):
        cold.set_epoch(epoch)
        kept.set_epoch(epoch)
        reads.clear()
        expect, got = _batches(cold), _batches(kept)
        assert len(reads) == units  # only the uncached loader read the table
        assert len(expect) == len(got) > 1
        for e, g in zip(expect, got):
            assert np.array_equal(e["id"], g["id"])
            assert torch.equal(e["dense"], g["dense"]) and torch.equal(e["ids"], g["ids"]) and torch.equal(e["domain"], g["domain"])
            assert all(torch.equal(e["labels"][o], g["labels"][o]) for o in e["labels"])
    # a batch's tensors are its own: writing one leaves the kept rows and the next pass as they were
    # (unshuffled, the riskier case: no permutation copies the rows)
    kept = BatchLoader(cfg, root, stats, "validation", shuffle=False, num_workers=0, batch_size=8, cache=True)  # one unit a batch
    _batches(kept)
    first = next(iter(kept))
    before = first.dense.clone()
    first.dense.add_(1.0)
    assert torch.equal(next(iter(kept)).dense, before)


def test_the_cache_keeps_what_fits_and_reads_the_rest(table, reads) -> None:
    cfg, _, root, stats = table
    small = BatchLoader(cfg, root, stats, "validation", shuffle=False, num_workers=0, cache=True)
    units = len(small.stream.units)
    small.stream.cache_bytes = 20_000  # a few units' rows
    whole = _ids(small)
    kept = len(small.stream._cache)
    assert 0 < kept < units and small.stream._cached_bytes <= 20_000
    reads.clear()
    assert _ids(small) == whole
    assert len(reads) == units - kept
    off = cfg.model_copy(update={"training": cfg.training.model_copy(update={"loader_cache_mb": 0})})
    assert BatchLoader(off, root, stats, "train", cache=True).stream.cache_bytes == 0
    assert BatchLoader(cfg, root, stats, "train", num_workers=1, cache=True).stream.cache_bytes == 0  # workers end with the pass
    assert BatchLoader(cfg, root, stats, "test").stream.cache_bytes == 0  # one-pass readers keep nothing


def test_split_rows_counts_the_stored_column_not_the_fractions(table, tmp_path) -> None:
    """The trainer plans its steps (and the rate's decay) from this count (issue 40): with shares
    far from the hash fractions the count follows the stored column."""
    import pyarrow.dataset as ds

    from lattice.data.loader import split_rows, table_rows

    cfg, _, root, stats = table
    assert split_rows(root, "train") == len(_ids(BatchLoader(cfg, root, stats, "train", shuffle=False)))
    # rewrite the column: 90% test, 10% train (as a time or column split may give)
    df = ds.dataset(str(root), format="parquet", partitioning="hive", ignore_prefixes=[".", "_"]).to_table().to_pandas()
    df["split"] = np.where(np.arange(len(df)) % 10 == 0, "train", "test")
    other = tmp_path / "skewed"
    other.mkdir()
    df.drop(columns=[c for c in ("date", "domain") if c not in df.columns]).to_parquet(other / "part-0.parquet", index=False)
    assert split_rows(other, "train") == int((df["split"] == "train").sum())
    assert split_rows(other, "train") < 0.2 * table_rows(other)  # the fractions would have said ~80%
    df.drop(columns=["split"]).to_parquet(other / "part-0.parquet", index=False)
    assert split_rows(other, "train") is None  # an old table: the trainer falls back to the fractions


def test_hive_folders_are_parsed_by_pyarrow_dataset_and_stay_strings(tmp_path) -> None:
    """Partition values as Spark writes them: URI-escaped, and `007` stays `007` (not the int 7)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lattice.data.loader import scan_units, table_columns

    for folder in ("date=2026-01-01/domain=feed/shard=007", "date=2026-01-02/domain=web%20search/shard=010"):
        (tmp_path / folder).mkdir(parents=True)
        pq.write_table(pa.table({"x": [1, 2]}), tmp_path / folder / "part-0.parquet")
    (tmp_path / "_SUCCESS").write_text("")
    units = scan_units(tmp_path)
    assert [u.partition for u in units] == [
        (("date", "2026-01-01"), ("domain", "feed"), ("shard", "007")),
        (("date", "2026-01-02"), ("domain", "web search"), ("shard", "010")),
    ]
    assert table_columns(tmp_path) == {"x", "date", "domain", "shard"}
