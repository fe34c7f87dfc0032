"""Build the packages from this repository, versioned from pyproject.

    python packaging/build.py deb       -> dist/gpuslice_<version>_<arch>.deb
    python packaging/build.py rpm       -> dist/gpuslice-<version>-1.<arch>.rpm
    python packaging/build.py sim-deb   -> dist/gpuslice-sim_<version>_<arch>.deb
    python packaging/build.py sim-rpm   -> dist/gpuslice-sim-<version>-1.<arch>.rpm
    python packaging/build.py image     -> dist/gpuslice-kubelet-plugin_<version>.oci.tar

gpuslice is the node package; gpuslice-sim, the simulated driver, is never
part of it (a production node must not carry a second libcuda.so.1).

Python dependencies come from the distribution where it packages them
(click, PyYAML, cffi, jsonschema, prometheus-client, tomli-w) and are vendored into
/usr/lib/gpuslice/python where it does not, or where its version is too old
for the generated gRPC code (grpcio, grpcio-health-checking, protobuf,
nvidia-ml-py)."""

from __future__ import annotations

import gzip
import io
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "packaging"
PYDIR = "/usr/lib/gpuslice/python"
VENDORED = ["grpcio>=1.85", "grpcio-health-checking>=1.85", "protobuf>=7.35", "nvidia-ml-py>=12.535"]
DEB_DEPENDS = [
    "python3 (>= 3.11)", "python3 (<< 3.12)", "python3-click", "python3-yaml", "python3-cffi",
    "python3-jsonschema", "python3-prometheus-client", "python3-tomli-w", "libyaml-0-2", "libc6",
]  # fmt: skip
RPM_REQUIRES = [
    "python3 >= 3.11", "python3 < 3.12", "python3-click", "python3-pyyaml", "python3-cffi", "python3-jsonschema",
    "python3-prometheus_client", "python3-tomli-w", "libyaml-0.so.2()(64bit)",
]  # fmt: skip
COMMANDS = {"gpuslice": "gpuslice.cli.main"}
EXECUTABLES = ("gpuslice-hook", "gpuslice-runtime")  # compiled: in the package's _native/bin, moved to /usr/bin
# rpm passes how many versions stay installed: 0 means erase
RPM_PREUN = '[ "$1" = 0 ] && gpuslice_stop || true'
RPM_POSTUN = '[ "$1" = 0 ] && gpuslice_purge || true'


CHANGELOG_DATE = ("Sat, 21 Nov 2026 00:00:00 +0000", "Sat Nov 21 2026")
MAINTAINER = "gpuslice maintainers <maintainers@gpuslice.dev>"


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def launcher(module: str) -> str:
    # -I: a system tool ignores the user's PYTHONPATH and site-packages
    return (
        "#!/usr/bin/python3 -I\n"
        f'"""{module}, from the gpuslice package."""\n'
        "import sys\n\n"
        f'sys.path.insert(0, "{PYDIR}")\n'
        f"from {module} import main  # noqa: E402\n\n"
        "sys.exit(main())\n"
    )


def install_wheel(source: Path, dest: Path, vendored: list[str]) -> Path:
    """The wheel built from `source` (and the `vendored` distributions) under
    PYDIR in `dest`; returns that directory."""
    pydir = dest / PYDIR.lstrip("/")
    with tempfile.TemporaryDirectory() as t:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", t, str(source)], check=True)
        pip = [sys.executable, "-m", "pip", "install", "-q", "--target", str(pydir), "--no-compile"]
        subprocess.run([*pip, "--no-deps", *map(str, Path(t).glob("*.whl"))], check=True)
    if vendored:
        subprocess.run([*pip, "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                        "--abi", "cp311", "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                        "--platform", "manylinux_2_28_x86_64", *vendored], check=True)  # fmt: skip
    for junk in (*pydir.glob("bin"), *pydir.rglob("__pycache__")):
        shutil.rmtree(junk, ignore_errors=True)
    return pydir


