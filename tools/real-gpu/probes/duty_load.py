"""A load of known shape for the trace step: spin kernels of KERNEL_US
microseconds, launched so that the GPU is busy DUTY of the time (1: back to
back), for SECONDS once the kit answers its hold. Driver API through
cuda.bindings, so it runs on the simulator as on a GPU.
argv: SECONDS KERNEL_US DUTY.

A kernel's length is calibrated, not assumed: on a GPU the spin kernel's
cycles set it (timed with events, queued behind a longer kernel so that the
host's launch is not counted: timed from an idle stream, a 50 us kernel read
8-12 us long on the H100 and H200); where they do not (the simulator, whose
kernels last waves x its wave time), the number of waves does."""

from __future__ import annotations

import ctypes
import itertools
import os
import time

from common import hold, main
from cuda.bindings import driver as cu

# each block spins `cycles` SM clocks; PTX JIT-compiled by the driver (no toolkit needed)
SPIN_PTX = (
    b".version 7.0\n.target sm_70\n.address_size 64\n"
    b".visible .entry spin(.param .u64 cycles)\n{\n"
    b" .reg .pred %p;\n .reg .b64 %rd<5>;\n"
    b" ld.param.u64 %rd1, [cycles];\n mov.u64 %rd2, %clock64;\n"
    b"WAIT:\n mov.u64 %rd3, %clock64;\n sub.s64 %rd4, %rd3, %rd2;\n"
    b" setp.lt.u64 %p, %rd4, %rd1;\n @%p bra WAIT;\n ret;\n}\n\0"
)
THREADS = 128
PROBE_CYCLES = 200_000  # ~0.1 ms on a 2 GHz GPU
# the kernel a timed one queues behind: 1 ms spins, 64 blocks a SM (a few ms on a GPU), and on
# the simulator, whose kernels last waves x its wave time, 64 of its waves
BLOCKER_CYCLES, BLOCKER_WAVES = 10 * PROBE_CYCLES, 64
# a launch call longer than this was held (gpuslice's gate sleeps to its next refill): a
# launch from Python takes tens of microseconds
HELD_S = 0.0005
GATE_WAIT_S = 10.0  # how long a timing waits out a held gate behind the same blocker
MAX_DOUBLINGS = 11  # the simulator's first blocker is 40 us (64 waves of 0.625 us): to 82 ms
BACK_TO_BACK_SYNC = 8  # at duty 1, launches between synchronizations: the queue stays short


