"""A small client of Airflow's REST API v2 (JWT from /auth/token): unpause, trigger with params,
wait for a run. Used by tests and scripts that drive a running Airflow."""

from __future__ import annotations

import time
from typing import Any

import httpx

FINISHED = {"success", "failed"}


class AirflowClient:
    def __init__(self, base_url: str, username: str, password: str, timeout: float = 60.0):
        self.base_url = base_url.rstrip("/")
        resp = httpx.post(f"{self.base_url}/auth/token", json={"username": username, "password": password}, timeout=timeout)
        resp.raise_for_status()
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout,
                                 headers={"Authorization": f"Bearer {resp.json()['access_token']}"})

    def _ok(self, resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            raise RuntimeError(f"{resp.request.method} {resp.request.url.path} -> {resp.status_code}: {resp.text[:1000]}")
        return resp.json()

    def dag(self, dag_id: str) -> dict:
        return self._ok(self.http.get(f"/api/v2/dags/{dag_id}"))

    def wait_for_dag(self, dag_id: str, timeout: float = 120.0) -> dict:
        """DAG files are parsed in the background; wait until this one is known to the API."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                resp = self.http.get(f"/api/v2/dags/{dag_id}")
                if resp.status_code == 200:
                    return resp.json()
            except httpx.TransportError:
                pass  # busy, not gone
            if time.monotonic() > deadline:
                errors = self.http.get("/api/v2/importErrors").text[:2000]
                raise TimeoutError(f"DAG {dag_id} not parsed after {timeout:.0f}s; import errors: {errors}")
            time.sleep(2)

    def unpause(self, dag_id: str) -> dict:
        return self._ok(self.http.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False}))

    def trigger(self, dag_id: str, conf: dict | None = None) -> httpx.Response:
        """POST a run; the raw response, so callers can check refusals (invalid params -> 400)."""
        return self.http.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}})

    def run(self, dag_id: str, run_id: str) -> dict:
        return self._ok(self.http.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}"))

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self._ok(self.http.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances"))["task_instances"]

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 300.0) -> dict:
        deadline = time.monotonic() + timeout
        state = "unknown"
        while True:
            try:
                run = self.run(dag_id, run_id)
                state = run["state"]
                if state in FINISHED:
                    return run
            except httpx.TransportError:
                pass  # a busy API server answering slowly is not a failed run; ask again
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} of {dag_id} still {state} after {timeout:.0f}s")
            time.sleep(3)

    def close(self) -> None:
        self.http.close()
