"""The README's promises: one setup command that installs what the one test command needs, and
CI (.ci/run) running exactly those two commands with nothing set that the README does not set."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP = "bash infra/setup.sh"
TESTS = ".venv/bin/python -m pytest -q"


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_readme_names_one_setup_one_demo_one_test_command():
    blocks = [b.strip() for b in _code_blocks((ROOT / "README.md").read_text())]
    assert SETUP in blocks and TESTS in blocks and ".venv/bin/lattice demo" in blocks


def test_ci_runs_the_readme_commands_and_sets_nothing_else():
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert any(ln.startswith(SETUP) for ln in lines) and any(ln.startswith(TESTS) for ln in lines)
    # an `export X=...` or a bare `X=... cmd` would give CI something a user following the README lacks
    assert not [ln for ln in lines if ln.startswith("export ") or re.match(r"^[A-Z_][A-Z0-9_]*=\S* +\S", ln)]


def test_setup_installs_chromium_unless_told_not_to():
    text = (ROOT / "infra" / "setup.sh").read_text()
    assert 'LATTICE_WITH_BROWSER:-1}" != "0"' in text and "chromium chromium-driver" in text
