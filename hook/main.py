"""`gpuslice-hook createRuntime|poststop`: the OCI hook.

createRuntime (runtime namespace, container created, not started): reads the
state on stdin and config.json from the bundle, and makes sure the container
holds a slice bound to its init process: reserved already by the runtime
shim, or reserved here from the annotations and the GPUs CDI injected.  Any
failure aborts creation with one line and leaves nothing reserved.
poststop: releases the slice (failures are only warnings to runtimes; the
daemon's sweep reclaims what is left)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from gpuslice import request

INJECTED = re.compile(r"^GPUSLICE_DEVICE_(\d+)=(.+)$")


class HookError(Exception):
    pass


def injected_devices(config: dict) -> list[str]:
    """UUIDs of the GPUs CDI injected (their devices' env entries)."""
    found = sorted(
        (int(m.group(1)), m.group(2)) for e in config.get("process", {}).get("env", []) if (m := INJECTED.match(e))
    )
    return [uuid for _, uuid in found]


def requested(config: dict, state: dict) -> dict[str, str] | None:
    annotations = {**config.get("annotations", {}), **(state.get("annotations") or {})}
    ours = {k: v for k, v in annotations.items() if k.startswith(request.PREFIX)}
    devices = injected_devices(config)
    if devices:
        pinned = ours.get(request.DEVICE)
        if pinned and set(pinned.split(",")) != set(devices):
            raise HookError(
                f'annotation {request.DEVICE}: "{pinned}" differs from the GPUs the CDI devices injected '
                f"({','.join(devices)})"
            )
        ours[request.DEVICE] = ",".join(devices)
        ours.setdefault(request.GPUS, str(len(devices)))
    return ours or None


def create_runtime(state: dict, client) -> None:  # type: ignore[no-untyped-def]
    import grpc

    cid, pid = state["id"], int(state["pid"])
    config = json.loads((Path(state["bundle"]) / "config.json").read_text())
    try:
        client.get(cid)
        reserved_here = False  # the runtime shim reserved it
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.NOT_FOUND:
            raise
        ours = requested(config, state)
        if ours is None:
            return  # the container asks for no GPU
        request.parse(ours)  # bad annotations fail here, with the parser's one line
        client.reserve(cid, ours, owner="hook")
        reserved_here = True
    try:
        client.bind(cid, pid)
    except grpc.RpcError:
        if reserved_here:
            client.release(cid)
        raise


LD_CONF = "etc/ld.so.conf.d/00-gpuslice.conf"
LIB_DIRS = ("/usr/lib/gpuslice/wrap", "/usr/lib/gpuslice/driver")


def update_ldcache(state: dict) -> None:
    """createContainer: make the container's loader cache point at the
    interposer first, for programs that drop LD_LIBRARY_PATH.  Best effort:
    an image without a writable /etc keeps LD_LIBRARY_PATH alone."""
    config = json.loads((Path(state["bundle"]) / "config.json").read_text())
    root = (
        Path(state["bundle"]) / config["root"]["path"]
        if not config["root"]["path"].startswith("/")
        else Path(config["root"]["path"])
    )
    conf = root / LD_CONF
    try:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("\n".join(LIB_DIRS) + "\n")
        # the directories on the command line too: many images have no /etc/ld.so.conf
        ldconfig = shutil.which("ldconfig", path="/sbin:/usr/sbin:/bin:/usr/bin") or "ldconfig"
        subprocess.run([ldconfig, "-r", str(root), *LIB_DIRS], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as e:
        print(
            f"gpuslice-hook: update-ldcache skipped ({e}); LD_LIBRARY_PATH still finds the interposer", file=sys.stderr
        )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ("createRuntime", "poststop", "update-ldcache"):
        print(
            "gpuslice-hook: usage: gpuslice-hook createRuntime|poststop|update-ldcache (OCI state on stdin)",
            file=sys.stderr,
        )
        return 2
    try:
        state = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        print(f"gpuslice-hook: the OCI state on stdin is not JSON: {e}", file=sys.stderr)
        return 1
    if args[0] == "update-ldcache":
        update_ldcache(state)
        return 0
    # imported here: update-ldcache runs in every container start and needs none of it
    import grpc

    from gpuslice.client import AllocatorClient

    with AllocatorClient(timeout=10) as client:
        try:
            if args[0] == "createRuntime":
                create_runtime(state, client)
            else:
                client.release(state["id"])
        except (HookError, request.RequestError) as e:
            print(f"gpuslice-hook: {e}", file=sys.stderr)
            return 1
        except grpc.RpcError as e:
            print(f"gpuslice-hook: {args[0]} for container {state.get('id')}: {e.details()}", file=sys.stderr)
            return 0 if args[0] == "poststop" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
