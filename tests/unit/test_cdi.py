"""The CDI model, alone: generation from a fixture driver root, the version table,
validation, JSON and YAML, the spec directories' precedence and conflicts, and
applying edits to a config.json, compared whole with golden files and checked
against the official CDI and OCI runtime-spec schemas."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from gpuslice.cdi import apply as cdi_apply
from gpuslice.cdi import generate as gen
from gpuslice.cdi import spec as cdi_spec
from gpuslice.cdi.registry import Registry
from gpuslice.cdi.spec import ContainerEdits, Device, DeviceNode, Mount, Spec, SpecError, minimum_version
from gpuslice.inventory import Gpu, Inventory
from gpuslice.paths import native_dir
from tests.harness.references import reference, schema_validator

GOLDEN = Path(__file__).parent / "golden" / "cdi"
DRIVER = "580.95.05"
UPDATE = os.environ.get("GPUSLICE_UPDATE_GOLDEN") == "1"  # rewrite the golden files (then review the diff)


def golden(name: str, actual: dict) -> None:
    path = GOLDEN / name
    text = json.dumps(actual, indent=2, sort_keys=True) + "\n"
    if UPDATE:
        path.write_text(text)
    assert json.loads(text) == json.loads(path.read_text()), f"{name} differs (GPUSLICE_UPDATE_GOLDEN=1 rewrites it)"


def normalized(data: dict, **places: Path) -> dict:
    """Machine-specific paths as @NAME@, so golden files hold on any checkout."""
    text = json.dumps(data)
    for name, path in sorted(places.items(), key=lambda kv: -len(str(kv[1]))):
        text = text.replace(str(path), f"@{name}@")
    return json.loads(text)


def inventory(n: int = 2) -> Inventory:
    gpus = tuple(
        Gpu(i, f"GPU-0000000{i}-1111-2222-3333-444444444444", "NVIDIA H100 80GB HBM3", f"00000000:0{i}:00.0",
            80 << 30, 0, 0)
        for i in range(n)
    )  # fmt: skip
    return Inventory(DRIVER, 13000, gpus, {})


@pytest.fixture
def driver_root(tmp_path: Path) -> Path:
    """A node's driver files as the NVIDIA packages lay them out."""
    root = tmp_path / "driver-root"
    libdir = root / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    for lib in (f"libcuda.so.{DRIVER}", f"libnvidia-ml.so.{DRIVER}"):
        (libdir / lib).write_bytes(b"\x7fELF")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("#!/bin/sh\n")
    (root / "usr/bin/nvidia-smi").chmod(0o755)
    (root / "dev").mkdir()
    for node in ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"):  # nvidia-uvm-tools absent: not in the spec
        (root / "dev" / node).touch()
    return root


def test_node_spec_from_a_driver_root_is_the_golden_one_and_officially_valid(driver_root):
    opts = gen.Options("nvidia", driver_root, "/usr/bin/gpuslice-hook")
    spec = gen.generate(inventory(), opts).to_dict()
    cdi_spec.validate(spec)
    schema_validator("cdi", "schema.json").validate(spec)
    golden("node-spec.nvidia.json", normalized(spec, ROOT=driver_root, NATIVE=native_dir()))


COMPUTE = {  # what a container image lacks and a CUDA program may load: container name -> the driver's file
    "libnvidia-ptxjitcompiler.so.1": f"libnvidia-ptxjitcompiler.so.{DRIVER}",
    "libnvidia-nvvm.so.4": f"libnvidia-nvvm.so.{DRIVER}",
    f"libnvidia-gpucomp.so.{DRIVER}": f"libnvidia-gpucomp.so.{DRIVER}",
    "libcudadebugger.so.1": f"libcudadebugger.so.{DRIVER}",
}


def _compute_libs(libdir: Path, names: dict[str, str]) -> None:
    for link, real in names.items():
        (libdir / real).write_bytes(b"\x7fELF")
        if link != real:
            (libdir / link).symlink_to(real)  # the soname link, as the driver's installer makes it


