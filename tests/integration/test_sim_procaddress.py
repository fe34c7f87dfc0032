"""cuGetProcAddress on the simulator, through cuda.bindings."""

from __future__ import annotations

import re

import pytest

from tests.harness import REPO
from tests.harness.nvidia import def_entries

DEFAULT, PTDS = 0, 2  # CU_GET_PROC_ADDRESS_DEFAULT / _PER_THREAD_DEFAULT_STREAM


@pytest.fixture
def agent(make_machine, agents):
    return agents(make_machine())


@pytest.mark.parametrize(
    ("name", "version", "flags", "symbol"),
    [
        ("cuMemAlloc", 3000, DEFAULT, "cuMemAlloc"),
        ("cuMemAlloc", 3020, DEFAULT, "cuMemAlloc_v2"),
        ("cuMemAlloc", 13000, PTDS, "cuMemAlloc_v2"),
        ("cuStreamSynchronize", 13000, DEFAULT, "cuStreamSynchronize"),
        ("cuStreamSynchronize", 13000, PTDS, "cuStreamSynchronize_ptsz"),
        ("cuStreamSynchronize", 6050, PTDS, "cuStreamSynchronize"),
        ("cuMemcpyHtoD", 13000, PTDS, "cuMemcpyHtoD_v2_ptds"),
        ("cuCtxCreate", 11040, DEFAULT, "cuCtxCreate_v3"),
        ("cuCtxCreate", 13000, DEFAULT, "cuCtxCreate_v4"),
        ("cuGetProcAddress", 12000, DEFAULT, "cuGetProcAddress_v2"),
        ("cuGetProcAddress", 11080, DEFAULT, "cuGetProcAddress"),
    ],
)
def test_variant_by_version_and_flag(agent, name, version, flags, symbol):
    got = agent.call("procaddr", symbol=name, version=version, flags=flags)
    want = agent.call("dlsym", names=[symbol])[symbol]
    assert got["error"] == "CUDA_SUCCESS" and want
    assert got["pfn"] == want


def test_unknown_names_and_too_old_versions_are_not_found(agent):
    unknown = agent.call("procaddr", symbol="cuNoSuchFunction", version=13000, flags=DEFAULT)
    assert unknown["error"] == "CUDA_ERROR_NOT_FOUND" and unknown["pfn"] == 0
    old = agent.call("procaddr", symbol="cuMemAllocAsync", version=11000, flags=DEFAULT)
    assert old["error"] == "CUDA_ERROR_NOT_FOUND" and old["pfn"] == 0


def test_what_is_not_modelled_is_not_supported_not_missing(agent):
    """Every cuda.h function is exported; one the simulator does not model
    answers CUDA_ERROR_NOT_SUPPORTED, by dlsym and by cuGetProcAddress."""
    names = re.findall(r"^FWD\((\w+)\)$", (REPO / "libcuda_wrap/symbols/cuda_exports.def").read_text(), re.M)
    exported = agent.call("dlsym", names=names)
    assert len(names) > 600 and [n for n, found in exported.items() if not found] == []
    got = agent.call("procaddr", symbol="cuMemPrefetchAsync", version=13000, flags=DEFAULT)
    assert got["error"] == "CUDA_SUCCESS" and got["pfn"] == exported["cuMemPrefetchAsync_v2"]  # the newest _vN
    assert set(agent.call("unmodelled").values()) == {"CUDA_ERROR_NOT_SUPPORTED"}
    assert agent.call("profiler") == {"start": "CUDA_SUCCESS", "stop": "CUDA_SUCCESS"}  # modelled: no profiler


def test_every_table_entry_resolves_to_its_exported_symbol(agent):
    entries = def_entries()
    addrs = agent.call("dlsym", names=[e[3] for e in entries])
    newest: dict[tuple[str, str], int] = {}
    for name, ver, kind, _ in entries:
        newest[(name, kind)] = max(ver, newest.get((name, kind), 0))
    for name, ver, kind, sym in entries:
        assert addrs[sym], f"{sym} is not exported"
        flags = PTDS if kind == "PTDS" else DEFAULT
        got = agent.call("procaddr", symbol=name, version=ver, flags=flags)
        if ver == newest[(name, kind)] or kind == "DEFAULT":
            # asking at exactly this version yields this variant
            assert got["pfn"] == addrs[sym], f"{name}@{ver} {kind} -> expected {sym}"


def cuda_h_results() -> dict[int, str]:
    """Every CUresult that NVIDIA's cuda.h declares: value -> name."""
    import re

    from tests.harness.nvidia import needs

    text = (needs("cuda.h") / "cuda.h").read_text()
    enum = text[text.index("typedef enum cudaError_enum") : text.index("} CUresult;")]
    return {int(v): n for n, v in re.findall(r"^\s+(CUDA_[A-Z_0-9]+)\s*=\s*(\d+)", enum, re.M)}


def test_every_error_of_cuda_h_has_its_name_and_a_text(agent):
    results = cuda_h_results()
    assert len(results) > 100
    got = agent.call("error_names", codes=sorted(results))
    for code, name in results.items():
        err, got_name, text, err2 = got[str(code)]
        assert (err, got_name, err2) == ("CUDA_SUCCESS", name, "CUDA_SUCCESS"), (code, got[str(code)])
        assert text and text != name and text.strip() == text, (name, text)
    assert agent.call("error_names", codes=[12345])["12345"][0] == "CUDA_ERROR_INVALID_VALUE"
