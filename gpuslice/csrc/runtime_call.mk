# The shared C client of the daemon's runtime socket, compiled into the hook
# and the shim (one round trip: request, one reply).
RUNTIME_CALL_SRC := gpuslice/csrc/runtime_call.c
RUNTIME_CALL_DEPS := $(RUNTIME_CALL_SRC) gpuslice/csrc/runtime_call.h gpuslice/csrc/gpuslice_constants.h
