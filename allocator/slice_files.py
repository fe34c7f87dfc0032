"""A slice's shared files (limits and usage), seen from Python through cffi.

The layout and the ledger atomics' prototypes are
libcuda_wrap/include/gpuslice_slice.h itself (the part between its cdef
markers), and the atomic updates are the ledger the interposer links: one
definition of both, not a Python copy.

The files are mapped with libc's mmap, not Python's (which keeps a duplicate
descriptor per map): a slice holds no file descriptor, so thousands of slices
fit any fd limit.  Their blocks are allocated before mapping, so a full
filesystem is an error at creation (ENOSPC), never a SIGBUS on a later write."""

from __future__ import annotations

import mmap
import os
import struct
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from itertools import compress
from pathlib import Path
from typing import Any, NamedTuple

from cffi import FFI

from gpuslice.allocator.records import Allocation
from gpuslice.paths import native_dir
from gpuslice.request import ComputePolicy, Priority

OPEN_UNTIL_CONTROLLED_NS = 1_000_000_000

LIBC_FUNCTIONS = """
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int munmap(void *addr, size_t length);
"""


def _header_cdef(header: Path) -> str:
    text = header.read_text()
    return text.split("/* cdef-begin */", 1)[1].split("/* cdef-end */", 1)[0]


@dataclass(frozen=True)
class _Layout:
    """Where a usage file's process rows and what they ever charged lie, and how their fields
    are read from the rows' bytes (native order): the header's layout, read once."""

    max_procs: int
    proc_at: int  # the rows' offset in the usage file
    charged_at: int  # what they ever charged: uint64_t[max_procs][GPUSLICE_SLICE_MAX_GPUS]
    row_size: int  # one process row
    charged_size: int  # one row of `charged`
    pid: struct.Struct  # a row's pid, at the row's offset
    used: struct.Struct  # a row's used[GPUs], at the row's offset
    charged: struct.Struct  # a row of `charged`, at its offset
    pid_skip: tuple[int, int]  # bytes before a row's pid, and after it

    @cache  # noqa: B019 (one layout, kept for the process's life)
    def pid_column(self, rows: int) -> struct.Struct:
        """The pid of each of the first `rows` rows."""
        before, after = self.pid_skip
        return struct.Struct("=" + f"{before}xi{after}x" * rows)

    def spans(self, rows: int) -> tuple[int, int, int, int]:
        """The first `rows` rows' (start, end), then what they ever charged's."""
        return (self.proc_at, self.proc_at + rows * self.row_size,
                self.charged_at, self.charged_at + rows * self.charged_size)  # fmt: skip


@cache
def _layout() -> _Layout:
    ffi, _ = ffi_and_lib()
    row, gpus = ffi.sizeof("struct gpuslice_proc_usage"), constant("GPUSLICE_SLICE_MAX_GPUS")
    pid_at, used_at = (ffi.offsetof("struct gpuslice_proc_usage", f) for f in ("pid", "used"))
    assert ffi.sizeof("int32_t") == 4 and ffi.sizeof("uint64_t") == 8 and pid_at + 4 <= row
    return _Layout(
        constant("GPUSLICE_SLICE_MAX_PROCS"),
        ffi.offsetof("struct gpuslice_usage", "proc"),
        ffi.offsetof("struct gpuslice_usage", "charged"),
        row,
        gpus * 8,
        struct.Struct(f"={pid_at}xi"),
        struct.Struct(f"={used_at}x{gpus}Q"),
        struct.Struct(f"={gpus}Q"),
        (pid_at, row - pid_at - 4),
    )


def _in_use(column: tuple[int, ...]) -> dict[int, int]:
    """slot -> pid of the rows whose pid (in row order) is set."""
    return dict(zip(compress(range(len(column)), column), filter(None, column), strict=True))


