"""Where NVIDIA's official headers are (PyPI nvidia-cuda-runtime, nvidia-nvml-dev)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def include_dir(header: str) -> Path | None:
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        for candidate in sorted(Path(root).glob(f"*/include/{header}")):
            return candidate.parent
    for d in (Path("/usr/local/cuda/include"), Path("/usr/include")):
        if (d / header).exists():
            return d
    return None
