"""gpuslice.hook: the OCI hook that binds a container to its slice and releases it."""
