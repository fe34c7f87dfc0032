"""The interposer's ABI: its prototypes against NVIDIA's headers, its export
list against cuda.h/nvml.h, and cuGetProcAddress handing out the hook of
exactly the variant the driver chose."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gpuslice_sim
from gpuslice.paths import native_dir
from tests.harness import REPO
from tests.harness.interposer import Slice
from tests.harness.machine import Agent, needs_root
from tests.harness.nvidia import def_entries, needs

ROOT = REPO
WRAP = ROOT / "libcuda_wrap"
# hooks the simulator's table does not list: the CUDA version of their PFN typedef
EXTRA_PFN = {
    "cuMemAllocPitch": "PFN_cuMemAllocPitch_v2000",
    "cuArrayCreate": "PFN_cuArrayCreate_v2000",
    "cuArray3DCreate": "PFN_cuArray3DCreate_v2000",
    "cuImportExternalMemory": "PFN_cuImportExternalMemory_v10000",
    "cuDestroyExternalMemory": "PFN_cuDestroyExternalMemory_v10000",
    "cuIpcOpenMemHandle": "PFN_cuIpcOpenMemHandle_v4010",
    "cuIpcOpenMemHandle_v2": "PFN_cuIpcOpenMemHandle_v11000",
    "cuIpcCloseMemHandle": "PFN_cuIpcCloseMemHandle_v4010",
    "cuGraphAddMemAllocNode": "PFN_cuGraphAddMemAllocNode_v11040",
    "cuMemPoolImportPointer": "PFN_cuMemPoolImportPointer_v11020",
    "cuMulticastCreate": "PFN_cuMulticastCreate_v12010",
    "cuLaunchCooperativeKernelMultiDevice": "PFN_cuLaunchCooperativeKernelMultiDevice_v9000",
    "cuLaunch": "PFN_cuLaunch_v2000",
    "cuLaunchGrid": "PFN_cuLaunchGrid_v2000",
    "cuLaunchGridAsync": "PFN_cuLaunchGridAsync_v2000",
    "cuGraphInstantiateWithParams": "PFN_cuGraphInstantiateWithParams_v12000",
    "cuGraphInstantiateWithParams_ptsz": "PFN_cuGraphInstantiateWithParams_v12000_ptsz",
}


def hooks() -> list[str]:
    return re.findall(r"^HOOK\((\w+)\)$", (WRAP / "wrap/intercepts.def").read_text(), re.M)


def pfn_of(symbol: str) -> str:
    for name, ver, kind, sym in def_entries():
        if sym == symbol:
            suffix = "_ptds" if sym.endswith("_ptds") else "_ptsz" if kind == "PTDS" else ""
            return f"PFN_{name}_v{ver}{suffix}"
    return EXTRA_PFN[symbol]


def our_prototypes(source: str, exports: str, tmp_path: Path) -> dict[str, str]:
    aux = tmp_path / "aux.txt"
    subprocess.run(
        ["cc", "-std=c11", f"-I{WRAP / 'include'}", f"-I{WRAP / 'symbols'}", f"-I{ROOT / 'gpuslice/csrc'}",
         f"-DEXPORTS=\"{exports}\"", "-aux-info", str(aux), "-fsyntax-only", str(WRAP / "wrap" / source)],
        check=True,
    )  # fmt: skip
    protos = {}
    for line in aux.read_text().splitlines():
        m = re.match(rf"/\* {re.escape(str(WRAP / 'wrap' / source))}:\d+:NF \*/ extern (.+?\((.*?)\));", line)
        if m:
            name = re.search(r"(\w+) \(", m.group(1)).group(1)
            protos[name] = m.group(1)
    return protos


def compiles(lines: list[str], inc: Path, define: str, src: Path) -> None:
    """The checks in `lines` compile against NVIDIA's headers in `inc`."""
    src.write_text("\n".join(lines) + "\n")
    r = subprocess.run(
        ["cc", "-std=gnu11", define, f"-I{inc}", "-fsyntax-only", str(src)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]


def test_hooks_match_the_toolkit_prototypes(tmp_path):
    inc = needs("cudaTypedefs.h")
    protos = {}
    for src in ("memory.c", "vmm.c", "context.c", "gate.c", "procaddr.c"):
        protos |= our_prototypes(src, "cuda_exports.def", tmp_path)
    lines = ["#include <cuda.h>", "#include <cudaTypedefs.h>"]
    assert len(hooks()) >= 20, hooks()  # an empty list would check nothing
    for hook in hooks():
        decl = protos[hook].replace(f"{hook} (", f"ours_{hook} (", 1)
        lines.append(f"{decl};")
        lines.append(
            f'_Static_assert(__builtin_types_compatible_p(__typeof__(&ours_{hook}), {pfn_of(hook)}), "{hook}");'
        )
    compiles(lines, inc, "-D__CUDA_API_VERSION_INTERNAL", tmp_path / "check.c")


def test_nvml_hooks_match_nvml_h(tmp_path):
    inc = needs("nvml.h")
    protos = our_prototypes("nvml.c", "nvml_exports.def", tmp_path)
    protos |= our_prototypes("nvml_processes.c", "nvml_exports.def", tmp_path)
    official = (inc / "nvml.h").read_text()
    lines = ["#include <nvml.h>"]
    for name, decl in protos.items():
        if not re.search(rf"\b{name}\s*\(", official):
            continue
        lines.append(decl.replace(f"{name} (", f"ours_{name} (", 1) + ";")
        lines.append(
            f'_Static_assert(__builtin_types_compatible_p(__typeof__(&ours_{name}), __typeof__(&{name})), "{name}");'
        )
    # the legacy (unversioned) entry points are declared only with this set
    compiles(lines, inc, "-DNVML_NO_UNVERSIONED_FUNC_DEFS", tmp_path / "check_nvml.c")
    assert len(lines) > 10


@pytest.mark.parametrize(("header", "listing"), [("cuda.h", "cuda_exports.def"), ("nvml.h", "nvml_exports.def")])
def test_export_lists_cover_the_official_headers(header, listing):
    needs(header)
    import tools.gen_exports as gen

    ours = set(re.findall(r"^FWD\((\w+)\)$", (WRAP / "symbols" / listing).read_text(), re.M))
    missing = set(gen.exported(header)) - ours
    assert not missing, f"{listing} lacks {sorted(missing)[:10]}: run tools/gen_exports.py"


def test_every_export_is_in_the_library():
    names = set(re.findall(r"^FWD\((\w+)\)$", (WRAP / "symbols/cuda_exports.def").read_text(), re.M))
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(native_dir() / "wrap/libcuda.so.1")], capture_output=True, text=True
    ).stdout
    exported = {line.split()[-1]: line.split()[-2] for line in out.splitlines()}
    assert names <= set(exported)
    # intercepted functions are strong, the rest are the weak trampolines
    assert {n for n, t in exported.items() if t == "T"} == set(hooks())


