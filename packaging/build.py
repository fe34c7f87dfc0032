"""Build the node packages from this repository, versioned from pyproject.

    python packaging/build.py deb     -> dist/gpuslice_<version>_<arch>.deb
    python packaging/build.py rpm     -> dist/gpuslice-<version>-1.<arch>.rpm

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
SUMMARY = "GPU sharing for containers: memory limits and compute shares"
DESCRIPTION = (
    "gpuslice lets containerd, CRI-O, Podman and Docker put several containers\n"
    "on one NVIDIA GPU, each with a hard memory limit and a compute share: an\n"
    "allocator daemon, an OCI hook, a runtime shim, CDI specs and a wrapper libcuda."
)


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


def stage(dest: Path) -> None:
    """The installed file tree, shared by both package formats."""
    with tempfile.TemporaryDirectory() as t:
        wheels = Path(t)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)], check=True
        )
        pydir = dest / PYDIR.lstrip("/")
        pip = [sys.executable, "-m", "pip", "install", "-q", "--target", str(pydir), "--no-compile"]
        subprocess.run([*pip, "--no-deps", *map(str, wheels.glob("gpuslice-*.whl"))], check=True)
        subprocess.run([*pip, "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                        "--abi", "cp311", "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                        "--platform", "manylinux_2_28_x86_64", *VENDORED], check=True)  # fmt: skip
    for junk in (*pydir.glob("bin"), *pydir.rglob("__pycache__")):
        shutil.rmtree(junk, ignore_errors=True)
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
    from gpuslice.install import hooks_d

    for name, text in hooks_d("/usr/bin/gpuslice-hook").items():
        (hooks / name).write_text(text)
    doc = dest / "usr/share/doc/gpuslice"
    doc.mkdir(parents=True)
    for f in ("README.md", *(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))):
        shutil.copy2(ROOT / f, doc / Path(f).name)
    (doc / "copyright").write_text(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        "Upstream-Name: gpuslice\n\nFiles: *\nCopyright: 2026 the gpuslice authors\nLicense: Apache-2.0\n"
        " On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.\n"
    )
    tools = dest / PYDIR.lstrip("/") / "gpuslice/_native/tools"
    for p in dest.rglob("*"):
        if p.is_dir():
            p.chmod(0o755)
        elif p.is_file():
            runnable = p.parent in (bindir, tools)
            p.chmod(0o755 if runnable else 0o644)
            if p.suffix == ".so" or ".so." in p.name or p.parent == tools or p.name in EXECUTABLES:
                # debug symbols stay out of a node package; dynamic symbols stay in
                subprocess.run(["strip", "--strip-unneeded", str(p)], check=True)


def maintscript(action: str) -> str:
    body = (PKG / "scripts/maintscript.sh").read_text()
    return f"#!/bin/sh\nset -e\n{body}\n{action}\n"


def build_deb(out: Path) -> Path:
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as t:
        dest = Path(t) / "root"
        stage(dest)
        doc = dest / "usr/share/doc/gpuslice"
        with open(doc / "changelog.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as z:
            f = io.TextIOWrapper(z)
            f.write(
                f"gpuslice ({version()}) unstable; urgency=medium\n\n  * Release {version()}.\n\n"
                " -- gpuslice maintainers <maintainers@gpuslice.dev>  Sat, 21 Nov 2026 00:00:00 +0000\n"
            )
            f.flush()
            f.detach()
        overrides = dest / "usr/share/lintian/overrides"
        overrides.mkdir(parents=True)
        shutil.copy2(PKG / "lintian-overrides", overrides / "gpuslice")
        control = dest / "DEBIAN"
        control.mkdir()
        size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) // 1024
        (control / "control").write_text(
            f"Package: gpuslice\nVersion: {version()}\nArchitecture: {arch}\nMaintainer: gpuslice maintainers "
            f"<maintainers@gpuslice.dev>\nInstalled-Size: {size}\nDepends: {', '.join(DEB_DEPENDS)}\n"
            "Recommends: podman | containerd, runc\nSection: admin\nPriority: optional\n"
            "Homepage: https://gpuslice.invalid/\n"
            f"Description: {SUMMARY}\n" + "".join(f" {line}\n" for line in DESCRIPTION.splitlines())
        )
        (control / "conffiles").write_text("/etc/gpuslice/daemon.yaml\n")
        scripts = {
            "postinst": 'case "$1" in configure) gpuslice_configure ;; esac',
            "prerm": 'case "$1" in remove|upgrade|deconfigure) gpuslice_stop ;; esac',
            "postrm": 'case "$1" in purge) gpuslice_purge ;; esac',
        }
        for name, action in scripts.items():
            (control / name).write_text(maintscript(action))
            (control / name).chmod(0o755)
        out.mkdir(parents=True, exist_ok=True)
        deb = out / f"gpuslice_{version()}_{arch}.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(dest), str(deb)], check=True,
                       capture_output=True)  # fmt: skip
    return deb


def build_rpm(out: Path) -> Path:
    arch = platform.machine()
    with tempfile.TemporaryDirectory() as t:
        top = Path(t)
        dest = top / "root"
        stage(dest)
        files = []
        for p in sorted(dest.rglob("*")):
            rel = "/" + str(p.relative_to(dest))
            if p.is_dir():
                if rel.startswith(("/usr/lib/gpuslice", "/usr/share/doc/gpuslice", "/etc/gpuslice")):
                    files.append(f"%dir {rel}")
            elif rel == "/etc/gpuslice/daemon.yaml":
                files.append(f"%config(noreplace) {rel}")
            else:
                files.append(rel)
        spec = top / "gpuslice.spec"
        spec.write_text(
            f"Name: gpuslice\nVersion: {version()}\nRelease: 1\nSummary: {SUMMARY}\nLicense: Apache-2.0\n"
            "Group: System Environment/Daemons\nPackager: gpuslice maintainers <maintainers@gpuslice.dev>\n"
            f"URL: https://gpuslice.invalid/\nRequires: {', '.join(RPM_REQUIRES)}\nRecommends: podman, runc\n"
            "AutoReqProv: no\n\n"
            f"%description\n{DESCRIPTION}\n\n"
            f"%install\ncp -a {dest}/. %{{buildroot}}/\n\n"
            f"%post\n{maintscript('gpuslice_configure')}\n"
            f"%preun\n{maintscript(RPM_PREUN)}\n"
            f"%postun\n{maintscript(RPM_POSTUN)}\n"
            "%files\n" + "\n".join(files) + "\n\n"
            f"%changelog\n* Sat Nov 21 2026 gpuslice maintainers <maintainers@gpuslice.dev> - {version()}-1\n"
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
    kinds = {"deb": build_deb, "rpm": build_rpm, "image": build_image}
    if len(sys.argv) not in (2, 3) or sys.argv[1] not in kinds:
        raise SystemExit("usage: packaging/build.py deb|rpm|image [OUTPUT_DIR]")
    out = Path(sys.argv[2]) if len(sys.argv) == 3 else ROOT / "dist"
    print(kinds[sys.argv[1]](out))


if __name__ == "__main__":
    main()
