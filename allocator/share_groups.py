"""Share groups: how a container given shares of claims (DRA) or of device
plugin allocations joins them. Its processes charge exactly those shares,
together with the other containers given the same set, through one share
group (a store row of kind SHARE_GROUP with the slice files its members
attach to). The rules here read the index; SliceManager writes.

A share is named by its owner (kind and UID) and its share ID. A container's
entry names a UID and a share and carries the share's membership key; which
kind of owner it is, the key proves (allocator/membership.py): only the
daemon can make a key, and it makes it over the kind."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from gpuslice import errors
from gpuslice import request as requests
from gpuslice.allocator.membership import MembershipKey, claim_share, devices_share
from gpuslice.allocator.records import SHARE_OWNERS, Allocation, OwnerKind, ShareOwner, SliceRecord
from gpuslice.allocator.slice_index import Index

Compute = requests.SizedElsewhere  # a device plugin container's own policy, priority and GPU choice


class Conflict(errors.FailedPrecondition):
    """The request contradicts what the store holds (e.g. another pid, other limits)."""


@dataclass(frozen=True)
class ShareEntry:
    """A share as a container's entry names it: an owner's UID, the share, and
    the share's membership key (the device's)."""

    uid: str
    share: str
    token: str = ""

    def __str__(self) -> str:
        return f"{self.uid}/{self.share}"


@dataclass(frozen=True)
class ShareRef:
    """A share a container was given, its owner proven by its key."""

    owner: ShareOwner
    share: str
    token: str = ""

    def __str__(self) -> str:
        return f"{self.owner.uid}/{self.share}"


def subject(owner: ShareOwner, share: str) -> str:
    """What a share's membership key is made over."""
    return (devices_share if owner.kind is OwnerKind.DEVICES else claim_share)(owner.uid, share)


def keys(membership: MembershipKey, owner: SliceRecord) -> dict[str, str]:
    """A claim's (or allocation's) membership key per share, for the devices that give them."""
    return {a.share: membership.token(subject(owner.share_owner, a.share)) for a in owner.allocations}


def typed(membership: MembershipKey, entries: list[ShareEntry]) -> list[ShareRef]:
    """Each entry with the owner its key proves; one line for one that none does."""
    refs = []
    for e in entries:
        kinds = [k for k in SHARE_OWNERS if membership.admits(subject(ShareOwner(k, e.uid), e.share), e.token)]
        if not kinds:  # before anything is looked up: a forged entry learns nothing, not even whether the owner is here
            raise errors.FailedPrecondition(
                f"share {e}: the container was not given its device (the entry lacks the share's key, which only "
                "the DRA plugin's or the device plugin's answer carries)"
            )
        refs.append(ShareRef(ShareOwner(kinds[0], e.uid), e.share, e.token))
    return list(dict.fromkeys(refs))


def named(index: Index, membership: MembershipKey, refs: list[ShareRef]) -> list[Allocation]:
    """The shares the refs name, each reserved here (its owner's allocation)."""
    found: dict[tuple[ShareOwner, str], Allocation] = {}
    for ref in refs:
        devices = ref.owner.kind is OwnerKind.DEVICES
        if not membership.admits(subject(ref.owner, ref.share), ref.token):
            raise errors.FailedPrecondition(
                f"{'allocation' if devices else 'claim'} share {ref}: the container was not given its device (the "
                f"entry lacks the share's key, which only the {'device plugin' if devices else 'claim'}'s answer "
                "carries)"
            )
        owner = index.owners.get(ref.owner)
        if owner is None:
            raise errors.NotFound(
                f"the slice of {ref.owner} is not on this node "
                f"(the {'device plugin reserves' if devices else 'DRA plugin prepares'} it before the pod's "
                "containers start)"
            )
        shares = [a for a in owner.allocations if a.share == ref.share]
        if not shares:
            raise errors.NotFound(f"{ref.owner} has no share {ref.share} on this node")
        for a in shares:
            found[(ref.owner, a.share)] = dataclasses.replace(a, of=ref.owner)
    return sorted(found.values(), key=order)