def test_the_drivers_compute_libraries_are_mounted_behind_the_interposer(driver_root):
    """On the H200 the spec mounted libcuda and NVML alone: PTX JIT (CuPy, NVRTC), NVVM and the
    debugger's back end were missing from every container without driver files of its own."""
    libdir = driver_root / "usr/lib/x86_64-linux-gnu"
    _compute_libs(libdir, COMPUTE)
    spec = gen.generate(inventory(), gen.Options("nvidia", driver_root, "/usr/bin/gpuslice-hook")).to_dict()
    cdi_spec.validate(spec)
    schema_validator("cdi", "schema.json").validate(spec)
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    for name, real in COMPUTE.items():
        assert mounts[f"{gen.DRIVER_DIR}/{name}"] == str(libdir / real), name
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    assert "LD_LIBRARY_PATH" not in env  # the container's own is kept; the hook's loader cache finds the interposer


def test_a_driver_without_some_compute_libraries_still_gets_a_spec(driver_root):
    libdir = driver_root / "usr/lib/x86_64-linux-gnu"
    _compute_libs(libdir, {"libnvidia-ptxjitcompiler.so.1": f"libnvidia-ptxjitcompiler.so.{DRIVER}"})
    spec = gen.generate(inventory(), gen.Options("nvidia", driver_root, "/usr/bin/gpuslice-hook")).to_dict()
    cdi_spec.validate(spec)
    paths = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert f"{gen.DRIVER_DIR}/libnvidia-ptxjitcompiler.so.1" in paths
    assert not any("nvvm" in p or "gpucomp" in p or "debugger" in p for p in paths)


def test_a_driver_under_usr_local_nvidia_is_found(tmp_path):
    # GKE's driver installer and many GPU machine images put the driver there, not in /usr/lib
    libdir, bindir = tmp_path / "usr/local/nvidia/lib64", tmp_path / "usr/local/nvidia/bin"
    libdir.mkdir(parents=True)
    bindir.mkdir()
    for lib in (f"libcuda.so.{DRIVER}", f"libnvidia-ml.so.{DRIVER}"):
        (libdir / lib).write_bytes(b"\x7fELF")
    (bindir / "nvidia-smi").write_text("#!/bin/sh\n")
    (bindir / "nvidia-smi").chmod(0o755)
    files = gen.driver_files.nvidia(tmp_path, DRIVER)
    assert files.libcuda == libdir / f"libcuda.so.{DRIVER}" and files.libnvml == libdir / f"libnvidia-ml.so.{DRIVER}"
    assert files.nvidia_smi == bindir / "nvidia-smi"


def test_a_driver_root_without_the_driver_is_one_clear_error(tmp_path):
    with pytest.raises(gen.driver_files.DriverFilesError, match=f"libcuda.so.{DRIVER} not found under {tmp_path}"):
        gen.generate(inventory(), gen.Options("nvidia", tmp_path, "/usr/bin/gpuslice-hook"))


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        (Spec("a.com/b", (Device("gpu0", ContainerEdits()),)), "0.3.0"),
        (Spec("a.com/b", (Device("g", ContainerEdits(mounts=(Mount("/a", "/b", type="bind"),))),)), "0.4.0"),
        (Spec("a.com/b", (Device("0", ContainerEdits()),)), "0.5.0"),
        (Spec("a.com/b", (Device("g", ContainerEdits(device_nodes=(DeviceNode("/dev/x", "/h/x"),))),)), "0.5.0"),
        (Spec("a.com/b", (Device("g", ContainerEdits(), {"k": "v"}),)), "0.6.0"),
        (Spec("a.com/b.c", (Device("g", ContainerEdits()),)), "0.6.0"),
        (Spec("a.com/b", (Device("g", ContainerEdits(additional_gids=(5,))),)), "0.7.0"),
        (Spec("a.com/b", (Device("0", ContainerEdits(additional_gids=(5,))), Device("g", ContainerEdits()))), "0.7.0"),
    ],
)
def test_minimum_version_comes_from_the_table(spec, version):
    assert minimum_version(spec) == version
    cdi_spec.validate(spec.to_dict())  # and the version written is accepted