def test_missing_symbols_answer_not_found(make_machine):
    """A driver older than cuda.h (here: a library without these functions)
    lacks some: the interposer answers CUDA_ERROR_NOT_FOUND, no crash. The
    simulator exports every cuda.h function: one it does not model answers
    CUDA_ERROR_NOT_SUPPORTED through the interposer."""
    m = make_machine()
    code = (
        "import ctypes\nlib = ctypes.CDLL('libcuda.so.1')\n"
        "print(lib.cuDeviceGetLuid(None, None, 0), lib.cuMemPrefetchAsync_v2(0, 0, 0, 0, 0))\n"
    )
    for driver, answer in (("libnvidia-ml.so.1", "500"), ("libcuda.so.1", "801")):
        env = {**wrapped_env_for_machine(m), "GPUSLICE_ALLOW_UNSLICED": "1",
               "GPUSLICE_REAL_LIBCUDA": str(gpuslice_sim.lib_dir() / driver)}  # fmt: skip
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.stdout.split() == [answer, answer], (driver, r.stderr)


def wrapped_env_for_machine(m) -> dict[str, str]:
    return {
        **m.env,
        "LD_LIBRARY_PATH": str(native_dir() / "wrap"),
        "GPUSLICE_REAL_LIBCUDA": str(gpuslice_sim.lib_dir() / "libcuda.so.1"),
        "GPUSLICE_REAL_LIBNVML": str(gpuslice_sim.lib_dir() / "libnvidia-ml.so.1"),
    }


@needs_root
def test_get_proc_address_hands_out_the_hook_of_the_drivers_variant(daemon, containers):
    s = Slice(daemon, containers, "1Gi")
    a = Agent(s.env, prefix=s.box.command([]))
    try:
        a.call("init")
        entries = def_entries()
        syms = [e[3] for e in entries]
        ours = a.call("dlsym", names=syms)
        real = a.call("dlsym", names=syms, path=str(gpuslice_sim.lib_dir() / "libcuda.so.1"))
        hooked = set(hooks())
        newest: dict[tuple[str, str], int] = {}
        for name, ver, kind, _ in entries:
            newest[(name, kind)] = max(ver, newest.get((name, kind), 0))
        checked = 0
        for name, ver, kind, sym in entries:
            if kind == "PTDS" and ver != newest[(name, kind)]:
                continue
            got = a.call("procaddr", symbol=name, version=ver, flags=2 if kind == "PTDS" else 0)
            want = ours[sym] if sym in hooked else real[sym]
            assert got["pfn"] == want, f"{name}@{ver} {kind}: expected {'our hook' if sym in hooked else 'the driver'}"
            checked += sym in hooked
        assert checked >= 20
    finally:
        a.close()


