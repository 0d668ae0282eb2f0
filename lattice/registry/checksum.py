"""Content checksums of model artifacts (a file or a folder), recorded in the registry so a
served artifact can be traced to the exact bytes that were gated."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

# the registry tag holding a version's manifest digest (here, beside the manifest: the exported
# artifact checks it without importing the registry client)
MANIFEST_TAG = "lattice.manifest"


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


# ------------------------------------------------------------ manifests: a sha256 per file

MANIFEST_FILE = "manifest.json"
"""Name of the manifest beside a registered folder: in the run's artifacts (next to `model/`) and
in each download-cache entry (next to its `model/`)."""


class ArtifactIntegrityError(ValueError):
    """An artifact's bytes differ from what was recorded when it was registered (a changed,
    missing or unexpected file, or no record to check against). `problems` names each file."""

    def __init__(self, what: str, problems: list[str]):
        self.what = what
        self.problems = list(problems)
        shown = "; ".join(self.problems[:8]) + (f"; and {len(self.problems) - 8} more" if len(self.problems) > 8 else "")
        super().__init__(f"{what} failed verification: {shown}")


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest(folder: str | Path) -> dict[str, str]:
    """{relative POSIX path: sha256} of every file under `folder` (empty if it has none)."""
    p = Path(folder)
    return {f.relative_to(p).as_posix(): file_sha256(f) for f in sorted(p.rglob("*")) if f.is_file()}


def manifest_digest(files: dict[str, str]) -> str:
    """One sha256 for a whole manifest (of its canonical JSON): the content key of a folder."""
    return hashlib.sha256(json.dumps(files, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def compare(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    """What differs between a recorded manifest and a folder's, one line per file."""
    out = []
    for name in sorted(set(expected) | set(actual)):
        if name not in actual:
            out.append(f"{name}: missing")
        elif name not in expected:
            out.append(f"{name}: not in the registered manifest")
        elif expected[name] != actual[name]:
            out.append(f"{name}: sha256 {actual[name][:16]}… differs from the registered {expected[name][:16]}…")
    return out


def verify(folder: str | Path, expected: dict[str, str], what: str | None = None) -> None:
    """Raise ArtifactIntegrityError unless `folder` holds exactly the files of `expected`."""
    problems = compare(expected, manifest(folder)) if Path(folder).is_dir() else [f"{folder}: no such folder"]
    if problems:
        raise ArtifactIntegrityError(what or str(folder), problems)


def write_manifest(files: dict[str, str], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(files, indent=1, sort_keys=True))
    return path


def read_manifest(path: str | Path, digest: str) -> dict[str, str]:
    """The manifest at `path`, checked against the digest the registry recorded for it."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactIntegrityError(str(path.parent), [f"{path.name}: missing (the registered file list cannot be checked)"])
    try:
        files = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactIntegrityError(str(path.parent), [f"{path.name}: unreadable ({exc})"]) from None
    if not isinstance(files, dict) or manifest_digest(files) != digest:
        raise ArtifactIntegrityError(str(path.parent), [f"{path.name}: does not match the registered manifest digest {digest[:16]}…"])
    return files


def sha256_files(files: dict[str, bytes]) -> str:
    """`sha256_path` of a folder whose files (relative POSIX name -> bytes) are already in memory,
    so a loader can report the checksum of exactly the bytes it loaded."""
    h = hashlib.sha256()
    for name in sorted(files, key=lambda n: n.split("/")):  # the order `sorted(paths)` gives sha256_path
        h.update(name.encode() + b"\0")
        h.update(files[name])
    return h.hexdigest()
