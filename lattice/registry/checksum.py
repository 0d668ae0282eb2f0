"""Content checksums of model artifacts (a file or a folder), recorded in the registry so a
served artifact can be traced to the exact bytes that were gated."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_path(path: str | Path) -> str:
    """sha256 of a file, or of a folder's files (relative names and bytes, in sorted order)."""
    p = Path(path)
    h = hashlib.sha256()
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    if not files:
        raise FileNotFoundError(f"nothing to checksum at {p}")
    for f in files:
        if p.is_dir():
            h.update(str(f.relative_to(p)).encode() + b"\0")
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def size_mb(path: str | Path) -> float:
    p = Path(path)
    files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files) / 2**20
