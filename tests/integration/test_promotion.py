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
    # (this tiny student's 4-wide tables are too narrow for INT8 rows, with their scale and bias,
    # to be smaller: the size gain is tested on wider tables in test_hashing_modules)
    export_model(config, paths, name, int8=True)
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


# ---------------------------------------------------------------- integrity and all-or-nothing promotion


def _stored(reg, version):
    """The version's `model/` folder inside the MLflow artifact store (the local file backend)."""
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    return Path(unquote(urlparse(reg.client.get_run(version.run_id).info.artifact_uri).path)) / "model"


def _flip_embedding_bytes(model_pt, n: int = 64) -> None:
    """Flip `n` bytes in the middle of the largest tensor of a TorchScript archive (an embedding
    table), leaving the zip structure alone: the artifact still loads, a few rows score garbage."""
    import struct
    import zipfile

    with zipfile.ZipFile(model_pt) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    assert info.compress_type == zipfile.ZIP_STORED
    with open(model_pt, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(at)
        chunk = bytes(b ^ 0xFF for b in f.read(n))
        f.seek(at)
        f.write(chunk)


def _cli_config(config, paths) -> str:
    import yaml

    cfg_file = paths.workdir / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return str(cfg_file)


@pytest.mark.slow
def test_a_flipped_byte_is_rejected_at_the_gate_and_refused_by_serving(tmp_path):
    from lattice.cli import main
    from lattice.export.predictor import Predictor
    from lattice.registry.checksum import ArtifactIntegrityError
    from lattice.serving.slot import ModelSlot

    config, _ = trained_workdir()
    paths = copy_workdir(tmp_path / "wd")
    reg = ModelRegistry(config, paths)
    v1 = register(config, paths, "student")["version"]
    first = promote(config, paths)
    assert first["passed"] and reg.by_alias(CHAMPION).version == v1
    assert [r for r in first["reasons"] if r["check"] == "artifact_integrity"][0]["passed"]

    # v2: the same student registered again, then 64 bytes of its embedding table flipped where it
    # is stored and in the download cache
    v2 = register(config, paths, "student")["version"]
    info2 = reg.version(v2)
    local = reg.download(info2)
    for folder in (_stored(reg, info2), local):
        _flip_embedding_bytes(folder / "export" / "model.pt")
    from lattice.export.window import load_window

    corrupt = Predictor.load(_stored(reg, info2))  # with no registry record to check against, it loads and scores
    assert all(len(p) for p in corrupt.predict_frame(load_window(config, paths, "test", max_rows=256)).values())
    assert corrupt.checksum != info2.tags["lattice.checksum"]

    second = promote(config, paths)
    assert not second["passed"] and second["decision"] == "reject"
    failed = [r for r in second["reasons"] if not r["passed"]]
    assert [r["check"] for r in failed] == ["artifact_integrity"]
    assert f"challenger v{v2}" in failed[0]["message"] and "export/model.pt" in failed[0]["message"]
    assert reg.by_alias(CHAMPION).version == v1 and reg.by_alias(CHALLENGER).version == v2
    tags = reg.version(v2).tags
    assert tags["lattice.gate.decision"] == "reject" and "export/model.pt" in tags["lattice.gate.failed"]
    assert main(["promote", _cli_config(config, paths), "--workdir", str(paths.workdir)]) == 2  # rejected, not an error
    assert reg.by_alias(CHAMPION).version == v1

    # serving (the load app.Server uses): v1 is served with the checksum of what it loaded; an
    # alias forced past the gate to v2 is refused, v1 keeps serving and the reason is reported
    def load(version: int) -> Predictor:
        info = reg.version(version)
        return Predictor.load(reg.download(info), version=info)

    slot = ModelSlot(lambda: reg.by_alias(CHAMPION).version, load)
    assert slot.refresh() and slot.current.version == v1
    assert slot.current.model.checksum == reg.version(v1).tags["lattice.checksum"]
    reg.promote(info2, verify_stored=False)  # forced past every check
    assert not slot.refresh()
    assert slot.current.version == v1
    assert f"refused version {v2}" in slot.last_error and "export/model.pt" in slot.last_error
    assert not slot.refresh()  # not downloaded again on every poll
    with pytest.raises(ArtifactIntegrityError, match="export/model.pt"):
        load(v2)


@pytest.mark.slow
def test_a_lock_after_the_alias_write_leaves_champion_and_history_consistent(tmp_path, monkeypatch):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from lattice.cli import main
    from lattice.registry.client import HISTORY_TAG, PROMOTION_STATUS_TAG

    config, _ = trained_workdir()
    paths = copy_workdir(tmp_path / "wd")
    reg = ModelRegistry(config, paths)
    v1 = register(config, paths, "student")["version"]
    assert promote(config, paths)["passed"]
    v2 = register(config, paths, "student")["version"]

    # the history write right after the champion alias write fails, once (not with a lock: a
    # locked database is waited for and retried, see lattice.registry.patience)
    state = {"moved": False, "raised": False}
    set_alias, set_tag = MlflowClient.set_registered_model_alias, MlflowClient.set_registered_model_tag

    def alias(self, name, alias_name, version):
        set_alias(self, name, alias_name, version)
        if alias_name == CHAMPION and str(version) == str(v2):
            state["moved"] = True

    def tag(self, name, key, value):
        if state["moved"] and not state["raised"] and key == HISTORY_TAG:
            state["raised"] = True
            raise MlflowException("(sqlite3.OperationalError) disk I/O error")
        set_tag(self, name, key, value)

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", alias)
    monkeypatch.setattr(MlflowClient, "set_registered_model_tag", tag)
    with pytest.raises(MlflowException, match="disk I/O error"):
        main(["promote", _cli_config(config, paths), "--workdir", str(paths.workdir)])
    assert state["raised"]
    assert reg.by_alias(CHAMPION).version == v1 and reg.champion_history() == [v1]
    assert reg.by_alias(CHALLENGER).version == v2
    assert "lattice.gate.decision" not in reg.version(v2).tags
    attempts = reg.client.search_runs([reg.experiment_id], f"tags.`lattice.challenger_version` = '{v2}'")
    assert [(r.data.tags[PROMOTION_STATUS_TAG], r.info.status) for r in attempts] == [("rolled_back", "FAILED")]

    # the lock cleared: the same promotion goes through, record and move together
    again = promote(config, paths)
    assert again["passed"] and again["champion_after"] == v2
    assert reg.by_alias(CHAMPION).version == v2 and reg.champion_history() == [v1, v2]
    tags = reg.version(v2).tags
    assert tags["lattice.gate.decision"] == "promote" and tags["lattice.gate.run_id"] == again["gate_run_id"]
    assert reg.client.get_run(again["gate_run_id"]).data.tags[PROMOTION_STATUS_TAG] == "done"


@pytest.mark.slow
def test_a_missing_registry_is_an_error_for_register_and_promote(tmp_path):
    from lattice.registry.client import RegistryMissingError

    config, _ = trained_workdir()
    paths = copy_workdir(tmp_path / "wd")
    register(config, paths, "student")
    db = paths.mlflow / "mlflow.db"
    db.rename(tmp_path / "moved.db")
    with pytest.raises(RegistryMissingError, match="is missing") as err:
        promote(config, paths)
    assert str(db) in str(err.value) and not db.exists()
    with pytest.raises(RegistryMissingError):
        register(config, paths, "student")  # distill's register step
    assert not db.exists()
