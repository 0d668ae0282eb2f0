"""Which platform configs load, and what to tell Airflow about the ones that do not.

Airflow records an import error per DAG *file*, and marks every DAG parsed from a file with an
import error as stale (hidden). So the DAG file that builds the configs' DAGs (`dags/lattice_dags.py`)
skips an invalid config and never fails itself: the other configs' DAGs stay up. A second DAG file
(`dags/lattice_config_errors.py`) defines no DAG and raises `InvalidPlatformConfigs` when some config
is invalid: Airflow shows that as an import error in its banner, naming each invalid config file,
every problem in it and the fix. The invalid config's DAGs are gone until the file is fixed; their
runs stay in the metadata DB and come back with them, since DAG ids are derived from the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lattice.config import ConfigError, PlatformConfig, Problem, load_config
from lattice.orchestration.locations import config_files
from lattice.orchestration.spec import FAMILIES, dag_id


@dataclass(frozen=True)
class Loaded:
    configs: list[tuple[Path, PlatformConfig]]
    """The valid configs, in file order, one per config name."""
    errors: list[ConfigError]
    """One per invalid file (every problem of the file in `problems`)."""


def load_configs(files: list[Path] | None = None) -> Loaded:
    """Every config of the configs folder, split into valid ones and errors. A second file that
    uses a name already taken is an error too: its DAG ids (and registered models) would clash."""
    configs: list[tuple[Path, PlatformConfig]] = []
    errors: list[ConfigError] = []
    owner: dict[str, Path] = {}
    for path in config_files() if files is None else files:
        try:
            config = load_config(str(path))
        except ConfigError as exc:
            errors.append(exc)
            continue
        if config.name in owner:
            errors.append(ConfigError(str(path), [Problem(
                "name", config.name, f"{owner[config.name]} already uses this name, and DAG ids and registered models "
                "are named after it; give this config a name of its own")]))
            continue
        owner[config.name] = path
        configs.append((path, config))
    return Loaded(configs, errors)


class InvalidPlatformConfigs(Exception):
    """Raised by `dags/lattice_config_errors.py`, so Airflow lists it as an import error."""


def _dag_ids(file: str) -> str:
    """The DAG ids a config file would get, read from its `name:` when the YAML allows."""
    import yaml

    try:
        name = yaml.safe_load(Path(file).read_text()).get("name")
    except Exception:
        name = None
    if not isinstance(name, str) or not name:
        return "its DAGs"
    return "its DAGs " + ", ".join(dag_id(name, f) for f in FAMILIES)


def _without_file(line: str, file: str) -> str:
    return line[len(file) + 2:] if line.startswith(f"{file}: ") else line  # the file heads its block


def report(errors: list[ConfigError]) -> str:
    """The import-error text: each invalid file, every problem (one a line), the fix."""
    lines = [f"{len(errors)} Lattice platform config{'s are' if len(errors) > 1 else ' is'} invalid. "
             "The DAGs of every other config are loaded as usual."]
    for exc in errors:
        lines += ["", f"{exc.file}: {len(exc.problems)} problem{'s' if len(exc.problems) != 1 else ''}, "
                      f"so {_dag_ids(exc.file)} are not loaded (their past runs are kept):"]
        lines += [f"  - {_without_file(p.render(exc.file), exc.file)}" for p in exc.problems]
        lines.append(f"  Fix: edit {exc.file} as each line says; `lattice config check {exc.file}` lists the "
                     "same problems. Once it is valid its DAGs come back with their history and this error clears.")
    return "\n".join(lines)


def raise_if_invalid(files: list[Path] | None = None) -> None:
    errors = load_configs(files).errors
    if errors:
        raise InvalidPlatformConfigs(report(errors))
