# The simulated NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1 and the bundled
# machine), shipped in its own package, gpuslice-sim.
SIM_COMMON := sim/sim_state.c sim/sim_schedule.c sim/sim_config.c sim/sim_limits.c sim/sim_accounting.c
SIM_CUDA := $(filter-out sim/sim_nvml%,$(wildcard sim/sim_cuda_*.c)) sim/sim_ptx.c
SIM_NVML := sim/sim_nvml.c sim/sim_nvml_monitor.c sim/sim_nvml_processes.c sim/sim_nvml_accounting.c \
    sim/sim_nvml_unsupported.c
SIM_DEPS := $(DECLARATIONS) $(wildcard sim/*.h)
SIM_CONFIG := sim/gpuslice-sim.yaml

sim: $(BUILD)/sim/libcuda.so.1 $(BUILD)/sim/libnvidia-ml.so.1 $(BUILD)/sim/libnvidia-ptxjitcompiler.so.1 \
     $(BUILD)/sim/gpuslice-sim.yaml

$(BUILD)/sim/libcuda.so.1: $(SIM_COMMON) $(SIM_CUDA) $(SIM_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $(SIM_COMMON) $(SIM_CUDA) $(SHARED) -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic -lyaml -ldl

# the PTX JIT compiler's stand-in (sim_ptxjit.c): the real libcuda loads the real one to compile PTX
$(BUILD)/sim/libnvidia-ptxjitcompiler.so.1: sim/sim_ptxjit.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(SHARED) -Wl,-soname,libnvidia-ptxjitcompiler.so.1 -Wl,--no-as-needed -lc

$(BUILD)/sim/libnvidia-ml.so.1: $(SIM_COMMON) $(SIM_NVML) $(SIM_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $(SIM_COMMON) $(SIM_NVML) $(SHARED) -Wl,-soname,libnvidia-ml.so.1 -Wl,-Bsymbolic -lyaml -ldl

$(BUILD)/sim/gpuslice-sim.yaml: $(SIM_CONFIG)
	@mkdir -p $(@D)
	cp $< $@

# the simulator under ASan/UBSan and TSan, driven by sim/tests/sim_stress.c (and the interposer's
# libcuda_wrap/tests/wrap_stress.c). -Bsymbolic as above: its calls to its own entry points
# (cuArrayCreate_v2 makes a 3D array) bind to itself, as a driver's do; in a program linked to
# the interposer they went through the interposer again and charged the slice twice
$(BUILD)/asan/libcuda.so.1 $(BUILD)/tsan/libcuda.so.1: $(SIM_COMMON) $(SIM_CUDA) $(SIM_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -O1 $(call san,$@) -o $@ $(SIM_COMMON) $(SIM_CUDA) \
	    $(SHARED) -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic -lyaml -ldl

$(BUILD)/asan/libnvidia-ml.so.1 $(BUILD)/tsan/libnvidia-ml.so.1: $(SIM_COMMON) $(SIM_NVML) $(SIM_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -O1 $(call san,$@) -o $@ $(SIM_COMMON) $(SIM_NVML) \
	    $(SHARED) -Wl,-soname,libnvidia-ml.so.1 -Wl,-Bsymbolic -lyaml -ldl

# beside each, the PTX JIT compiler's stand-in it loads (sim_cuda_jit.c)
$(BUILD)/asan/libnvidia-ptxjitcompiler.so.1 $(BUILD)/tsan/libnvidia-ptxjitcompiler.so.1: sim/sim_ptxjit.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(SHARED) -Wl,-soname,libnvidia-ptxjitcompiler.so.1 -Wl,--no-as-needed -lc

$(BUILD)/asan/sim_stress $(BUILD)/tsan/sim_stress: $(BUILD)/%/sim_stress: sim/tests/sim_stress.c $(BUILD)/%/libcuda.so.1 \
    $(BUILD)/%/libnvidia-ptxjitcompiler.so.1
	$(CC) $(CFLAGS) -O1 $(call san,$@) -o $@ $< -L$(@D) -l:libcuda.so.1 -Wl,-rpath,'$$ORIGIN' -pthread

check-sim-sanitizers: $(BUILD)/asan/sim_stress $(BUILD)/tsan/sim_stress
	GPUSLICE_SIM_CONFIG=$(SIM_CONFIG) GPUSLICE_SIM_STATE_DIR=$$(mktemp -d) $(BUILD)/asan/sim_stress
	GPUSLICE_SIM_CONFIG=$(SIM_CONFIG) GPUSLICE_SIM_STATE_DIR=$$(mktemp -d) \
	    TSAN_OPTIONS=halt_on_error=1 setarch -R $(BUILD)/tsan/sim_stress
