"""NodePrepareResources and NodeUnprepareResources for one claim: each
allocation result read from the API server becomes one share in the daemon
(its GPU, exactly its consumedCapacity, its own opaque configuration) and one
CDI device of kind gpuslice.io/claim, so that a container given one request of
the claim gets that request's shares and no other. Admin-access results book
nothing: their devices give the GPU for monitoring (the device nodes and the
real driver libraries, no interposer). Each claim is all or nothing: a failure
leaves no shares, no spec and no checkpoint entry."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuslice import constants, errors
from gpuslice.cdi import spec as cdi_spec
from gpuslice.client import AllocatorClient, DaemonError
from gpuslice.dra import claims as claim_model
from gpuslice.dra import resource_slice
from gpuslice.dra.checkpoint import Checkpoint, Prepared
from gpuslice.dra.resource_slice import MEMORY_STEP, index_of
from gpuslice.proto import gpuslice_pb2 as pb

log = logging.getLogger(__name__)

ClaimReader = Callable[[str, str], dict[str, Any]]  # (namespace, name) -> the ResourceClaim
# what the interposer needs in a container, and a monitoring container does without
_INTERPOSER_ENV = (constants.ENV_REAL_LIBCUDA, constants.ENV_REAL_LIBNVML, constants.ENV_SLICE_SOCKET)


def workload_of(claim: dict[str, Any]) -> pb.Workload:
    """The claim's workload for the metrics: its namespace and the pod the
    scheduler reserved it for (status.reservedFor; a claim shared by several
    pods names the first)."""
    meta = claim.get("metadata") or {}
    users = (claim.get("status") or {}).get("reservedFor") or []
    pod = next((str(u.get("name", "")) for u in users if isinstance(u, dict) and u.get("resource") == "pods"), "")
    return pb.Workload(namespace=str(meta.get("namespace", "")), pod=pod)


@dataclass(frozen=True)
class ClaimRef:
    uid: str
    namespace: str
    name: str


def _named(ref: ClaimRef, e: errors.GpusliceError) -> errors.GpusliceError:
    """The daemon's error, of the same kind, naming the claim."""
    return errors.KINDS.get(errors.code_of(e), errors.GpusliceError)(f"claim {ref.namespace}/{ref.name}: {e}")


def device_name(uid: str, n: int) -> str:
    """The CDI device of the claim's n-th result of ours."""
    return f"{uid}-{n}"


def _warn_memory_only(ref: ClaimRef, shares: list[pb.Share], before: dict[int, pb.Gpu]) -> None:
    """Memory and no cores (the default) on a GPU others use too: the claim gets only the
    compute they leave, and the allocator packs such claims onto one GPU (it books no compute
    for them). Said once per prepare, where an operator reads. `before`: the GPUs as they were
    before this claim was reserved (its own slice is not among their slices)."""
    for s in shares:
        others = before[s.gpu_index].slices if s.gpu_index in before else 0
        if s.memory and not s.cores and others > 0:
            log.warning(
                "claim %s/%s books %d MiB of gpu-%d and no cores, beside %d other slice%s: its compute is "
                "best effort (what the others leave); name cores in the request for a share of its own",
                ref.namespace, ref.name, s.memory >> 20, s.gpu_index, others, "" if others == 1 else "s",
            )  # fmt: skip


class UnwellDevice(errors.FailedPrecondition):
    """A result on a GPU the node reports unwell, which its request does not tolerate."""


def _refuse_unwell(r: claim_model.Result, health: str) -> None:
    """An allocator that does not honour device taints (Kubernetes before 1.36, where
    DRADeviceTaints is off) may place a claim on a GPU published tainted: refused here,
    before anything is booked, unless the request tolerates the taint."""
    if health and not claim_model.tolerates(r.tolerations, resource_slice.UNHEALTHY, "NoSchedule"):
        raise UnwellDevice(
            f"request {r.request}: {r.device} is unwell ({health}) and tainted {resource_slice.UNHEALTHY}:NoSchedule, "
            "which the allocator did not honour (device taints are off before Kubernetes 1.36); nothing was "
            f"prepared. A request that tolerates {resource_slice.UNHEALTHY} may use it"
        )


def cdi_device_id(uid: str, n: int) -> str:
    return f"{constants.CDI_CLAIM_KIND}={device_name(uid, n)}"


def share_env(uid: str, n: int, share: str, key: str) -> str:
    """The env entry by which a container names a share it was given (one per
    device, so that a container given several has them all), with the share's
    membership key from the daemon: the proof that the device was given."""
    return f"{constants.ENV_SHARE_PREFIX}{uid.replace('-', '')}_{n}={uid}/{share}/{key}"


