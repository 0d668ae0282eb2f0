"""The promotion gate on real registered artifacts: first model through the floors, a better
student promoted, a deliberately degraded one rejected with its failing cells recorded in MLflow,
rollback restoring the previous champion."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from lattice.export.stages import export_model
from lattice.promotion.stages import promote, rollback
from lattice.registry import CHALLENGER, CHAMPION, ModelRegistry
from lattice.registry.stages import register
from test_distill import copy_workdir, trained_workdir


def _variant(paths, name: str) -> str:
    """A copy of the distilled student's training output under another model name."""
    shutil.copytree(paths.model_dir("student"), paths.model_dir(name), ignore=shutil.ignore_patterns("export", "checkpoint"))
    return name


def _degrade(paths, objective: str) -> str:
    """The distilled student with its `objective` head biased upwards: every cell of that
    objective gets worse (over-predicts), the other objectives are untouched."""
    dst = paths.model_dir(_variant(paths, "student@degraded"))
    blob = torch.load(dst / "model.pt", weights_only=False)
    biases = sorted((k for k in blob["state_dict"] if k.startswith(f"heads.{objective}.") and k.endswith(".bias")),
                    key=lambda k: int(k.split(".")[2]))
    blob["state_dict"][biases[-1]] += 2.0  # logit + 2: probabilities about 7x too high
    torch.save(blob, dst / "model.pt")
    return "student@degraded"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    config, _ = trained_workdir()
    paths = copy_workdir(tmp_path_factory.mktemp("promotion") / "wd")
    return config, paths


@pytest.mark.slow
def test_gate_promotes_rejects_and_rolls_back(setup):
    config, paths = setup
    reg = ModelRegistry(config, paths)

    # 1. the first model: no champion yet, so the absolute floors apply (the export exists: distill made it)
    v1 = register(config, paths, "student")["version"]
    dry = promote(config, paths, dry_run=True)
    assert dry["passed"], [r["message"] for r in dry["reasons"] if not r["passed"]]
    assert dry["champion_before"] is None and dry["champion_after"] is None
    assert {r["check"] for r in dry["reasons"]} >= {"ne_floor", "auc_floor", "calibration", "teacher_epsilon", "export_parity"}
    assert reg.by_alias(CHAMPION) is None  # a dry run never moves the alias
    first = promote(config, paths)
    assert first["passed"] and first["champion_after"] == v1
    assert reg.by_alias(CHAMPION).version == v1 and reg.by_alias(CHALLENGER) is None

    # 2. a degraded challenger is rejected, and the failing cells are exactly the degraded objective's
    name = _degrade(paths, "conversion")
    export_model(config, paths, name)
    v2 = register(config, paths, name)["version"]
    second = promote(config, paths)
    assert not second["passed"]
    conversion_cells = sorted(f"{d}/{o}" for d, o in config.cells() if o == "conversion")
    assert second["failed_cells"] == conversion_cells
    assert {r["check"] for r in second["reasons"] if not r["passed"]} >= {"ne_vs_champion"}
    assert reg.by_alias(CHAMPION).version == v1 and reg.by_alias(CHALLENGER).version == v2
    tags = reg.version(v2).tags
    assert tags["lattice.gate.decision"] == "reject"
    assert all(any(c in msg for msg in json.loads(tags["lattice.gate.failed"])) for c in conversion_cells)
    # the full decision (every reason, passed or not) is an artifact of the gate run
    local = reg.client.download_artifacts(tags["lattice.gate.run_id"], "decision.json", str(paths.workdir))
    recorded = json.loads(open(local).read())
    assert recorded["failed_cells"] == conversion_cells and len(recorded["reasons"]) == len(second["reasons"])

    # 3. a good challenger: the champion's weights with INT8 row-wise embeddings (a smaller
    #    artifact, judged with the INT8 parity tolerance) keeps every cell within δ: promoted
    name = _variant(paths, "student@int8")
    int8 = export_model(config, paths, name, int8=True)
    assert int8["artifact_mb"] < export_model(config, paths, "student")["artifact_mb"]
    v3 = register(config, paths, name)["version"]
    third = promote(config, paths)
    assert third["passed"], [r["message"] for r in third["reasons"] if not r["passed"]]
    assert {r["check"] for r in third["reasons"]} >= {"ne_vs_champion", "latency", "artifact_size"}
    assert third["champion_before"] == v1 and reg.by_alias(CHAMPION).version == v3
    assert reg.version(v3).tags["lattice.gate.decision"] == "promote"
    assert reg.champion_history() == [v1, v3]

    # 4. rollback returns the alias to the previous champion, and only as far as there is history
    back = rollback(config, paths)
    assert back == {"from_version": v3, "to_version": v1, "registered_model": reg.base_name}
    assert reg.by_alias(CHAMPION).version == v1
    with pytest.raises(RuntimeError, match="no previous champion"):
        rollback(config, paths)

    # 5. the same through the command line, on the config as a YAML file
    import yaml

    from lattice.cli import main

    cfg_file = paths.workdir / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    v4 = register(config, paths, "student@int8")["version"]
    assert main(["promote", str(cfg_file), "--workdir", str(paths.workdir), "--dry-run"]) == 0
    assert reg.by_alias(CHAMPION).version == v1
    assert main(["promote", str(cfg_file), "--workdir", str(paths.workdir)]) == 0
    assert reg.by_alias(CHAMPION).version == v4
    assert main(["rollback", str(cfg_file), "--workdir", str(paths.workdir)]) == 0
    assert reg.by_alias(CHAMPION).version == v1


@pytest.mark.slow
def test_promote_without_challenger_says_what_to_run(setup, tmp_path):
    config, _ = setup
    from lattice.paths import Paths

    with pytest.raises(LookupError, match="lattice distill"):
        promote(config, Paths.for_config(config, tmp_path / "empty"))