def ok(ret: object) -> object:
    err, *rest = ret if isinstance(ret, tuple) else (ret,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(cu.cuGetErrorName(err)[1].decode())
    return rest[0] if len(rest) == 1 else rest


class Spin:
    def __init__(self) -> None:
        ok(cu.cuInit(0))
        dev = ok(cu.cuDeviceGet(0))
        ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(dev))))
        self.sms = int(ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)))
        module = ok(cu.cuModuleLoadData(SPIN_PTX))
        self.fn = ok(cu.cuModuleGetFunction(module, b"spin"))
        self.stream = ok(cu.cuStreamCreate(0))
        self.start, self.stop = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))
        self.cycles, self.waves = PROBE_CYCLES, 1
        self.uncovered = 0  # timings the host's launch may be in (timed_us)
        self.tries: list[int] = []  # each timing's tries (timed_us)
        self.held = 0  # tries whose launch the gate held (timed_us)

    def launch(self, cycles: int | None = None, waves: int | None = None) -> None:
        arg = ctypes.c_uint64(self.cycles if cycles is None else cycles)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
        grid = self.sms * (self.waves if waves is None else waves)
        ok(cu.cuLaunchKernel(self.fn, grid, 1, 1, THREADS, 1, 1, 0, self.stream, ctypes.addressof(params), 0))

    def _elapsed_us(self, cycles: int, waves: int, blocker: int | None) -> tuple[float, bool, bool]:
        """One kernel timed by events: behind a blocker of `blocker` waves, or from an idle
        stream (None); whether the start event was still to come once it was queued; and
        whether its launch call was held (a gate's wait for budget, not the host's pace)."""
        self.launch(cycles, waves)  # warm: the first launch loads the module
        if blocker is None:
            ok(cu.cuStreamSynchronize(self.stream))
        else:
            self.launch(BLOCKER_CYCLES, blocker)
        ok(cu.cuEventRecord(self.start, self.stream))
        called = time.monotonic()
        self.launch(cycles, waves)
        held = time.monotonic() - called > HELD_S
        # asked at once: a host descheduled after the kernel was queued took nothing from its timing
        covered = cu.cuEventQuery(self.start)[0] == cu.CUresult.CUDA_ERROR_NOT_READY
        ok(cu.cuEventRecord(self.stop, self.stream))
        ok(cu.cuEventSynchronize(self.stop))
        return float(ok(cu.cuEventElapsedTime(self.start, self.stop))) * 1000, covered, held

    def idle_timed_us(self, cycles: int, waves: int) -> float:
        """Timed from an event recorded on an idle stream: the GPU stamps it at once, and
        the kernel starts only once the host has launched it, so this holds that gap."""
        return self._elapsed_us(cycles, waves, None)[0]

    def timed_us(self, cycles: int, waves: int) -> float:
        """A kernel's length on the GPU alone: its start event and the kernel queued behind a
        longer kernel, so the event is stamped when the GPU reaches them, not while the host
        is still launching. Where the start event was done by the time the kernel was queued:
        if the launch call was held (gpuslice's gate: a new hard slice's budget starts at one
        launch and doubles with what it ran, so a doubled blocker stays ahead of it), again
        behind the same blocker, for GATE_WAIT_S at most; if the host was slower than the
        blocker, behind one twice as long. After twelve doublings the last time stands, counted
        in `uncovered`. `tries` keeps how many each timing took, `held` how many the gate held."""
        blocker, doublings, elapsed = BLOCKER_WAVES, 0, 0.0
        gate_until = time.monotonic() + GATE_WAIT_S
        for tries in itertools.count(1):
            elapsed, covered, held = self._elapsed_us(cycles, waves, blocker)
            if covered:
                self.tries.append(tries)
                return elapsed
            if held and time.monotonic() < gate_until:
                self.held += 1
                continue
            if doublings == MAX_DOUBLINGS:
                self.tries.append(tries)
                break
            blocker, doublings = blocker * 2, doublings + 1
        self.uncovered += 1
        return elapsed

    def calibrate(self, kernel_us: float) -> dict:
        """The knob that sets a kernel's length, and its value for kernel_us: a line through two
        timed points (a launch's fixed cost, then the slope), checked by timing the result."""
        c1, c8 = self.timed_us(PROBE_CYCLES, 1), self.timed_us(8 * PROBE_CYCLES, 1)
        if c8 > 2 * c1:  # the cycles set the length: a GPU
            slope = (c8 - c1) / (7 * PROBE_CYCLES)
            self.cycles, self.waves, how = max(1, round(PROBE_CYCLES + (kernel_us - c1) / slope)), 1, "cycles"
        else:  # they do not: the simulator's waves do, in steps of as many blocks as a SM holds,
            # so the line is drawn through two points well above one step
            w64, w1024 = self.timed_us(PROBE_CYCLES, 64), self.timed_us(PROBE_CYCLES, 1024)
            slope = (w1024 - w64) / 960
            self.cycles, self.waves, how = PROBE_CYCLES, max(1, round(64 + (kernel_us - w64) / slope)), "waves"
        return {"by": how, "cycles": self.cycles, "waves": self.waves, "sms": self.sms,
                "kernel_us": self.timed_us(self.cycles, self.waves),
                # what timing it on an idle stream adds: the host's launch, which the GPU does not run
                "idle_timed_us": self.idle_timed_us(self.cycles, self.waves),
                "uncovered": self.uncovered, "tries": self.tries, "held": self.held}  # fmt: skip


def run(argv: list[str]) -> dict:
    seconds, kernel_us, duty = float(argv[0]), float(argv[1]), float(argv[2])
    if not (0 < duty <= 1 and kernel_us > 0 and seconds > 0):
        raise ValueError(f"SECONDS KERNEL_US DUTY: got {argv}; DUTY in (0, 1]")
    spin = Spin()
    calibration = spin.calibrate(kernel_us)
    hold("ready", pid=os.getpid(), **calibration)
    period = calibration["kernel_us"] / 1e6 / duty
    launches = 0
    start = time.monotonic()
    end = start + seconds
    while (now := time.monotonic()) < end:
        spin.launch()
        launches += 1
        if duty < 1:
            ok(cu.cuStreamSynchronize(spin.stream))
            while time.monotonic() < now + period:  # idle by the host's clock: a sleep is too coarse at 50 us
                pass
        elif launches % BACK_TO_BACK_SYNC == 0:
            ok(cu.cuStreamSynchronize(spin.stream))
    ok(cu.cuStreamSynchronize(spin.stream))
    wall = time.monotonic() - start
    hold("done")  # alive while the kit reads the driver's record of it
    return {"launches": launches, "wall_s": wall, "busy_fraction": launches * calibration["kernel_us"] / 1e6 / wall,
            "calibration": calibration, "duty_asked": duty}  # fmt: skip


if __name__ == "__main__":
    main(run)
