"""The admission webhook's configuration: one type, with its defaults (the
command line reads them from here). HAMi's resource names are its chart's
(resourceName, resourceMem, resourceMemPercentage, resourceCores,
resourcePriority), configurable there and so here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuslice.admission import hami

MODES = ("devicePlugin", "runtimeClass")


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

    def names(self) -> tuple[hami.Names, ...]:
        """HAMi's names as configured, then Volcano's."""
        ours = hami.Names("HAMi", self.resource_name, self.resource_mem, self.resource_mem_percentage,
                          self.resource_cores, self.resource_priority)  # fmt: skip
        return (ours, hami.VOLCANO)
