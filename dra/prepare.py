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

from gpuslice import constants, errors
from gpuslice.cdi import spec as cdi_spec
from gpuslice.client import AllocatorClient
from gpuslice.dra import claims as claim_model
from gpuslice.dra.checkpoint import Checkpoint, Prepared
from gpuslice.dra.resource_slice import index_of
from gpuslice.proto import gpuslice_pb2 as pb

log = logging.getLogger(__name__)

ClaimReader = Callable[[str, str], dict[str, Any]]  # (namespace, name) -> the ResourceClaim


@dataclass(frozen=True)
class ClaimRef:
    uid: str
    namespace: str
    name: str


def _named(ref: ClaimRef, e: errors.GpusliceError) -> errors.GpusliceError:
    """The daemon's error, of the same kind, naming the claim."""
    return errors.KINDS.get(errors.code_of(e), errors.GpusliceError)(f"claim {ref.namespace}/{ref.name}: {e}")


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
            shares = self._shares(parsed)
        except claim_model.ClaimError as e:
            raise claim_model.ClaimError(f"claim {ref.namespace}/{ref.name}: {e}") from None
        try:
            sid = self.daemon.reserve_claim(ref.uid, shares, owner=f"dra {ref.namespace}/{ref.name}").container_id
        except errors.GpusliceError as e:  # the daemon's kind (no room: RESOURCE_EXHAUSTED), named for the claim
            raise _named(ref, e) from e
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
        log.info("prepared claim %s/%s (%s): slice %s", ref.namespace, ref.name, ref.uid, sid)
        return devices

    def unprepare(self, ref: ClaimRef) -> None:
        done = self.checkpoint.get(ref.uid)
        try:
            self.daemon.release(done.slice_id if done else constants.claim_slice_key(ref.uid))
        except errors.GpusliceError as e:
            raise _named(ref, e) from e
        self.spec_path(ref.uid).unlink(missing_ok=True)
        self.checkpoint.drop(ref.uid)
        log.info("unprepared claim %s/%s (%s)", ref.namespace, ref.name, ref.uid)

    @staticmethod
    def _shares(claim: claim_model.Claim) -> list[pb.Share]:
        """The claim's shares as the scheduler allocated them, each its own size
        (the daemon checks the GPUs and their room). Whole GPUs: no memory,
        no cores."""
        shares = []
        for d in claim.devices:
            index = index_of(d.device)
            if index is None:
                raise claim_model.ClaimError(f"device {d.device} is not a GPU of this node")
            memory = None if claim.whole else d.memory
            # a full compute share with a memory limit asks for no guaranteed share, as before
            cores = None if claim.whole or d.cores is None or d.cores >= 100 else d.cores
            shares.append(pb.Share(gpu_index=index, memory=memory or 0, cores=cores or 0, policy=claim.policy or "",
                                   priority=claim.priority or "", share_id=d.share_id or ""))  # fmt: skip
        return shares

    def _write_spec(self, uid: str, indexes: list[int | None]) -> Path:
        gpu_edits = [self.base.device(str(i)).edits for i in indexes]
        edits = _merge([self.base.edits, *gpu_edits])
        edits = replace(edits, env=(*edits.env, f"{constants.ENV_CLAIM}={uid}"))
        kind = constants.CDI_CLAIM_KIND
        spec = cdi_spec.Spec(kind=kind, devices=(cdi_spec.Device(uid, edits),))
        path = self.spec_path(uid)
        cdi_spec.write(spec, path)
        return path
