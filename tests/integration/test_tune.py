"""`lattice tune`: an Optuna study on the validation split of a tiny table. Two trials of one
epoch write an overlay inside the space; a rerun continues the same study; instrumentation of
the loader shows no test row is ever read; a bad space key is refused with a message naming it."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from lattice.config import ConfigError, load_config
from lattice.config.schema import Tune, TuneRange

pytestmark = pytest.mark.slow

SPACE = {
    "training.lr_dense": TuneRange(low=1e-3, high=1e-2, log=True),
    "models.teacher.dropout": TuneRange(low=0.0, high=0.2),
    "models.teacher.embedding_dim": TuneRange(choices=[8, 16]),
}


@pytest.fixture(scope="module")
def setup(tiny_demo):
    cfg, paths = tiny_demo("tune", 2_000)
    cfg = cfg.model_copy(update={"tune": Tune(trials=2, epochs=1, space=SPACE)})
    cfg_file = paths.workdir / "config.yaml"
    cfg_file.parent.mkdir(parents=True, exist_ok=True)
    cfg_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return cfg, paths, cfg_file


@pytest.fixture()
def reads(monkeypatch):
    """Every split any loader selects rows of, and the example ids of every batch built."""
    import lattice.data.loader as loader

    seen = {"splits": [], "ids": set()}
    real_mask, real_batch = loader.split_mask, loader.to_batch

    def split_mask(config, ids, split, stored=None):
        seen["splits"].append(split)
        return real_mask(config, ids, split, stored)

    def to_batch(config, arrs):
        seen["ids"].update(map(str, arrs["example_id"]))
        return real_batch(config, arrs)

    monkeypatch.setattr(loader, "split_mask", split_mask)
    monkeypatch.setattr(loader, "to_batch", to_batch)
    return seen


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        out.update(_flat(v, key) if isinstance(v, dict) else {key: v})
    return out


def _in_space(key: str, value) -> bool:
    spec = SPACE[key]
    return value in spec.choices if spec.choices is not None else spec.low <= value <= spec.high


def test_tune_runs_resumes_and_never_reads_test_rows(setup, reads, capsys) -> None:
    import optuna
    from mlflow import MlflowClient

    from lattice.cli import main

    cfg, paths, cfg_file = setup
    args = ["tune", str(cfg_file), "--workdir", str(paths.workdir), "--nproc", "1"]
    assert main([*args, "--trials", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("[lattice] trial ") == 2 and "best so far" in out
    assert "validation macro NE" in out and "train with it: lattice train" in out

    folder = paths.tune_dir("teacher")
    best = json.loads((folder / "best.json").read_text())
    assert best["trials_total"] == 2 and best["trials_run"] == 2
    overlay = _flat(yaml.safe_load((folder / "overlay.yaml").read_text()))
    assert set(overlay) == set(SPACE)
    assert all(_in_space(k, v) for k, v in overlay.items()), overlay
    # the printed --set flags load (what `lattice train CONFIG --set ...` does) and set the chosen values
    tuned = load_config(cfg_file, best["sets"])
    assert tuned.training.lr_dense == pytest.approx(overlay["training.lr_dense"])
    assert tuned.models.teacher.embedding_dim == overlay["models.teacher.embedding_dim"]
    # trial folders are gone; the real teacher folder was never made
    assert not list(paths.models.glob("teacher*"))

    # a rerun continues the same study to 3 trials in total: one new trial
    assert main([*args, "--trials", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("[lattice] trial ") == 1
    study = optuna.load_study(study_name="teacher", storage=f"sqlite:///{folder / 'study.db'}")
    assert len([t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]) == 3
    assert json.loads((folder / "best.json").read_text())["trials_total"] == 3
    # and again at 3: nothing to run, the best is reported as before
    assert main([*args, "--trials", "3"]) == 0
    assert "[lattice] trial " not in capsys.readouterr().out

    # every trial is one finished MLflow run of the project's tracking store, with validation figures
    client = MlflowClient(tracking_uri=best["tracking_uri"])
    exp = client.get_experiment_by_name(best["mlflow_experiment"])
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}
    for r in runs:
        assert set(SPACE) <= set(r.data.params)
        assert "val_macro_ne" in r.data.metrics and any(k.startswith("val_ne/") for k in r.data.metrics)
        assert r.data.tags["lattice.split"] == "validation"

    # instrumentation: rows of train (dense stats, training) and validation were read, never of test
    assert "test" not in reads["splits"] and "all" not in reads["splits"]
    assert {"train", "validation"} <= set(reads["splits"])
    table = pd.concat(pd.read_parquet(p, columns=["example_id", "split"]) for p in paths.consolidated.rglob("*.parquet"))
    test_ids = set(table.loc[table["split"] == "test", "example_id"].astype(str))
    val_ids = set(table.loc[table["split"] == "validation", "example_id"].astype(str))
    assert test_ids and reads["ids"] and val_ids <= reads["ids"]
    assert not (reads["ids"] & test_ids), "lattice tune read test rows"


def test_a_bad_space_key_is_refused_naming_it(setup, tmp_path, capsys) -> None:
    from lattice.cli import main
    from lattice.tuning.stages import tune

    cfg, paths, _ = setup
    bad = cfg.model_copy(update={"tune": Tune(space={"training.lr_dence": TuneRange(low=1e-3, high=1e-2)})})
    with pytest.raises(ConfigError, match=r"tune\.space\.training\.lr_dence.*did you mean 'training\.lr_dense'"):
        tune(bad, paths, trials=1, nproc=1, progress=False)
    # from a file: the CLI names the file, the key and the fix, and trains nothing
    data = bad.model_dump(mode="json")
    data["tune"]["space"]["models.teacher.embedding_dim"] = {"choices": [2, 1000]}  # 1000 is fine; 2 < student's 4
    cfg_file = tmp_path / "bad.yaml"
    cfg_file.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SystemExit) as exited:  # the config loader refuses the file before anything runs
        main(["tune", str(cfg_file), "--workdir", str(tmp_path / "work"), "--trials", "1"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert f"{cfg_file}: tune.space.training.lr_dence" in err and "training.lr_dense" in err
    assert not (tmp_path / "work" / "tune").exists()
    # a key that resolves but whose choice breaks the config is named too
    data["tune"]["space"].pop("training.lr_dence")
    cfg_file.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["tune", str(cfg_file), "--workdir", str(tmp_path / "work"), "--trials", "1"]) == 1
    err = capsys.readouterr().err
    assert "tune.space.models.teacher.embedding_dim" in err and "student" in err
