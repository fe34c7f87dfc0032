"""Writes tests/data/store-f0844ec.db: a slice store as gpuslice f0844ec's own
SliceManager left it (schema 3), holding every owner kind: a container's
slice, a claim with two shares on one GPU and one on another, a device plugin
allocation, share groups of one claim's shares, of two claims' shares with
the same share ID, and of a device plugin allocation, with bound members.

Run it with f0844ec's tree importable as the package, e.g.:
  git worktree add /tmp/f084 f0844ec && (cd /tmp/f084 && make -j2)
  python tests/data/make_store_f0844ec.py /tmp/f084 tests/data/store-f0844ec.db
It was run once; the test reads the file it wrote."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

tree, out = Path(sys.argv[1]), Path(sys.argv[2])
pkg = Path(tempfile.mkdtemp()) / "gpuslice"
shutil.copytree(tree / "gpuslice", pkg, symlinks=True)
for sub in ("allocator", "cdi", "dra", "device_plugin", "cli"):
    (pkg / sub).symlink_to(tree / sub)
sys.path.insert(0, str(pkg.parent))
os.environ.setdefault("GPUSLICE_NATIVE_DIR", str(tree / "build" / "native"))

from gpuslice import request  # noqa: E402
from gpuslice.allocator import slices  # noqa: E402
from gpuslice.allocator.membership import MembershipKey  # noqa: E402
from gpuslice.allocator.store import SliceStore, Workload  # noqa: E402
from gpuslice.inventory import Gpu, Inventory  # noqa: E402

GiB = 1 << 30
gpus = tuple(
    Gpu(i, f"GPU-{i:08d}-0000-0000-0000-000000000000", "sim", f"0000:0{i}:00.0", 16 * GiB, 0, 0) for i in range(2)
)
work = Path(tempfile.mkdtemp())
store = SliceStore(out)
key = MembershipKey(b"\x01" * 32)
m = slices.SliceManager(store, Inventory("580.0", 13000, gpus, {}), work / "files", membership=key)
pid = os.getpid()  # members bound to this process (gone when the test reads the file: the sweep's case)

ours = {"gpuslice.io/memory": "2Gi", "gpuslice.io/cores": "20"}
m.reserve("ctr-1", request.Parsed(request.parse(ours), ours), "hook")  # type: ignore[arg-type]
claim_a, claim_b = "0a000000-0000-4000-8000-00000000000a", "0b000000-0000-4000-8000-00000000000b"
shares_a = [slices.ShareRequest(0, GiB, 10, share="s1"), slices.ShareRequest(0, GiB, 10, share="s2"),
            slices.ShareRequest(1, 2 * GiB, 30, share="s3")]  # fmt: skip
m.reserve_claim(claim_a, shares_a, "dra ml/a", Workload("ml", "pod-a"))
m.reserve_claim(claim_b, [slices.ShareRequest(1, GiB, 5, share="s3")], "dra ml/b")
dp = "dp-" + "c" * 24
m.reserve_devices(dp, slices.ShareRequest(1, 3 * GiB, None, share="memory"), "device-plugin gpuslice.io/memory")


def ref(uid: str, share: str) -> slices.ShareRef:
    return slices.ShareRef(uid, share, key.token(slices.subject(uid, share)))


m.join("pod-a-main", [ref(claim_a, "s1"), ref(claim_a, "s2")], pid)
m.join("pod-a-side", [ref(claim_a, "s1"), ref(claim_a, "s2")], pid)
m.join("pod-ab", [ref(claim_a, "s3"), ref(claim_b, "s3")], pid)  # one GPU, one share ID, two claims
m.join("pod-dp", [ref(dp, "memory")], pid, (request.ComputePolicy.ELASTIC, request.Priority.HIGH))
store.close()
print(out, sorted((r.kind.value, r.container_id) for r in SliceStore(out).all()))