def stage_node(dest: Path) -> None:
    """gpuslice's installed file tree, shared by both package formats."""
    pydir = install_wheel(ROOT, dest, VENDORED)
    bindir = dest / "usr/bin"
    bindir.mkdir(parents=True)
    for name, module in COMMANDS.items():
        (bindir / name).write_text(launcher(module))
        (bindir / name).chmod(0o755)
    native_bin = pydir / "gpuslice/_native/bin"
    for name in EXECUTABLES:
        shutil.move(native_bin / name, bindir / name)
    native_bin.rmdir()
    units = dest / "lib/systemd/system"
    units.mkdir(parents=True)
    for unit in (PKG / "systemd").iterdir():
        shutil.copy2(unit, units / unit.name)
        (units / unit.name).chmod(0o644)
    (dest / "etc/gpuslice").mkdir(parents=True)
    shutil.copy2(PKG / "daemon.yaml", dest / "etc/gpuslice/daemon.yaml")
    hooks = dest / "usr/share/containers/oci/hooks.d"
    hooks.mkdir(parents=True)
    sys.path.insert(0, str(pydir))
    from gpuslice.cli.install import hooks_d

    for name, text in hooks_d("/usr/bin/gpuslice-hook").items():
        (hooks / name).write_text(text)
    docs(dest, "gpuslice", ["README.md", *(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))])
    finish(dest, runnable=(bindir, pydir / "gpuslice/_native/tools"))


def stage_sim(dest: Path) -> None:
    """gpuslice-sim's installed file tree: the gpuslice_sim module with the
    simulated libcuda.so.1, libnvidia-ml.so.1 and bundled machine beside it."""
    install_wheel(ROOT / "sim", dest, [])
    docs(dest, "gpuslice-sim", ["docs/simulator.md"])
    finish(dest, runnable=())


def docs(dest: Path, name: str, files: list[str]) -> None:
    doc = dest / "usr/share/doc" / name
    doc.mkdir(parents=True)
    for f in files:
        shutil.copy2(ROOT / f, doc / Path(f).name)
    (doc / "copyright").write_text(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        f"Upstream-Name: {name}\n\nFiles: *\nCopyright: 2026 the gpuslice authors\nLicense: Apache-2.0\n"
        " On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.\n"
    )


def finish(dest: Path, runnable: tuple[Path, ...]) -> None:
    """Modes as a package installs them; compiled files stripped."""
    for p in dest.rglob("*"):
        if p.is_dir():
            p.chmod(0o755)
        elif p.is_file():
            p.chmod(0o755 if p.parent in runnable else 0o644)
            if p.suffix == ".so" or ".so." in p.name or (p.parent in runnable and p.read_bytes()[:4] == b"\x7fELF"):
                # debug symbols stay out of a package; dynamic symbols stay in
                subprocess.run(["strip", "--strip-unneeded", str(p)], check=True)


def maintscript(pkg: Package, action: str) -> str:
    """A maintainer script: the package's shell functions (packaging/scripts/), then its step."""
    body = "\n".join((PKG / "scripts" / name).read_text() for name in pkg.script_files)
    return f"#!/bin/sh\nset -e\n{body}\n{action}\n"


@dataclass(frozen=True)
class Package:
    """What differs between the two packages; both formats build from it."""

    name: str
    summary: str
    description: str
    stage: Callable[[Path], None]
    deb_depends: list[str]
    rpm_requires: list[str]
    deb_recommends: str
    rpm_recommends: str
    section: str
    script_files: tuple[str, ...]  # under packaging/scripts/: the functions the scripts call
    deb_scripts: dict[str, str]  # postinst/prerm/postrm -> the action after the body
    rpm_scripts: dict[str, str]  # post/preun/postun -> the action after the body
    conffiles: list[str] = field(default_factory=list)
    lintian_overrides: Path | None = None


NODE = Package(
    name="gpuslice",
    summary="GPU sharing for containers: memory limits and compute shares",
    description=(
        "gpuslice lets containerd, CRI-O, Podman and Docker put several containers\n"
        "on one NVIDIA GPU, each with a hard memory limit and a compute share: an\n"
        "allocator daemon, an OCI hook, a runtime shim, CDI specs and a wrapper libcuda."
    ),
    stage=stage_node,
    deb_depends=DEB_DEPENDS,
    rpm_requires=RPM_REQUIRES,
    deb_recommends="podman | containerd, runc",
    rpm_recommends="podman, runc",
    section="admin",
    script_files=("bytecode.sh", "maintscript.sh"),
    deb_scripts={
        "postinst": 'case "$1" in configure) gpuslice_configure ;; esac',
        "prerm": 'case "$1" in remove|upgrade|deconfigure) gpuslice_stop ;; esac',
        "postrm": 'case "$1" in purge) gpuslice_purge ;; esac',
    },
    rpm_scripts={"post": "gpuslice_configure", "preun": RPM_PREUN, "postun": RPM_POSTUN},
    conffiles=["/etc/gpuslice/daemon.yaml"],
    lintian_overrides=PKG / "lintian-overrides",
)

