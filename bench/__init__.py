"""gpuslice.bench: benchmarks, separate from tests; each prints ratios measured side by side."""
