"""A slice's shared files across layout versions (libcuda_wrap/include/gpuslice_slice.h):
each version only appends to the usage file, so the processes of a slice kept across an
upgrade go on with their rows as they were."""

from __future__ import annotations

import pytest

from gpuslice.allocator.slice_files import GpuLimit, SliceFiles, constant, ffi_and_lib

pytestmark = pytest.mark.unit
MiB = 1 << 20


def version_3_usage(used: int, pid: int) -> bytes:
    """A version 3 usage file: a slice total, one process row, no `charged` after the gates."""
    ffi, _ = ffi_and_lib()
    u = ffi.new("struct gpuslice_usage *")
    u.magic, u.version = constant("GPUSLICE_USAGE_MAGIC"), 3
    u.used[0] = used
    u.proc[0].pid, u.proc[0].used[0] = pid, used
    u.gate[0].tokens, u.gate[0].next_refill_ns = 12345, 1  # a gate the daemon had set
    return bytes(ffi.buffer(u))[: ffi.offsetof("struct gpuslice_usage", "charged")]


def test_a_version_3_usage_file_is_extended_with_its_rows_kept(tmp_path):
    (tmp_path / "s.usage").write_bytes(version_3_usage(300 * MiB, 4242))
    files = SliceFiles(tmp_path, "s")
    files.write_limits([GpuLimit("GPU-a", 1 << 30, 50, True)])
    ffi, _ = ffi_and_lib()
    assert (tmp_path / "s.usage").stat().st_size == ffi.sizeof("struct gpuslice_usage")
    assert files.used() == [300 * MiB] and files.slot_pids() == {0: 4242} and files.proc_used(0, 0) == 300 * MiB
    assert files.usage.gate[0].tokens == 12345 and files.proc_charged(0, 0) == 0
    assert files.usage.version == constant("GPUSLICE_SLICE_VERSION")
    # the version 3 process frees what it held (its ledger knows nothing of `charged`)
    files.uncharge(0, 0, 300 * MiB)
    assert files.used() == [0]


def test_a_usage_file_of_any_other_layout_starts_again_from_zero(tmp_path):
    stale = bytearray(version_3_usage(300 * MiB, 4242))
    (tmp_path / "a.usage").write_bytes(bytes(stale[:-8]))  # another size
    stale[0:4] = b"\0\0\0\0"
    (tmp_path / "b.usage").write_bytes(bytes(stale))  # the size, not the magic
    for name in ("a", "b"):
        files = SliceFiles(tmp_path, name)
        files.write_limits([GpuLimit("GPU-a", 1 << 30, 50, True)])
        assert files.used() == [0] and files.slot_pids() == {}, name


def test_the_rows_pids_follow_every_claim_and_release_whichever_files_of_the_slice_made_it(tmp_path):
    """slot_pids reads the rows again only once a row was claimed or released (the daemon
    writes every pid): through another SliceFiles of the same slice too."""
    files = SliceFiles(tmp_path, "s")
    files.write_limits([GpuLimit("GPU-a", 1 << 30, 10, False)])
    assert files.claim_slot(77) == 0 and files.slot_pids() == {0: 77}
    assert files.claim_slot(78) == 1 and files.slot_pids() == {0: 77, 1: 78}
    files.release_slot(0)
    assert files.slot_pids() == {1: 78}
    other = SliceFiles(tmp_path, "s")
    assert other.claim_slot(79) == 0 and files.slot_pids() == {0: 79, 1: 78}
    other.release_slot(1)
    assert files.slot_pids() == {0: 79} == other.slot_pids()
    files.slot_pids()[5] = 1  # a caller's copy
    assert files.slot_pids() == {0: 79}
