"""What NVML and nvidia-smi show inside a slice (the kit runs this beside a
process that holds memory in the same slice). No CUDA context of its own."""

from __future__ import annotations

import shutil
import subprocess

import pynvml
from common import main


def nvml() -> dict:
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        return {"count": pynvml.nvmlDeviceGetCount(), "total": mem.total, "used": mem.used, "free": mem.free,
                "processes": [{"pid": p.pid, "used": p.usedGpuMemory} for p in procs]}  # fmt: skip
    finally:
        pynvml.nvmlShutdown()


def smi() -> dict | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    gpu = subprocess.run([exe, "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    apps = subprocess.run([exe, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    if gpu.returncode or apps.returncode:
        return {"error": (gpu.stderr or apps.stderr or gpu.stdout).strip()[-300:]}
    total, used = (int(x) for x in gpu.stdout.splitlines()[0].split(","))
    procs = [line.split(",") for line in apps.stdout.splitlines() if line.strip()]
    return {"total_mib": total, "used_mib": used,
            "processes": [{"pid": int(p), "used_mib": int(u)} for p, u in procs]}  # fmt: skip


if __name__ == "__main__":
    main(lambda argv: {"nvml": nvml(), "nvidia_smi": smi()})
