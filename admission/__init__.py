"""Pods written for HAMi or Volcano's vGPU, rewritten to ask gpuslice for the
same (docs/migrate-from-hami.md)."""