class Rows(NamedTuple):
    """A slice's first process rows as read at one moment, as bytes: equal to another read of
    as many rows exactly when nothing in them moved (the reconciler works out again only a
    slice whose rows did)."""

    proc: bytes  # struct gpuslice_proc_usage[n_rows]
    charged: bytes  # uint64_t[n_rows][GPUSLICE_SLICE_MAX_GPUS]
    n_rows: int  # the rows read, from the first

    def pids(self) -> dict[int, int]:
        """slot -> pid of the rows in use."""
        return _in_use(_layout().pid_column(self.n_rows).unpack_from(self.proc))

    def whole(self) -> bool:
        """Every row in use is among those read, given that none was released since a read that
        found all rows after these free: the last row read is free (a claim takes the first
        free row, so none was taken past it), or there are no more."""
        lay = _layout()
        return self.n_rows == lay.max_procs or lay.pid.unpack_from(self.proc, (self.n_rows - 1) * lay.row_size)[0] == 0

    def first(self, n_rows: int) -> Rows:
        """The first `n_rows` of these rows, as a read of that many would give them."""
        lay = _layout()
        return Rows(self.proc[: n_rows * lay.row_size], self.charged[: n_rows * lay.charged_size], n_rows)

    def used(self, slot: int, gpu: int) -> int:
        """What the process of `slot` charged on `gpu` (SliceFiles.proc_used)."""
        lay = _layout()
        return int(lay.used.unpack_from(self.proc, slot * lay.row_size)[gpu])

    def ever(self, slot: int, gpu: int) -> int:
        """What the process of `slot` ever charged on `gpu` (SliceFiles.proc_charged)."""
        lay = _layout()
        return int(lay.charged.unpack_from(self.charged, slot * lay.charged_size)[gpu])


_ROWS_LOCK = threading.Lock()  # guards the two counts below
_RELEASES: dict[str, int] = {}  # slice id -> its release_seq, whichever SliceFiles of it released
_CLAIMS: dict[str, int] = {}  # slice id -> the rows claimed, whichever SliceFiles of it claimed


@cache
def ffi_and_lib() -> tuple[FFI, Any]:
    d = native_dir() / "ledger"
    ffi = FFI()
    ffi.cdef(_header_cdef(d / "gpuslice_slice.h") + LIBC_FUNCTIONS)  # the ledger atomics are in the header
    return ffi, ffi.dlopen(str(d / "libgpuslice-ledger.so"))


def _magic(fd: int) -> int:
    """A shared file's first field (every layout's magic)."""
    return int.from_bytes(os.pread(fd, 4, 0), sys.byteorder)


@cache
def _int64_p(ffi: FFI) -> Any:
    """`int64_t *` resolved once (the compute controller refills thousands of gates a second)."""
    return ffi.typeof("int64_t *")


@cache
def _libc() -> Any:
    ffi, _ = ffi_and_lib()
    return ffi.dlopen(None)


def constant(name: str) -> int:
    _, lib = ffi_and_lib()
    return int(getattr(lib, name))


@dataclass(frozen=True)
class GpuLimit:
    uuid: str
    memory_limit: int
    cores: int
    hard: bool
    context_reserve: int = 0
    priority: str = "normal"


PRIORITY_CONSTANT = {
    "low": "GPUSLICE_PRIORITY_LOW",
    "normal": "GPUSLICE_PRIORITY_NORMAL",
    "high": "GPUSLICE_PRIORITY_HIGH",
}


def on_disk(directory: Path) -> dict[str, list[Path]]:
    """The slices whose files are in `directory`: slice id -> its .limits and .usage."""
    found: dict[str, list[Path]] = {}
    if directory.is_dir():
        for p in directory.iterdir():
            if p.suffix in (".limits", ".usage"):
                found.setdefault(p.stem, []).append(p)
    return found


def set_aside(directory: Path, keep: set[str]) -> list[Path]:
    """Files of slices not in `keep` (the store does not hold them) moved to
    <dir>/orphaned, not deleted; the files moved."""
    stale = [p for sid, paths in on_disk(directory).items() if sid not in keep for p in paths]
    if stale:
        aside = directory / "orphaned"
        aside.mkdir(mode=0o700, exist_ok=True)
        for p in stale:
            p.replace(aside / p.name)
    return stale


