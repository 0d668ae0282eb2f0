"""Finding 8 of issue 37: `lattice serve --host 0.0.0.0` with the default config listened on every
interface and answered /predict without credentials, with no warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from lattice.cli import main
from lattice.cli.serve_cmd import exposure_error, is_loopback

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("host,loopback", [("127.0.0.1", True), ("127.0.0.5", True), ("localhost", True), ("::1", True),
                                           ("[::1]", True), ("0.0.0.0", False), ("::", False), ("10.1.2.3", False),
                                           ("serving.internal", False)])
def test_loopback_is_recognised(host, loopback):
    assert is_loopback(host) is loopback


def test_beyond_loopback_needs_a_token_or_insecure():
    assert exposure_error("127.0.0.1", None, False) is None
    assert exposure_error("0.0.0.0", "LATTICE_TOKEN", False) is None
    assert exposure_error("0.0.0.0", None, True) is None
    err = exposure_error("0.0.0.0", None, False)
    assert "serving.auth_token_env" in err and "--insecure" in err


def test_serve_on_all_interfaces_without_a_token_refuses_before_binding(capsys, monkeypatch):
    import uvicorn

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: started.append(k))
    assert main(["serve", str(ROOT / "configs" / "demo.yaml"), "--host", "0.0.0.0"]) == 1
    assert "no token is configured" in capsys.readouterr().err and not started


def test_insecure_starts_and_says_so(capsys, monkeypatch, tmp_path):
    import uvicorn

    import lattice.serving.app as app

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda target, **k: started.append(k))
    monkeypatch.setattr(app, "create_app", lambda *a, **k: object())  # no registry needed to check the bind rule
    assert main(["serve", str(ROOT / "configs" / "demo.yaml"), "--workdir", str(tmp_path), "--host", "0.0.0.0",
                 "--insecure"]) == 0
    assert [k["host"] for k in started] == ["0.0.0.0"]
    assert "WARNING: --insecure" in capsys.readouterr().err
