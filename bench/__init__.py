"""Benchmarks, separate from tests (developer tooling, not shipped): each prints
ratios measured side by side.  Run: ./dev.sh bench [NAME...]"""