def test_bad_specs_are_refused_with_one_line_per_problem():
    with pytest.raises(SpecError) as e:
        two = [{"name": "0", "containerEdits": {}}, {"name": "0", "containerEdits": {}}]
        cdi_spec.validate({"cdiVersion": "0.3.0", "kind": "Gpuslice/gpu", "devices": two})
    lines = str(e.value).splitlines()
    assert 'kind: "Gpuslice/gpu" is not vendor.com/class' in lines
    assert 'devices.1.name: "0" appears twice' in lines
    assert any(x.startswith("cdiVersion: 0.3.0 is too low for the fields used (a device name") for x in lines)
    with pytest.raises(SpecError, match=r"devices\.0\.containerEdits\.env\.0"):
        cdi_spec.validate({"cdiVersion": "0.3.0", "kind": "a.com/b", "devices": [
            {"name": "x", "containerEdits": {"env": ["NOEQUALS"]}}]})  # fmt: skip


def test_yaml_and_json_round_trip_to_the_same_spec(tmp_path):
    spec = cdi_spec.load(GOLDEN / "vendor.yaml")
    assert spec.kind == "example.com/card" and spec.version == "0.6.0"
    for name in ("copy.json", "copy.yaml"):
        cdi_spec.write(spec, tmp_path / name)
        assert oct((tmp_path / name).stat().st_mode & 0o777) == "0o644"
        assert cdi_spec.load(tmp_path / name) == spec
    assert yaml.safe_load((tmp_path / "copy.yaml").read_text())["kind"] == "example.com/card"
    schema_validator("cdi", "schema.json").validate(json.loads((tmp_path / "copy.json").read_text()))


def test_applying_devices_gives_the_golden_config_and_again_the_same(tmp_path):
    config = json.loads((GOLDEN / "config.base.json").read_text())
    reg = Registry((tmp_path / "etc", tmp_path / "run"))
    (tmp_path / "etc").mkdir()
    shutil.copy(GOLDEN / "vendor.yaml", tmp_path / "etc" / "vendor.yaml")
    devices = reg.resolve(["card0", "card1"], kind="example.com/card")
    cdi_apply.inject(config, devices)
    golden("config.applied.json", config)
    schema_validator("oci-runtime-spec", "config-schema.json").validate(config)
    once = json.dumps(config, sort_keys=True)
    cdi_apply.inject(config, devices)
    assert json.dumps(config, sort_keys=True) == once


def test_apply_replaces_what_is_at_the_same_path_and_honours_permissions():
    config = json.loads((GOLDEN / "config.base.json").read_text())
    config["process"]["env"].append("CARD_VISIBLE=old")
    config["mounts"].append({"destination": "/opt/card", "type": "bind", "source": "/old", "options": ["rw"]})
    config["linux"]["devices"] = [{"path": "/dev/card0", "type": "c", "major": 1, "minor": 3}]
    edits = ContainerEdits(
        env=("CARD_VISIBLE=0",),
        device_nodes=(DeviceNode("/dev/card0", "/dev/zero", permissions="r"),),
        mounts=(Mount("/usr/share/card", "/opt/card"),),
    )
    cdi_apply.apply_edits(config, edits)
    assert [e for e in config["process"]["env"] if e.startswith("CARD_VISIBLE=")] == ["CARD_VISIBLE=0"]
    assert [m["source"] for m in config["mounts"] if m["destination"] == "/opt/card"] == ["/usr/share/card"]
    zero = os.stat("/dev/zero").st_rdev
    assert config["linux"]["devices"] == [
        {"path": "/dev/card0", "type": "c", "major": os.major(zero), "minor": os.minor(zero), "fileMode": 0o666}
    ]
    assert config["linux"]["resources"]["devices"][-1] == {"allow": True, "type": "c", "major": os.major(zero),
                                                            "minor": os.minor(zero), "access": "r"}  # fmt: skip


def _spec_file(path: Path, devices: dict[str, str]) -> None:
    """A spec whose devices each set WHO=<value>."""
    path.parent.mkdir(parents=True, exist_ok=True)
    spec = Spec("example.com/card", tuple(Device(n, ContainerEdits(env=(f"WHO={v}",))) for n, v in devices.items()))
    cdi_spec.write(spec, path)


