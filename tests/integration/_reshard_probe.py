"""Test helper, run in-process or under torchrun: load a model's latest checkpoint into a trainer
of this world size and save it again, untouched, under OUT (tests/integration/test_train_scaleout.py
compares the two)."""

import sys
from pathlib import Path

from lattice.training.loop import Trainer
from lattice.training.spec import RunSpec


def resave(spec_path: str, out: str) -> None:
    spec = RunSpec.load(Path(spec_path))
    spec.resume = True
    trainer = Trainer(spec)
    try:
        assert trainer.load_checkpoint()
        trainer.save_checkpoint(Path(out))
    finally:
        trainer.close()


if __name__ == "__main__":
    resave(sys.argv[1], sys.argv[2])
