"""What programs ask of their kernels before launching them, on the
simulator through cuda.bindings: names, parameters, attributes derived from
the PTX, occupancy, and what a stream capture has so far. The expected
figures are worked out here from the documented model (docs/simulator.md)."""

from __future__ import annotations

import pytest

from tests.harness.machine import gpu

PTX = """.version 8.0
.target sm_80
.address_size 64
.const .align 4 .b8 coeffs[256];
.visible .global .align 4 .b32 table[64];
.visible .entry heavy(.param .u64 out, .param .u32 n, .param .align 8 .b8 cfg[24], .param .f32 scale)
.maxntid 256, 1, 1
{
 .reg .pred %p<3>;
 .reg .b32 %r<40>;
 .reg .b64 %rd<20>;
 .shared .align 8 .b8 tile[8192];
 .local .align 4 .b8 scratch[64];
 ld.shared.u32 %r1, [tile];
 ret;
}
.visible .entry light(.param .u32 count, .param .u64 .ptr .global .align 16 data)
{
 ret;
}
"""
H100 = gpu("80Gi", sms=132, compute_capability="9.0")


@pytest.fixture
def model(make_machine, agents, tmp_path):
    return agents(make_machine([H100])).call("kernel_model", ptx=PTX, path=str(tmp_path / "k.ptx"))


def test_a_library_from_a_file_lists_its_kernels_with_names_and_parameters(model):
    assert model["count"] == 2 and set(model["kernels"]) == {"heavy", "light"}
    heavy, light = model["kernels"]["heavy"], model["kernels"]["light"]
    assert heavy["func_name"] == "heavy"
    # u64 at 0; u32 at 8; a 24-byte struct aligned to 8 at 16; f32 at 40; then no more
    assert heavy["params"] == [[0, 8], [8, 4], [16, 24], [40, 4], "CUDA_ERROR_INVALID_VALUE"]
    # a pointer's .align is its pointee's: the u64 itself aligns to 8
    assert light["params"] == [[0, 4], [8, 8], "CUDA_ERROR_INVALID_VALUE"]
    assert model["global"] == ["CUDA_SUCCESS", 256]
    assert model["missing_file"] == "CUDA_ERROR_FILE_NOT_FOUND"


def test_function_attributes_come_from_the_ptx(model):
    heavy, light = model["kernels"]["heavy"]["attrs"], model["kernels"]["light"]["attrs"]
    assert heavy["CU_FUNC_ATTRIBUTE_NUM_REGS"] == 80  # 40 b32 + 20 b64 x 2; predicates none
    assert heavy["CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"] == 8192
    assert heavy["CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"] == 64
    assert heavy["CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES"] == 256
    assert heavy["CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"] == 256  # .maxntid
    assert heavy["CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"] == 49152 - 8192
    assert heavy["CU_FUNC_ATTRIBUTE_PTX_VERSION"] == 80 and heavy["CU_FUNC_ATTRIBUTE_BINARY_VERSION"] == 90
    assert light["CU_FUNC_ATTRIBUTE_NUM_REGS"] == 2 and light["CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"] == 1024
    assert light["CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"] == 0
    assert model["kernels"]["heavy"]["kernel_attrs"] == heavy  # cuKernelGetAttribute on device 0 agrees


