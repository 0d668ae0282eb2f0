"""Airflow import errors for invalid Lattice platform configs (this file defines no DAG).

`dags/lattice_dags.py` builds the DAGs of every valid config and skips an invalid one. This file
raises when some config in `configs/` (or $LATTICE_CONFIGS_DIR) is invalid, so Airflow's
import-error banner names each invalid config file, lists every problem in it and says how to fix
it. It is a file of its own because Airflow hides every DAG of a file that has an import error.
"""

from lattice.orchestration.config_errors import raise_if_invalid

raise_if_invalid()
