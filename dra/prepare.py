"""NodePrepareResources and NodeUnprepareResources for one claim: the claim's
allocation read from the API server becomes one slice of the daemon on exactly
the allocated GPUs with exactly the consumed memory and cores (keyed by the
claim's UID), and a CDI spec of kind gpuslice.io/claim whose device gives a
container the GPUs, the interposer and the claim's name. Each claim is all or
nothing: a failure leaves no slice, no spec and no checkpoint entry."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from gpuslice import constants, errors, request
from gpuslice.cdi import spec as cdi_spec
from gpuslice.client import AllocatorClient
from gpuslice.dra import claims as claim_model
from gpuslice.dra.checkpoint import Checkpoint, Prepared
from gpuslice.dra.resource_slice import index_of

log = logging.getLogger(__name__)

ClaimReader = Callable[[str, str], dict[str, Any]]  # (namespace, name) -> the ResourceClaim


@dataclass(frozen=True)
class ClaimRef:
    uid: str
    namespace: str
    name: str


def slice_id(uid: str) -> str:
    return constants.CLAIM_SLICE_PREFIX + uid


def cdi_device_id(uid: str) -> str:
    return f"{constants.CDI_CLAIM_KIND}={uid}"


def _merge(parts: list[cdi_spec.ContainerEdits]) -> cdi_spec.ContainerEdits:
    """Edits of several devices as one, each entry once, in order."""

    def once(items: list[Any]) -> tuple[Any, ...]:
        return tuple(dict.fromkeys(items))

    return cdi_spec.ContainerEdits(
        env=once([e for p in parts for e in p.env]),
        device_nodes=once([d for p in parts for d in p.device_nodes]),
        mounts=once([m for p in parts for m in p.mounts]),
        hooks=once([h for p in parts for h in p.hooks]),
    )


class Preparer:
    def __init__(self, node: str, daemon: AllocatorClient, read_claim: ClaimReader, base: cdi_spec.Spec,
                 cdi_dir: Path, checkpoint: Checkpoint) -> None:  # fmt: skip
        self.node = node
        self.daemon = daemon
        self.read_claim = read_claim
        self.base = base  # the node's gpuslice.io/gpu spec: the edits for each GPU
        self.cdi_dir = cdi_dir
        self.checkpoint = checkpoint

    def spec_path(self, uid: str) -> Path:
        return self.cdi_dir / f"gpuslice.io-claim_{uid}.json"

    def prepare(self, ref: ClaimRef) -> list[dict[str, Any]]:
        """The devices to answer for the claim; raises GpusliceError with one line."""
        done = self.checkpoint.get(ref.uid)
        if done is not None:
            return done.devices  # the kubelet asks again after a restart: the same answer
        claim = self.read_claim(ref.namespace, ref.name)
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise errors.FailedPrecondition(f"claim {ref.namespace}/{ref.name} is now UID {uid}, not {ref.uid}")
        try:
            parsed = claim_model.parse(claim, self.node)
            annotations = self._annotations(parsed, self._gpus(parsed))
        except claim_model.ClaimError as e:
            raise claim_model.ClaimError(f"claim {ref.namespace}/{ref.name}: {e}") from None
        sid = slice_id(ref.uid)
        try:
            self.daemon.reserve(sid, annotations, owner=f"dra {ref.namespace}/{ref.name}")
        except grpc.RpcError as e:
            raise errors.FailedPrecondition(f"claim {ref.namespace}/{ref.name}: {e.details()}") from e
        try:
            spec = self._write_spec(ref.uid, [index_of(d.device) for d in parsed.devices])
            devices = [
                {"request_names": [d.request], "pool_name": d.pool, "device_name": d.device,
                 "cdi_device_ids": [cdi_device_id(ref.uid)], **({"share_id": d.share_id} if d.share_id else {})}
                for d in parsed.devices
            ]  # fmt: skip
            self.checkpoint.put(Prepared(ref.uid, ref.namespace, ref.name, sid, str(spec), devices))
        except BaseException:
            self.spec_path(ref.uid).unlink(missing_ok=True)
            self.daemon.release(sid)
            raise
        log.info("prepared claim %s/%s (%s): %s", ref.namespace, ref.name, ref.uid, annotations)
        return devices

    def unprepare(self, ref: ClaimRef) -> None:
        done = self.checkpoint.get(ref.uid)
        try:
            self.daemon.release(done.slice_id if done else slice_id(ref.uid))
        except grpc.RpcError as e:
            raise errors.Unavailable(f"claim {ref.namespace}/{ref.name}: the daemon: {e.details()}") from e
        self.spec_path(ref.uid).unlink(missing_ok=True)
        self.checkpoint.drop(ref.uid)
        log.info("unprepared claim %s/%s (%s)", ref.namespace, ref.name, ref.uid)

    def _gpus(self, claim: claim_model.Claim) -> list[str]:
        by_index = {g.index: g.uuid for g in self.daemon.inventory().gpus}
        uuids = []
        for d in claim.devices:
            index = index_of(d.device)
            if index is None or index not in by_index:
                raise claim_model.ClaimError(f"device {d.device} is not a GPU of this node")
            uuids.append(by_index[index])
        if len(set(uuids)) != len(uuids):
            raise claim_model.ClaimError("one GPU allocated twice")
        return uuids

    def _annotations(self, claim: claim_model.Claim, uuids: list[str]) -> dict[str, str]:
        """One slice for the claim: the same memory and cores on each of its GPUs."""
        memories = {d.memory for d in claim.devices}
        cores = {d.cores for d in claim.devices}
        if len(memories) > 1 or len(cores) > 1:
            raise claim_model.ClaimError(
                "its GPUs were allocated different memory or cores; "
                "a claim's slice has one size on every GPU (one request per size)"
            )
        out = {request.DEVICE: ",".join(uuids), request.GPUS: str(len(uuids))}
        if claim.whole:  # whole GPUs: the scheduler booked all their cores, so no claim shares them
            return out
        memory, share = memories.pop(), cores.pop()
        if memory is not None:
            out[request.MEMORY] = str(memory)
        if share is not None and share < 100:
            out[request.CORES] = str(share)
        if claim.policy:
            out[request.POLICY] = claim.policy
        if claim.priority:
            out[request.PRIORITY] = claim.priority
        return out

    def _write_spec(self, uid: str, indexes: list[int | None]) -> Path:
        gpu_edits = [self.base.device(str(i)).edits for i in indexes]
        edits = _merge([self.base.edits, *gpu_edits])
        edits = replace(edits, env=(*edits.env, f"{constants.ENV_CLAIM}={uid}"))
        kind = constants.CDI_CLAIM_KIND
        spec = cdi_spec.Spec(kind=kind, devices=(cdi_spec.Device(uid, edits),))
        path = self.spec_path(uid)
        cdi_spec.write(spec, path)
        return path