def per_gpu(allocations: Iterable[Allocation], policy: str, priority: str) -> list[GpuLimit]:
    """A slice's limits, one per GPU in its allocations' order: shares on one
    GPU add up (hard if any of them is, at the highest of their priorities;
    `policy`, `priority`: the slice's, for a share without its own)."""
    order = list(Priority)  # high, normal, low
    merged: dict[str, GpuLimit] = {}
    for a in allocations:
        hard = (a.policy or policy) == ComputePolicy.HARD.value
        prio = a.priority or priority
        if (m := merged.get(a.gpu_uuid)) is None:
            merged[a.gpu_uuid] = GpuLimit(a.gpu_uuid, a.memory, a.cores, hard, 0, prio)
        else:
            best = min(m.priority, prio, key=lambda p: order.index(Priority(p)))
            total = GpuLimit(
                a.gpu_uuid, m.memory_limit + a.memory, min(100, m.cores + a.cores), m.hard or hard, 0, best
            )
            merged[a.gpu_uuid] = total
    return list(merged.values())


class SliceFiles:
    """<dir>/<slice>.limits (daemon writes, processes read) and
    <dir>/<slice>.usage (processes and daemon update atomically)."""

    def __init__(self, directory: Path, slice_id: str) -> None:
        self.ffi, self.lib = ffi_and_lib()
        self.limits_path = directory / f"{slice_id}.limits"
        self.usage_path = directory / f"{slice_id}.usage"
        self.slice_id = slice_id
        self.limits = self._map(self.limits_path, "struct gpuslice_limits")
        # a version 3 usage file is this one without the rows' `charged`: its processes may still
        # be running (an upgrade keeps slices), so it is extended, never cleared
        older = self.ffi.offsetof("struct gpuslice_usage", "charged"), constant("GPUSLICE_USAGE_MAGIC")
        self.usage = self._map(self.usage_path, "struct gpuslice_usage", older)
        self.usage.version = constant("GPUSLICE_SLICE_VERSION")  # new, or a version 3 file extended
        self._usage_bytes = self.ffi.buffer(self.usage)  # the rows' bytes read as slices of it (rows())
        self._pids: tuple[tuple[int, int] | None, dict[int, int]] = (None, {})  # slot_pids's, and when
        if self.usage.magic != constant("GPUSLICE_USAGE_MAGIC"):  # new: counters start at zero
            self.usage.magic = constant("GPUSLICE_USAGE_MAGIC")

    def _map(self, path: Path, ctype: str, older: tuple[int, int] | None = None) -> Any:
        """The file as a struct pointer; unmapped when the last reference goes
        (the compute controller may still hold a released slice's files).
        `older`: the size and magic of an older layout that this one only extends."""
        size = self.ffi.sizeof(ctype)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            have = os.fstat(fd).st_size
            if have != size and not (older and have == older[0] and _magic(fd) == older[1]):
                os.ftruncate(fd, 0)  # a stale layout is never reinterpreted
            if have != size:
                os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)  # blocks now: ENOSPC here, not SIGBUS later
            libc = _libc()
            addr = libc.mmap(self.ffi.NULL, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
            if addr == self.ffi.cast("void *", -1):
                err = self.ffi.errno
                raise OSError(err, os.strerror(err), str(path))
        except OSError:
            if os.fstat(fd).st_blocks == 0:  # nothing of it was ever used: no half-made file stays
                os.unlink(path)
            raise
        finally:
            os.close(fd)
        return self.ffi.gc(self.ffi.cast(f"{ctype} *", addr), lambda p: libc.munmap(p, size), size)

    def write_limits(self, gpus: list[GpuLimit]) -> None:
        lim = self.limits
        lim.magic = 0  # readers see a consistent record or none while it changes
        lim.version = constant("GPUSLICE_SLICE_VERSION")
        lim.slice_id = self.slice_id.encode()[:39]
        lim.gpu_count = len(gpus)
        for i, g in enumerate(gpus):
            lim.gpu[i].uuid = g.uuid.encode()[:47]
            lim.gpu[i].memory_limit = g.memory_limit
            lim.gpu[i].context_reserve = g.context_reserve
            lim.gpu[i].cores = g.cores
            lim.gpu[i].policy = constant("GPUSLICE_POLICY_HARD" if g.hard else "GPUSLICE_POLICY_ELASTIC")
            lim.gpu[i].priority = constant(PRIORITY_CONSTANT[g.priority])
            gate = self.usage.gate[i]
            if gate.next_refill_ns == 0:  # open until the compute controller first sets a budget
                self.open_gate(i, time.monotonic_ns() + OPEN_UNTIL_CONTROLLED_NS)
        lim.generation += 1
        lim.magic = constant("GPUSLICE_LIMITS_MAGIC")

    def gpu_count(self) -> int:
        """The GPUs the slice's limits cover (shares on one GPU are one)."""
        return int(self.limits.gpu_count)

    # -- usage -----------------------------------------------------------------
    def used(self) -> list[int]:
        return [int(self.usage.used[g]) for g in range(int(self.limits.gpu_count))]

    def claim_slot(self, pid: int) -> int | None:
        """A free process row for pid (daemon side, single writer of pids)."""
        rows = self.usage.proc
        for i in range(constant("GPUSLICE_SLICE_MAX_PROCS")):
            if rows[i].pid == pid:
                return i
        for i in range(constant("GPUSLICE_SLICE_MAX_PROCS")):
            if rows[i].pid == 0:
                rows[i].pid = pid
                with _ROWS_LOCK:  # after the pid is written: a slot_pids keyed before it reads it again
                    _CLAIMS[self.slice_id] = _CLAIMS.get(self.slice_id, 0) + 1
                return i
        return None

    def slot_pids(self) -> dict[int, int]:
        # the daemon writes every pid (claim_slot, release_slot), so the rows are read again only
        # once one of them was claimed or released since (the controller asks each slice each tick)
        key = (_CLAIMS.get(self.slice_id, 0), _RELEASES.get(self.slice_id, 0))
        if self._pids[0] == key:
            return dict(self._pids[1])
        # every row's pid in one unpack of the rows' bytes: a row at a time through cffi made three
        # of these per slice each period half of the reconciler's CPU at 2,000 slices
        lay = _layout()
        pids = _in_use(lay.pid_column(lay.max_procs).unpack_from(self._usage_bytes, lay.proc_at))
        if not key[1] % 2:  # not while a release is under way
            self._pids = (key, pids)
        return dict(pids)

    def rows(self, ever_first: bool, count: int = 0) -> Rows:
        """The first `count` process rows' bytes (all of them: 0). `ever_first`: what the rows
        ever charged is read before what they hold (the ledger raises it after), as a read
        before the driver's count wants it: a charge between the two is counted twice at worst,
        never missed (driver_memory.py)."""
        count = count or _layout().max_procs
        (p, q, c, d), usage = _layout().spans(count), self._usage_bytes
        if ever_first:
            charged = usage[c:d]
            return Rows(usage[p:q], charged, count)
        proc = usage[p:q]
        return Rows(proc, usage[c:d], count)

    def generation(self) -> int:
        """The limits' generation: bumped by every change of them (a Resize)."""
        return int(self.limits.generation)

    def release_slot(self, slot: int) -> int:
        with _ROWS_LOCK:  # odd while a release of this slice's rows is under way (release_seq)
            _RELEASES[self.slice_id] = _RELEASES.get(self.slice_id, 0) + 1
        try:
            return int(self.lib.gpuslice_usage_release_proc(self.usage, slot))
        finally:
            with _ROWS_LOCK:
                _RELEASES[self.slice_id] += 1

    def release_seq(self) -> int:
        """How many times a release of one of the slice's rows has begun and ended, in this
        process (the daemon's, the one that releases): odd while one is under way. A reader of
        the rows (the reconciler) that finds it changed across its reads read a row that was
        being emptied (its charges zeroed before its pid), and takes nothing from them."""
        return _RELEASES.get(self.slice_id, 0)

    def charge(self, slot: int, gpu: int, nbytes: int) -> bool:
        return self.lib.gpuslice_usage_charge(self.usage, self.limits, slot, gpu, nbytes) == 0

    def uncharge(self, slot: int, gpu: int, nbytes: int) -> None:
        self.lib.gpuslice_usage_uncharge(self.usage, slot, gpu, nbytes)

    # -- what the driver holds beyond the charges (allocator/driver_memory.py) --------
    def gpu_uuid(self, gpu: int) -> str:
        return self.ffi.string(self.limits.gpu[gpu].uuid).decode()

    def memory_limit(self, gpu: int) -> int:
        return int(self.limits.gpu[gpu].memory_limit)

    def proc_used(self, slot: int, gpu: int) -> int:
        """What the process of `slot` charged on `gpu` (its context reserve included)."""
        return int(self.usage.proc[slot].used[gpu])

    def proc_charged(self, slot: int, gpu: int) -> int:
        """What the process of `slot` ever charged on `gpu`: only grows while the process lives."""
        return int(self.usage.charged[slot][gpu])

    def driver_side(self, gpu: int) -> int:
        return int(self.usage.gate[gpu].driver_side)

    def set_driver_side(self, gpu: int, nbytes: int) -> int:
        """The driver's excess on `gpu` becomes `nbytes`, in the slice's total too; returns what it was."""
        return int(self.lib.gpuslice_usage_driver_set(self.usage, gpu, nbytes))

    # -- launch gates (docs/compute.md) -------------------------------------------
    def refill_gate(self, gpu: int, add: int, cap: int, next_refill_ns: int) -> tuple[int, int]:
        """Add a period's budget (capped); returns (tokens before, tokens after)."""
        before = self.ffi.new(_int64_p(self.ffi))
        after = self.lib.gpuslice_gate_refill(self.usage.gate + gpu, add, cap, next_refill_ns, before)
        return int(before[0]), int(after)

    def open_gate(self, gpu: int, next_refill_ns: int) -> tuple[int, int]:
        """No limit until the next refill; returns (tokens before, tokens after)."""
        before = self.ffi.new(_int64_p(self.ffi))
        self.lib.gpuslice_gate_open(self.usage.gate + gpu, next_refill_ns, before)
        return int(before[0]), 2 * constant("GPUSLICE_GATE_OPEN")

    def gate_waits(self, gpu: int) -> int:
        return int(self.usage.gate[gpu].waits)

    def gate_record(self, gpu: int) -> dict[str, int]:
        """A launch gate as it is now, for a person asking why a slice's launches wait."""
        g = self.usage.gate[gpu]
        return {"tokens": int(g.tokens), "waits": int(g.waits), "refused": int(g.refused),
                "next_refill_in_ns": int(g.next_refill_ns) - time.monotonic_ns()}  # fmt: skip

    def refusals(self, gpu: int) -> int:
        """Allocations the slice's processes were refused on `gpu` at its memory limit."""
        return int(self.usage.gate[gpu].refused)

    def open_fds(self) -> tuple[int, int]:
        """fds to pass to a process: limits read-only, usage read-write."""
        return (
            os.open(self.limits_path, os.O_RDONLY | os.O_CLOEXEC),
            os.open(self.usage_path, os.O_RDWR | os.O_CLOEXEC),
        )

    def remove(self) -> None:
        for p in (self.limits_path, self.usage_path):
            p.unlink(missing_ok=True)
        with _ROWS_LOCK:
            _RELEASES.pop(self.slice_id, None)
            _CLAIMS.pop(self.slice_id, None)
