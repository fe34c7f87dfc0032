"""Driver-enforced memory limits per cgroup (NVML nvmlDeviceSetMemoryLimits_v1,
recent drivers): a limit the driver enforces cannot be bypassed by a program
that skips the interposer.  Used whenever the driver has it; the interposer
stays for compute, the slice view and older drivers."""

from __future__ import annotations

import logging
from pathlib import Path

import pynvml

log = logging.getLogger(__name__)


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
        self.supported: dict[str, bool] = {}
        self.mount = unified_mount()
        pynvml.nvmlInit()  # held for the daemon's life: NVML counts its users
        own = self.mount or Path("/sys/fs/cgroup")
        for uuid in uuids:
            self.supported[uuid] = self._probe(uuid, str(own))
        log.info("driver-enforced memory limits: %s", {u: s for u, s in self.supported.items()})

    def _handle(self, uuid: str):
        return pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())

    def _probe(self, uuid: str, ns: str) -> bool:
        name = ns.encode()  # kept alive for the call: the struct holds only a pointer
        q = pynvml.c_nvmlGetMemoryLimits_v1_t(nameSpace=name)
        try:
            pynvml.nvmlDeviceGetMemoryLimits_v1(self._handle(uuid), q)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            return False
        except pynvml.NVMLError:
            return True  # not found / no such cgroup: the call itself exists
        return True

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
