"""`gpuslice-runtime`: an OCI runtime in front of runc/crun.

Every verb but `create` is handed to the real runtime unchanged (the same
argv, so the same exit status and logs).  On `create`, a container whose
annotations ask for a slice gets it reserved, the CDI edits of the GPUs the
daemon placed and the hook applied to its config.json (written atomically),
and then the real runtime runs.  A container that asks for nothing is left
byte for byte as it was."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gpuslice.cdi import spec as cdi_spec
from gpuslice.cdi.apply import apply_devices

from gpuslice import request

RUNTIME_ENV = "GPUSLICE_RUNTIME"  # the real runtime: a path or a name on PATH
SPEC_ENV = "GPUSLICE_CDI_SPEC"  # the CDI spec to apply (default: the one in /etc/cdi or /var/run/cdi)
GLOBAL_WITH_VALUE = {"--root", "--log", "--log-format", "--criu", "--rootless"}
CREATE_WITH_VALUE = {"--bundle", "-b", "--console-socket", "--pid-file", "--preserve-fds"}


class ShimError(Exception):
    pass


def real_runtime() -> str:
    wanted = os.environ.get(RUNTIME_ENV, "runc")
    me = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    candidates = [wanted] if "/" in wanted else [p for p in (shutil.which(wanted),) if p]
    for c in candidates:
        if Path(c).resolve() != me:
            return c
    raise ShimError(f"cannot find the real runtime {wanted!r} (set {RUNTIME_ENV})")


def parse_argv(argv: list[str]) -> tuple[dict[str, str], str | None, dict[str, str], list[str]]:
    """(global options, command, command options, positionals) of a runc command line."""
    glob: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        key, _, val = argv[i].partition("=")
        if key in GLOBAL_WITH_VALUE and not val and i + 1 < len(argv):
            val = argv[i + 1]
            i += 1
        glob[key] = val
        i += 1
    if i >= len(argv):
        return glob, None, {}, []
    command, opts, pos = argv[i], {}, []
    i += 1
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and a != "-":
            key, _, val = a.partition("=")
            if key in CREATE_WITH_VALUE and not val and i + 1 < len(argv):
                val = argv[i + 1]
                i += 1
            opts[key] = val
        else:
            pos.append(a)
        i += 1
    return glob, command, opts, pos


def write_atomically(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".config.json.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_spec() -> dict:
    explicit = os.environ.get(SPEC_ENV)
    paths = [Path(explicit)] if explicit else cdi_spec.find_specs()
    if not paths:
        raise ShimError(f"no CDI spec of kind {cdi_spec.KIND} in /etc/cdi or /var/run/cdi (run: gpuslice cdi generate)")
    try:  # validated when it was generated; a start should not pay for it again
        return json.loads(paths[0].read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ShimError(f"{paths[0]}: cannot read the CDI spec: {e}") from e


def prepare(bundle: Path, container_id: str, client_factory=None) -> bool:  # type: ignore[no-untyped-def]
    """Give the container its slice; False when it asks for none."""
    config_path = bundle / "config.json"
    config = json.loads(config_path.read_text())
    ours = {k: v for k, v in config.get("annotations", {}).items() if k.startswith(request.PREFIX)}
    if not ours:
        return False
    request.parse(ours)  # the one line for bad annotations, before anything is reserved
    spec = load_spec()
    if client_factory is None:
        from gpuslice.client import AllocatorClient as client_factory
    with client_factory(timeout=10) as client:
        placed = client.reserve(container_id, ours, owner="runtime-shim")
        try:
            apply_devices(config, spec, [g.uuid for g in placed.gpus])
            write_atomically(config_path, config)
        except BaseException:
            client.release(container_id)
            raise
    return True


def report(glob: dict[str, str], message: str) -> None:
    """One line on stderr, and in runc's log file and format when given one."""
    print(f"gpuslice-runtime: {message}", file=sys.stderr)
    log = glob.get("--log")
    if log:
        line = (
            json.dumps(
                {
                    "level": "error",
                    "msg": f"gpuslice-runtime: {message}",
                    "time": time.strftime("%FT%TZ", time.gmtime()),
                }
            )
            if glob.get("--log-format") == "json"
            else f"gpuslice-runtime: {message}"
        )
        try:
            with open(log, "a") as f:
                f.write(line + "\n")
        except OSError:
            pass


def main() -> None:
    argv = sys.argv[1:]
    glob, command, opts, pos = parse_argv(argv)
    try:
        runtime = real_runtime()
        if command == "create" and pos:
            bundle = Path(opts.get("--bundle") or opts.get("-b") or ".")
            prepare(bundle.resolve(), pos[-1])
    except (ShimError, request.RequestError, cdi_spec.SpecError, KeyError, OSError, ValueError) as e:
        report(glob, str(e).strip("'\""))
        sys.exit(1)
    except Exception as e:  # grpc.RpcError, imported lazily with the client
        if not hasattr(e, "details"):
            raise
        report(glob, f"create {pos[-1] if pos else ''}: {e.details()}")
        sys.exit(1)
    os.execv(runtime, [runtime, *argv])


if __name__ == "__main__":
    main()
