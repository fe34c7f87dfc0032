"""Our own CUDA/NVML declarations (libcuda_wrap/include, symbols/*.def)
checked against NVIDIA's official cuda.h, cudaTypedefs.h and nvml.h."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.harness import REPO
from tests.harness.nvidia import SIM_DRIVER_VERSION, def_entries, needs

ROOT = REPO
OUR_CUDA = ROOT / "libcuda_wrap/include/gpuslice_cuda.h"
OUR_NVML = ROOT / "libcuda_wrap/include/gpuslice_nvml.h"

CUDA_STRUCTS = {
    "CUuuid": ["bytes"],
    "CUDA_ARRAY_DESCRIPTOR": ["Width", "Height", "Format", "NumChannels"],
    "CUDA_ARRAY3D_DESCRIPTOR": ["Width", "Height", "Depth", "Format", "NumChannels", "Flags"],
    "CUDA_MEMCPY2D": [
        "srcXInBytes",
        "srcMemoryType",
        "srcDevice",
        "srcPitch",
        "dstXInBytes",
        "dstHost",
        "dstArray",
        "dstPitch",
        "WidthInBytes",
        "Height",
    ],
    "CUmemLocation": ["type", "id"],
    "CUmemAllocationProp": ["type", "requestedHandleTypes", "location", "win32HandleMetaData", "allocFlags"],
    "CUmemAccessDesc": ["location", "flags"],
    "CUmemPoolProps": [
        "allocType",
        "handleTypes",
        "location",
        "win32SecurityAttributes",
        "maxSize",
        "usage",
        "gpuDirectRDMACapable",
        "reserved",
    ],
    "CUlaunchAttribute": ["id", "value"],
    "CUlaunchConfig": ["gridDimX", "blockDimZ", "sharedMemBytes", "hStream", "attrs", "numAttrs"],
    "CUDA_KERNEL_NODE_PARAMS_v1": ["func", "gridDimX", "blockDimZ", "sharedMemBytes", "kernelParams", "extra"],
    "CUDA_KERNEL_NODE_PARAMS_v2": ["func", "sharedMemBytes", "kernelParams", "extra", "kern", "ctx"],
    "CUgraphEdgeData": ["from_port", "to_port", "type", "reserved"],
    "CUgraphExecUpdateResultInfo": ["result", "errorNode", "errorFromNode"],
    "CUDA_KERNEL_NODE_PARAMS_v3": ["func", "gridDimX", "blockDimZ", "sharedMemBytes", "kernelParams", "kern", "ctx"],
    "CUgraphNodeParams": ["type", "reserved0", "kernel", "graph", "eventRecord", "reserved2"],
    "CUctxCreateParams": ["execAffinityParams", "numExecAffinityParams", "cigParams"],
    "CUipcMemHandle": ["reserved"],
    "CUDA_EXTERNAL_MEMORY_HANDLE_DESC": ["type", "handle", "size", "flags", "reserved"],
}
NVML_STRUCTS = {
    "nvmlPciInfo_t": ["busIdLegacy", "domain", "bus", "device", "pciDeviceId", "pciSubSystemId", "busId"],
    "nvmlMemory_t": ["total", "free", "used"],
    "nvmlMemory_v2_t": ["version", "total", "reserved", "free", "used"],
    "nvmlProcessInfo_v1_t": ["pid", "usedGpuMemory"],
    "nvmlProcessInfo_t": ["pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId"],
    "nvmlUtilization_t": ["gpu", "memory"],
    "nvmlProcessUtilizationSample_t": ["pid", "timeStamp", "smUtil", "memUtil", "encUtil", "decUtil"],
    "nvmlProcessDetail_v1_t": [
        "pid",
        "usedGpuMemory",
        "gpuInstanceId",
        "computeInstanceId",
        "usedGpuCcProtectedMemory",
    ],
    "nvmlProcessDetailList_v1_t": ["version", "mode", "numProcArrayEntries", "procArray"],
    "nvmlProcessUtilizationInfo_v1_t": [
        "timeStamp",
        "pid",
        "smUtil",
        "memUtil",
        "encUtil",
        "decUtil",
        "jpgUtil",
        "ofaUtil",
    ],
    "nvmlAccountingStats_t": [
        "gpuUtilization",
        "memoryUtilization",
        "maxMemoryUsage",
        "time",
        "startTime",
        "isRunning",
        "reserved",
    ],
    "nvmlProcessesUtilizationInfo_v1_t": ["version", "processSamplesCount", "lastSeenTimeStamp", "procUtilArray"],
    "nvmlSetMemoryLimits_v1_t": ["nameSpace", "softLimit", "hardLimit"],
    "nvmlGetMemoryLimits_v1_t": ["nameSpace", "softLimit", "hardLimit", "currentUsed"],
}


def enum_constants(header: Path) -> dict[str, int]:
    text = header.read_text()
    found = {}
    for name, value in re.findall(r"^\s+((?:CU|CUDA|NVML)_[A-Z0-9_]+)\s*=\s*([^,\n]+?),?\s*$", text, re.M):
        found[name] = int(eval(value, {}))  # literals and shifts only
    return found


def layout_program(include: str, structs: dict[str, list[str]]) -> str:
    lines = [include, "#include <stdio.h>", "#include <stddef.h>", "int main(void) {"]
    for t, fields in structs.items():
        lines.append(f'printf("{t} %zu\\n", sizeof({t}));')
        lines += [f'printf("{t}.{f} %zu\\n", offsetof({t}, {f}));' for f in fields]
    lines += ["return 0; }"]
    return "\n".join(lines)


def run_c(tmp_path: Path, name: str, source: str, includes: list[Path]) -> str:
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    exe = tmp_path / name
    flags = [f"-I{d}" for d in includes]
    subprocess.run(
        ["cc", "-std=c11", "-Wall", "-Werror", *flags, "-o", exe, src], check=True, capture_output=True, text=True
    )
    return subprocess.run([exe], check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize(("ours", "official"), [(OUR_CUDA, "cuda.h"), (OUR_NVML, "nvml.h")])
def test_constants_match_official_header(tmp_path, ours, official):
    inc = needs(official)
    consts = enum_constants(ours)
    assert len(consts) > 20
    checks = "\n".join(f'_Static_assert({n} == {v}, "{n} differs");' for n, v in consts.items())
    src = tmp_path / "consts.c"
    src.write_text(f"#include <{official}>\n{checks}\nint main(void) {{ return 0; }}\n")
    r = subprocess.run(["cc", "-std=c11", f"-I{inc}", "-o", tmp_path / "c", src], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    ("ours", "official", "structs"), [(OUR_CUDA, "cuda.h", CUDA_STRUCTS), (OUR_NVML, "nvml.h", NVML_STRUCTS)]
)
def test_struct_layouts_match_official_header(tmp_path, ours, official, structs):
    inc = needs(official)
    theirs = run_c(tmp_path, "theirs", layout_program(f"#include <{official}>", structs), [inc])
    mine = run_c(tmp_path, "mine", layout_program(f'#include "{ours.name}"', structs), [ours.parent])
    assert mine == theirs


def official_variants() -> dict[str, set[tuple[int, str]]]:
    # the driver API's versions: cudaTypedefs.h, and cudaProfilerTypedefs.h for cuProfiler*
    text = (needs("cudaTypedefs.h") / "cudaTypedefs.h").read_text()
    text += (needs("cudaProfilerTypedefs.h") / "cudaProfilerTypedefs.h").read_text()
    out: dict[str, set[tuple[int, str]]] = {}
    for name, ver, suffix in re.findall(r"\*PFN_(cu\w+?)_v(\d+)(_ptsz|_ptds)?\)", text):
        out.setdefault(name, set()).add((int(ver), "PTDS" if suffix else "DEFAULT"))
    return out


def test_symbol_table_matches_cuda_typedefs():
    official = official_variants()
    ours: dict[str, set[tuple[int, str]]] = {}
    for name, ver, kind, _sym in def_entries():
        ours.setdefault(name, set()).add((ver, kind))
    for name, variants in ours.items():
        assert name in official, f"{name} is not a driver API function"
        assert variants <= official[name], f"{name}: {variants - official[name]} not in cudaTypedefs.h"
        for kind in ("DEFAULT", "PTDS"):
            theirs = [v for v, k in official[name] if k == kind and v <= SIM_DRIVER_VERSION]
            mine = [v for v, k in variants if k == kind]
            if theirs:
                # callers at the simulator's version must get the newest ABI
                assert max(mine, default=None) == max(theirs), f"{name} {kind}: newest variant missing"
