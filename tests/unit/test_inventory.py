"""The inventory read through a fake NVML: the reader's logic (health,
topology, NVLink, text fields) without a driver. The simulator runs the real
pynvml through the same code in the integration tests."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pynvml
import pytest

from gpuslice import inventory


@dataclass
class FakeNvml:
    """The functions inventory.read calls, answering from a description of GPUs."""

    ecc: tuple  # per GPU: an error count, or an NVMLError class to raise
    nvlinked: frozenset = frozenset()
    loads: bool = True
    inits: int = 0

    def nvmlInit(self) -> None:
        if not self.loads:
            raise pynvml.NVMLError_LibraryNotFound()
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.ecc)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> int:
        return int(uuid.decode().rsplit("-", 1)[1])

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=(80 + h) << 30, used=1 << 30)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list:
        return [SimpleNamespace(pid=100 + h, usedGpuMemory=None)]  # NVML may not say

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-fake-{h}".encode()  # older pynvml gives bytes

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=f"00000000:{h + 1:02X}:00.0")

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=7 * h)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return 9, 0

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        assert (kind, counter) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        if isinstance(self.ecc[h], type):
            raise self.ecc[h]()
        return self.ecc[h]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return pynvml.NVML_TOPOLOGY_SINGLE if {a, b} == {0, 1} else pynvml.NVML_TOPOLOGY_SYSTEM

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, cap: int) -> int:
        return pynvml.NVML_P2P_STATUS_OK if frozenset((a, b)) in self.nvlinked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"580.159.04"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000


def test_the_inventory_from_a_fake_nvml():
    nvml = FakeNvml((0, 3, pynvml.NVMLError_NotSupported), nvlinked=frozenset({frozenset((0, 2))}))
    inv = inventory.read(nvml)
    assert inv.driver_version == "580.159.04" and inv.cuda_version == 13000 and nvml.inits == 0  # shut down again
    assert [g.uuid for g in inv.gpus] == ["GPU-fake-0", "GPU-fake-1", "GPU-fake-2"]
    assert [g.health for g in inv.gpus] == ["", "3 uncorrected ECC errors", ""]  # no ECC: nothing to say
    assert inv.gpus[1].processes == (inventory.GpuProcess(101, 0),) and inv.gpus[2].compute_capability == "9.0"
    assert inv.topology[(0, 1)] == "single" and inv.topology[(1, 2)] == "system"
    assert inv.distance(0, 2) == 1 < inv.distance(0, 1) < inv.distance(1, 2)  # NVLink beats every PCIe path


def test_health_when_nvml_loses_the_gpu_and_no_driver_at_all():
    assert inventory.health("GPU-fake-0", FakeNvml((pynvml.NVMLError_GpuIsLost,))).startswith("NVML cannot read it:")
    with pytest.raises(inventory.NoDriver, match="cannot read the GPUs through NVML"):
        inventory.read(FakeNvml((0,), loads=False))
