"""A redirected `lattice train` on 2 ranks writes its progress to the file as it goes: one plain
line per interval from the ranks (relayed through the launcher), no carriage returns (issue 40)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lattice.config import load_config
from lattice.data.local_table import write_local_table
from lattice.data.synth import generate
from lattice.paths import Paths
from lattice.training.tiny import tiny

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_redirected_two_rank_training_logs_progress_lines(tmp_path) -> None:
    cfg = tiny(load_config(ROOT / "configs" / "demo.yaml"), data_root=str(tmp_path / "raw"))
    generate(cfg, 4_000, tmp_path / "raw", progress=False)
    write_local_table(cfg, Paths.for_config(cfg, tmp_path / "work"))
    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True), sort_keys=False))
    log = tmp_path / "train.log"
    env = {**os.environ, "LATTICE_PROGRESS_SECONDS": "0"}  # a line per batch: the test sees them all
    env.pop("TQDM_DISABLE", None)
    with log.open("w") as out:
        res = subprocess.run([sys.executable, "-m", "lattice.cli", "train", str(config_file), "--model", "teacher",
                              "--nproc", "2", "--epochs", "1", "--workdir", str(tmp_path / "work")],
                             cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=900)
    text = log.read_text()
    assert res.returncode == 0, text[-3000:]
    progress = [ln for ln in text.splitlines() if "teacher epoch 1/1:" in ln]
    assert len(progress) >= 3, text[-3000:]  # while training, not only a last line
    assert "\r" not in text
    assert any("batch/s" in ln for ln in progress)
