"""The README's main command, end to end at a tiny size: `lattice demo` must produce a report with
every stage, reconciled counts, metrics for every (model, cell), a promotion decision with
reasons, a serving check that matches offline scores, and an HTML page a browser renders."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# the pipeline graph's steps (the DAGs' tasks, in their order), then the demo's serving check
STAGES = ["synthesize_raw_logs", "consolidate", "aggregates", "feast_apply", "training_set", "materialize",
          "fit_trees", "train_teacher", "evaluate_teacher", "register_teacher", "train_separate", "train_pooled", "train_mmoe",
          "train_gbdt", "train_gbdt_cell", "evaluate_vs_trees", "distill_student", "export_student", "register_student",
          "gate", "promote_challenger", "refresh_report"]
# each daily round after the first window: the new day's feature steps, the teacher (its baselines
# train once), the student, the gate (lattice.demo.life); then the serving check
ROUND = ["synthesize_raw_logs", "consolidate", "aggregates", "feast_apply", "training_set", "materialize",
         "fit_trees", "train_teacher", "evaluate_teacher", "register_teacher", "distill_student", "export_student", "register_student",
         "gate", "promote_challenger", "refresh_report"]
STAGES = STAGES + [f"day{i}.{s}" for i in (1, 2) for s in ROUND] + ["serve"]


def _tiny_demo_config(folder: Path) -> Path:
    """The demo config with smaller tables and gate floors loose enough for 8,000 rows, whose cells
    hold only tens of positives (the gate's logic has its own tests)."""
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["synthetic"].update(users=3000, ads=600, chunk_rows=4000)
    for f in cfg["features"]["sparse"]:
        f["num_embeddings"] = min(f["num_embeddings"], 5000)
    cfg["training"].update(batch_size=256)
    # one short epoch on 8,000 rows barely beats the base rate: the floors only keep the gate honest
    cfg["promotion"] = {"max_ne_regression": 0.2, "calibration": [0.2, 5.0], "teacher_epsilon": 0.5,
                        "max_latency_ms": 1000, "max_artifact_mb": 200, "floors": {"max_ne": 1.5, "min_auc": 0.4}}
    path = folder / "demo_tiny.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("demo")
    config = _tiny_demo_config(tmp_path_factory.mktemp("cfg"))
    cmd = [sys.executable, "-m", "lattice.cli", "demo", "--config", str(config), "--workdir", str(wd), "--rows", "8000",
           "--epochs", "1", "--requests", "40", "--quiet"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=2400)
    report = json.loads((wd / "report.json").read_text()) if (wd / "report.json").exists() else {}
    return wd, res, report


def test_demo_exits_zero_and_reports_every_stage(demo_run):
    wd, res, report = demo_run
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert report["status"] == "ok"
    assert [t["stage"] for t in report["timings"]] == STAGES
    assert all(t["status"] == "ok" and t["seconds"] > 0 for t in report["timings"])
    assert report["header"]["machine"]["cpus"] >= 1
    assert "Headline" in res.stdout


def test_demo_counts_reconcile(demo_run):
    _, _, report = demo_run
    rec = report["pipeline"]["reconciliation"]
    assert set(rec) >= {"feed", "search", "video"}
    for domain, r in rec.items():
        assert r["in"] == r["out"] + r["quarantined"] + r["skipped"], (domain, r)
    assert sum(r["in"] for r in rec.values()) == 8000


def test_demo_metrics_for_every_cell_and_model(demo_run):
    _, _, report = demo_run
    cells = {"feed/click", "search/click", "video/click", "feed/conversion", "search/conversion"}
    for model in ["teacher", "student", "separate", "pooled", "mmoe", "gbdt", "gbdt_cell"]:
        got = report["models"][model]["cells"]
        assert set(got) == cells, model
        for cell, m in got.items():
            assert 0 < m["ne"] < 2 and 0 <= m["auc"] <= 1, (model, cell, m)
    assert set(report["oracle"]["cells"]) == cells
    assert set(report["headline"]) >= {"teacher", "student", "oracle"}
    # every deep model beside the trees, cell by cell
    assert set(report["vs_trees"]["cells"]) == cells and report["vs_trees"]["summary"]["teacher"]["cells"] == len(cells)


def test_demo_promotion_decision_and_serving(demo_run):
    _, _, report = demo_run
    promo = report["promotion"]
    # a fresh workdir has no champion, so the gate holds the student to the first model's floors
    # (loosened above for 8,000 rows): it must pass them and become champion v1
    assert promo["champion_before"] is None, promo
    assert promo["decision"] == "promote", [r["message"] for r in promo["reasons"] if not r["passed"]]
    assert promo["champion_after"] == promo["challenger_version"]
    assert promo["reasons"] and all(r["passed"] and r["message"] for r in promo["reasons"])
    serving = report["serving"]
    assert serving["requests"] == 40 and serving["failed"] == 0
    assert serving["matches_offline"], serving


def test_demo_lives_two_days_warm_started_and_judged_on_the_next_day(demo_run):
    _, _, report = demo_run
    days = report["days"]
    assert days["window"] == "11d"
    first, *later = days["rounds"]
    assert [r["test_day"] for r in days["rounds"]] == ["2026-01-12", "2026-01-13", "2026-01-14"]
    assert first["warm_start"] == "none" and len(first["trained_days"]) == 10
    # each round trains on the one day its parent had not seen (yesterday's validation day) and is
    # judged by the gate on the day after its window, the newest day in the table
    for prev, r in zip(days["rounds"], later):
        assert r["warm_start"] == "last" and r["parent_days_seen"] == prev["days_seen"]
        assert r["trained_days"] == [(dt.date.fromisoformat(prev["test_day"]) - dt.timedelta(days=1)).isoformat()]
        assert r["days_seen"] == prev["days_seen"] + 1
        assert r["judged_on"] == r["test_day"] and 0 < r["teacher_examples"] < first["teacher_examples"] / 3
        assert r["champion_before"] == prev["champion_after"] is not None
        assert r["decision"] == ("promote" if r["passed"] else "reject")
        assert r["champion_after"] == (r["challenger_version"] if r["passed"] else r["champion_before"])
        assert {k.split(".")[1] for k in r["series"]} == {"challenger", "champion"}


def test_demo_html_renders_in_chromium(demo_run, artifacts):
    wd, _, _ = demo_run
    html = (wd / "report.html").read_text()
    assert html.count("<img") >= 3 and "Promotion decision" in html and "Deep models vs gradient-boosted trees" in html
    chromium = "/usr/bin/chromium"
    if not os.path.exists(chromium):
        pytest.fail("Debian chromium is required for this test; run `bash infra/setup.sh`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto((wd / "report.html").as_uri())
        assert "Lattice demo report" in page.title()
        assert page.locator("img").count() >= 3
        widths = page.eval_on_selector_all("img", "els => els.map(e => e.naturalWidth)")
        assert all(w > 100 for w in widths), widths  # every plot decoded
        page.screenshot(path=str(artifacts / "demo_report.png"), full_page=True)
        browser.close()
