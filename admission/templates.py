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
minute, so a burst of pods of one shape costs one write.

Each template written names the webhook's MutatingWebhookConfiguration as its
owner (`owner`: its name; the chart's, `gpuslice-admission`): the templates
are of that webhook, and Kubernetes' garbage collector deletes them with it
(a namespaced object may have a cluster-scoped owner), so uninstalling the
chart leaves none behind in the users' namespaces. A pod's claim, once made
from its template, is the pod's own, and goes on without it. The owner's UID
is read once, at the first write; a configuration that cannot be read is
said once in the log, and templates are written without an owner rather
than pods refused, until a read a minute later finds it. A template found
there (written by a webhook from before owners, or while the owner could not
be read, or naming a configuration of that name since deleted and made
again) is given the owner then, by a merge patch conditional on its
resourceVersion; one that cannot be patched is said once in the log and used
all the same."""

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
                 clock: Callable[[], float] = time.monotonic, owner: str | None = None) -> None:  # fmt: skip
        from gpuslice import kube

        self.client = kube.client(kubeconfig, "the admission webhook")
        self.objects = self.client.CustomObjectsApi()
        self.timeout = timeout
        self.clock = clock
        self.known: dict[tuple[str, str], float] = {}  # (namespace, name) -> when last written or found
        self.lock = threading.Lock()
        self.owner = owner  # the MutatingWebhookConfiguration's name; None: templates without an owner
        self._owner_ref: list[dict[str, str]] | None = None  # read at the first write
        self._owner_tried = -KNOWN_S  # when it was last read (again a minute after one that failed)
        self._owner_warned = False
        self._adopt_warned = False
        self._owner_lock = threading.Lock()  # its read (a call of up to `timeout`) holds back no other check

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
        body = {**template, "metadata": {**template["metadata"], "namespace": namespace, **self._owned()}}
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

    def _owned(self) -> dict[str, list[dict[str, str]]]:
        """A template's ownerReferences: the webhook's configuration, once its UID is read."""
        if self.owner is None:
            return {}
        with self._owner_lock:
            if self._owner_ref is None and self.clock() - self._owner_tried >= KNOWN_S:
                self._owner_tried = self.clock()
                self._owner_ref = self._read_owner(self.owner)
            return {"ownerReferences": self._owner_ref} if self._owner_ref else {}

    def _read_owner(self, name: str) -> list[dict[str, str]] | None:
        """Its owner reference; None (read again a minute on) if the configuration cannot be read."""
        api = self.client.AdmissionregistrationV1Api()
        try:
            there = api.read_mutating_webhook_configuration(name, _request_timeout=self.timeout)
        except Exception as e:  # refused (RBAC), not there, or no answer: the pods go on
            said = f"{e.status} {e.reason}" if isinstance(e, self.client.ApiException) else f"{type(e).__name__}: {e}"
            if not self._owner_warned:
                log.warning("MutatingWebhookConfiguration %s, the templates' owner: the API server: %s; templates "
                            "are written without an owner (not deleted with it) until it can be read",
                            name, said)  # fmt: skip
            self._owner_warned = True
            return None
        return [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                 "name": name, "uid": str(there.metadata.uid)}]  # fmt: skip

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
        self._adopt(namespace, name, there.get("metadata") or {})

    def _adopt(self, namespace: str, name: str, meta: dict[str, Any]) -> None:
        """A template found there without the owner gets it: its other owners kept, one naming
        an earlier configuration of that name (a UID since gone) replaced."""
        owned = self._owned().get("ownerReferences")
        refs = meta.get("ownerReferences") or []
        if not owned or owned[0] in refs:
            return
        ours = owned[0]
        kept = [r for r in refs if (r.get("kind"), r.get("name")) != (ours["kind"], ours["name"])]
        patch = {"metadata": {"ownerReferences": [*kept, ours], "resourceVersion": meta.get("resourceVersion")}}
        try:
            self.objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch,
                                                        _content_type="application/merge-patch+json",
                                                        _request_timeout=self.timeout)  # fmt: skip
            log.info("ResourceClaimTemplate %s/%s given its owner, MutatingWebhookConfiguration %s", namespace, name,
                     ours["name"])  # fmt: skip
        except Exception as e:  # refused (RBAC), moved on meanwhile (409), or no answer: it is used all the same
            said = f"{e.status} {e.reason}" if isinstance(e, self.client.ApiException) else f"{type(e).__name__}: {e}"
            if not self._adopt_warned:
                log.warning("ResourceClaimTemplate %s/%s: giving it its owner, the API server: %s; templates "
                            "found without it stay so (not deleted with the webhook)",
                            namespace, name, said)  # fmt: skip
            self._adopt_warned = True
