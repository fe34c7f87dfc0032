# The interposer-calls benchmark's driver (./dev.sh bench interposer-calls).
bench: $(BUILD)/bench/call_bench

$(BUILD)/bench/call_bench: bench/call_bench.c $(DECLARATIONS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIE -o $@ $< -ldl