# The interposer's stand-in for a name the driver lacks (real.c), per library.
STUB_ANSWER = {"cuda_exports.def": "500", "nvml_exports.def": "13"}


@pytest.mark.parametrize(
    ("listing", "library", "init"),
    [("cuda_exports.def", "libcuda.so.1", "cuInit"), ("nvml_exports.def", "libnvidia-ml.so.1", "nvmlInit_v2")],
)
def test_no_export_answers_not_found_where_the_driver_answers(make_machine, tmp_path, listing, library, init):
    """Every export, called with zero arguments through the interposer and
    straight on the simulator: the interposer's "not found" (CUDA 500, NVML
    13, its stand-in for a name the driver lacks) appears only where the
    driver gives the same answer.  Clients pick an API by the names a library
    exports (nvitop takes nvmlDeviceGetTemperatureV when it exists), so a
    stand-in where the driver has the function is worse than no interposer."""
    names = re.findall(r"^FWD\((\w+)\)$", (WRAP / "symbols" / listing).read_text(), re.M)
    listed = tmp_path / "names.txt"
    listed.write_text("\n".join(names))
    m = make_machine()
    walker = [sys.executable, "-m", "tests.harness.export_walk"]

    def answers(lib: str, env: dict[str, str]) -> dict[str, str]:
        r = subprocess.run([*walker, lib, init, str(listed)], env=env, cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    driver = answers(str(gpuslice_sim.lib_dir() / library), m.env)
    wrapped = answers(
        str(native_dir() / "wrap" / library), {**wrapped_env_for_machine(m), "GPUSLICE_ALLOW_UNSLICED": "1"}
    )
    stub = STUB_ANSWER[listing]
    worse = {n: (driver[n], wrapped[n]) for n in names if wrapped[n] == stub and driver[n] != stub}
    assert not worse, f"{len(worse)} answer {stub} where the driver answers otherwise: {sorted(worse.items())[:12]}"
    assert sum(driver[n] != "absent" for n in names) == len(names), "the simulator lacks names the header declares"


def test_temperature_through_pynvml_is_the_drivers(make_machine):
    """nvmlDeviceGetTemperatureV (NVML 13's form; the unversioned one is
    deprecated there) reads the same through the interposer as straight on
    the simulator."""
    m = make_machine()
    code = (
        "import pynvml\npynvml.nvmlInit()\nh = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
        "print(pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),"
        " pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))\n"
    )
    seen = []
    for env in (m.env, {**wrapped_env_for_machine(m), "GPUSLICE_ALLOW_UNSLICED": "1"}):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        seen.append(r.stdout.split())
    assert seen[0] == seen[1] and seen[0][0] == seen[0][1] and int(seen[0][0]) > 0, seen


OLD_NVML = """
typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
static int device;
nvmlReturn_t nvmlInit_v2(void) { return 0; }
nvmlReturn_t nvmlShutdown(void) { return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) { *d = &device; return i ? 2 : 0; }
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned *t)
{ if (d != &device || sensor || !t) return 2; *t = 41; return 0; }
"""


def test_temperature_v_on_a_driver_without_it(tmp_path):
    """A driver from before nvmlDeviceGetTemperatureV (a stand-in with the
    unversioned call only): through the interposer, which exports the V name,
    the V call answers from the unversioned one, as a client that takes the V
    form because the name exists expects."""
    (tmp_path / "old.c").write_text(OLD_NVML)
    old = tmp_path / "libnvidia-ml.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(old), str(tmp_path / "old.c")], check=True)
    code = (
        "import ctypes\nlib = ctypes.CDLL('libnvidia-ml.so.1')\nassert lib.nvmlInit_v2() == 0\n"
        "d = ctypes.c_void_p()\nassert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(d)) == 0\n"
        "t = (ctypes.c_uint * 3)(12 | (1 << 24), 0, 0)\n"
        "print(lib.nvmlDeviceGetTemperatureV(d, t), t[2])\n"
        "t[0] = 8 | (1 << 24)\nprint(lib.nvmlDeviceGetTemperatureV(d, t))\n"
    )
    env = {**os.environ, "LD_LIBRARY_PATH": str(native_dir() / "wrap"), "GPUSLICE_ALLOW_UNSLICED": "1",
           "GPUSLICE_REAL_LIBNVML": str(old)}  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["0", "41", "25"], r.stdout
