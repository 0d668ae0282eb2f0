"""torchrun entry point: `python -m lattice.training.worker RUN_SPEC.json` on every rank."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from lattice.relay import configure_child


def main(spec_path: str) -> None:
    from torch.distributed.elastic.multiprocessing.errors import record

    from lattice.training.loop import run
    from lattice.training.spec import RunSpec

    # `record` writes torchelastic's error file (the exception and its traceback) before the
    # exception goes on: the launcher reads it to name what failed (lattice.training.launch)
    record(lambda: run(RunSpec.load(Path(spec_path))))()


if __name__ == "__main__":
    configure_child()  # first: the imports below warn too
    try:
        main(sys.argv[1])
    except KeyboardInterrupt:
        # Ctrl-C reaches every rank: one quiet exit each; the parent says how to resume
        sys.exit(130)
    except Exception:
        # through logging, so a relayed traceback reads as ERROR line by line, not as stray stderr
        logging.getLogger("lattice.training.worker").exception("rank failed")
        sys.exit(1)
