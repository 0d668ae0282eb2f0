"""The registered champion through MLflow's public interface: `mlflow.pyfunc.load_model(
"models:/<name>@champion").predict(raw_rows)` gives the scores `lattice predict` gives the same
raw rows (the source's own columns), and a row that cannot be parsed comes back with its reason."""

from __future__ import annotations

import csv

import numpy as np
import pandas as pd
import pytest

from lattice.registry import ModelRegistry
from lattice.registry.stages import register
from test_distill import copy_workdir, trained_workdir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def champion(tmp_path_factory):
    from pipelines.feast_jobs import feast_apply, materialize

    config, _ = trained_workdir()
    paths = copy_workdir(tmp_path_factory.mktemp("pyfunc") / "wd")
    feast_apply(config, paths)
    materialize(config, paths)  # the online aggregates both paths join in
    reg = ModelRegistry(config, paths)
    reg.promote(reg.version(register(config, paths, "student")["version"]))  # the gate has its own tests
    return config, paths, reg


def test_pyfunc_of_the_champion_scores_raw_rows_like_lattice_predict(champion, tmp_path):
    import mlflow

    from lattice.scoring.batch import predict_file

    config, paths, reg = champion
    src = next(s for s in config.sources if s.name == "feed_log")
    raw_file = sorted(paths.source_path(src.path).parent.glob("*.csv"))[0]
    with open(raw_file, newline="") as fh:
        rows = list(csv.DictReader(fh))[:120]
    bad = dict(rows[0], ts="not-a-time")
    (tmp_path / "in").mkdir()
    with open(tmp_path / "in" / "feed.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([*rows, bad])
    summary = predict_file(config, paths, str(tmp_path / "in"), str(tmp_path / "scores.parquet"), model="champion")
    assert summary["rows_scored"] == 120 and summary["quarantined"] == 1
    want = pd.read_parquet(tmp_path / "scores.parquet").set_index("example_id")

    mlflow.set_registry_uri(reg.tracking_uri)
    mlflow.set_tracking_uri(reg.tracking_uri)
    model = mlflow.pyfunc.load_model(f"models:/{reg.base_name}@champion")
    got = model.predict(pd.DataFrame([*rows, bad]))  # the raw rows as strings, as a CSV reader gives them

    assert len(got) == 121  # rows in = rows out: the bad row comes back with its reason and no score
    rejected = got[got["quarantine_reason"].notna()]
    assert rejected["quarantine_reason"].tolist() == ["bad_timestamp"]
    assert rejected[[f"p_{o}" for o in config.objective_names]].isna().all().all()
    scored = got[got["quarantine_reason"].isna()].set_index("example_id")
    assert sorted(scored.index) == sorted(want.index)
    scored = scored.loc[want.index]
    assert (scored["domain"] == want["domain"]).all()
    assert (scored["unknown_entities"] == want["unknown_entities"]).all()
    for o in config.objective_names:
        # the same artifact on the same encoded rows in batches of the same size: only float32
        # summation order could differ, so far below any score difference that matters
        np.testing.assert_allclose(scored[f"p_{o}"].to_numpy(), want[f"p_{o}"].to_numpy(), atol=1e-6, rtol=0)
    assert want[f"p_{config.objective_names[0]}"].std() > 0  # the scores vary: equal scores are not constants

    # `params` reach the model (MLflow drops params a signature does not declare)
    with pytest.raises(Exception, match="unknown source 'no_such_log'"):
        model.predict(pd.DataFrame(rows[:3]), params={"source": "no_such_log"})
