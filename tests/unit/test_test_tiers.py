"""The fast tier (`pytest -m "not slow"`) leaves out every test that starts a real service: the
marking in tests/conftest.py follows the test's folder and the fixtures it uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, pytest_collection_modifyitems


class _Item:
    def __init__(self, path: Path, fixtures: list[str]):
        self.path, self.fixturenames, self.own_markers = path, fixtures, []

    def add_marker(self, mark) -> None:
        self.own_markers.append(mark.name if hasattr(mark, "name") else mark.mark.name)


@pytest.mark.parametrize("where, fixtures, slow", [
    ("tests/integration/test_x.py", [], True),
    ("tests/e2e/test_x.py", ["tmp_path"], True),
    ("tests/unit/test_x.py", ["tmp_path", "spark"], True),
    ("tests/unit/test_x.py", ["scaleout_mlflow"], True),
    ("tests/unit/test_x.py", ["tmp_path", "one_thread"], False),
])
def test_services_make_a_test_slow(where: str, fixtures: list[str], slow: bool) -> None:
    item = _Item(ROOT / where, fixtures)
    pytest_collection_modifyitems(None, [item])
    assert (item.own_markers == ["slow"]) is slow
