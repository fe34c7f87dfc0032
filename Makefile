# The C build, one `make` here: each component's fragment adds its targets.
#   make            everything: the node's C parts and the simulator
#   make node       what the node package ships: ledger, wrap, tools, bin
#   make sim        the simulated driver (the gpuslice-sim package)
# into $(BUILD)/{ledger,wrap,tools,bin,sim}/.  Sanitizer builds:
#   make check-sanitizers, make asan-bin, make wrap-stress  (tests/integration/test_sanitizers.py)
# Installed by hand (the packages install through pip instead, packaging/build.py):
#   make install DESTDIR=... LIBDIR=/usr/lib/gpuslice BINDIR=/usr/bin
#   make install-sim DESTDIR=... LIBDIR=/usr/lib/gpuslice
CC ?= cc
CFLAGS ?= -O2 -g
CFLAGS += -std=c11 -Wall -Wextra -Werror -fPIC -fvisibility=hidden -pthread \
    -Ilibcuda_wrap/include -Ilibcuda_wrap/symbols -Igpuslice/csrc
SHARED := -shared -pthread -Wl,--no-undefined -Wl,-z,defs
BUILD ?= build/native
LIBDIR ?= /usr/lib/gpuslice
BINDIR ?= /usr/bin
# Our declarations of NVIDIA's API, the slice protocol and the node constants:
# every C part depends on them.
DECLARATIONS := $(wildcard libcuda_wrap/include/*.h libcuda_wrap/symbols/*.def) gpuslice/csrc/gpuslice_constants.h
PIE := -fPIE -D_FORTIFY_SOURCE=2 -pie -Wl,-z,relro,-z,now
SAN_ASAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
SAN_TSAN := -fsanitize=thread
# one flag set per sanitizer build directory (asan/ or tsan/)
san = $(if $(findstring /asan/,$(1)),$(SAN_ASAN),$(SAN_TSAN))

all: node sim
node: ledger wrap tools bin

include gpuslice/csrc/runtime_call.mk
include libcuda_wrap/wrap.mk
include hook/hook.mk
include runtime_shim/runtime_shim.mk
include cuda_tools/cuda_tools.mk
include sim/sim.mk
include bench/bench.mk

bin: $(BUILD)/bin/gpuslice-hook $(BUILD)/bin/gpuslice-runtime
asan-bin: $(BUILD)/asan/bin/gpuslice-hook $(BUILD)/asan/bin/gpuslice-runtime

check-sanitizers: check-ledger-sanitizers check-sim-sanitizers

install: node
	install -d $(DESTDIR)$(LIBDIR)/wrap $(DESTDIR)$(LIBDIR)/ledger $(DESTDIR)$(LIBDIR)/tools $(DESTDIR)$(BINDIR)
	install -m 0644 $(BUILD)/wrap/libcuda.so.1 $(BUILD)/wrap/libnvidia-ml.so.1 $(DESTDIR)$(LIBDIR)/wrap/
	install -m 0644 $(BUILD)/ledger/libgpuslice-ledger.so $(BUILD)/ledger/gpuslice_slice.h $(DESTDIR)$(LIBDIR)/ledger/
	install -m 0755 $(addprefix $(BUILD)/tools/,$(CUDA_TOOLS)) $(DESTDIR)$(LIBDIR)/tools/
	install -m 0755 $(BUILD)/bin/gpuslice-hook $(BUILD)/bin/gpuslice-runtime $(DESTDIR)$(BINDIR)/

install-sim: sim
	install -d $(DESTDIR)$(LIBDIR)/sim
	install -m 0644 $(BUILD)/sim/libcuda.so.1 $(BUILD)/sim/libnvidia-ml.so.1 $(BUILD)/sim/gpuslice-sim.yaml \
	    $(DESTDIR)$(LIBDIR)/sim/

.PHONY: all node sim install install-sim ledger wrap wrap-stress tools bin asan-bin bench check-sanitizers check-ledger-sanitizers check-sim-sanitizers
