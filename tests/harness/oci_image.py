"""An OCI image archive made from a root filesystem directory, for `ctr images
import` and `docker load`: one layer, a config with the command, the
containerd name annotation and Docker's manifest.json."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path


def _blob(tar: tarfile.TarFile, data: bytes, media_type: str) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_archive(rootfs: Path, name: str, cmd: list[str], out: Path) -> Path:
    """`out`: an OCI image layout tar of `rootfs` named `name` (docker.io/library/x:1)."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as layer:
        for path in sorted(rootfs.rglob("*")):
            layer.add(path, arcname=str(path.relative_to(rootfs)), recursive=False)
    layer_bytes = layer_buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": cmd, "Env": ["PATH=/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    with tarfile.open(out, "w") as tar:
        _add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        layer_desc = _blob(tar, layer_bytes, "application/vnd.oci.image.layer.v1.tar")
        config_desc = _blob(tar, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": config_desc, "layers": [layer_desc]}  # fmt: skip
        manifest_desc = _blob(tar, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
        manifest_desc["annotations"] = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": "1"}
        _add(tar, "index.json", json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}).encode())
        docker = [{"Config": f"blobs/sha256/{config_desc['digest'][7:]}", "RepoTags": [name.split("/", 2)[-1]],
                   "Layers": [f"blobs/sha256/{layer_desc['digest'][7:]}"]}]  # fmt: skip
        _add(tar, "manifest.json", json.dumps(docker).encode())
    return out
