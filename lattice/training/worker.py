"""torchrun entry point: `python -m lattice.training.worker RUN_SPEC.json` on every rank."""

from __future__ import annotations

import sys
from pathlib import Path

from lattice.training.loop import run
from lattice.training.spec import RunSpec

if __name__ == "__main__":
    run(RunSpec.load(Path(sys.argv[1])))