def test_occupancy_follows_threads_registers_and_shared_memory(model):
    heavy, light = model["kernels"]["heavy"], model["kernels"]["light"]
    # heavy: 80 registers = 2560 per warp; 65536 / (8 warps x 2560) = 3 blocks of 256; for small blocks
    # shared memory binds: 167936 / (8192 + 1024 reserved) = 18
    assert heavy["blocks"] == {"32": 18, "128": 6, "256": 3, "512": 0, "1024": 0}
    # light: threads bind (2048 per SM), and 32 blocks per SM at most
    assert light["blocks"] == {"32": 32, "128": 16, "256": 8, "512": 4, "1024": 2}
    # most resident threads: heavy 160 x 5 = 800 (of 2048), light 1024 x 2; min grid = blocks x 132 SMs
    assert heavy["potential"] == [5 * 132, 160] and light["potential"] == [2 * 132, 1024]
    assert light["potential_128"] == [16 * 132, 128]  # within the caller's limit
    # dynamic shared memory left for n blocks of 256 per SM: capped by heavy's 40 KiB limit; none for 4 (3 fit)
    assert heavy["dyn_smem"] == {"1": 40960, "2": 40960, "4": 0}
    assert light["dyn_smem"] == {"1": 49152, "2": 49152, "4": 167936 // 4 - 1024}
    assert heavy["launch_512"] == "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"  # over its launch bounds
    assert light["launch_512"] == "CUDA_SUCCESS"


def test_clusters_on_compute_capability_9_and_not_before(make_machine, agents, tmp_path, model):
    light = model["kernels"]["light"]
    assert light["cluster_size"] == ["CUDA_SUCCESS", 8]  # portable limit
    assert light["active_clusters"] == ["CUDA_SUCCESS", 16 * 16 // 2 * (132 // 16)]  # per GPC, 8 GPCs
    a100 = agents(make_machine([gpu("40Gi")])).call("kernel_model", ptx=PTX, path=str(tmp_path / "a.ptx"))
    assert a100["kernels"]["light"]["cluster_size"][0] == "CUDA_ERROR_NOT_SUPPORTED"
    assert a100["kernels"]["light"]["attrs"]["CU_FUNC_ATTRIBUTE_BINARY_VERSION"] == 80


def test_capture_info_names_the_capture_and_the_node_to_follow(make_machine, agents):
    got = agents(make_machine()).call("capture_info")
    before, empty, one, two, after = got["seen"]
    assert before == {"error": "CUDA_SUCCESS", "status": "CU_STREAM_CAPTURE_STATUS_NONE", "id": 0, "graph": 0,
                      "deps": [], "n": 0}  # fmt: skip
    assert empty["status"] == "CU_STREAM_CAPTURE_STATUS_ACTIVE" and empty["n"] == 0 and empty["id"] > 0
    assert one["id"] == two["id"] == empty["id"] and one["graph"] == two["graph"] == got["graph"]
    assert one["deps"] == got["nodes"][:1] and two["deps"] == got["nodes"][1:2]  # the last node captured
    assert after["status"] == "CU_STREAM_CAPTURE_STATUS_NONE"
    assert got["second_id"] not in (0, empty["id"])  # each capture its own id


def test_graph_add_node_makes_the_kinds_the_simulator_has(make_machine, agents):
    got = agents(make_machine()).call("add_nodes")
    kinds = ["CU_GRAPH_NODE_TYPE_KERNEL", "CU_GRAPH_NODE_TYPE_EMPTY", "CU_GRAPH_NODE_TYPE_GRAPH",
             "CU_GRAPH_NODE_TYPE_EVENT_RECORD"]  # fmt: skip
    assert got["errors"] == dict.fromkeys(kinds, "CUDA_SUCCESS") and got["types"] == kinds
    assert got["unmodelled"] == "CUDA_ERROR_NOT_SUPPORTED"  # a host node: not modelled
    assert got["launch"] == "CUDA_SUCCESS" and got["event_after"] == "CUDA_SUCCESS"


def test_the_primary_context_keeps_its_handle_through_a_reset(make_machine, agents):
    """As the driver does (cudaDeviceReset, then the runtime's next call): the
    reset frees what the context held and leaves the thread's current slot
    naming it; calls fail as destroyed until it is retained again, which
    brings back the same handle."""
    got = agents(make_machine(), init=False).call("primary_reset")
    assert got["reset"] == "CUDA_SUCCESS" and got["current_after_reset"] and got["active_after_reset"] == 0
    assert got["alloc_while_inactive"] == "CUDA_ERROR_CONTEXT_IS_DESTROYED"
    assert got["same_handle"] and got["alloc_after_retain"] == "CUDA_SUCCESS"
    assert got["freed_by_reset"]  # the 64 MiB before the reset went with it
