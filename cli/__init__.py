"""The `gpuslice` command (main.py, the composition root), the demos, the
node selftest, and the simulator's daemon harness the demos use."""
