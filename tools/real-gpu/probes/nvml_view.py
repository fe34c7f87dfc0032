"""What NVML and nvidia-smi show inside a slice (the kit runs this beside a
process that holds memory in the same slice). No CUDA context of its own.

For nvidia-smi every form the kit checks is run and kept whole (exit status,
output's tail), with the names the driver's NVML exports that the slice's
NVML does not: nvidia-smi loads libnvidia-ml.so.1 at run time and needs its
whole symbol set (on the H200 it failed in a slice, and why was lost)."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess

import pynvml
from common import main

SMI_FORMS = {
    "plain": [],
    "query-gpu": ["--query-gpu=memory.total,memory.used,driver_version", "--format=csv,noheader,nounits"],
    "query-apps": ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
    "memory": ["-q", "-d", "MEMORY"],
}


def nvml() -> dict:
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        version = pynvml.nvmlSystemGetDriverVersion()
        return {"count": pynvml.nvmlDeviceGetCount(), "total": mem.total, "used": mem.used, "free": mem.free,
                "processes": [{"pid": p.pid, "used": p.usedGpuMemory} for p in procs],
                "driver": version.decode() if isinstance(version, bytes) else version}  # fmt: skip
    finally:
        pynvml.nvmlShutdown()


def exports(path: str) -> set[str]:
    """The function names an ELF64 shared library defines in its dynamic symbol table."""
    with open(path, "rb") as f:
        data = f.read()
    shoff, shentsize, shnum = struct.unpack_from("<Q", data, 0x28)[0], *struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for sh in sections:
        if sh[1] != 11:  # SHT_DYNSYM
            continue
        strtab = sections[sh[6]]
        for off in range(sh[4], sh[4] + sh[5], 24):
            st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", data, off)
            if st_shndx and st_info & 0xF == 2:  # defined, STT_FUNC
                end = data.index(b"\0", strtab[4] + st_name)
                names.add(data[strtab[4] + st_name : end].decode())
    return names


def missing_exports() -> list[str] | str:
    """What the driver's NVML exports and the slice's (the interposer's) does not."""
    real, ours = os.environ.get("GPUSLICE_REAL_LIBNVML", ""), None
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if d and os.path.exists(os.path.join(d, "libnvidia-ml.so.1")):
            ours = os.path.join(d, "libnvidia-ml.so.1")
            break
    if not real or not ours:
        return "no driver NVML or no interposer on the library path"
    try:
        return sorted(exports(os.path.realpath(real)) - exports(os.path.realpath(ours)))
    except (OSError, ValueError, struct.error) as e:
        return f"unreadable: {e}"


def smi() -> dict | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    runs = {}
    for form, args in SMI_FORMS.items():
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
        runs[form] = {"rc": r.returncode, "out": r.stdout[-1500:], "err": r.stderr[-500:]}
    out: dict = {"runs": runs, "missing_exports": missing_exports()}
    gpu, apps = runs["query-gpu"], runs["query-apps"]
    if gpu["rc"] == 0 and gpu["out"].strip():
        total, used, driver = (x.strip() for x in gpu["out"].splitlines()[0].split(","))
        out.update(total_mib=int(total), used_mib=int(used), driver=driver)
    if apps["rc"] == 0:
        out["processes"] = [
            {"pid": int(p), "used_mib": int(u)}
            for p, u in (line.split(",") for line in apps["out"].splitlines() if line.strip())
        ]
    m = re.search(r"FB Memory Usage\s+Total\s+:\s+(\d+) MiB", runs["memory"]["out"])
    if m:
        out["q_total_mib"] = int(m.group(1))
    return out


if __name__ == "__main__":
    main(lambda argv: {"nvml": nvml(), "nvidia_smi": smi()})
