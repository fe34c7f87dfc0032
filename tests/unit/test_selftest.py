"""`gpuslice selftest`'s pure parts: container paths back to host files, and
the verdict of a set of checks."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from gpuslice.cdi import spec as cdi_spec
from gpuslice.cli.selftest_node import in_view, view_links
from gpuslice.cli.selftest_report import Check, all_passed, render
from gpuslice.cli.selftest_slices import _launch_overhead
from gpuslice.proto import kubelet_podresources_v1_pb2 as pr
from gpuslice.proto import kubelet_podresources_v1_pb2_grpc as pr_grpc


def test_the_containers_paths_lead_to_the_host_files_mounted_there(tmp_path):
    host = tmp_path / "host"
    (host / "wrap").mkdir(parents=True)
    (host / "wrap/libcuda.so.1").write_text("interposer")
    (host / "slice").mkdir()
    mounts = (
        cdi_spec.Mount(str(host / "wrap/libcuda.so.1"), "/usr/lib/gpuslice/wrap/libcuda.so.1"),
        cdi_spec.Mount(str(host / "slice"), "/run/gpuslice/slice"),
    )
    view = tmp_path / "view"
    view_links(view, mounts)
    lib_dir = in_view(view, "/usr/lib/gpuslice/wrap")
    assert (Path(lib_dir) / "libcuda.so.1").read_text() == "interposer"
    socket = in_view(view, "/run/gpuslice/slice/slice.sock")  # not made yet: its directory is mounted
    assert Path(socket).parent.resolve() == host / "slice"
    assert in_view(view, "/opt/elsewhere/lib") == "/opt/elsewhere/lib"  # nothing mounted there
    assert in_view(view, "relative") == "relative"


def test_informative_rows_neither_pass_nor_fail():
    fact = Check("runtimes", "as installed", "none configured", None)
    good = Check("daemon", "serving", "SERVING", True)
    bad = Check("GPU 0 mem to the limit", "OOM after 1", "no error after 2", False)
    assert all_passed([fact, good]) and not all_passed([fact, good, bad]) and not all_passed([])
    table = render([fact, good, bad])
    assert table.splitlines()[1].endswith("INFO") and table.splitlines()[3].endswith("FAIL")
    assert table.endswith("1 of 2 checks passed")


class _Kubelet(pr_grpc.PodResourcesListerServicer):
    def __init__(self, names: list[str]) -> None:
        self.names = names

    def GetAllocatableResources(self, request, context):
        return pr.AllocatableResourcesResponse(
            devices=[pr.ContainerDevices(resource_name=n, device_ids=["x"]) for n in self.names]
        )


@pytest.mark.parametrize(
    ("names", "verdict"),
    [(["gpuslice.io/memory", "nvidia.com/gpu"], "FAIL"), (["gpuslice.io/memory", "gpuslice.io/cores"], "PASS")],
)
def test_the_selftest_fails_a_node_whose_kubelet_also_advertises_nvidias_gpus(tmp_path, names, verdict):
    from gpuslice.cli.selftest_node import kubelet_resources

    assert kubelet_resources(tmp_path / "absent.sock") is None  # no kubelet: no row
    server = grpc.server(futures.ThreadPoolExecutor(2))
    pr_grpc.add_PodResourcesListerServicer_to_server(_Kubelet(names), server)
    sock = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        check = kubelet_resources(sock)
    finally:
        server.stop(0)
    assert check is not None and check.verdict == verdict
    assert ("nvidia.com/gpu" in check.observed) == (verdict == "FAIL")


def test_the_container_view_mounts_the_spec_then_hides_the_hosts_driver(tmp_path):
    from gpuslice.cdi.driver_files import DriverFiles
    from gpuslice.cli import container_view

    libdir = tmp_path / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    for name in ("libcuda.so.580.1", "libnvidia-ml.so.580.1", "libnvidia-ptxjitcompiler.so.580.1", "libc.so.6",
                 "libEGL_nvidia.so.580.1", "libyaml-0.so.2"):  # fmt: skip
        (libdir / name).write_bytes(b"\x7fELF")
    (libdir / "libcuda.so.1").symlink_to("libcuda.so.580.1")
    files = DriverFiles(libdir / "libcuda.so.580.1", libdir / "libnvidia-ml.so.580.1")
    hide, dirs = container_view.host_driver(files, simulated=False, root=tmp_path)
    assert [Path(p).name for p in hide] == ["libEGL_nvidia.so.580.1", "libcuda.so.580.1", "libnvidia-ml.so.580.1",
                                            "libnvidia-ptxjitcompiler.so.580.1"] and dirs == []  # fmt: skip
    view = container_view.View(
        tmp_path / "view", ((str(libdir / "libcuda.so.580.1"), "/usr/lib/gpuslice/driver/libcuda.so.1"),), tuple(hide)
    )
    lines = container_view.script(view).splitlines()
    binds = [i for i, ln in enumerate(lines) if ln.startswith("mount --bind ") and "/dev/null" not in ln]
    masks = [i for i, ln in enumerate(lines) if ln.startswith("mount --bind /dev/null ")]
    assert len(binds) == 1 and len(masks) == 4 and max(binds) < min(masks)  # the spec's files first
    sim_hide, sim_dirs = container_view.host_driver(files, simulated=True)
    assert sim_hide == [] and sim_dirs == [str(libdir)]


class ScriptedBox:
    """A slice's worker that answers `launches` with the next scripted ns per launch, interposed or
    direct by whether the run names the driver's libcuda (as the selftest's direct runs do)."""

    def __init__(self, gated: list[float], direct: list[float]) -> None:
        self.env: dict[str, str] = {}
        self.gated, self.direct = list(gated), list(direct)
        self.name = "scripted"

    def run(self, command: str, *args: str, env: dict[str, str] | None = None) -> dict:
        assert command == "launches"
        side = self.direct if env and "GPUSLICE_SELFTEST_LIBCUDA" in env else self.gated
        return {"launches": int(args[0]), "ns_per_launch": side.pop(0)}


@pytest.mark.parametrize(
    ("gated", "direct", "passed", "observed"),
    [
        # +10 ns: one reading
        ([460.0] * 7, [450.0] * 7, True, "+10.0 ns on 450 ns (noise 0.0 ns)"),
        # +60 ns over 10 ns of noise, then +12 ns: the second reading decides
        ([510.0] * 7 + [462.0] * 7, [455.0, 450.0] * 3 + [460.0] + [450.0] * 7, True,
         "+60.0 ns on 450 ns (noise 10.0 ns); again: +12.0 ns on 450 ns (noise 0.0 ns)"),
        # a launch that really costs 60 ns more is over in both readings
        ([510.0] * 14, [450.0] * 14, False,
         "+60.0 ns on 450 ns (noise 0.0 ns); again: +60.0 ns on 450 ns (noise 0.0 ns)"),
    ],
)  # fmt: skip
def test_the_launch_gate_is_measured_again_only_when_over_and_fails_only_if_over_twice(gated, direct, passed, observed):
    box = ScriptedBox(gated, direct)
    layout = SimpleNamespace(driver_libcuda=Path("/driver/libcuda.so.1"))
    check = _launch_overhead(box, box, layout, "GPU 0")  # type: ignore[arg-type]
    assert (check.passed, check.observed) == (passed, observed)
    assert box.gated == [] and box.direct == []  # every scripted run taken, and no more
