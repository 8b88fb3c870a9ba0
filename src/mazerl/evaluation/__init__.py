"""Evaluation: episode metrics, statistics, comparison, reports."""