def order(a: Allocation) -> tuple:
    """Allocations as the store lists them."""
    return (a.gpu_index, a.of.kind.value if a.of else "", a.of.uid if a.of else "", a.share)


def group_key(shares: list[Allocation]) -> str:
    """The key of the share group that charges exactly these shares together
    (a digest of their names; the same as before owners were typed, so groups
    made then are found again)."""
    names = sorted(f"{a.of.uid if a.of else ''}/{a.share}" for a in shares)
    return "shares-" + hashlib.sha256("\n".join(names).encode()).hexdigest()[:24]


def group_label(shares: list[Allocation]) -> str:
    owners = sorted({a.of for a in shares if a.of})
    return "shares of " + ", ".join(str(o) for o in owners)


def agreed(allocs: list[Allocation]) -> tuple[str, str]:
    """A slice's own policy and priority: its shares' where they agree (each share keeps its own)."""
    policies, priorities = {a.policy for a in allocs}, {a.priority for a in allocs}
    policy = policies.pop() if len(policies) == 1 else requests.ComputePolicy.ELASTIC.value
    priority = priorities.pop() if len(priorities) == 1 else requests.Priority.NORMAL.value
    return policy, priority


def one_device_slice(container_id: str, wanted: list[Allocation]) -> None:
    """A container's device plugin shares make one slice: memory and cores on
    one GPU (memory asked: a share of compute without memory could hold
    nothing), or whole GPUs only, never both and never with a claim's."""
    devices = [a for a in wanted if a.of and a.of.kind is OwnerKind.DEVICES]
    if not devices:
        return
    resources = {a.share for a in devices}
    partial = {a.gpu_uuid for a in devices if a.share != "gpu"}
    said = f"container {container_id}"
    if len(devices) != len(wanted):
        raise errors.InvalidArgument(f"{said}: gpuslice.io/* extended resources and a DRA claim together; use one")
    if "gpu" in resources and resources != {"gpu"}:
        raise errors.InvalidArgument(
            f"{said}: gpuslice.io/gpu with gpuslice.io/memory or cores; ask whole GPUs or a slice"
        )
    if len(partial) > 1:
        raise errors.FailedPrecondition(
            f"{said}: its gpuslice.io/memory and gpuslice.io/cores lie on GPUs {', '.join(sorted(partial))}; a slice "
            "lies on one GPU (the device plugin refuses such a pod at admission; this one was allocated otherwise)"
        )
    if resources == {"cores"}:
        raise errors.InvalidArgument(f"{said}: gpuslice.io/cores without gpuslice.io/memory; ask both in its limits")


def with_compute(a: Allocation, compute: Compute) -> Allocation:
    """A device plugin share with the container's policy and priority (a claim's share keeps its own)."""
    if not a.of or a.of.kind is not OwnerKind.DEVICES:
        return a
    # the policy rules a share of compute: a memory share holds none, and stays elastic
    policy = compute.policy.value if a.share == "cores" else a.policy
    return dataclasses.replace(a, policy=policy, priority=compute.priority.value)


def no_other_group(index: Index, key: str, wanted: list[Allocation]) -> None:
    """A share is charged through one group at a time: two containers given
    overlapping but different sets of shares cannot both hold them exactly."""
    asked = {(a.of, a.share) for a in wanted}
    for owner in sorted({a.of for a in wanted if a.of}):
        rec = index.owners[owner]
        if index.members.get(rec.id):
            # members joined before groups (an upgrade) charge the owner's own files, all its shares
            others: list[tuple[SliceRecord, set[tuple[ShareOwner | None, str]]]] = [
                (rec, {(owner, a.share) for a in rec.allocations})
            ]
        else:
            others = [
                (g, {(a.of, a.share) for a in g.allocations}) for g in index.groups_of(owner) if g.container_id != key
            ]
        for g, held in others:
            overlap = sorted(asked & held, key=lambda s: s[1])
            if overlap:
                users = ", ".join(sorted(index.members.get(g.id, ())))
                raise Conflict(
                    f"claim share {owner.uid}/{overlap[0][1]} is in use by container(s) {users} with other shares "
                    "of the claim; give containers that share a claim either the same requests of it or requests "
                    "that do not overlap"
                )
