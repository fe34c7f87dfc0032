"""What the slice store holds, as types: a slice's record, its allocations,
its owner's kind and UID, and the workload it serves."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class OwnerKind(str, Enum):
    """What a slice belongs to. A new kind of owner is a new value here, not a
    convention in a key, a name or a request."""

    CONTAINER = "container"  # a container's own slice (hook, shim, CLI)
    CLAIM = "claim"  # a DRA claim's slice: kept until the kubelet unprepares it
    # a device plugin's allocation: the units of one resource the kubelet gave
    # one container; kept while the kubelet holds them (pod-resources), joined
    # by the container's shares as a claim is
    DEVICES = "devices"
    MEMBER = "member"  # a container in a share group: no capacity of its own
    # a share group: the shares (of claims, of allocations) that a container's
    # processes charge together, with the slice files its members attach to;
    # its allocations are the shares' and book nothing (their owners do)
    SHARE_GROUP = "shares"


# owners whose shares containers join (ShareRef)
SHARE_OWNERS = (OwnerKind.CLAIM, OwnerKind.DEVICES)


@dataclass(frozen=True, order=True)
class ShareOwner:
    """Whose share an allocation is: a claim by its UID, a device plugin
    allocation by its key."""

    kind: OwnerKind
    uid: str

    def __str__(self) -> str:
        return f"{'allocation' if self.kind is OwnerKind.DEVICES else 'claim'} {self.uid}"


@dataclass(frozen=True)
class Allocation:
    """One share of a slice on one GPU. `share` tells shares on the same GPU
    apart (a DRA share ID, a device plugin resource); policy and priority are
    the share's own where set, else the slice's. `of`: the claim or allocation
    whose share it is (on its own slice and on a share group's), None on a
    container's slice."""

    gpu_index: int
    gpu_uuid: str
    memory: int
    cores: int
    share: str = ""
    policy: str = ""
    priority: str = ""
    of: ShareOwner | None = None


@dataclass(frozen=True)
class Workload:
    """The Kubernetes workload a slice serves, as people look for it: its
    namespace, pod and container name (a claim's slice: the claim's namespace
    and the pod it is reserved for, no container). Empty outside Kubernetes."""

    namespace: str = ""
    pod: str = ""
    container: str = ""

    def __bool__(self) -> bool:
        return bool(self.namespace or self.pod or self.container)


NO_WORKLOAD = Workload()


@dataclass(frozen=True)
class SliceRecord:
    id: str
    container_id: str  # the key it is listed and released by
    state: str
    request: dict
    policy: str
    priority: str
    whole: bool
    owner: str  # free text: who asked
    created_ms: int
    bound_ms: int | None
    pid: int | None
    pid_ns: int | None
    cgroup: str | None
    pid_start: int | None
    allocations: tuple[Allocation, ...]
    kind: OwnerKind = OwnerKind.CONTAINER
    member_of: str | None = None  # a member's share group (its id)
    workload: Workload = NO_WORKLOAD
    uid: str = ""  # its owner's UID: a claim's UID, an allocation's key; else its key

    @property
    def share_owner(self) -> ShareOwner:
        return ShareOwner(self.kind, self.uid or self.container_id)

    @property
    def file_gpus(self) -> tuple[str, ...]:
        """The UUIDs of its slice files' GPUs, in the files' order: shares on
        one GPU add up to one entry there (SliceManager._limits)."""
        return tuple(dict.fromkeys(a.gpu_uuid for a in self.allocations))

    @property
    def books(self) -> bool:
        """Whether its allocations count against the GPUs (a share group's are its owners')."""
        return self.kind is not OwnerKind.SHARE_GROUP

    def owners(self) -> set[ShareOwner]:
        """The claims and allocations whose shares it holds."""
        return {a.of for a in self.allocations if a.of is not None}
