"""The documentation site (mkdocs.yml, docs/) builds with `mkdocs build --strict`: a broken link,
a missing page or any other warning fails it. Pages are found, not listed, so every Markdown file
under docs/ must come out as a page."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_site_builds_strict_with_every_page(tmp_path: Path) -> None:
    site = tmp_path / "site"
    # NO_MKDOCS_2_WARNING: mkdocs-material's banner about its own end of life is printed on every
    # build; it is not a warning of this site
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                          "--site-dir", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "WARNING" not in log, log[-4000:]
    docs = ROOT / "docs"
    for page in docs.rglob("*.md"):
        rel = page.relative_to(docs).with_suffix("")
        html = site / ("index.html" if rel.name == "index" and rel.parent == Path(".") else
                       rel.parent / "index.html" if rel.name == "index" else rel / "index.html")
        assert html.is_file(), f"{page} did not become a page of the site ({html})"
    # the generated config reference is part of the site, with its tables rendered
    assert "<table>" in (site / "config-reference" / "index.html").read_text()
