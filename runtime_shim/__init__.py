"""gpuslice.runtime_shim: wraps runc/crun and applies a container's slice on create."""