def test_var_run_cdi_wins_over_etc_cdi_and_a_conflict_in_one_directory_uses_neither(tmp_path):
    etc, run = tmp_path / "etc/cdi", tmp_path / "var/run/cdi"
    reg = Registry((etc, run))
    _spec_file(etc / "static.yaml", {"a": "etc", "b": "etc", "c": "etc"})
    _spec_file(run / "generated.json", {"a": "run"})
    _spec_file(run / "other.json", {"b": "run1"})
    _spec_file(run / "third.json", {"b": "run2"})
    found = reg.devices("example.com/card")
    assert found["a"].device.edits.env == ("WHO=run",) and found["a"].path == run / "generated.json"
    assert found["c"].device.edits.env == ("WHO=etc",)
    assert "b" not in found  # two files of /var/run/cdi define it; the lower /etc/cdi one is overridden too
    with pytest.raises(SpecError, match=r"no CDI device example\.com/card=b in .*; run: gpuslice cdi generate"):
        reg.resolve(["a", "b"], kind="example.com/card")


def test_registry_skips_broken_files_and_rereads_changed_ones(tmp_path):
    run = tmp_path / "run"
    reg = Registry((run,))
    _spec_file(run / "card.json", {"a": "1"})
    (run / "broken.json").write_text("{not json")
    (run / "bad.yaml").write_text("cdiVersion: '0.3.0'\nkind: example.com/card\ndevices: []\n")
    assert list(reg.devices("example.com/card")) == ["a"]
    _spec_file(run / "card.json", {"a": "2", "bb": "2"})  # a new size: seen without a restart
    assert reg.devices("example.com/card")["a"].device.edits.env == ("WHO=2",)


def test_a_file_the_registry_cannot_read_is_said_once_per_version(tmp_path, caplog):
    run = tmp_path / "run"
    reg = Registry((run,))
    _spec_file(run / "card.json", {"a": "1"})
    (run / "latin1.json").write_bytes(b'{"kind": "caf\xe9"}')  # not UTF-8
    for _ in range(3):
        assert list(reg.devices("example.com/card")) == ["a"]
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [f"CDI spec {run / 'latin1.json'} skipped"]


def test_the_registry_forgets_the_files_that_are_gone(tmp_path):
    """The daemon's registry lives as long as the daemon, and /var/run/cdi gets a
    spec made and removed for every DRA claim: what it keeps is what is there."""
    run = tmp_path / "run"
    reg = Registry((run,))
    _spec_file(run / "node.json", {"a": "1"})
    for n in range(50):
        claim = run / f"gpuslice.io-claim_{n}.json"
        _spec_file(claim, {f"c{n}": "x"})
        assert f"c{n}" in reg.devices("example.com/card")
        claim.unlink()
    assert list(reg.devices("example.com/card")) == ["a"]
    assert list(reg._parsed) == [run / "node.json"]  # the cache itself: nothing of the 50 claims


def test_a_spec_named_outright_is_validated_once_per_version_of_the_file(tmp_path, monkeypatch):
    """The shim's GPUSLICE_CDI_SPEC names a spec at every create: its schema check
    (0.6 ms) is paid once per version of the file, not per container."""
    from gpuslice.cdi import registry

    checked: list[str] = []
    real_validate = cdi_spec.validate

    def counting(data):
        checked.append(data["devices"][0]["containerEdits"]["env"][0])
        return real_validate(data)

    monkeypatch.setattr(cdi_spec, "validate", counting)
    reg = Registry((tmp_path / "none",))
    path = tmp_path / "named.json"
    _spec_file(path, {"a": "1"})  # writing validates it too
    checked.clear()
    first = reg.named(path)
    assert reg.named(path) is first and checked == ["WHO=1"]
    _spec_file(path, {"a": "2"})  # replaced as `gpuslice cdi generate` does: a new file
    checked.clear()
    assert reg.named(path).devices[0].edits.env == ("WHO=2",) and checked == ["WHO=2"]
    text = path.read_text().replace("WHO=2", "WHO=33")
    with open(path, "r+") as f:  # rewritten in place: the same inode, another size
        f.write(text)
    assert reg.named(path).devices[0].edits.env == ("WHO=33",)

    path.write_text("{not json")
    with pytest.raises(SpecError, match=rf"^{path}: cannot read a CDI spec: "):
        reg.named(path)
    _spec_file(path, {"a": "4"})  # a failure is not kept: the mended file is read
    assert reg.named(path).devices[0].edits.env == ("WHO=4",)

    monkeypatch.setattr(registry, "MAX_SPEC_BYTES", 64)
    path.write_text(text)
    with pytest.raises(SpecError, match=r"cannot read a CDI spec: \d+ bytes; a CDI spec is at most 64"):
        reg.named(path)