SIM = Package(
    name="gpuslice-sim",
    summary="Simulated NVIDIA driver (libcuda, NVML) for gpuslice's demo and tests",
    description=(
        "A simulated NVIDIA driver: libcuda.so.1 and libnvidia-ml.so.1 that model\n"
        "GPUs described in YAML, for running CUDA programs and gpuslice without a\n"
        "GPU (gpuslice sim, gpuslice demo). Never needed on a production node."
    ),
    stage=stage_sim,
    deb_depends=["python3 (>= 3.11)", "libyaml-0-2", "libc6"],
    rpm_requires=["python3 >= 3.11", "libyaml-0.so.2()(64bit)"],
    deb_recommends="gpuslice",
    rpm_recommends="gpuslice",
    section="devel",
    script_files=("bytecode.sh",),
    deb_scripts={
        "prerm": f'case "$1" in remove|upgrade|deconfigure) gpuslice_forget_bytecode {PYDIR}/gpuslice_sim ;; esac'
    },
    rpm_scripts={"preun": f"gpuslice_forget_bytecode {PYDIR}/gpuslice_sim"},
)


def build_deb(out: Path, pkg: Package = NODE) -> Path:
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as t:
        dest = Path(t) / "root"
        pkg.stage(dest)
        doc = dest / "usr/share/doc" / pkg.name
        with open(doc / "changelog.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as z:
            f = io.TextIOWrapper(z)
            f.write(
                f"{pkg.name} ({version()}) unstable; urgency=medium\n\n  * Release {version()}.\n\n"
                f" -- {MAINTAINER}  {CHANGELOG_DATE[0]}\n"
            )
            f.flush()
            f.detach()
        if pkg.lintian_overrides:
            overrides = dest / "usr/share/lintian/overrides"
            overrides.mkdir(parents=True)
            shutil.copy2(pkg.lintian_overrides, overrides / pkg.name)
        control = dest / "DEBIAN"
        control.mkdir()
        size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) // 1024
        (control / "control").write_text(
            f"Package: {pkg.name}\nVersion: {version()}\nArchitecture: {arch}\nMaintainer: {MAINTAINER}\n"
            f"Installed-Size: {size}\nDepends: {', '.join(pkg.deb_depends)}\nRecommends: {pkg.deb_recommends}\n"
            f"Section: {pkg.section}\nPriority: optional\nHomepage: https://gpuslice.invalid/\n"
            f"Description: {pkg.summary}\n" + "".join(f" {line}\n" for line in pkg.description.splitlines())
        )
        if pkg.conffiles:
            (control / "conffiles").write_text("".join(f"{c}\n" for c in pkg.conffiles))
        for name, action in pkg.deb_scripts.items():
            (control / name).write_text(maintscript(pkg, action))
            (control / name).chmod(0o755)
        out.mkdir(parents=True, exist_ok=True)
        deb = out / f"{pkg.name}_{version()}_{arch}.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(dest), str(deb)], check=True, capture_output=True
        )
    return deb


