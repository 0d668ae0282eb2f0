"""The calibration stage: every map is monotone, it is fitted on validation rows only, and the
trainer's test predictions, the eagerly rebuilt model and the TorchScript artifact apply the same
map to the same logits."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lattice.config import load_config
from lattice.data.batch import kjt_from_ids
from lattice.models import build_model
from lattice.models.calibrated import Calibrated, CellCalibration
from lattice.training import calibration as C
from lattice.training.tiny import tiny
from tolerances import assert_same_kernels_close

ROOT = Path(__file__).resolve().parents[2]
FITTED = ("platt", "isotonic", "histogram")


@pytest.fixture(scope="module")
def demo():
    return load_config(ROOT / "configs" / "demo.yaml")


def _validation_frame(config, n: int, seed: int, scale: float = 0.6, shift: float = 0.5) -> pd.DataFrame:
    """Rows whose raw logits are over-spread (x 1/scale) and shifted against the truth, so every
    cell needs a real correction; a few tied logits too."""
    rng = np.random.default_rng(seed)
    domains = rng.choice(config.domain_names, n)
    f = {"example_id": [f"e{i}" for i in range(n)], "domain": domains}
    for o in config.objective_names:
        truth = rng.normal(-3.0 if o == "conversion" else -2.0, 1.0, n)
        y = (rng.random(n) < 1 / (1 + np.exp(-truth))).astype(np.float32)
        z = ((truth - shift) / scale).astype(np.float32)
        z[: n // 50] = np.round(z[: n // 50])  # ties
        f[f"z_{o}"], f[f"label_{o}"], f[f"mask_{o}"] = z, y, np.ones(n, np.float32)
    return pd.DataFrame(f)


@pytest.mark.parametrize("method", FITTED)
@pytest.mark.parametrize("n", [300, 20_000])
def test_maps_are_monotone_in_every_cell(demo, method, n) -> None:
    maps = C.fit_maps(demo, _validation_frame(demo, n, seed=n), method, min_positives=0)
    stage = CellCalibration(maps)
    grid = torch.linspace(-25, 25, 4001)
    for cell, m in maps["cells"].items():
        assert np.all(np.diff(m["x"]) > 0) and np.all(np.diff(m["y"]) >= 0), cell
        assert m["lo"] > 0 and m["hi"] > 0, cell
    for i, _ in enumerate(demo.domain_names):
        out = stage({o: grid for o in demo.objective_names}, torch.full((len(grid),), i, dtype=torch.int64))
        for o, v in out.items():
            assert torch.isfinite(v).all()
            assert (v[1:] >= v[:-1]).all(), f"{method} {demo.domain_names[i]}/{o} not monotone"


@pytest.mark.parametrize("method", FITTED)
def test_a_fitted_map_corrects_the_validation_level(demo, method) -> None:
    frame = _validation_frame(demo, 60_000, seed=1)
    maps = C.fit_maps(demo, frame, method, min_positives=200)
    before = C.calibrated_probabilities(demo, frame, None)
    after = C.calibrated_probabilities(demo, frame, CellCalibration(maps))
    effect = C.effect(demo, frame, before, after)
    for cell, e in effect.items():
        assert not 0.95 <= e["before"]["calibration"] <= 1.05, cell  # the constructed rows are off
        assert 0.97 <= e["after"]["calibration"] <= 1.03, (cell, e["after"])
        assert e["after"]["ece"] < e["before"]["ece"], cell
        if method == "platt":  # an increasing line keeps every order (up to float32 ties)
            assert e["after"]["auc"] == pytest.approx(e["before"]["auc"], abs=1e-6)


def test_small_cells_fall_back_to_platt_or_identity(demo) -> None:
    frame = _validation_frame(demo, 3000, seed=2)
    sel = (frame["domain"] == "feed").to_numpy()
    frame.loc[sel, "label_conversion"] = 0.0  # a cell without positives
    maps = C.fit_maps(demo, frame, "isotonic", min_positives=200)
    assert maps["cells"]["feed/conversion"]["method"] == "identity"
    small = [c for c, m in maps["cells"].items() if 0 < m["positives"] < 200]
    assert small and all(maps["cells"][c]["method"] == "platt" for c in small)
    # the prior pulls a cell with a handful of positives toward the identity
    few = frame[frame["domain"] == "video"].head(60)
    z, y = few["z_click"].to_numpy(), few["label_click"].to_numpy()
    assert 0 < y.sum() < 15
    shrunk, free = C.fit_platt(z, y), C.fit_platt(z, y, prior=0.0)
    zbar = float(z.mean())
    assert abs(shrunk[0] - 1) < abs(free[0] - 1)
    assert abs(shrunk[0] * zbar + shrunk[1] - zbar) < abs(free[0] * zbar + free[1] - zbar)


def _batch(config, n: int, n_dense: int, seed: int):
    rng = np.random.default_rng(seed)
    names = [f.name for f in config.features.sparse]
    kjt = kjt_from_ids(names, [rng.integers(0, 50, n) for _ in names], [rng.random(n) < 0.9 for _ in names])
    return torch.as_tensor(rng.normal(size=(n, n_dense)), dtype=torch.float32), kjt, torch.as_tensor(
        rng.integers(0, len(config.domain_names), n))


def test_eager_model_and_scripted_artifact_give_the_same_calibrated_outputs(demo) -> None:
    from lattice.export.serving_module import script

    cfg = tiny(demo)
    torch.manual_seed(0)
    net = build_model(cfg, "teacher", 4).eval()
    maps = C.fit_maps(cfg, _validation_frame(cfg, 8000, seed=3), "isotonic", min_positives=100)
    model = Calibrated(net, CellCalibration(maps)).eval()
    scripted = script(model)
    dense, kjt, domain = _batch(cfg, 300, 4, seed=4)
    with torch.no_grad():
        eager = {o: torch.sigmoid(v) for o, v in model(dense, kjt, domain).items()}
        raw = {o: torch.sigmoid(v) for o, v in net(dense, kjt, domain).items()}
        served = scripted(dense, kjt, domain)
    for o in cfg.objective_names:
        # the artifact pools its tables with aten's embedding_bag, the eager model with fbgemm's
        # TBE kernel: float32 sums in another order (tests/tolerances.py)
        assert_same_kernels_close(served[o], eager[o], o)
        assert not torch.allclose(eager[o], raw[o])  # the stage really acts
    # the map travels inside the artifact: saved and loaded, it still answers the same
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    again = loaded(dense, kjt, domain)
    for o in cfg.objective_names:
        # the same TorchScript graph and weights, saved and loaded: the same ops on this machine
        assert torch.equal(again[o], served[o]), o


# ---------------------------------------------------------------- the trainer's calibration step

@pytest.fixture(scope="module")
def trained(tmp_path_factory, demo):
    """A tiny teacher trained in-process, with the calibration fit instrumented."""
    from lattice.data.local_table import write_local_table
    from lattice.data.synth import generate
    from lattice.paths import Paths
    from lattice.training.stages import train

    base = tmp_path_factory.mktemp("calibration")
    cfg = tiny(demo, data_root=str(base / "raw"))
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"calibration": "isotonic",
                                                                             "calibration_min_positives": 30})})
    generate(cfg, 8000, base / "raw", progress=False)
    paths = Paths.for_config(cfg, base / "work")
    write_local_table(cfg, paths)
    seen: list[pd.DataFrame] = []
    real = C.fit_maps

    def spy(config, frame, method, min_positives=0):
        seen.append(frame.copy())
        return real(config, frame, method, min_positives)

    mp = pytest.MonkeyPatch()
    mp.setattr(C, "fit_maps", spy)
    try:
        train(cfg, paths, model="teacher", nproc=1, epochs=1, progress=False)
    finally:
        mp.undo()
    return cfg, paths, seen


def test_calibration_is_fitted_on_validation_rows_only(trained) -> None:
    from lattice.data.loader import find_table

    cfg, paths, seen = trained
    assert len(seen) == 1
    table = pd.read_parquet(find_table(paths), columns=["example_id", "split"])
    splits = table.set_index("example_id")["split"]
    fitted_on = splits.loc[seen[0]["example_id"]]
    assert set(fitted_on) == {"validation"}
    assert len(fitted_on) == int((table["split"] == "validation").sum())  # all of them, once


def test_trainer_predictions_equal_the_saved_model_and_metrics_record_before_after(trained) -> None:
    from lattice.data.loader import BatchLoader, find_table
    from lattice.evaluation.stages import load_model, predict

    cfg, paths, _ = trained
    folder = paths.model_dir("teacher")
    preds = pd.read_parquet(folder / "predictions.parquet").set_index("example_id")
    model = load_model(cfg, paths, "teacher")
    assert isinstance(model, Calibrated)
    got = []
    for b in BatchLoader(cfg, find_table(paths), model.dense_stats, "test", shuffle=False, num_workers=0):
        p = predict(model, b)
        got.append(pd.DataFrame({"example_id": b.example_ids, **{o: v.numpy() for o, v in p.items()}}))
    single = pd.concat(got).set_index("example_id")
    for o in cfg.objective_names:
        np.testing.assert_allclose(single[o].to_numpy(), preds.loc[single.index, f"p_{o}"].to_numpy(), rtol=1e-5, atol=1e-7)
    metrics = json.loads((folder / "metrics.json").read_text())
    cal = metrics["calibration"]
    # the per-cell choice: a kept map acts on its cell, a dropped one leaves the raw probabilities
    # (passed through, the same float32 values)
    for cell, c in cal["cells"].items():
        d, o = cell.split("/")
        rows = (preds["domain"] == d).to_numpy()
        same = preds.loc[rows, f"raw_p_{o}"].to_numpy() == preds.loc[rows, f"p_{o}"].to_numpy()
        acts = c["choice"]["kept"] and c["fit"] != "identity"  # identity: a cell without positives or negatives
        assert acts == (not same.all()), (cell, c["fit"], c["choice"])
    assert cal["choice"] == "validated" and cal["kept"]
    assert cal["method"] == "isotonic" and set(cal["cells"]) == {f"{d}/{o}" for d, o in cfg.cells()}
    for cell, c in cal["cells"].items():
        assert {"before", "after"} <= set(c["test"]) and {"calibration", "ece", "ne"} <= set(c["test"]["after"])
        assert c["test"]["after"]["calibration"] == pytest.approx(metrics["cells"][cell]["calibration"], nan_ok=True)
