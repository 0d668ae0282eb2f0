"""The paired bootstrap: its interval covers a known NE difference, is exactly [0, 0] for a model
against itself, and refuses two prediction sets on different rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lattice.config import load_config
from lattice.evaluation.compare import RowsDiffer, compare_models, paired_bootstrap
from lattice.evaluation.metrics import EPS, entropy

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo():
    return load_config(ROOT / "configs" / "demo.yaml")


def _blur(t: np.ndarray) -> np.ndarray:
    """Model B: the truth with its logit flattened (a known, modest loss of sharpness)."""
    z = np.log(t) - np.log1p(-t)
    return 1 / (1 + np.exp(-(0.7 * z - 0.6)))


def _truth(rng: np.random.Generator, n: int, o: str) -> np.ndarray:
    return 1 / (1 + np.exp(-rng.normal(-3.0 if o == "conversion" else -2.0, 0.9, n)))


def _frames(config, n: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Model A predicts the true probabilities, model B `_blur` of them; labels drawn from the truth."""
    rng = np.random.default_rng(seed)
    base = {"example_id": [f"x{seed}_{i}" for i in range(n)], "domain": rng.choice(config.domain_names, n)}
    a, b = dict(base), dict(base)
    for o in config.objective_names:
        t = _truth(rng, n, o)
        y = (rng.random(n) < t).astype(np.float32)
        mask = np.isin(base["domain"], [d for d, oo in config.cells() if oo == o]).astype(np.float32)
        for f, p in ((a, t), (b, _blur(t))):
            f[f"p_{o}"], f[f"label_{o}"], f[f"mask_{o}"] = p.astype(np.float32), y, mask
    return pd.DataFrame(a), pd.DataFrame(b)


def _expected_gap(o: str, n: int = 2_000_000) -> float:
    """The population NE(B) - NE(A) of one cell: expected log losses under the truth (no label
    noise), over a large sample of true probabilities."""
    t = _truth(np.random.default_rng(123), n, o)

    def loss(p: np.ndarray) -> float:
        q = np.clip(p, EPS, 1 - EPS)
        return float(np.mean(-(t * np.log(q) + (1 - t) * np.log1p(-q))))

    return (loss(_blur(t)) - loss(t)) / entropy(float(t.mean()))


def test_a_model_against_itself_is_exactly_zero(demo) -> None:
    a, _ = _frames(demo, 5000, seed=0)
    out = paired_bootstrap(demo, a, a.sample(frac=1.0, random_state=1))  # row order does not matter
    for cell, c in out["cells"].items():
        assert c["ne_diff"] == 0.0 and c["low"] == 0.0 and c["high"] == 0.0, cell
        assert c["verdict"] == "within noise"
    assert (out["macro"]["ne_diff"], out["macro"]["low"], out["macro"]["high"]) == (0.0, 0.0, 0.0)
    for o, v in out["by_objective"].items():
        assert (v["ne_diff"], v["low"], v["high"], v["verdict"]) == (0.0, 0.0, 0.0, "within noise"), o


def test_the_interval_covers_a_known_difference(demo) -> None:
    truth = {o: _expected_gap(o) for o in demo.objective_names}
    assert all(g > 0 for g in truth.values())  # B really is worse
    covered, total, verdicts = 0, 0, []
    for rep in range(30):
        a, b = _frames(demo, 6000, seed=100 + rep)
        out = paired_bootstrap(demo, a, b, resamples=200, seed=rep)
        for cell, c in out["cells"].items():
            total += 1
            covered += c["low"] <= truth[cell.split("/")[1]] <= c["high"]
            verdicts.append(c["verdict"])
        macro_truth = float(np.mean([truth[c.split("/")[1]] for c in out["cells"]]))
        total += 1
        covered += out["macro"]["low"] <= macro_truth <= out["macro"]["high"]
        for o, v in out["by_objective"].items():  # every cell of an objective shares its true gap
            total += 1
            covered += v["low"] <= truth[o] <= v["high"]
            mine = [out["cells"][c]["ne_diff"] for c in out["cells"] if c.endswith("/" + o)]
            assert v["ne_diff"] == pytest.approx(np.mean(mine)), o
    assert covered / total >= 0.88, f"95% intervals covered the known difference {covered}/{total} times"
    assert set(verdicts) <= {"A better", "within noise"}  # never the wrong way round
    assert verdicts.count("A better") > len(verdicts) // 2


def test_a_large_sample_tells_the_models_apart(demo) -> None:
    a, b = _frames(demo, 60_000, seed=7)
    out = paired_bootstrap(demo, a, b)
    assert out["macro"]["verdict"] == "A better" and out["macro"]["low"] > 0
    swapped = paired_bootstrap(demo, b, a)
    assert swapped["macro"]["verdict"] == "B better"
    assert swapped["macro"]["ne_diff"] == pytest.approx(-out["macro"]["ne_diff"])


def test_different_rows_are_refused(demo) -> None:
    a, b = _frames(demo, 1000, seed=3)
    with pytest.raises(RowsDiffer, match="same test rows: 10 rows only in A"):
        paired_bootstrap(demo, a, b.iloc[10:])
    pairs = compare_models(demo, {"one": a, "two": b.iloc[10:], "three": b})
    assert [(p["a"], p["b"]) for p in pairs] == [("one", "two"), ("one", "three"), ("two", "three")]
    assert "error" in pairs[0] and "error" not in pairs[1] and "error" in pairs[2]
    relabeled = b.copy()
    relabeled["label_click"] = 1 - relabeled["label_click"]
    with pytest.raises(RowsDiffer, match="labels or masks"):
        paired_bootstrap(demo, a, relabeled)


def test_evaluate_and_the_demo_report_show_every_pair(demo, tmp_path) -> None:
    import json

    from lattice.demo.report import render_html
    from lattice.evaluation.metrics import cell_metrics
    from lattice.evaluation.report import comparison_lines
    from lattice.evaluation.stages import evaluate
    from lattice.paths import Paths

    paths = Paths.for_config(demo, tmp_path)
    a, b = _frames(demo, 4000, seed=11)
    for name, df in (("teacher", a), ("student", b), ("pooled", a)):
        d = paths.model_dir(name)
        d.mkdir(parents=True)
        df.to_parquet(d / "predictions.parquet", index=False)
        (d / "metrics.json").write_text(json.dumps(cell_metrics(demo, df)))
    out = evaluate(demo, paths, ["teacher", "student", "pooled"])
    report = json.loads(Path(out["report"]).read_text())
    pairs = {(c["a"], c["b"]): c for c in report["comparisons"]}
    assert set(pairs) == {("teacher", "student"), ("teacher", "pooled"), ("student", "pooled")}
    assert pairs[("teacher", "pooled")]["macro"]["verdict"] == "within noise"
    assert pairs[("teacher", "pooled")]["macro"]["low"] == pairs[("teacher", "pooled")]["macro"]["high"] == 0.0
    assert any("student - teacher: macro NE +" in line for line in comparison_lines(out["comparisons"]))
    page = render_html({"models": {}, "comparisons": report["comparisons"]})
    assert "paired bootstrap 95% interval" in page and "student vs teacher" in page
