"""gpuslice.cdi: CDI spec model, generation, validation and atomic writing."""