def monitoring_edits(base: cdi_spec.ContainerEdits) -> cdi_spec.ContainerEdits:
    """The node spec's common edits without the interposer: the real driver
    libraries, found through the loader cache as in a slice's container (the
    interposer's directory is not mounted), the control device nodes, no slice
    socket and no createRuntime or poststop hook (an admin-access container
    holds no slice)."""
    wrap, sockets = constants.CONTAINER_WRAP_DIR, constants.SLICE_SOCKET_DIR
    mounts = tuple(m for m in base.mounts if not m.container_path.startswith((wrap + "/", sockets)))
    env = tuple(e for e in base.env if e.partition("=")[0] not in _INTERPOSER_ENV)
    hooks = tuple(h for h in base.hooks if h.args[1:] == ("update-ldcache",))
    return cdi_spec.ContainerEdits(env=env, device_nodes=base.device_nodes, mounts=mounts, hooks=hooks)


class Preparer:
    def __init__(self, node: str, daemon: AllocatorClient, read_claim: ClaimReader,
                 base: Callable[[], cdi_spec.Spec], cdi_dir: Path, checkpoint: Checkpoint) -> None:  # fmt: skip
        self.node = node
        self.daemon = daemon
        self.read_claim = read_claim
        # the node's gpuslice.io/gpu spec as it is now (the edits for each GPU): made anew
        # when the driver changes, so a claim prepared after that mounts the new driver
        self.base = base
        self.cdi_dir = cdi_dir
        self.checkpoint = checkpoint

    def spec_path(self, uid: str) -> Path:
        return self.cdi_dir / f"gpuslice.io-claim_{uid}.json"

    def admin_spec_path(self, uid: str) -> Path:
        return self.cdi_dir / f"gpuslice.io-claim_{uid}_admin.json"

    def prepare(self, ref: ClaimRef) -> list[dict[str, Any]]:
        """The devices to answer for the claim; raises GpusliceError with one line."""
        try:
            return self._prepare(ref)
        except errors.GpusliceError as e:
            if not isinstance(e, DaemonError):
                raise
            raise _named(ref, e) from e  # any RPC's error, of the daemon's kind (Unavailable: retried), named

    def _prepare(self, ref: ClaimRef) -> list[dict[str, Any]]:
        done = self.checkpoint.get(ref.uid)
        if done is not None:
            if self._still_there(done):
                return done.devices  # the kubelet asks again after a restart: the same answer
            self._remove_specs(ref.uid)  # what is left of it goes before it is prepared anew
            if done.slice_id:
                self.daemon.release(done.slice_id)
        claim = self.read_claim(ref.namespace, ref.name)
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise errors.FailedPrecondition(f"claim {ref.namespace}/{ref.name} is now UID {uid}, not {ref.uid}")
        try:
            base = self.base()  # before anything is reserved: no spec, nothing prepared
        except errors.FailedPrecondition as e:
            raise errors.FailedPrecondition(f"claim {ref.namespace}/{ref.name}: {e}") from e
        gpus = {g.index: g for g in self.daemon.inventory().gpus}  # read once: checks and the warning
        try:
            parsed = claim_model.parse(claim, self.node)
            shares = self._shares(parsed, gpus)
        except (claim_model.ClaimError, UnwellDevice) as e:
            raise type(e)(f"claim {ref.namespace}/{ref.name}: {e}") from None
        sid, keys = "", {}
        if shares:
            owner = f"dra {ref.namespace}/{ref.name}"
            reserved = self.daemon.reserve_claim(ref.uid, shares, owner=owner, workload=workload_of(claim))
            sid, keys = reserved.container_id, dict(reserved.share_keys)
            _warn_memory_only(ref, shares, gpus)
        try:
            try:
                spec = self._write_specs(parsed, keys, base)
            except OSError as e:  # a full disk: said as the checkpoint says it, and the kubelet retries
                where = e.filename or self.spec_path(ref.uid)
                raise errors.Unavailable(
                    f"claim {ref.namespace}/{ref.name}: its CDI spec {where}: {e.strerror or e}; nothing was prepared"
                ) from e
            devices = [
                {"request_names": [r.base_request], "pool_name": r.pool, "device_name": r.device,
                 "cdi_device_ids": [cdi_device_id(ref.uid, n)], **({"share_id": r.share_id} if r.share_id else {})}
                for n, r in enumerate(parsed.results)
            ]  # fmt: skip
            self.checkpoint.put(Prepared(ref.uid, ref.namespace, ref.name, sid, str(spec), devices))
        except BaseException:
            self._remove_specs(ref.uid)
            if sid:
                self.daemon.release(sid)
            raise
        for r in parsed.results:
            if r.admin:
                log.info("claim %s/%s: admin access to %s (request %s): monitoring, nothing reserved",
                         ref.namespace, ref.name, r.device, r.request)  # fmt: skip
        log.info("prepared claim %s/%s (%s): %d shares", ref.namespace, ref.name, ref.uid, len(shares))
        return devices

    def _still_there(self, done: Prepared) -> bool:
        """An answer kept is given again only while what it names exists: the
        claim's slice in the daemon and its spec file. Else it is prepared anew."""
        missing = [] if Path(done.spec).is_file() else [f"spec {done.spec}"]
        if done.slice_id:
            try:
                self.daemon.get(done.slice_id)
            except errors.NotFound:
                missing.append(f"slice {done.slice_id}")
        if missing:
            log.warning("claim %s/%s (%s): the checkpoint's answer names what is gone (%s): preparing it again",
                        done.namespace, done.name, done.uid, ", ".join(missing))  # fmt: skip
        return not missing

    def unprepare(self, ref: ClaimRef) -> None:
        done = self.checkpoint.get(ref.uid)
        slice_id = done.slice_id if done and done.slice_id else constants.claim_slice_key(ref.uid)
        try:
            self.daemon.release(slice_id)
        except errors.GpusliceError as e:
            raise _named(ref, e) from e
        self._remove_specs(ref.uid)
        try:
            self.checkpoint.drop(ref.uid)
        except errors.Unavailable as e:  # a full disk: say what is done and what is left, not "nothing"
            cause = e.__cause__
            why = (cause.strerror if isinstance(cause, OSError) else None) or str(e)
            raise errors.Unavailable(
                f"claim {ref.namespace}/{ref.name}: slice {slice_id} released and its CDI specs removed; "
                f"kept: its entry in the checkpoint {self.checkpoint.path} ({why}), which a retry removes"
            ) from e
        log.info("unprepared claim %s/%s (%s)", ref.namespace, ref.name, ref.uid)

    def _remove_specs(self, uid: str) -> None:
        self.spec_path(uid).unlink(missing_ok=True)
        self.admin_spec_path(uid).unlink(missing_ok=True)

    def _shares(self, claim: claim_model.Claim, gpus: dict[int, pb.Gpu]) -> list[pb.Share]:
        """The claim's non-admin results as the scheduler booked them: each
        exactly its consumedCapacity (the daemon checks the room); a result
        that consumed nothing (an exclusive device) is the whole GPU, and so is
        one of the whole-GPU class (wholeGPU: all of the memory, which leaves
        room for no other claim): booked whole, its compute held too (the
        scheduler's 0 cores would show a GPU held whole as an idle share)."""
        # each GPU's memory as the ResourceSlice publishes it
        published = {i: g.memory_total - g.memory_total % MEMORY_STEP for i, g in gpus.items()}
        shares = []
        for r in claim.results:
            index = index_of(r.device)
            if index not in published:
                have = ", ".join(f"gpu-{i}" for i in sorted(published))
                raise claim_model.ClaimError(f"device {r.device} is not a GPU of this node (it has {have})")
            if r.admin:
                continue  # the scheduler leaves admin access out of its books: so does the daemon
            _refuse_unwell(r, gpus[index].health)
            if r.config.whole and r.memory is not None and r.memory < published[index]:
                raise claim_model.ClaimError(
                    f"request {r.request}: wholeGPU: true, but it consumed {r.memory} bytes of {r.device}; "
                    "a whole GPU consumes all of its memory (leave memory out of the request)"
                )
            whole = r.config.whole or r.memory is None
            shares.append(pb.Share(gpu_index=index, memory=0 if whole else r.memory or 0,
                                   cores=0 if whole else r.cores or 0, policy=r.config.policy or "",
                                   priority=r.config.priority or "", share_id=r.share))  # fmt: skip
        return shares

    def _write_specs(self, claim: claim_model.Claim, keys: dict[str, str], base: cdi_spec.Spec) -> Path:
        """The claim's CDI devices: those of shares in one spec whose common
        edits are the interposer's, those of admin access in another whose
        common edits are the driver's alone."""
        shares, admin = [], []
        for n, r in enumerate(claim.results):
            gpu = base.device(str(index_of(r.device))).edits
            if r.admin:
                admin.append(cdi_spec.Device(device_name(claim.uid, n), gpu))
            else:
                env = (*gpu.env, share_env(claim.uid, n, r.share, keys[r.share]))
                shares.append(cdi_spec.Device(device_name(claim.uid, n), replace(gpu, env=env)))
        kind = constants.CDI_CLAIM_KIND
        path = self.spec_path(claim.uid)
        if shares:
            cdi_spec.write(cdi_spec.Spec(kind=kind, devices=tuple(shares), edits=base.edits), path)
        if admin:
            edits = monitoring_edits(base.edits)
            cdi_spec.write(cdi_spec.Spec(kind=kind, devices=tuple(admin), edits=edits), self.admin_spec_path(claim.uid))
        return path if shares else self.admin_spec_path(claim.uid)