def build_rpm(out: Path, pkg: Package = NODE) -> Path:
    arch = platform.machine()
    owned = ("/usr/lib/gpuslice", f"/usr/share/doc/{pkg.name}", "/etc/gpuslice")
    with tempfile.TemporaryDirectory() as t:
        top = Path(t)
        dest = top / "root"
        pkg.stage(dest)
        files = []
        for p in sorted(dest.rglob("*")):
            rel = "/" + str(p.relative_to(dest))
            if p.is_dir():
                # both packages own /usr/lib/gpuslice/python: rpm removes it with the last
                if rel.startswith(owned):
                    files.append(f"%dir {rel}")
            elif rel in pkg.conffiles:
                files.append(f"%config(noreplace) {rel}")
            else:
                files.append(rel)
        scripts = "".join(f"%{name}\n{maintscript(pkg, action)}\n" for name, action in pkg.rpm_scripts.items())
        spec = top / f"{pkg.name}.spec"
        spec.write_text(
            f"Name: {pkg.name}\nVersion: {version()}\nRelease: 1\nSummary: {pkg.summary}\nLicense: Apache-2.0\n"
            f"Group: System Environment/Daemons\nPackager: {MAINTAINER}\n"
            f"URL: https://gpuslice.invalid/\nRequires: {', '.join(pkg.rpm_requires)}\n"
            f"Recommends: {pkg.rpm_recommends}\nAutoReqProv: no\n\n"
            f"%description\n{pkg.description}\n\n"
            f"%install\ncp -a {dest}/. %{{buildroot}}/\n\n"
            f"{scripts}"
            "%files\n" + "\n".join(files) + "\n\n"
            f"%changelog\n* {CHANGELOG_DATE[1]} {MAINTAINER} - {version()}-1\n"
            f"- Release {version()}.\n"
        )
        subprocess.run(
            ["rpmbuild", "-bb", "--define", f"_topdir {top}", "--define", "__os_install_post %{nil}",
             "--define", "_build_id_links none", "--target", arch, str(spec)],
            check=True, capture_output=True,
        )  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        (rpm,) = (top / "RPMS" / arch).glob("*.rpm")
        target = out / rpm.name
        shutil.copy2(rpm, target)
    return target


IMAGE = "gpuslice/kubelet-plugin"
IMAGE_SUITE = "bookworm"


def image_mirror() -> str:
    """Debian's own mirror, or the one GPUSLICE_DEBIAN_MIRROR names (a local one)."""
    return os.environ.get("GPUSLICE_DEBIAN_MIRROR", "").strip() or "http://deb.debian.org/debian"


def image_packages() -> list[str]:
    """What the image's Debian needs: the .deb's dependencies (debootstrap
    resolves no alternatives and misses python3-cffi's python3-ply) and the
    kubernetes client for the plugin."""
    return sorted({d.split()[0] for d in DEB_DEPENDS} | {"python3-ply", "python3-kubernetes"})


def build_image(out: Path) -> Path:
    """The DRA kubelet plugin's container image, from Debian packages and our
    .deb (debootstrap, then `podman import`), saved as an OCI archive."""
    deb = build_deb(out)
    tag = f"{IMAGE}:{version()}"
    with tempfile.TemporaryDirectory(prefix="gpuslice-image-") as tmp:
        root = Path(tmp) / "rootfs"
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(image_packages())}",
                        IMAGE_SUITE, str(root), image_mirror()], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        shutil.copy2(deb, root / "tmp" / deb.name)
        subprocess.run(["chroot", str(root), "dpkg", "-i", f"/tmp/{deb.name}"], check=True, stdout=subprocess.DEVNULL)
        (root / "tmp" / deb.name).unlink()
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (root / cache).glob("*"):
                if p.is_file():
                    p.unlink()
        tar = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tar), "."], check=True)
        subprocess.run(["podman", "import", "--change", 'ENTRYPOINT ["gpuslice"]', "--change",
                        'CMD ["kubelet-plugin"]', str(tar), tag], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    archive = out / f"gpuslice-kubelet-plugin_{version()}.oci.tar"
    archive.unlink(missing_ok=True)
    subprocess.run(["podman", "save", "--format", "oci-archive", "-o", str(archive), tag], check=True)
    return archive


def main() -> None:
    kinds: dict[str, Callable[[Path], Path]] = {
        "deb": build_deb,
        "rpm": build_rpm,
        "sim-deb": lambda out: build_deb(out, SIM),
        "sim-rpm": lambda out: build_rpm(out, SIM),
        "image": build_image,
    }
    if len(sys.argv) not in (2, 3) or sys.argv[1] not in kinds:
        raise SystemExit(f"usage: packaging/build.py {'|'.join(kinds)} [OUTPUT_DIR]")
    out = Path(sys.argv[2]) if len(sys.argv) == 3 else ROOT / "dist"
    print(kinds[sys.argv[1]](out))


if __name__ == "__main__":
    main()