def test_the_node_spec_is_the_file_named_else_the_one_resolving_all(tmp_path):
    """One rule for the DRA plugin and the selftest: `--cdi-spec`, else gpuslice.io/gpu=all."""
    run = tmp_path / "run"
    reg = Registry((tmp_path / "etc", run))
    none = rf"^no gpuslice.io/gpu=all in {tmp_path}/etc or {run} \(`gpuslice cdi generate` writes it\)$"
    with pytest.raises(SpecError, match=none):
        reg.node()
    node = Spec("gpuslice.io/gpu", (Device("all", ContainerEdits(env=("WHO=node",))),))
    cdi_spec.write(node, run / "gpuslice.json")
    spec, path = reg.node()
    assert path == run / "gpuslice.json" and spec.devices[0].edits.env == ("WHO=node",)
    _spec_file(tmp_path / "named.json", {"x": "named"})
    spec, path = reg.node(tmp_path / "named.json")
    assert path == tmp_path / "named.json" and spec.devices[0].edits.env == ("WHO=named",)


def test_specs_named_outright_are_kept_up_to_a_bound(tmp_path, monkeypatch):
    from gpuslice.cdi import registry

    checked: list[Path] = []
    monkeypatch.setattr(cdi_spec, "load_from", lambda text, path: checked.append(path) or cdi_spec.parse_text(text, ""))
    monkeypatch.setattr(registry, "load_from", cdi_spec.load_from)
    reg = Registry((tmp_path / "none",))
    paths = [tmp_path / f"s{i}.json" for i in range(registry.NAMED_KEPT + 1)]
    for p in paths:
        p.write_text("{}")
        reg.named(p)
    assert checked == paths
    reg.named(paths[-1])  # the newest is kept
    assert checked == paths
    reg.named(paths[0])  # the oldest was let go
    assert checked == [*paths, paths[0]]


def test_the_path_unit_watches_the_files_whose_changes_make_the_spec_read_again(tmp_path):
    from gpuslice.cdi import driver_files

    unit = (Path(__file__).parents[2] / "packaging/systemd/gpuslice-cdi.path").read_text()
    watched = [line.split("=", 1)[1].lstrip("/") for line in unit.splitlines() if line.startswith("PathChanged=")]
    assert watched == list(driver_files.WATCHED)
    before = driver_files.watched_state(tmp_path)
    assert before == (None,) * len(watched)
    lib = tmp_path / watched[0]
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"v1")
    installed = driver_files.watched_state(tmp_path)
    assert installed != before and installed[0] is not None
    replacement = lib.with_name(lib.name + ".dpkg-new")
    replacement.write_bytes(b"v2")
    replacement.rename(lib)  # an upgrade: a new inode in place
    assert driver_files.watched_state(tmp_path) not in (before, installed)


