"""The `kubernetes` client, configured once for a node component: from a
kubeconfig file, else the pod's in-cluster service account."""

from __future__ import annotations

from types import ModuleType

from gpuslice import errors


def client(kubeconfig: str | None, who: str) -> ModuleType:
    """`kubernetes.client`, its configuration loaded; `who` names the component in the errors."""
    try:
        from kubernetes import client as kube_client
        from kubernetes import config
    except ImportError as e:
        raise errors.FailedPrecondition(
            f"{who} needs the `kubernetes` Python client (pip install 'gpuslice[dra]')"
        ) from e
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig)
        else:
            config.load_incluster_config()
    except config.ConfigException as e:
        raise errors.FailedPrecondition(f"no access to the API server: {e}") from e
    return kube_client
