"""deploy/overlays/ (kustomize, for nodes that carry the gpuslice package)
rendered from the one source, the Helm chart deploy/helm/gpuslice:
`python -m tools.render_deploy` rewrites them; `--check` says which differ
(tests/integration/test_chart.py runs it)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import yaml

from tools.helm import REPO, template_text

OVERLAYS = REPO / "deploy" / "overlays"
NAMESPACE = "gpuslice-system"
# the nodes carry the .deb (its daemon under systemd): no node agent, no dashboard
NODE_PACKAGE = ("nodeAgent.enabled=false", "metrics.dashboard.enabled=false")  # explicit, whatever the defaults


@dataclass(frozen=True)
class Overlay:
    name: str
    kube_version: str  # the newest Kubernetes the mode is meant for
    sets: tuple[str, ...]
    why: str


OVERLAY_LIST = (
    Overlay("dra", "1.37.0", ("mode=dra",), "the DRA driver gpuslice.io (Kubernetes >= 1.36, or 1.34-1.35 with gates)"),
    Overlay("device-plugin", "1.35.0", ("mode=devicePlugin",), "the device plugin (Kubernetes 1.30-1.35)"),
    Overlay("device-plugin-extender", "1.35.0", ("mode=devicePlugin", "devicePlugin.schedulerExtender.enabled=true"),
            "the device plugin and the gpuslice-scheduler profile with its extender (Kubernetes 1.30-1.35)"),
    Overlay("runtimeclass", "1.37.0", ("mode=runtimeClass",), "the RuntimeClass path: annotations, nothing counted"),
)  # fmt: skip


def rendered(o: Overlay) -> dict[str, str]:
    """The overlay's files: the chart's objects (a Namespace first where any
    is namespaced) and the kustomization naming them."""
    text = template_text(o.kube_version, *o.sets, *NODE_PACKAGE, namespace=NAMESPACE)
    namespaced = any(d and d["metadata"].get("namespace") == NAMESPACE for d in yaml.safe_load_all(text))
    namespace = f"---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n" if namespaced else ""
    sets = " --set ".join(o.sets + NODE_PACKAGE)
    head = (
        f"# {o.why}\n# Rendered from deploy/helm/gpuslice (helm template --set {sets})"
        " by tools/render_deploy.py: edit the chart, not this file.\n"
    )
    kustomization = (
        f"# kubectl apply -k deploy/overlays/{o.name}\n# {o.why}\n"
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources:\n  - gpuslice.yaml\n"
    )
    return {"gpuslice.yaml": head + namespace + text, "kustomization.yaml": kustomization}


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for o in OVERLAY_LIST:
        for name, text in rendered(o).items():
            path = OVERLAYS / o.name / name
            if check:
                if not path.is_file() or path.read_text() != text:
                    stale.append(str(path.relative_to(REPO)))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if stale:
        print(f"render_deploy: stale, run python -m tools.render_deploy: {', '.join(stale)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
