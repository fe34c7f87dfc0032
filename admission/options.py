"""The admission webhook's configuration: one type, with its defaults (the
command line reads them from here). HAMi's resource names are its chart's
(resourceName, resourceMem, resourceMemPercentage, resourceCores,
resourcePriority), configurable there and so here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice import errors
from gpuslice.admission import hami

MODES = ("devicePlugin", "runtimeClass", "dra")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z", re.ASCII)


@dataclass(frozen=True)
class WebhookOptions:
    listen: str = "0.0.0.0:8443"  # HOST:PORT the API server calls (the chart's Service points here)
    mode: str = "devicePlugin"  # the chart's mode: how a rewritten pod asks gpuslice
    tls_cert: Path = Path("/etc/gpuslice/webhook/tls.crt")
    tls_key: Path = Path("/etc/gpuslice/webhook/tls.key")
    resource_name: str = hami.HAMI.count
    resource_mem: str = hami.HAMI.memory
    resource_mem_percentage: str = hami.HAMI.memory_percentage
    resource_cores: str = hami.HAMI.cores
    resource_priority: str = hami.HAMI.priority
    largest_gpu_memory: int = 0  # MiB: the cluster's largest GPU; 0: as the device plugins publish it, or unchecked
    # devicePlugin mode: read the largest GPU from the Nodes the plugins publish on; dra: write the templates
    use_api: bool = True
    kubeconfig: str | None = None  # None: the pod's in-cluster service account
    # mode dra: the MutatingWebhookConfiguration that owns the templates written (deleted with it); None: no owner
    templates_owner: str | None = None
    scheduler_names: tuple[str, ...] = field(default=())  # FROM=TO: a pod's schedulerName and the one it gets

    def schedulers(self) -> dict[str, str]:
        """--scheduler-name FROM=TO, each checked: both names a DNS subdomain, as schedulerName is."""
        out = {}
        for pair in self.scheduler_names:
            old, sep, new = pair.partition("=")
            if not sep or not _DNS_SUBDOMAIN.match(old) or not _DNS_SUBDOMAIN.match(new):
                raise errors.InvalidArgument(
                    f"--scheduler-name {pair!r}: accepted FROM=TO, each a scheduler's name (a DNS subdomain), "
                    "such as hami-scheduler=default-scheduler"
                )
            out[old] = new
        return out

    def names(self) -> tuple[hami.Names, ...]:
        """HAMi's names as configured, then Volcano's."""
        ours = hami.Names("HAMi", self.resource_name, self.resource_mem, self.resource_mem_percentage,
                          self.resource_cores, self.resource_priority)  # fmt: skip
        return (ours, hami.VOLCANO)
