# The interposer: drop-in libcuda.so.1 and libnvidia-ml.so.1 in front of the
# real libraries at a private path (overridable at run time), and the ledger
# atomics it shares with the daemon (loaded there through cffi).
REAL_LIBCUDA ?= /usr/lib/gpuslice/driver/libcuda.so.1
REAL_LIBNVML ?= /usr/lib/gpuslice/driver/libnvidia-ml.so.1
WRAP_DIR := libcuda_wrap/wrap
LEDGER_SRC := libcuda_wrap/ledger/slice_ledger.c
SLICE_H := libcuda_wrap/include/gpuslice_slice.h
WRAP_COMMON := $(addprefix $(WRAP_DIR)/,real.c slice.c table.c log.c)
WRAP_CUDA := $(WRAP_DIR)/forward.S $(WRAP_COMMON) \
    $(addprefix $(WRAP_DIR)/,memory.c vmm.c context.c gate.c procaddr.c hooks.c) $(LEDGER_SRC)
WRAP_NVML := $(WRAP_DIR)/forward.S $(WRAP_COMMON) $(WRAP_DIR)/nvml.c $(WRAP_DIR)/nvml_processes.c
WRAP_DEPS := $(DECLARATIONS) $(wildcard $(WRAP_DIR)/*.h $(WRAP_DIR)/*.def)

wrap: $(BUILD)/wrap/libcuda.so.1 $(BUILD)/wrap/libnvidia-ml.so.1

$(BUILD)/wrap/libcuda.so.1: $(WRAP_CUDA) $(WRAP_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -DLEDGER_API= -DEXPORTS='"cuda_exports.def"' -DGS_NOT_FOUND=500 \
	    -DGS_REAL_ENV=GS_ENV_REAL_LIBCUDA -DGS_REAL_DEFAULT='"$(REAL_LIBCUDA)"' \
	    -o $@ $(WRAP_CUDA) $(SHARED) -Wl,-soname,libcuda.so.1 -ldl

$(BUILD)/wrap/libnvidia-ml.so.1: $(WRAP_NVML) $(WRAP_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -DEXPORTS='"nvml_exports.def"' -DGS_NOT_FOUND=13 \
	    -DGS_REAL_ENV=GS_ENV_REAL_LIBNVML -DGS_REAL_DEFAULT='"$(REAL_LIBNVML)"' \
	    -o $@ $(WRAP_NVML) $(SHARED) -Wl,-soname,libnvidia-ml.so.1 -ldl

ledger: $(BUILD)/ledger/libgpuslice-ledger.so $(BUILD)/ledger/gpuslice_slice.h

$(BUILD)/ledger/gpuslice_slice.h: $(SLICE_H)
	@mkdir -p $(@D)
	cp $< $@

$(BUILD)/ledger/libgpuslice-ledger.so: $(LEDGER_SRC) $(SLICE_H)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(SHARED) -Wl,--no-as-needed -lc

# the ledger atomics under ASan/UBSan and TSan, driven by libcuda_wrap/tests/ledger_stress.c
$(BUILD)/asan/ledger_stress $(BUILD)/tsan/ledger_stress: libcuda_wrap/tests/ledger_stress.c $(LEDGER_SRC) $(SLICE_H)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -O1 $(call san,$@) -o $@ $< $(LEDGER_SRC) -pthread

check-ledger-sanitizers: $(BUILD)/asan/ledger_stress $(BUILD)/tsan/ledger_stress
	$(BUILD)/asan/ledger_stress
	setarch -R $(BUILD)/tsan/ledger_stress

# the interposer itself (libcuda and NVML) under ASan/UBSan and TSan, in front of
# the simulator built with the same sanitizer (sim.mk): libcuda_wrap/tests/wrap_stress.c, run
# attached to a slice by tests/integration/test_sanitizers.py
$(BUILD)/asan/wrap/libcuda.so.1 $(BUILD)/tsan/wrap/libcuda.so.1: $(WRAP_CUDA) $(WRAP_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -O1 $(call san,$@) -DLEDGER_API= -DEXPORTS='"cuda_exports.def"' -DGS_NOT_FOUND=500 \
	    -DGS_REAL_ENV=GS_ENV_REAL_LIBCUDA -DGS_REAL_DEFAULT='"$(REAL_LIBCUDA)"' \
	    -o $@ $(WRAP_CUDA) $(SHARED) -Wl,-soname,libcuda.so.1 -ldl

$(BUILD)/asan/wrap/libnvidia-ml.so.1 $(BUILD)/tsan/wrap/libnvidia-ml.so.1: $(WRAP_NVML) $(WRAP_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -O1 $(call san,$@) -DEXPORTS='"nvml_exports.def"' -DGS_NOT_FOUND=13 \
	    -DGS_REAL_ENV=GS_ENV_REAL_LIBNVML -DGS_REAL_DEFAULT='"$(REAL_LIBNVML)"' \
	    -o $@ $(WRAP_NVML) $(SHARED) -Wl,-soname,libnvidia-ml.so.1 -ldl

$(BUILD)/asan/wrap/wrap_stress $(BUILD)/tsan/wrap/wrap_stress: $(BUILD)/%/wrap/wrap_stress: \
    libcuda_wrap/tests/wrap_stress.c $(BUILD)/%/wrap/libcuda.so.1 $(BUILD)/%/wrap/libnvidia-ml.so.1 \
    $(BUILD)/%/libcuda.so.1 $(BUILD)/%/libnvidia-ml.so.1 $(BUILD)/%/libnvidia-ptxjitcompiler.so.1
	$(CC) $(CFLAGS) -O1 $(call san,$@) -o $@ $< -L$(@D) -l:libcuda.so.1 -l:libnvidia-ml.so.1 \
	    -Wl,-rpath,'$$ORIGIN' -pthread

wrap-stress: $(BUILD)/asan/wrap/wrap_stress $(BUILD)/tsan/wrap/wrap_stress
