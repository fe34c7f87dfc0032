"""Mode dra: the ResourceClaimTemplates a rewritten pod's claims are made
from, written into the pod's namespace before the pod is let through
(admission/claim_template.py builds them). The webhook is declared
`sideEffects: NoneOnDryRun`: a dry run's pod is rewritten the same, and
nothing is written for it.

A template's name is its content's digest, so a template already there
under that name is the one wanted: a create answered 409 reads it back and
takes it if its spec is the same (one that is not is someone else's object
under gpuslice's name, and the pod is refused naming it). A template written
for a pod that another admission step then refuses stays: it is what the
next pod of that shape uses. Each one written or found is remembered for a
minute, so a burst of pods of one shape costs one write."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuslice import errors

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "resource.k8s.io", "v1", "resourceclaimtemplates"
KNOWN_S = 60.0
# a call's bound: a create and a read back stay within the webhook's own timeout (the chart's
# timeoutSeconds, 10), so the API server hears a refusal in words rather than a timeout
CALL_TIMEOUT_S = 3.0


class TemplateWriter:
    """Writes templates through the API server (`kubernetes` client, CustomObjectsApi)."""

    def __init__(self, kubeconfig: str | None, timeout: float = CALL_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        from gpuslice import kube

        self.client = kube.client(kubeconfig, "the admission webhook")
        self.objects = self.client.CustomObjectsApi()
        self.timeout = timeout
        self.clock = clock
        self.known: dict[tuple[str, str], float] = {}  # (namespace, name) -> when last written or found
        self.lock = threading.Lock()

    def __call__(self, namespace: str, templates: list[dict[str, Any]], dry_run: bool) -> None:
        for t in templates:
            self._ensure(namespace, t, dry_run)

    def _ensure(self, namespace: str, template: dict[str, Any], dry_run: bool) -> None:
        name = template["metadata"]["name"]
        key = (namespace, name)
        if dry_run:
            return
        with self.lock:
            seen = self.known.get(key)
        if seen is not None and self.clock() - seen < KNOWN_S:
            return
        body = {**template, "metadata": {**template["metadata"], "namespace": namespace}}
        try:
            self.objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body,
                                                         _request_timeout=self.timeout)  # fmt: skip
            log.info("ResourceClaimTemplate %s/%s written", namespace, name)
        except self.client.ApiException as e:
            if e.status != 409:
                raise errors.Unavailable(f"ResourceClaimTemplate {namespace}/{name}: the API server answered "
                                         f"{e.status} {e.reason}") from e  # fmt: skip
            self._same(namespace, template)
        except Exception as e:  # urllib3's errors (refused, retries spent) are not OSErrors
            raise errors.Unavailable(f"ResourceClaimTemplate {namespace}/{name}: the API server: "
                                     f"{type(e).__name__}: {e}") from e  # fmt: skip
        with self.lock:
            self.known[key] = self.clock()
            for k in [k for k, at in self.known.items() if self.clock() - at >= KNOWN_S]:
                del self.known[k]

    def _same(self, namespace: str, template: dict[str, Any]) -> None:
        """The template already there under its name: taken if it asks the same."""
        name = template["metadata"]["name"]
        try:
            there = self.objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                              _request_timeout=self.timeout)  # fmt: skip
        except self.client.ApiException as e:
            raise errors.Unavailable(f"ResourceClaimTemplate {namespace}/{name}: the API server answered "
                                     f"{e.status} {e.reason}") from e  # fmt: skip
        if there.get("spec") != template["spec"]:
            raise errors.InvalidArgument(f"ResourceClaimTemplate {namespace}/{name} exists and asks something "
                                         "else (it is not one the webhook wrote); accepted: that name left to "
                                         "gpuslice's webhook")  # fmt: skip
