# gpuslice-hook: the OCI hook (createRuntime, poststop, update-ldcache).
$(BUILD)/bin/gpuslice-hook: hook/gpuslice_hook.c $(RUNTIME_CALL_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(PIE) -o $@ $< $(RUNTIME_CALL_SRC)

$(BUILD)/asan/bin/gpuslice-hook: hook/gpuslice_hook.c $(RUNTIME_CALL_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -O1 $(SAN_ASAN) -o $@ $< $(RUNTIME_CALL_SRC)
