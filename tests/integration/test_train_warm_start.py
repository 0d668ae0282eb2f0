"""Living over days: a windowed run trains on its window's days and is tested on the day after; a
warm start continues the parent (weights, tables, optimizer state) on the new day and equals one
run over the same batches in the same order; a config the old weights do not fit is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lattice.paths import Paths
from lattice.training.stages import train

pytestmark = pytest.mark.slow

# days of the tiny demo table (synthetic.days 14 from 2026-01-01): A trains on days 1-2 (3 is its
# validation, 4 its test); B warm-starts from A on day 3 (4 validation, 5 test)
END_A, END_B = "2026-01-04", "2026-01-05"


@pytest.fixture(scope="module")
def setup(tiny_demo):
    cfg, paths = tiny_demo("warm", 8_000)
    tr = cfg.training.model_copy(update={
        "window": "3d", "epochs": 1, "calibration": "none", "checkpoint_every": 0,
        # one constant rate for both runs: the reference continues as a second pass, B as a first
        "lr_decay_to": 1.0, "lr_sparse_after_first_epoch": 1.0, "lr_dense_after_first_epoch": 1.0})
    return cfg.model_copy(update={"training": tr}), paths


def _blob(paths: Paths, name: str) -> dict:
    return torch.load(paths.model_dir(name) / "model.pt", weights_only=False)


def test_window_selects_its_days_and_tests_on_the_next(setup) -> None:
    cfg, paths = setup
    train(cfg, paths, model="teacher@w", nproc=1, end=END_A, progress=False)
    lin = json.loads((paths.model_dir("teacher@w") / "lineage.json").read_text())
    assert lin["window"] == {"train": ["2026-01-01", "2026-01-02"], "validation": "2026-01-03",
                             "test": "2026-01-04", "end": END_A}
    assert lin["judged_on"] == "2026-01-04" and lin["days_seen"] == ["2026-01-01", "2026-01-02"]
    preds = pd.read_parquet(paths.model_dir("teacher@w") / "predictions.parquet")
    table = pd.read_parquet(paths.consolidated, columns=["example_id", "date"])
    table["date"] = table["date"].astype(str)
    assert len(preds) == int((table.date == "2026-01-04").sum()) > 0
    assert set(table.set_index("example_id").loc[preds.example_id, "date"]) == {"2026-01-04"}
    history = json.loads((paths.model_dir("teacher@w") / "history.json").read_text())
    assert history["epochs"][0]["examples"] == int(table.date.isin(["2026-01-01", "2026-01-02"]).sum())


def test_warm_start_equals_one_run_over_the_same_batches(setup) -> None:
    cfg, paths = setup
    train(cfg, paths, model="teacher@ws", nproc=1, end=END_A, progress=False)
    parent_blob = _blob(paths, "teacher@ws")
    parent_sum = parent_blob["lineage"]
    b = train(cfg, paths, model="teacher@ws", nproc=1, end=END_B, warm_start="last", progress=False)
    lin = b["lineage"]
    assert lin["trained_days"] == ["2026-01-03"] and lin["days_seen"] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert lin["parent"]["mode"] == "last" and len(lin["parent"]["checksum"]) == 64
    assert lin["judged_on"] == "2026-01-05" and parent_sum["parent"] is None

    # the reference: one trainer passes over A's batches, then over B's (day 3, epoch-0 order)
    from lattice.data.window import DaySplits
    from lattice.training import distributed as D
    from lattice.training.loop import Trainer
    from lattice.training.spec import RunSpec

    spec_a = RunSpec.load(paths.model_dir("teacher@ws") / "run_spec.json")  # B's spec: same config and table
    ref_dir = paths.model_dir("teacher@ref")
    ref_dir.mkdir(parents=True, exist_ok=True)
    a_days = {"2026-01-01": "train", "2026-01-02": "train", "2026-01-03": "validation", "2026-01-04": "test"}
    import shutil

    shutil.copy(paths.model_dir("teacher@ws") / "dense_stats.json", ref_dir / "dense_stats.json")  # A's, kept by B
    ref = Trainer(RunSpec(**{**spec_a.__dict__, "model": "teacher@ref", "days": DaySplits(a_days).to_json(),
                             "parent": None, "lineage": None, "progress": False}))
    try:
        assert ref.fit()
        ref.days = DaySplits.from_json(spec_a.days)  # B's days: day 3 is the train split
        ref._loaders.clear()
        ref.state.epoch, ref.state.step_in_epoch = 0, 0
        assert ref.train_epoch(0)
        want = D.full_state_dict(ref.model)
    finally:
        ref.close()
    got = _blob(paths, "teacher@ws")["state_dict"]
    assert want.keys() == got.keys()
    # exact: the same float ops in the same order (weights, row-wise Adagrad and Adam states all
    # carried over bit for bit through model.pt and the DCP checkpoint)
    for k in want:
        assert torch.equal(want[k], got[k]), k
    # and the warm start did move the weights away from the parent's
    parent = parent_blob["state_dict"]
    assert any(not torch.equal(parent[k], got[k]) for k in got)
    assert not (paths.model_dir("teacher@ws") / "parent").exists()  # moved aside for the run, gone after


def test_incompatible_config_is_refused_naming_the_change(setup) -> None:
    from lattice.training.warm_start import WarmStartError

    cfg, paths = setup
    train(cfg, paths, model="teacher@x", nproc=1, end=END_A, progress=False)
    sparse = [f.model_copy(update={"num_embeddings": f.num_embeddings // 2}) if f.name == "ad_id" else f
              for f in cfg.features.sparse]
    changed = cfg.model_copy(update={"features": cfg.features.model_copy(update={"sparse": sparse})})
    with pytest.raises(WarmStartError, match=r"features\.sparse\.ad_id\.num_embeddings.*warm_start: none"):
        train(changed, paths, model="teacher@x", nproc=1, end=END_B, warm_start="last", progress=False)
    assert (paths.model_dir("teacher@x") / "model.pt").exists()  # a refused run leaves the model where it was


def test_nothing_new_to_train_is_an_error(setup) -> None:
    cfg, paths = setup
    train(cfg, paths, model="teacher@n", nproc=1, end=END_A, progress=False)
    from lattice.training.warm_start import WarmStartError

    with pytest.raises(WarmStartError, match="every train day"):
        train(cfg, paths, model="teacher@n", nproc=1, end=END_A, warm_start="last", progress=False)
    assert (paths.model_dir("teacher@n") / "model.pt").exists()


def test_vocab_refit_keeps_known_ids_rows_and_gives_new_ids_free_rows(setup) -> None:
    from lattice.data.loader import find_table
    from lattice.data.window import DaySplits, resolve
    from lattice.hashing.budgets import fit_keys, row_budgets
    from lattice.hashing.id_stats import IdStats, Window
    from lattice.hashing.maps import ranked_map
    from lattice.hashing.refit import train_id_counts
    from lattice.hashing.store import lookup, save_fitted, table_fingerprint

    cfg, paths = setup
    sparse = [f.model_copy(update={"hashing": "vocab"}) if f.name == "ad_id" else f for f in cfg.features.sparse]
    cfg = cfg.model_copy(update={"features": cfg.features.model_copy(update={"sparse": sparse})})
    feat = next(f for f in cfg.features.sparse if f.name == "ad_id")
    table = find_table(paths)
    # the parent's fit, on its train days, built by the platform's own map builder
    ids, counts = train_id_counts(cfg, table, DaySplits({"2026-01-01": "train", "2026-01-02": "train"}), ["ad_id"])["ad_id"]
    stats = IdStats("ad_id", ids, counts, None, None, None, int(counts.sum()), 0.0)
    window = Window(int(counts.sum()), "2026-01-01", "2026-01-02", True, np.zeros((1, 1)), np.zeros(1))
    fits = {r: ranked_map(feat, r, stats, window) for r in row_budgets(cfg, feat)}
    # recorded as fitted on END_A's window, as `lattice hashing fit --end END_A` records it
    days = {**resolve(cfg, table, END_A).to_json(), "validation_share": 1.0}
    assert days["train"] == ["2026-01-01", "2026-01-02"]
    save_fitted(paths, "ad_id", fits, {**table_fingerprint(table, int(counts.sum())), "keys": fit_keys(feat), "seed": 0,
                                       "window": days})

    train(cfg, paths, model="teacher@v", nproc=1, end=END_A, progress=False)
    a = _blob(paths, "teacher@v")
    train(cfg, paths, model="teacher@v", nproc=1, end=END_B, warm_start="last", progress=False)
    b = _blob(paths, "teacher@v")
    key = "sparse.ebc.embedding_bags.t_ad_id.weight"
    r = max(b["hashing"]["ad_id"])  # the teacher's budget (the student's table_scale is smaller)
    old, new = a["hashing"]["ad_id"][r], b["hashing"]["ad_id"][r]
    np.testing.assert_array_equal(lookup(new, old["ids"]), lookup(old, old["ids"]))  # known ids keep their rows
    day3, _ = train_id_counts(cfg, table, DaySplits({"2026-01-03": "train"}), ["ad_id"])["ad_id"]
    fresh = np.setdiff1d(day3, old["ids"])
    assert len(fresh) > 0
    rows = lookup(new, fresh)
    assert rows.min() >= old["table_rows"] and len(np.unique(rows)) == len(fresh)  # free rows, one each
    assert new["table_rows"] == old["table_rows"] + len(fresh) == b["state_dict"][key].shape[0]
    # a known id absent from day 3 was not trained again: its row is the parent's, bit for bit
    idle = np.setdiff1d(old["ids"], day3)
    assert len(idle) > 0
    ra, rb = lookup(old, idle), lookup(new, idle)
    assert torch.equal(a["state_dict"][key][ra], b["state_dict"][key][rb])


def test_default_end_is_the_day_after_the_table_and_its_test_is_pending(setup) -> None:
    cfg, paths = setup
    summary = train(cfg, paths, model="teacher@d", nproc=1, progress=False)
    table = pd.read_parquet(paths.consolidated, columns=["date"])
    last = max(table["date"].astype(str))
    assert summary["lineage"]["window"]["validation"] == last
    assert summary["lineage"]["judged_on"] > last  # the day after the table: not in it yet
    metrics = json.loads((paths.model_dir("teacher@d") / "metrics.json").read_text())
    assert metrics["test_examples"] == 0 and (paths.model_dir("teacher@d") / "model.pt").exists()


def test_replay_adds_the_hashed_share_of_older_window_days(setup) -> None:
    from lattice.data.window import replay_fraction

    cfg, paths = setup
    replayed = cfg.model_copy(update={"training": cfg.training.model_copy(update={"replay": 0.5})})
    train(replayed, paths, model="teacher@r", nproc=1, end=END_A, progress=False)
    b = train(replayed, paths, model="teacher@r", nproc=1, end=END_B, warm_start="last", progress=False)
    # B's window trains on days 2-3; the parent trained on 1-2: day 3 is new, day 2 replayed at 50%
    assert b["lineage"]["trained_days"] == ["2026-01-03"] and b["lineage"]["replayed_days"] == ["2026-01-02"]
    table = pd.read_parquet(paths.consolidated, columns=["example_id", "date"])
    table["date"] = table["date"].astype(str)
    day2 = table[table.date == "2026-01-02"].example_id.tolist()
    # the default rotating replay: the hash salted with B's test day, the day after its window
    replayed = int((replay_fraction(day2, END_B) < 0.5).sum())
    assert b["history"][0]["examples"] == int((table.date == "2026-01-03").sum()) + replayed
    assert 0 < replayed < len(day2)


def test_the_student_is_distilled_warm_from_the_last_student_on_the_teachers_days(setup) -> None:
    """The daily chain's second half: after a warm-started teacher, `distill` trains the student on
    the teacher's window (its lineage's end) and continues the last student, whose lineage names it."""
    from lattice.distill.stages import distill

    cfg, paths = setup
    warm = cfg.model_copy(update={"training": cfg.training.model_copy(update={"warm_start": "last"})})
    train(cfg, paths, model="teacher", nproc=1, end=END_A, progress=False)
    distill(cfg, paths, nproc=1, export=False, register=False, progress=False)
    first = json.loads((paths.model_dir("student") / "lineage.json").read_text())
    assert first["parent"] is None and first["window"]["end"] == END_A
    first_sum = _blob(paths, "student")["state_dict"]

    train(warm, paths, model="teacher", nproc=1, end=END_B, progress=False)
    distill(warm, paths, nproc=1, export=False, register=False, progress=False)
    lin = json.loads((paths.model_dir("student") / "lineage.json").read_text())
    assert lin["window"]["end"] == END_B and lin["judged_on"] == "2026-01-05"  # the teacher's days, not its own guess
    assert lin["trained_days"] == ["2026-01-03"]  # only the day the last student has not seen
    assert lin["days_seen"] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert lin["parent"]["mode"] == "last" and len(lin["parent"]["checksum"]) == 64
    after = _blob(paths, "student")["state_dict"]
    moved = [k for k in first_sum if torch.is_tensor(first_sum[k]) and first_sum[k].dtype.is_floating_point
             and not torch.equal(first_sum[k], after[k])]
    assert moved  # it trained on: weights continued, not copied


def test_a_rule_started_retrain_trains_teacher_and_student_on_the_rest_of_the_tripped_day(setup) -> None:
    """monitoring.retrain_validation_share: a retrain a rule started holds out only a share of its
    window's newest day (the day the rule tripped on); the teacher trains on the rest of it, and
    the student, distilled after it, holds out the same rows (its teacher's lineage)."""
    from lattice.data.split import hash_fraction
    from lattice.distill.stages import distill

    cfg, paths = setup
    warm = cfg.model_copy(update={"training": cfg.training.model_copy(update={"warm_start": "last"})})
    train(cfg, paths, model="teacher", nproc=1, end=END_A, progress=False)
    distill(cfg, paths, nproc=1, export=False, register=False, progress=False)
    t = train(warm, paths, model="teacher", nproc=1, end=END_B, progress=False, validation_share=0.5)
    distill(warm, paths, nproc=1, export=False, register=False, progress=False)
    table = pd.read_parquet(paths.consolidated, columns=["example_id", "date"])
    table["date"] = table["date"].astype(str)
    day4 = table[table.date == "2026-01-04"].example_id.tolist()
    trained4 = int((hash_fraction(day4) >= 0.5).sum())
    assert 0 < trained4 < len(day4)
    # the new day 3 whole and the rest of day 4, the tripped day, which the config alone holds out whole
    assert t["lineage"]["trained_days"] == ["2026-01-03", "2026-01-04"]
    assert t["history"][0]["examples"] == int((table.date == "2026-01-03").sum()) + trained4
    for name in ("teacher", "student"):
        lin = json.loads((paths.model_dir(name) / "lineage.json").read_text())
        assert lin["splits"]["validation_share"] == 0.5 and lin["judged_on"] == END_B, name
        assert lin["trained_days"] == ["2026-01-03", "2026-01-04"], name
    student = json.loads((paths.model_dir("student") / "history.json").read_text())
    assert student["epochs"][0]["examples"] == t["history"][0]["examples"]  # the same rows as its teacher
    with pytest.raises(ValueError, match=r"validation_share 1.5: give a share in \(0, 1\]"):
        train(warm, paths, model="teacher@bad", nproc=1, end=END_B, progress=False, validation_share=1.5)


def test_refresh_every_sends_a_chain_of_warm_starts_back_to_scratch(setup) -> None:
    """training.refresh_every: warm starts continue until their chain began that many days before
    the run's interval end; that run trains from scratch on its whole window and starts a chain."""
    cfg, paths = setup
    warm = cfg.model_copy(update={"training": cfg.training.model_copy(update={"warm_start": "last", "refresh_every": "2d"})})
    lin = lambda: json.loads((paths.model_dir("teacher@r") / "lineage.json").read_text())  # noqa: E731
    shutil.rmtree(paths.model_dir("teacher@r"), ignore_errors=True)  # the tiny table's work dir outlives a session
    train(warm, paths, model="teacher@r", nproc=1, end=END_A, progress=False)  # no parent yet
    a = lin()
    assert (a["warm_start"], a["chain_started"], a["refreshed"]) == ("none", END_A, None)
    train(warm, paths, model="teacher@r", nproc=1, end=END_B, progress=False)  # one day on: continues
    b = lin()
    assert (b["warm_start"], b["chain_started"], b["refreshed"]) == ("last", END_A, None)
    assert b["trained_days"] == ["2026-01-03"]
    end_c = "2026-01-06"  # two days after the chain began: from scratch, on the whole window
    train(warm, paths, model="teacher@r", nproc=1, end=end_c, progress=False)
    c = lin()
    assert (c["warm_start"], c["parent"], c["chain_started"]) == ("none", None, end_c)
    assert c["refreshed"]["every"] == "2d" and c["refreshed"]["chain_started"] == END_A
    assert c["trained_days"] == ["2026-01-03", "2026-01-04"]  # a warm start would train 2026-01-04 alone
    assert c["days_seen"] == ["2026-01-03", "2026-01-04"]  # a new chain: the old days are not this model's