def test_a_driver_changed_while_read_starts_the_process_again_at_most_rereads_times(tmp_path, monkeypatch):
    from gpuslice.cdi import driver_files

    class Restarted(Exception):
        pass

    def execv(*args):
        raise Restarted

    monkeypatch.setattr(driver_files.os, "execv", execv)
    monkeypatch.delenv(driver_files.REREAD_ENV, raising=False)
    lib = tmp_path / driver_files.WATCHED[0]
    lib.parent.mkdir(parents=True)
    with driver_files.reread_if_changed(tmp_path, watch=True):
        pass  # nothing changed: no restart
    with pytest.raises(Restarted), driver_files.reread_if_changed(tmp_path, watch=True):
        lib.write_bytes(b"v1")  # an install while the spec is made
    assert os.environ[driver_files.REREAD_ENV] == "1"
    with driver_files.reread_if_changed(tmp_path, watch=False):
        lib.write_bytes(b"v2")  # not watched (--stdout, the simulator): no restart
    monkeypatch.setenv(driver_files.REREAD_ENV, str(driver_files.REREADS))
    with driver_files.reread_if_changed(tmp_path, watch=True):
        lib.write_bytes(b"v3")  # changing all the time: it gives up after REREADS rounds


def test_a_driver_found_incomplete_is_waited_for_and_read_again(tmp_path, monkeypatch):
    """Seen in the systemd boot test: the path unit ran on libnvidia-ml.so.1,
    libcuda.so.1 landed while the unit was still running (systemd drops that
    event), and the spec was never made. Now the missing file is waited for."""
    import threading

    from gpuslice.cdi import driver_files

    class Restarted(Exception):
        pass

    def execv(*args):
        raise Restarted

    monkeypatch.setattr(driver_files.os, "execv", execv)
    monkeypatch.delenv(driver_files.REREAD_ENV, raising=False)
    lib = tmp_path / driver_files.WATCHED[1]  # libcuda.so.1, after libnvidia-ml.so.1
    lib.parent.mkdir(parents=True)
    (tmp_path / driver_files.WATCHED[0]).write_bytes(b"\x7fELF")  # NVML is there: an install in progress
    later = threading.Timer(0.5, lambda: lib.write_bytes(b"\x7fELF"))
    later.start()
    with pytest.raises(Restarted), driver_files.reread_if_changed(tmp_path, watch=True):
        raise driver_files.DriverFilesError("libcuda.so.1 not found")
    monkeypatch.setattr(driver_files, "INCOMPLETE_WAIT_S", 0.3)
    with pytest.raises(driver_files.DriverFilesError), driver_files.reread_if_changed(tmp_path, watch=True):
        raise driver_files.DriverFilesError("libcuda.so.1 not found")  # nothing comes: the error stands
    for f in driver_files.WATCHED[:2]:
        (tmp_path / f).unlink()
    monkeypatch.setattr(driver_files, "INCOMPLETE_WAIT_S", 60)
    with pytest.raises(driver_files.DriverFilesError), driver_files.reread_if_changed(tmp_path, watch=True):
        raise driver_files.DriverFilesError("no driver")  # no driver file at all: no install to wait for


@pytest.mark.parametrize("kind", ["good", "bad"])
def test_the_official_test_specs_are_judged_as_the_cdi_project_judges_them(kind):
    """The CDI package's own test data: its schema and our loader accept each
    good spec and refuse each bad one (one of them is an empty file)."""
    specs = sorted((reference("cdi") / "testdata" / kind).glob("*.json"))
    assert len(specs) >= 2, specs
    official = schema_validator("cdi", "schema.json")
    for path in specs:
        if kind == "good":
            official.validate(json.loads(path.read_text()))
            assert cdi_spec.load(path).kind
        else:
            assert not path.read_text().strip() or not official.is_valid(json.loads(path.read_text())), path
            with pytest.raises(SpecError):
                cdi_spec.load(path)


def test_one_driver_watcher_sees_each_change_once(tmp_path):
    """cdi generate and the node agent watch the driver through DriverWatch:
    a change is seen once (the agent makes the spec once per change), and a
    wait ends at the change without consuming it (generate reads again)."""
    from gpuslice.cdi import driver_files

    lib = tmp_path / driver_files.WATCHED[0]
    lib.parent.mkdir(parents=True)
    watch = driver_files.DriverWatch(tmp_path)
    assert not watch.any() and not watch.changed() and not watch.wait(0.2)
    lib.write_bytes(b"\x7fELF")
    assert watch.wait(5) and watch.differs()  # seen, not consumed
    assert watch.changed() and not watch.changed() and watch.any()
