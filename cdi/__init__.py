"""gpuslice.cdi: one CDI model: read, validate, write, spec directories, apply, generate."""
