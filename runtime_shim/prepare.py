"""What `gpuslice-runtime create` (runtime_shim/gpuslice_runtime.c) asks the
daemon to do to a bundle, on its runtime socket: a container whose
annotations ask for a slice gets it reserved, and the CDI edits of the GPUs
the daemon placed, and the hook, applied to its config.json (written
atomically).  A container that asks for nothing is left byte for byte as it
was."""

from __future__ import annotations

import json
from pathlib import Path

from gpuslice.allocator.slices import SliceManager
from gpuslice.cdi import spec as cdi_spec
from gpuslice.cdi.apply import apply_devices

from gpuslice import request
from gpuslice.atomic_file import write_text_atomically


class ShimError(Exception):
    pass


def load_spec(explicit: str = "") -> dict:
    paths = [Path(explicit)] if explicit else cdi_spec.find_specs()
    if not paths:
        raise ShimError(f"no CDI spec of kind {cdi_spec.KIND} in /etc/cdi or /var/run/cdi (run: gpuslice cdi generate)")
    try:  # validated when it was generated; a start should not pay for it again
        return json.loads(paths[0].read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ShimError(f"{paths[0]}: cannot read the CDI spec: {e}") from e


def prepare(bundle: Path, container_id: str, slices: SliceManager, spec_path: str = "") -> bool:
    """Give the container its slice; False when it asks for none."""
    if not bundle.is_absolute():
        raise ShimError(f"bundle {bundle}: not an absolute path")
    config_path = bundle / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ShimError(f"create {container_id}: cannot read {config_path}: {e}") from e
    ours = {k: v for k, v in config.get("annotations", {}).items() if k.startswith(request.PREFIX)}
    if not ours:
        return False
    request.parse(ours)  # the one line for bad annotations, before anything is reserved
    spec = load_spec(spec_path)
    placed = slices.reserve(container_id, ours, owner="runtime-shim")
    try:
        apply_devices(config, spec, [a.gpu_uuid for a in placed.allocations])
        write_text_atomically(config_path, json.dumps(config), config_path.stat().st_mode & 0o777)
    except BaseException:
        slices.release(container_id)
        raise
    return True
