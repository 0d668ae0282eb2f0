"""The scale-out Prometheus without starting it: the generated prometheus.yml scrapes the file_sd
folder the profile names, `lattice serve`'s target file is what file_sd reads, and the profile
round-trips the Prometheus endpoint."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from lattice.deploy import local_services as ls
from lattice.deploy import prometheus_server as prom
from lattice.deploy.profile import read_profile, write_profile
from lattice.serving import scrape_target


def _layout(tmp_path: Path) -> ls.Layout:
    return ls.Layout(home=tmp_path / "home", secrets=tmp_path / "secrets", ports=dict(ls.DEFAULT_PORTS, prometheus=19191))


def test_config_scrapes_the_targets_folder_of_the_profile(tmp_path):
    layout = _layout(tmp_path)
    cfg = yaml.safe_load(prom.render_config(prom.targets_dir(layout)))
    (job,) = cfg["scrape_configs"]
    assert job["job_name"] == "lattice-serving" and job["metrics_path"] == "/metrics"
    (sd,) = job["file_sd_configs"]
    assert sd["files"] == [f"{prom.targets_dir(layout)}/*.json"]
    assert cfg["global"]["scrape_interval"] == f"{prom.SCRAPE_SECONDS}s"
    write_profile(layout.profile_file, ls.profile_dict(layout))
    services = read_profile(layout.profile_file)
    # the folder `lattice serve` writes to is the one Prometheus reads
    assert Path(services.prometheus_targets_dir) == prom.targets_dir(layout)
    assert services.prometheus_url == "http://127.0.0.1:19191" == prom.url(layout)


def test_serve_target_file_is_file_sd_json_and_goes_away(tmp_path):
    path = scrape_target.register(tmp_path / "t", "0.0.0.0", 8123, {"config": "demo.yaml"})
    assert json.loads(path.read_text()) == [{"targets": ["127.0.0.1:8123"], "labels": {"config": "demo.yaml"}}]
    assert [p.name for p in (tmp_path / "t").iterdir()] == ["lattice-serve-8123.json"]  # no temp file left
    scrape_target.register(tmp_path / "t", "10.0.0.5", 8124, {})
    assert json.loads(scrape_target.target_file(tmp_path / "t", 8124).read_text())[0]["targets"] == ["10.0.0.5:8124"]
    scrape_target.unregister(path)
    assert not path.exists()


def test_embedded_profile_has_no_prometheus(tmp_path):
    layout = _layout(tmp_path)
    d = ls.profile_dict(layout)
    d.pop("prometheus")
    write_profile(layout.profile_file, d)
    s = read_profile(layout.profile_file)
    assert s.prometheus_targets_dir is None and s.prometheus_url is None
