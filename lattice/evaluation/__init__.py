"""Evaluation: NE, AUC and calibration per (domain, objective) cell, macro means, oracle NE,
reports with plots comparing models."""
