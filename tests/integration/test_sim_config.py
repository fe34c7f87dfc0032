"""The simulated machine's config: what it describes is what the clients see,
and a bad config gives one clear line naming the problem."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.harness.machine import GiB, gpu

UUID_A = "GPU-11111111-2222-3333-4444-555555555555"
UUID_B = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"

IDENTITY = r"""
import pynvml
from cuda.bindings import driver as cu
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    uuid = pynvml.nvmlDeviceGetUUID(h)
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == i
    bus = pynvml.nvmlDeviceGetPciInfo(h).busId
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(bus)) == i
    out.append([pynvml.nvmlDeviceGetName(h), uuid, bus, pynvml.nvmlDeviceGetMemoryInfo(h).total,
                list(pynvml.nvmlDeviceGetCudaComputeCapability(h))])
h0, h1, h2 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(3))
out.append([pynvml.nvmlDeviceGetTopologyCommonAncestor(h0, h1), pynvml.nvmlDeviceGetTopologyCommonAncestor(h0, h2)])
out.append([pynvml.nvmlDeviceGetP2PStatus(h0, h1, pynvml.NVML_P2P_CAPS_INDEX_NVLINK),
            pynvml.nvmlDeviceGetP2PStatus(h0, h2, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)])
out.append(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h0, 0).busId)
cu.cuInit(0)
_, dev = cu.cuDeviceGet(2)
_, uuid = cu.cuDeviceGetUuid(dev)
_, sms = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
_, total = cu.cuDeviceTotalMem(dev)
_, bus = cu.cuDeviceGetPCIBusId(32, dev)
out.append([bytes(uuid.bytes).hex(), sms, total, bus.split(b"\0")[0].decode()])
print(repr(out))
"""


def test_config_describes_the_machine(make_machine):
    m = make_machine(
        [
            gpu("80Gi", name="Sim H100", uuid=UUID_A, pci_bus_id="00000000:1A:00.0", compute_capability="9.0"),
            gpu("40Gi", uuid=UUID_B, pci_bus_id="00000000:1B:00.0"),
            gpu("24Gi", sms=46, pci_bus_id="00000000:C1:00.0"),
        ],
        topology=[{"gpus": [0, 1], "pcie": "single", "nvlinks": 4}, {"gpus": [0, 2], "pcie": "system"}],
    )
    r = m.python(IDENTITY)
    assert r.returncode == 0, r.stderr
    out = eval(r.stdout)
    assert out[0] == ["Sim H100", UUID_A, "00000000:1A:00.0", 80 * GiB, [9, 0]]
    assert out[1][1:4] == [UUID_B, "00000000:1B:00.0", 40 * GiB]
    assert out[3] == [10, 50]  # NVML_TOPOLOGY_SINGLE, NVML_TOPOLOGY_SYSTEM
    assert out[4] == [0, 5]  # P2P over NVLink: OK, NOT_SUPPORTED
    assert out[5] == "00000000:1B:00.0"
    uuid_hex, sms, total, bus = out[6]
    assert (
        out[2][1].lower() == f"gpu-{uuid_hex[:8]}-{uuid_hex[8:12]}-{uuid_hex[12:16]}-{uuid_hex[16:20]}-{uuid_hex[20:]}"
    )
    assert (sms, total, bus) == (46, 24 * GiB, "0000:C1:00.0")


BAD = [
    ("missing file", None, "cannot open"),
    ("negative memory", {"gpus": [{"memory": "-5Gi"}]}, "gpus[0].memory: must be a positive size"),
    (
        "duplicate uuid",
        {"gpus": [{"memory": "1Gi", "uuid": UUID_A}, {"memory": "1Gi", "uuid": UUID_A}]},
        "gpus[1].uuid: duplicate of gpus[0].uuid",
    ),
    ("unknown key", {"gpus": [{"memory": "1Gi", "memroy": "2Gi"}]}, 'unknown key "memroy"'),
    ("no gpus", {"gpus": []}, "gpus: must list 1 to 8 GPUs"),
    (
        "sample time off the 10 ms grid",
        {"gpus": [{"memory": "1Gi", "util_sample_time": "15ms"}]},
        'gpus[0].util_sample_time: must be a multiple of 10ms up to 1000ms, got "15ms"',
    ),
    (
        "time slice too short",
        {"gpus": [{"memory": "1Gi", "timeslice": "10us"}]},
        'gpus[0].timeslice: must be a duration from 100us to 1s such as 2ms, got "10us"',
    ),
    ("not yaml", "gpus: [\n", "not valid YAML/JSON"),
]


def write(tmp_path, content) -> str:
    path = tmp_path / "bad.yaml"
    if content is None:
        return str(tmp_path / "does-not-exist.yaml")
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return str(path)


@pytest.mark.parametrize(("case", "content", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_config_gives_one_clear_line(make_machine, tmp_path, case, content, message):
    m = make_machine()
    m.env["GPUSLICE_SIM_CONFIG"] = path = write(tmp_path, content)
    code = (
        "import pynvml\nfrom cuda.bindings import driver as cu\n"
        "print(cu.cuInit(0)[0].name)\n"
        "try:\n    pynvml.nvmlInit()\nexcept pynvml.NVMLError as e:\n    print(type(e).__name__)\n"
    )
    r = m.python(code)
    assert r.stdout.split() == ["CUDA_ERROR_NO_DEVICE", "NVMLError_DriverNotLoaded"]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2  # one from libcuda, one from NVML
    for line in lines:
        assert line.startswith(f"gpuslice-sim: sim config {path}: ") and message in line
    cli = subprocess.run([sys.executable, "-m", "gpuslice.cli", "sim", "check", path], capture_output=True, text=True)
    assert cli.returncode == 2
    assert cli.stderr.count("\n") == 1 and message in cli.stderr


def test_json_config_is_accepted(make_machine, tmp_path):
    path = tmp_path / "sim.json"
    path.write_text('{"gpus": [{"memory": "2Gi"}, {"memory": 1073741824}]}')
    r = subprocess.run(
        [sys.executable, "-m", "gpuslice.cli", "sim", "check", str(path)], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok: 2 GPUs"
