"""Driver-enforced memory limits per cgroup (NVML nvmlDeviceSetMemoryLimits_v1,
recent drivers): a limit the driver enforces cannot be bypassed by a program
that skips the interposer.  Used whenever the driver has it; the interposer
stays for compute, the slice view and older drivers."""

from __future__ import annotations

import importlib.metadata
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pynvml

if TYPE_CHECKING:
    from gpuslice.allocator.records import SliceRecord

log = logging.getLogger(__name__)

# what the driver limits need from pynvml: NVML 610's calls and structs, which
# nvidia-ml-py releases before 13.610 do not have (a node keeps whatever it has)
NEEDED = ("c_nvmlGetMemoryLimits_v1_t", "c_nvmlSetMemoryLimits_v1_t", "nvmlDeviceGetMemoryLimits_v1",
          "nvmlDeviceSetMemoryLimits_v1", "NVML_DEVICE_MEMORY_LIMIT_MAX")  # fmt: skip
SUPPORTED = "supported"


def missing_in_pynvml() -> str:
    """Why this pynvml cannot ask for driver limits, or "" when it can."""
    lacking = [n for n in NEEDED if not hasattr(pynvml, n)]
    if not lacking:
        return ""
    try:
        version = importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return f"unavailable: nvidia-ml-py {version} has no {lacking[0]} (13.610 or newer has it)"


def unified_mount() -> Path | None:
    """Where the cgroup v2 (unified) hierarchy is mounted, if anywhere."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] == "cgroup2":
            return Path(fields[4])
    return None


class DriverLimits:
    def __init__(self, uuids: list[str]) -> None:
        # per GPU: "supported", or why not (one line, shown by `gpuslice status` and the selftest)
        self.state: dict[str, str] = {}
        self.mount = unified_mount()
        pynvml.nvmlInit()  # held for the daemon's life: NVML counts its users
        own = self.mount or Path("/sys/fs/cgroup")
        lacking = missing_in_pynvml()
        for uuid in uuids:
            self.state[uuid] = lacking or self._probe(uuid, str(own))
        if lacking:
            log.info("driver-enforced memory limits %s; the interposer enforces memory alone", lacking)
        else:
            log.info("driver-enforced memory limits: %s", self.state)

    @property
    def supported(self) -> dict[str, bool]:
        return {u: s == SUPPORTED for u, s in self.state.items()}

    def _handle(self, uuid: str):
        return pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())

    def _probe(self, uuid: str, ns: str) -> str:
        name = ns.encode()  # kept alive for the call: the struct holds only a pointer
        q = pynvml.c_nvmlGetMemoryLimits_v1_t(nameSpace=name)
        try:
            pynvml.nvmlDeviceGetMemoryLimits_v1(self._handle(uuid), q)
        except pynvml.NVMLError_NotSupported:
            return "not supported by this GPU or driver"
        except pynvml.NVMLError_FunctionNotFound:
            return "not in this driver's NVML (610 or newer has it)"
        except pynvml.NVMLError:
            return SUPPORTED  # not found / no such cgroup: the call itself exists
        return SUPPORTED

    def cgroup_path(self, cgroup: str | None) -> str | None:
        """The sysfs path of a container's cgroup, or None where no limit may
        go (no cgroup v2 mount, the root cgroup)."""
        if not cgroup or cgroup == "/" or self.mount is None:
            return None
        path = self.mount / cgroup.lstrip("/")
        return str(path) if path.is_dir() else None

    def any_supported(self, uuids: list[str]) -> bool:
        return bool(uuids) and all(self.supported.get(u) for u in uuids)

    def set(self, uuid: str, ns: str, soft: int, hard: int) -> bool:
        name = ns.encode()  # kept alive for the call: the struct holds only a pointer
        limits = pynvml.c_nvmlSetMemoryLimits_v1_t(nameSpace=name, softLimit=soft, hardLimit=hard)
        try:
            pynvml.nvmlDeviceSetMemoryLimits_v1(self._handle(uuid), limits)
            del name
            return True
        except pynvml.NVMLError as e:
            log.warning("cannot set the driver's memory limit on %s for %s: %s", uuid, ns, e)
            return False

    def clear(self, uuid: str, ns: str) -> None:
        if Path(ns).is_dir():  # a removed cgroup has lost its limit already
            self.set(uuid, ns, 0, pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX)

    def get(self, uuid: str, ns: str) -> tuple[int, int, int] | None:
        name = ns.encode()  # kept alive for the call: the struct holds only a pointer
        q = pynvml.c_nvmlGetMemoryLimits_v1_t(nameSpace=name)
        try:
            pynvml.nvmlDeviceGetMemoryLimits_v1(self._handle(uuid), q)
        except pynvml.NVMLError:
            return None
        del name
        return q.softLimit, q.hardLimit, q.currentUsed


class Enforcement:
    """Which slices the driver limits too, on which cgroup: the slice's memory
    as the cgroup's hard and soft limit on each of its GPUs, where the driver
    can (`limits` None: a driver or pynvml without them)."""

    def __init__(self, limits: DriverLimits | None, own_cgroup: str) -> None:
        self.limits = limits
        self.own_cgroup = own_cgroup  # the daemon's: never limited
        self.enforced: dict[str, str] = {}  # slice id -> the cgroup path the driver limits

    def __contains__(self, slice_id: str) -> bool:
        return slice_id in self.enforced

    def apply(self, rec: SliceRecord) -> None:
        dl = self.limits
        if dl is None or rec.state != "bound" or rec.cgroup == self.own_cgroup:
            return
        ns = dl.cgroup_path(rec.cgroup)
        if ns is None or not dl.any_supported([a.gpu_uuid for a in rec.allocations]):
            log.info("slice %s: no driver limit (cgroup %s)", rec.id, rec.cgroup)
            return
        if all(dl.set(a.gpu_uuid, ns, a.memory, a.memory) for a in rec.allocations):
            self.enforced[rec.id] = ns
            log.info("slice %s: the driver limits %s", rec.id, ns)
        else:
            self.clear(rec)

    def clear(self, rec: SliceRecord) -> None:
        ns = self.enforced.pop(rec.id, None)
        if ns and self.limits:
            for a in rec.allocations:
                self.limits.clear(a.gpu_uuid, ns)
