"""A real `airflow standalone` (scheduler, dag-processor, api-server, triggerer; SQLite +
LocalExecutor) on 127.0.0.1 at a free port, started once for this module: the features DAG is
triggered through REST API v2 with a param, and a headless Chromium (Debian's, via Playwright)
logs in to the UI, opens a DAG, triggers it with a parameter through the form and watches the
run succeed; screenshots go to test-artifacts/."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml

from lattice.orchestration import standalone
from lattice.orchestration.airflow_env import free_port
from lattice.orchestration.rest import AirflowClient
from tiny_dags import write_tiny_config

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
FEATURE_STAGES = ["synth", "consolidate", "aggregates", "feast_apply", "training_set", "materialize"]
ROWS = 6000
REJECTED = {"passed": False, "decision": "reject", "challenger_version": 2, "champion_before": 1,
            "champion_after": 1, "dry_run": False, "gate_run_id": "run-1",
            "reasons": [{"passed": True, "message": "artifact parity 1e-7 <= 1e-4"},
                        {"passed": False, "message": "feed/click NE 0.912 regresses the champion's 0.880 by more than 0.01"}]}

pytestmark = pytest.mark.slow


def _missing(names: list[str]) -> list[str]:
    from lattice import stages

    return [n for n in names if n not in stages.STAGES]


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, artifacts: Path):
    """One standalone for the module; its log is kept as an artifact, and it is always stopped."""
    tmp = tmp_path_factory.mktemp("airflow-standalone")
    cfg = write_tiny_config(ROOT / "configs" / "demo.yaml", tmp / "configs", data_root=tmp / "raw", workdir=tmp / "work",
                            name="tiny")
    data = yaml.safe_load(cfg.read_text())
    # manual runs only: an unpaused DAG must not start a scheduled or asset-triggered run of its own
    data["schedules"] = {f: {} for f in ("features", "train_teacher", "distill", "promote")}
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    # a second config with a typo: an import error in the banner, and tiny's DAGs unaffected
    (tmp / "configs" / "broken.yaml").write_text(cfg.read_text().replace("name: tiny", "name: broken")
                                                 .replace("epochs:", "epoch:"))
    # the promote stage answers with a rejection (a real one needs a trained champion and challenger):
    # every Airflow process of this standalone imports sitecustomize at start, and tasks fork from them
    fake = tmp / "fake_stages"
    fake.mkdir()
    (fake / "lattice_fake_promote.py").write_text(
        "REJECTED = " + repr(REJECTED) + "\n\ndef gate(config, paths, dry_run=False):\n    return dict(REJECTED)\n")
    (fake / "sitecustomize.py").write_text(
        "import lattice.stages\nlattice.stages.STAGES['gate'] = 'lattice_fake_promote:gate'\n"
        "lattice.stages.STAGES['apply_gate'] = 'lattice_fake_promote:gate'\n")
    sa = standalone.start(tmp / "home", port=free_port(), configs_dir=tmp / "configs",
                          extra_env={"LATTICE_AIRFLOW_RETRIES": "0", "PYTHONPATH": str(fake)})
    try:
        standalone.wait_ready(sa, timeout=300)
        user, password = sa.credentials()
        client = AirflowClient(sa.url, user, password)
        client.wait_for_dag("tiny__features", timeout=180)
        yield sa, client, tmp
        client.close()
    finally:
        standalone.stop(tmp / "home")
        shutil.copy(sa.log_file, artifacts / "airflow_standalone.log")


def _task_states(client: AirflowClient, dag_id: str, run_id: str) -> dict[str, str]:
    return {t["task_id"]: t["state"] for t in client.task_instances(dag_id, run_id)}


@pytest.fixture(scope="module")
def features_run(airflow):
    """The features DAG triggered through REST v2 with a param (shared by the tests below)."""
    sa, client, tmp = airflow
    missing = _missing(FEATURE_STAGES)
    assert not missing, f"stages the features DAG runs are not registered in lattice/stages.py: {missing}"
    resp = client.trigger("tiny__features", {"synthetic_rows": ROWS, "domains": ["feed", "search", "video"]})
    assert resp.status_code == 200, resp.text
    client.unpause("tiny__features")
    run = client.wait_run("tiny__features", resp.json()["dag_run_id"], timeout=1800)
    return run, _task_states(client, "tiny__features", run["dag_run_id"])


def test_rest_refuses_invalid_params_with_a_message(airflow) -> None:
    _, client, _ = airflow
    resp = client.trigger("tiny__features", {"domains": ["tv"]})
    assert resp.status_code == 400
    assert "'tv' is not one of ['feed', 'search', 'video']" in resp.json()["detail"]
    resp = client.trigger("tiny__train_teacher", {"epochs": 0})
    assert resp.status_code == 400 and "minimum" in resp.json()["detail"]


def test_an_invalid_config_shows_in_the_import_errors_and_hides_no_other_dag(airflow) -> None:
    _, client, tmp = airflow
    broken = str(tmp / "configs" / "broken.yaml")
    deadline = time.monotonic() + 120
    while True:
        errors = client.http.get("/api/v2/importErrors").json()["import_errors"]
        if errors or time.monotonic() > deadline:
            break
        time.sleep(3)
    [error] = errors
    assert error["filename"].endswith("lattice_config_errors.py")
    assert broken in error["stack_trace"] and "unknown key 'epoch'; did you mean 'epochs'?" in error["stack_trace"]
    assert f"Fix: edit {broken}" in error["stack_trace"]
    # Airflow marks every DAG of a file with an import error stale: tiny's DAGs are in another file
    dag = client.dag("tiny__features")
    assert dag["is_stale"] is False and dag["has_import_errors"] is False
    assert client.http.get("/api/v2/dags/broken__features").status_code == 404


def test_a_rejected_promotion_is_a_decision_not_a_failure_in_the_rest_api(airflow) -> None:
    """A rejection is its own state: the gate task succeeds with the whole decision as its XCom,
    `promote_challenger` is skipped with each failed check in its log (not failed, not retried),
    and the report refresh after it is skipped (the champion stays)."""
    _, client, _ = airflow
    resp = client.trigger("tiny__promote", {"dry_run": False})
    assert resp.status_code == 200, resp.text
    client.unpause("tiny__promote")
    run_id = resp.json()["dag_run_id"]
    client.wait_run("tiny__promote", run_id, timeout=600)
    tis = {t["task_id"]: t for t in client.task_instances("tiny__promote", run_id)}
    assert {k: t["state"] for k, t in tis.items()} == {"gate": "success", "promote_challenger": "skipped",
                                                       "refresh_report": "skipped"}
    base = f"/api/v2/dags/tiny__promote/dagRuns/{run_id}/taskInstances"
    xcom = client.http.get(f"{base}/gate/xcomEntries/return_value").json()
    value = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert value["summary"]["reasons"] == REJECTED["reasons"]
    log = client.http.get(f"{base}/promote_challenger/logs/1", params={"full_content": "true"}).text
    assert "REJECTED challenger v2" in log and "regresses the champion's 0.880" in log


def test_rest_trigger_of_the_features_dag_succeeds(airflow, features_run) -> None:
    _, client, tmp = airflow
    run, states = features_run
    assert run["state"] == "success", states
    assert run["conf"]["synthetic_rows"] == ROWS
    assert states == {"synthesize_raw_logs": "success", "consolidate_to_materialize": "success"}
    # the param reached the stage: the synthetic step wrote exactly that many rows
    assert json.loads((tmp / "raw" / "manifest.json").read_text())["rows"] == ROWS
    events = client.http.get("/api/v2/assets/events", params={"source_dag_id": "tiny__features"}).json()
    assert events["total_entries"] >= 1


# library start-up chatter that must never reach a task log (Spark's JVM, Hadoop, GX, torch)
NOISE = ("Skipping registering function", "NativeCodeLoader", "Setting default log level", "Successfully loaded")


def test_the_spark_tasks_log_has_no_error_line_and_no_library_chatter(airflow, features_run) -> None:
    """A Spark task that succeeds leaves no ERROR line in its Airflow log. The task supervisor
    files every line the task process (and the JVM it starts) writes on stderr at ERROR, so this
    also says that stderr stayed empty; read through REST as the UI reads it."""
    _, client, _ = airflow
    run, _ = features_run
    url = (f"/api/v2/dags/tiny__features/dagRuns/{run['dag_run_id']}/taskInstances/consolidate_to_materialize/logs/1")
    resp = client.http.get(url, params={"full_content": "true"}, headers={"Accept": "application/json"})
    assert resp.status_code == 200, resp.text
    entries = resp.json()["content"]
    assert entries and all(isinstance(e, dict) and "event" in e for e in entries), entries[:3]
    errors = [e for e in entries if str(e.get("level", "")).lower() in ("error", "critical")]
    assert errors == [], errors[:5]
    events = [str(e["event"]) for e in entries]
    assert [x for x in events if any(n in x for n in NOISE)] == []
    assert not any("\r" in x for x in events)  # no console progress bar
    # the story ends with each step's summary, and they are there
    for step in ("consolidate", "materialize"):
        assert any(f"stage {step} finished" in x for x in events), events[-10:]


def test_browser_login_trigger_with_param_and_watch_success(airflow, artifacts: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    sa, client, _ = airflow
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: install Debian's chromium (bash infra/setup.sh installs it)")
    # the promote DAG (its gate answers at once here) with its Dry run switch turned on: the form's
    # value differs from the param's default, so the run's conf shows the form was read. Training
    # through the UI proved nothing more than test_dags_run does, at three minutes a CI run.
    dag_id, field = "tiny__promote", "dry_run"
    user, password = sa.credentials()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(sa.url + "/")
            page.fill("input[name=username]", user)
            page.fill("input[name=password]", password)
            page.click("button[type=submit]")
            page.wait_for_url(re.compile(r"^(?!.*/auth/login).*$"), timeout=60_000)
            page.goto(f"{sa.url}/dags/{dag_id}")
            page.get_by_role("button", name="Trigger Dag").click()
            dialog = page.get_by_role("dialog")
            expect(dialog.get_by_text("Run Parameters")).to_be_visible(timeout=30_000)
            switch = dialog.locator(f"input[name=element_{field}]")
            assert not switch.is_checked()
            dialog.locator(f"label:has(input[name=element_{field}])").last.click()  # Chakra's switch: the input is hidden in its label
            expect(switch).to_be_checked()
            dialog.get_by_role("button", name="Trigger", exact=True).click()
            page.wait_for_url(re.compile(rf"/dags/{dag_id}/runs/.+"), timeout=60_000)
            run_id = unquote(page.url.split("/runs/")[1].split("?")[0])
            run = client.wait_run(dag_id, run_id, timeout=1800)
            page.reload()
            assert run["state"] == "success", _task_states(client, dag_id, run_id)
            expect(page.get_by_text("Success").first).to_be_visible(timeout=60_000)  # the run's badge in the UI
            page.screenshot(path=str(artifacts / "airflow_ui_run_success.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(artifacts / "airflow_ui_failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    assert run["conf"][field] is True  # the form's value is the run's param (its default is False)
