"""The node agent's pieces that need no daemon: files written on the host and
put back (cli/host_files.py), links followed under a host root, the spec's
host paths, and how the runtime is restarted."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpuslice.cdi import driver_files
from gpuslice.cdi import generate as gen
from gpuslice.cli import node_agent
from gpuslice.cli.host_files import HostFiles
from gpuslice.host_root import HostPathError


def tree(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            key = str(p.relative_to(root))
            if p.is_symlink():
                out[key] = ("link", os.readlink(p))
            elif p.is_dir():
                out[key] = "dir"
            else:
                out[key] = (p.read_bytes(), p.stat().st_mode & 0o7777)
    return out


def test_what_was_written_goes_back_as_it_was_files_links_modes_and_made_directories(tmp_path):
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    (host / "etc/kept.conf").write_bytes(b"mine\n")
    (host / "etc/kept.conf").chmod(0o600)
    (host / "etc/link").symlink_to("/somewhere/else")
    before = tree(host)
    files = HostFiles(tmp_path / "state/record.json")
    assert files.put(host / "etc/kept.conf", b"ours\n", 0o644)
    assert files.put(host / "etc/link", b"ours too\n")
    assert files.put(host / "opt/gpuslice/bin/tool", b"\x7fELF", 0o755)
    assert not files.put(host / "opt/gpuslice/bin/tool", b"\x7fELF", 0o755)  # already so: nothing written
    assert (host / "etc/kept.conf").read_bytes() == b"ours\n" and not (host / "etc/link").is_symlink()
    assert files.undo() == []
    assert tree(host) == before
    assert not (tmp_path / "state/record.json").exists()


def test_a_new_recorder_after_a_kill_keeps_the_first_view(tmp_path):
    target = tmp_path / "f"
    target.write_bytes(b"original")
    record = tmp_path / "record.json"
    HostFiles(record).put(target, b"first agent")
    second = HostFiles(record)  # the first never undid: its record is read
    second.put(target, b"second agent")
    assert json.loads(record.read_text())["files"][str(target)]["before"]["kind"] == "file"
    second.undo()
    assert target.read_bytes() == b"original"


def test_a_file_edited_since_is_left_and_said(tmp_path):
    target = tmp_path / "conf"
    files = HostFiles(tmp_path / "record.json")
    files.put(target, b"ours")
    target.write_bytes(b"the admin's edit")
    assert files.undo() == [str(target)]
    assert target.read_bytes() == b"the admin's edit"


def test_links_are_followed_under_the_host_root_not_this_process_root(tmp_path):
    root = tmp_path / "host"
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.580.1").write_bytes(b"\x7fELF")
    (lib / "libnvidia-ml.so.1").symlink_to("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.1")
    (root / "lib").symlink_to("usr/lib")  # merged /usr
    assert driver_files.resolve_under(root, root / "lib/x86_64-linux-gnu/libnvidia-ml.so.1") == (
        lib / "libnvidia-ml.so.580.1"
    )
    (lib / "loop").symlink_to("loop")
    with pytest.raises(HostPathError, match="too many levels"):
        driver_files.resolve_under(root, lib / "loop")


def test_the_spec_names_host_paths_without_the_agents_mount():
    opts = gen.Options(host_root=Path("/host"), driver_root=Path("/run/nvidia/driver"))
    assert opts.driver_here == Path("/host/run/nvidia/driver")
    assert (
        opts.on_host(Path("/host/run/nvidia/driver/usr/lib/libcuda.so.1")) == "/run/nvidia/driver/usr/lib/libcuda.so.1"
    )
    with pytest.raises(HostPathError, match="not under the host root /host"):
        opts.on_host(Path("/usr/lib/libcuda.so.1"))


def test_every_component_reaches_host_paths_one_way_and_a_dotdot_never_leaves_the_root():
    """The node agent joined /host and a host path as it came: `/a/../../etc/shadow` named
    /etc/shadow of the agent's own container, outside /host. All three now use HostRoot."""
    from gpuslice.allocator.container_start import Host
    from gpuslice.cli.node_agent import Options

    escape = "/var/lib/../../../etc/shadow"
    ways = {
        "node agent": Options(host_root=Path("/host")).here(escape),
        "daemon (container starts)": Host(Path("/host")).here(Path(escape)),
        "CDI generate": gen.Options(host_root=Path("/host"), driver_root=Path(escape)).driver_here,
    }
    assert set(ways.values()) == {Path("/host/etc/shadow")}, ways
    for bad in (
        lambda: Options(host_root=Path("/host")).here("etc/x", "runtime config"),
        lambda: Host(Path("/host")).here(Path("etc/x"), "runtime config"),
    ):
        with pytest.raises(HostPathError, match=r"^runtime config etc/x: not an absolute path; accepted: a path on"):
            bad()


def test_the_runtime_is_restarted_through_the_hosts_systemd_and_a_failure_is_one_line(tmp_path):
    ran: list[list[str]] = []

    def run(cmd, **kw):  # type: ignore[no-untyped-def]
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "Failed to restart crio.service: Unit not found.\n")

    opts = node_agent.Options(host_root=tmp_path, runtime="crio", state_dir=tmp_path / "state")
    agent = node_agent.NodeAgent(opts, run)
    with pytest.raises(node_agent.AgentError, match=r"exit 1: Failed to restart crio\.service: Unit not found\.$"):
        agent.restart_runtime()
    assert ran == [["nsenter", "--target", "1", "--mount", "--", "systemctl", "restart", "crio.service"]]


@pytest.mark.parametrize("runtime", ["docker", "podman", "runc"])
def test_a_runtime_the_agent_does_not_configure_is_refused_in_one_line(tmp_path, runtime):
    with pytest.raises(node_agent.AgentError, match="accepted: containerd, crio, none"):
        node_agent.NodeAgent(node_agent.Options(host_root=tmp_path, runtime=runtime, state_dir=tmp_path))


def test_the_node_agent_records_the_runtimes_configuration_with_its_parts_in_one_record(tmp_path):
    """One recorder: the runtime's configuration the agent writes (through
    `gpuslice install`'s plan) is in the agent's record beside its parts; a
    record an older agent's install kept is taken over; undo restores all."""
    host = tmp_path / "host"
    cfg = host / "etc/crio/crio.conf.d"
    cfg.mkdir(parents=True)
    (cfg / "00-default.conf").write_text("[crio]\n")
    before = {p: p.read_bytes() for p in host.rglob("*") if p.is_file()}
    state = host / "var/lib/gpuslice"
    opts = node_agent.Options(host_root=host, runtime="crio", runtime_restart="none", state_dir=state)
    old = state / "install" / "crio.json"  # an older agent's install record, of a file since gone
    old.parent.mkdir(parents=True)
    old.write_text(
        json.dumps({"before": {str(host / "etc/old.conf"): None}, "wrote": {str(host / "etc/old.conf"): "x"}})
    )
    agent = node_agent.NodeAgent(opts, lambda *a, **k: subprocess.CompletedProcess(a, 0, "", ""))
    agent.install_parts()
    agent.configure_runtime()
    record = json.loads((state / node_agent.RECORD).read_text())["files"]
    written = [p for p in record if p.startswith(str(host / "etc/crio"))]
    assert written and any(p.startswith(str(host / "opt/gpuslice")) for p in record), sorted(record)
    assert str(host / "etc/old.conf") in record and not old.exists()  # taken over
    agent.runtime_configured = True
    agent.undo()
    assert {p: p.read_bytes() for p in host.rglob("*") if p.is_file()} == before
