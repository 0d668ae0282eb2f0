"""The closing lines of a task log name rows, model, metrics and decision when the summary has them."""

from __future__ import annotations

import logging

from lattice.orchestration.story import summary_lines
from lattice.orchestration.task_runner import _log_summary


def test_consolidate_summary_reads_rows_and_status():
    lines = summary_lines({"totals": {"rows_in": 1000, "rows_out": 990, "quarantined": 10, "skipped": 0,
                                      "balanced": True}, "status": "ok", "cells": [{"domain": "a"}]})
    assert lines == ["rows: rows in 1000, rows out 990, quarantined 10, skipped 0", "decision: status ok"]


def test_model_metrics_and_decision():
    lines = summary_lines({"model": "student", "challenger_version": 3, "promoted": False, "champion_after": 2,
                           "metrics": {"teacher": {"auc": 0.71234, "logloss": 0.5}, "student": {"auc": 0.7}}})
    assert lines == ["model: model student, challenger version 3",
                     "metrics: teacher.auc=0.7123, teacher.logloss=0.5, student.auc=0.7",
                     "decision: promoted False, champion after 2"]


def test_a_summary_without_known_keys_adds_nothing():
    assert summary_lines({"feature_views": ["a"]}) == [] and summary_lines(None) == []


def test_the_log_ends_with_the_short_account(caplog):
    with caplog.at_level(logging.INFO, logger="lattice.orchestration"):
        _log_summary("consolidate", {"totals": {"rows_in": 5, "rows_out": 4, "quarantined": 1}, "status": "ok"}, 2.0)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[-3:] == ["stage consolidate finished in 2.0 s", "  rows: rows in 5, rows out 4, quarantined 1",
                             "  decision: status ok"]
