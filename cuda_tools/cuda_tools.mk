# CUDA programs gpuslice runs inside slices: the selftest's worker, the probe
# the demos and tests read a slice's view with, and the load generator.
CUDA_TOOLS := gpuslice-cuda-probe gpuslice-cuda-load gpuslice-selftest-worker
tools: $(addprefix $(BUILD)/tools/,$(CUDA_TOOLS))

$(BUILD)/tools/gpuslice-cuda-probe: cuda_tools/cuda_probe.c $(DECLARATIONS)
$(BUILD)/tools/gpuslice-cuda-load: cuda_tools/cuda_load.c $(DECLARATIONS)
$(BUILD)/tools/gpuslice-selftest-worker: cuda_tools/selftest_worker.c $(DECLARATIONS)
$(addprefix $(BUILD)/tools/,$(CUDA_TOOLS)):
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIE -o $@ $< -ldl
