"""Orchestration helpers that hold no Airflow import: what each DAG of a config runs and which
parameters it offers (`spec`), how one task runs one stage (`task_runner`), where configs and the
project live (`locations`), and how `airflow standalone` is started and stopped (`standalone`);
which configs load and the import error for those that do not (`config_errors`), and where a model
task reads a domain subset and stages a model folder (`run_paths`).

The DAG file `dags/lattice_dags.py` turns the specs into Airflow objects; everything here is plain
Python, so it is unit-tested without Airflow and keeps `lattice/` free of Airflow imports.
"""
