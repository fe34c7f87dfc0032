# gpuslice-runtime: the runtime shim in front of runc.
$(BUILD)/bin/gpuslice-runtime: runtime_shim/gpuslice_runtime.c $(RUNTIME_CALL_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(PIE) -o $@ $< $(RUNTIME_CALL_SRC)

$(BUILD)/asan/bin/gpuslice-runtime: runtime_shim/gpuslice_runtime.c $(RUNTIME_CALL_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -O1 $(SAN_ASAN) -o $@ $< $(RUNTIME_CALL_SRC)
