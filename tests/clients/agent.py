"""A test client that drives the driver through NVIDIA's own Python clients
only (cuda.bindings.driver and pynvml), never through gpuslice code.

It reads one JSON command per line on stdin and answers one JSON line on
stdout, so a test can hold several of these processes at once, make them
allocate, and SIGKILL one of them."""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time

import pynvml
from cuda.bindings import driver as cu

PTX = b".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry spin()\n{\n ret;\n}\n"


def name_of(err: cu.CUresult) -> str:
    return cu.cuGetErrorName(err)[1].decode()


class Agent:
    def __init__(self) -> None:
        self.objects: dict[int, tuple[str, object]] = {}
        self.next_id = 1
        self.ctx = None
        self.stream = None
        self.worker: threading.Thread | None = None

    def keep(self, kind: str, obj: object) -> int:
        oid = self.next_id
        self.next_id += 1
        self.objects[oid] = (kind, obj)
        return oid

    # -- setup --------------------------------------------------------------
    def init(self, device: int = 0) -> dict:
        (err,) = cu.cuInit(0)
        if err:
            return {"error": name_of(err)}
        _, dev = cu.cuDeviceGet(device)
        _, self.ctx = cu.cuDevicePrimaryCtxRetain(dev)
        cu.cuCtxSetCurrent(self.ctx)
        _, self.stream = cu.cuStreamCreate(0)
        # /proc here is the host's: it names this process as the host sees it
        return {"pid": os.getpid(), "error": "CUDA_SUCCESS"}

    def ctx_cycle(self, size: int) -> dict:
        """Free memory before, with a new context, with an allocation in it,
        and after destroying the context (which frees the allocation)."""
        free = [cu.cuMemGetInfo()[1]]
        _, dev = cu.cuDeviceGet(0)
        err, ctx = cu.cuCtxCreate(None, 0, dev)
        free.append(cu.cuMemGetInfo()[1])
        cu.cuMemAlloc(size)
        free.append(cu.cuMemGetInfo()[1])
        cu.cuCtxDestroy(ctx)
        cu.cuCtxSetCurrent(self.ctx)
        free.append(cu.cuMemGetInfo()[1])
        return {"error": name_of(err), "free": free}

    def reset_primary(self) -> dict:
        _, dev = cu.cuDeviceGet(0)
        (err,) = cu.cuDevicePrimaryCtxReset(dev)
        return {"error": name_of(err)}

    def meminfo(self) -> dict:
        err, free, total = cu.cuMemGetInfo()
        return {"error": name_of(err), "free": free, "total": total}

    # -- every allocation path -----------------------------------------------
    def alloc(self, path: str, size: int) -> dict:
        err, obj = getattr(self, "_alloc_" + path)(size)
        if err != cu.CUresult.CUDA_SUCCESS:
            return {"error": name_of(err)}
        return {"error": "CUDA_SUCCESS", "id": self.keep(path, obj)}

    def _alloc_mem(self, size: int):
        return cu.cuMemAlloc(size)

    def _alloc_pitch(self, size: int):
        # width 512 keeps pitch == width, so the allocation is exactly size
        err, ptr, _pitch = cu.cuMemAllocPitch(512, size // 512, 4)
        return err, ptr

    def _alloc_managed(self, size: int):
        return cu.cuMemAllocManaged(size, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)

    def _alloc_host(self, size: int):
        return cu.cuMemAllocHost(size)

    def _alloc_async(self, size: int):
        err, ptr = cu.cuMemAllocAsync(size, self.stream)
        return err, ptr

    def _alloc_pool(self, size: int):
        props = cu.CUmemPoolProps()
        props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = 0
        err, pool = cu.cuMemPoolCreate(props)
        if err:
            return err, None
        err, ptr = cu.cuMemAllocFromPoolAsync(size, pool, self.stream)
        if err:
            cu.cuMemPoolDestroy(pool)
        return err, (pool, ptr)

    def _vmm_prop(self, exportable: bool = False):
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        if exportable:
            prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        return prop

    def _alloc_vmm(self, size: int):
        err, handle = cu.cuMemCreate(size, self._vmm_prop(), 0)
        if err:
            return err, None
        _, va = cu.cuMemAddressReserve(size, 0, 0, 0)
        cu.cuMemMap(va, size, 0, handle, 0)
        access = cu.CUmemAccessDesc()
        access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = 0
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        cu.cuMemSetAccess(va, size, [access], 1)
        return cu.CUresult.CUDA_SUCCESS, (handle, va, size)

    def _alloc_array(self, size: int):
        desc = cu.CUDA_ARRAY_DESCRIPTOR()
        desc.Format = cu.CUarray_format.CU_AD_FORMAT_FLOAT
        desc.NumChannels = 1
        desc.Width = 1024
        desc.Height = size // 4096
        return cu.cuArrayCreate(desc)

    def _alloc_array3d(self, size: int):
        desc = cu.CUDA_ARRAY3D_DESCRIPTOR()
        desc.Format = cu.CUarray_format.CU_AD_FORMAT_UNSIGNED_INT8
        desc.NumChannels = 4
        desc.Width = 256
        desc.Height = 256
        desc.Depth = size // (256 * 256 * 4)
        return cu.cuArray3DCreate(desc)

    def _alloc_mipmap(self, size: int):
        desc = cu.CUDA_ARRAY3D_DESCRIPTOR()
        desc.Format = cu.CUarray_format.CU_AD_FORMAT_UNSIGNED_INT8
        desc.NumChannels = 1
        desc.Width = 1024
        desc.Height = size // 1024
        return cu.cuMipmappedArrayCreate(desc, 1)

    def free(self, id: int) -> dict:
        kind, obj = self.objects.pop(id)
        if kind in ("mem", "pitch", "managed"):
            (err,) = cu.cuMemFree(obj)
        elif kind == "host":
            (err,) = cu.cuMemFreeHost(obj)
        elif kind == "async":
            (err,) = cu.cuMemFreeAsync(obj, self.stream)
        elif kind == "pool":
            pool, ptr = obj
            (err,) = cu.cuMemFreeAsync(ptr, self.stream)
            cu.cuStreamSynchronize(self.stream)
            cu.cuMemPoolDestroy(pool)
        elif kind == "vmm":
            handle, va, size = obj
            cu.cuMemUnmap(va, size)
            cu.cuMemAddressFree(va, size)
            (err,) = cu.cuMemRelease(handle)
        elif kind in ("array", "array3d"):
            (err,) = cu.cuArrayDestroy(obj)
        else:
            (err,) = cu.cuMipmappedArrayDestroy(obj)
        return {"error": name_of(err)}

    # -- data and kernels ----------------------------------------------------
    def roundtrip(self, size: int) -> dict:
        _, ptr = cu.cuMemAlloc(size)
        data = os.urandom(size)
        (e1,) = cu.cuMemcpyHtoD(ptr, data, size)
        back = bytearray(size)
        (e2,) = cu.cuMemcpyDtoH(back, ptr, size)
        cu.cuMemFree(ptr)
        return {"error": name_of(e1 or e2), "same": bytes(back) == data}

    def launch_for(self, seconds: float, grid: int = 864) -> dict:
        """Launch kernels back to back in the background for `seconds`."""
        _, mod = cu.cuModuleLoadData(PTX)
        _, fn = cu.cuModuleGetFunction(mod, b"spin")
        ctx = self.ctx

        def loop() -> None:
            cu.cuCtxSetCurrent(ctx)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                cu.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, self.stream, 0, 0)
            cu.cuStreamSynchronize(self.stream)

        self.worker = threading.Thread(target=loop)
        self.worker.start()
        return {"started": True}

    def steps(self, seconds: float, kernels: int, grid: int = 1) -> dict:
        """A generate-like loop for `seconds`: `kernels` small launches, then a
        synchronize (a token read back), again and again; when each step ended."""
        fn, ends = self._spin(), []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(kernels):
                cu.cuLaunchKernel(fn, grid, 1, 1, 32, 1, 1, 0, self.stream, 0, 0)
            (err,) = cu.cuStreamSynchronize(self.stream)
            if err != cu.CUresult.CUDA_SUCCESS:
                return {"error": name_of(err), "ends_ns": ends}
            ends.append(time.monotonic_ns())
        return {"error": "CUDA_SUCCESS", "ends_ns": ends}

    def join(self) -> dict:
        if self.worker:
            self.worker.join()
        return {}

    def capture(self, kernels: int, grid: int) -> dict:
        """Record `kernels` launches into a graph by stream capture; how long that took."""
        _, mod = cu.cuModuleLoadData(PTX)
        _, fn = cu.cuModuleGetFunction(mod, b"spin")
        _, stream = cu.cuStreamCreate(1)
        t0 = time.monotonic()
        (e1,) = cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        errs = [cu.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, stream, 0, 0)[0] for _ in range(kernels)]
        e2, _graph = cu.cuStreamEndCapture(stream)
        took = time.monotonic() - t0
        bad = next((e for e in [e1, *errs, e2] if e != cu.CUresult.CUDA_SUCCESS), cu.CUresult.CUDA_SUCCESS)
        return {"error": name_of(bad), "seconds": took}

    def capture_event(self, grid: int) -> dict:
        """cuEventRecord on a capturing stream, between two kernels: an event
        record node, recorded when the graph runs, after the first kernel."""
        _, mod = cu.cuModuleLoadData(PTX)
        _, fn = cu.cuModuleGetFunction(mod, b"spin")
        _, stream = cu.cuStreamCreate(1)
        _, start = cu.cuEventCreate(0)
        _, mid = cu.cuEventCreate(0)
        cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        cu.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, stream, 0, 0)
        (recorded,) = cu.cuEventRecord(mid, stream)
        cu.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, stream, 0, 0)
        _, graph = cu.cuStreamEndCapture(stream)
        _, nodes, count = cu.cuGraphGetNodes(graph, 8)
        types = [cu.cuGraphNodeGetType(n)[1].name for n in nodes[:count]]
        before_launch = name_of(cu.cuEventQuery(mid)[0])  # captured, not run: nothing recorded yet
        _, exec_ = cu.cuGraphInstantiate(graph, 0)
        cu.cuEventRecord(start, stream)
        cu.cuGraphLaunch(exec_, stream)
        cu.cuStreamSynchronize(stream)
        _, ms = cu.cuEventElapsedTime(start, mid)
        return {"record": name_of(recorded), "types": types, "before_launch": before_launch, "ms": ms}

    # -- graphs: built, captured, instantiated, updated in place ----------------
    def _spin(self):  # type: ignore[no-untyped-def]
        if not hasattr(self, "spin"):
            _, mod = cu.cuModuleLoadData(PTX)
            _, self.spin = cu.cuModuleGetFunction(mod, b"spin")
        return self.spin

    def _node_params(self, grid: int) -> cu.CUDA_KERNEL_NODE_PARAMS:
        p = cu.CUDA_KERNEL_NODE_PARAMS()
        p.func = self._spin()
        p.gridDimX, p.gridDimY, p.gridDimZ = grid, 1, 1
        p.blockDimX, p.blockDimY, p.blockDimZ = 256, 1, 1
        return p

    def launch(self, grid: int) -> dict:
        """One kernel of `grid` blocks of 256 threads, waited for."""
        (err,) = cu.cuLaunchKernel(self._spin(), grid, 1, 1, 256, 1, 1, 0, self.stream, 0, 0)
        cu.cuStreamSynchronize(self.stream)
        return {"error": name_of(err)}

    def graph(self, grids: list[int], child: list[int] | None = None) -> dict:
        """A graph of kernel nodes (cuGraphAddKernelNode), one per grid, after a
        child graph node of kernels of the `child` grids when given."""
        err, g = cu.cuGraphCreate(0)
        nodes = []
        if child is not None:
            e, n = cu.cuGraphAddChildGraphNode(g, None, 0, self._kernels_graph(child))
            err = err or e
            nodes.append(n)
        for grid in grids:
            e, n = cu.cuGraphAddKernelNode(g, None, 0, self._node_params(grid))
            err = err or e
            nodes.append(n)
        return {"error": name_of(err), "id": self.keep("graph", (g, nodes))}

    def _kernels_graph(self, grids: list[int]) -> cu.CUgraph:
        _, g = cu.cuGraphCreate(0)
        for grid in grids:
            cu.cuGraphAddKernelNode(g, None, 0, self._node_params(grid))
        return g

    def exec_set_child(self, exec: int, graph: int, node: int, grids: list[int]) -> dict:
        """cuGraphExecChildGraphNodeSetParams: child graph node `node` of `graph` runs kernels of `grids`."""
        n = self.objects[graph][1][1][node]
        (err,) = cu.cuGraphExecChildGraphNodeSetParams(self.objects[exec][1], n, self._kernels_graph(grids))
        return {"error": name_of(err)}

    def capture_into(self, id: int, grids: list[int]) -> dict:
        """Launches of these grids recorded into graph `id` by cuStreamBeginCaptureToGraph."""
        g, _nodes = self.objects[id][1]
        _, stream = cu.cuStreamCreate(1)
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        (e1,) = cu.cuStreamBeginCaptureToGraph(stream, g, None, None, 0, mode)
        errs = [cu.cuLaunchKernel(self._spin(), grid, 1, 1, 256, 1, 1, 0, stream, 0, 0)[0] for grid in grids]
        e2, _same = cu.cuStreamEndCapture(stream)
        bad = next((e for e in [e1, *errs, e2] if e != cu.CUresult.CUDA_SUCCESS), cu.CUresult.CUDA_SUCCESS)
        return {"error": name_of(bad)}

    def instantiate(self, id: int) -> dict:
        err, ex = cu.cuGraphInstantiate(self.objects[id][1][0], 0)
        return {"error": name_of(err), "id": self.keep("exec", ex)}

    def exec_set_grid(self, exec: int, graph: int, node: int, grid: int, generic: bool = False) -> dict:
        """Node `node` of `graph` runs `grid` blocks in `exec`: cuGraphExecKernelNodeSetParams,
        or the generic cuGraphExecNodeSetParams."""
        n, ex = self.objects[graph][1][1][node], self.objects[exec][1]
        if not generic:
            (err,) = cu.cuGraphExecKernelNodeSetParams(ex, n, self._node_params(grid))
            return {"error": name_of(err)}
        p = cu.CUgraphNodeParams()
        p.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
        p.kernel.func = self._spin()
        p.kernel.gridDimX, p.kernel.gridDimY, p.kernel.gridDimZ = grid, 1, 1
        p.kernel.blockDimX, p.kernel.blockDimY, p.kernel.blockDimZ = 256, 1, 1
        (err,) = cu.cuGraphExecNodeSetParams(ex, n, p)
        return {"error": name_of(err)}

    def exec_update(self, exec: int, graph: int) -> dict:
        err, info = cu.cuGraphExecUpdate(self.objects[exec][1], self.objects[graph][1][0])
        return {"error": name_of(err), "result": None if info is None else int(info.result)}

    def graph_launch(self, exec: int) -> dict:
        (err,) = cu.cuGraphLaunch(self.objects[exec][1], self.stream)
        cu.cuStreamSynchronize(self.stream)
        return {"error": name_of(err)}

    def sim_busy(self, from_ns: int, to_ns: int, device: int = 0) -> dict:
        """This process's exact GPU time in [from, to), from the simulator behind the interposer."""
        sim = ctypes.CDLL(os.environ.get("GPUSLICE_REAL_LIBCUDA", "libcuda.so.1"))
        sim.gpusliceSimBusyNs.restype = ctypes.c_ulonglong
        sim.gpusliceSimBusyNs.argtypes = [ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong]
        return {"busy": int(sim.gpusliceSimBusyNs(device, from_ns, to_ns))}

    # -- cuGetProcAddress ------------------------------------------------------
    def procaddr(self, symbol: str, version: int, flags: int) -> dict:
        err, pfn, status = cu.cuGetProcAddress(symbol.encode(), version, flags)
        return {"error": name_of(err), "pfn": int(pfn) if pfn else 0, "status": None if status is None else int(status)}

    def library_before_context(self) -> dict:
        """cuLibraryLoadData with no context current (libraries are context-independent),
        then its kernel launched in the primary context made afterwards."""
        steps = {"init": cu.cuInit(0)[0]}
        err, lib = cu.cuLibraryLoadData(PTX, None, None, 0, None, None, 0)
        steps["load"] = err
        err, kernel = cu.cuLibraryGetKernel(lib, b"spin")
        steps["kernel"] = err
        _, dev = cu.cuDeviceGet(0)
        _, self.ctx = cu.cuDevicePrimaryCtxRetain(dev)
        cu.cuCtxSetCurrent(self.ctx)
        err, func = cu.cuKernelGetFunction(kernel)
        steps["function"] = err
        steps["launch"] = cu.cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0)[0]
        steps["sync"] = cu.cuCtxSynchronize()[0]
        steps["unload"] = cu.cuLibraryUnload(lib)[0]
        return {k: name_of(v) for k, v in steps.items()}

    def pointer_attributes(self, path: str, size: int) -> dict:
        """Every CUpointer_attribute of a new allocation: its value, or the error's name."""
        err, obj = getattr(self, f"_alloc_{path}")(size)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        ptr = obj[1] if isinstance(obj, tuple) else obj
        out = {}
        for attr in cu.CUpointer_attribute:
            err, *value = cu.cuPointerGetAttribute(attr, ptr)
            out[attr.name] = int(value[0]) if err == cu.CUresult.CUDA_SUCCESS else name_of(err)
        return out

    def vmm_references(self, size: int, rounds: int) -> dict:
        """VMM memory held by a retained reference after the creator's release
        and the unmap, as libraries do it: what cuMemGetInfo says free at each
        step, and whether one more allocation of the whole rest fits meanwhile."""
        steps: list[dict] = []
        for _ in range(rounds):
            err, (handle, va, _) = self._alloc_vmm(size)
            assert err == cu.CUresult.CUDA_SUCCESS, err
            err, again = cu.cuMemRetainAllocationHandle(va)
            assert err == cu.CUresult.CUDA_SUCCESS and int(again) == int(handle), err
            cu.cuMemRelease(handle)  # the creation's reference
            cu.cuMemUnmap(va, size)
            held = cu.cuMemGetInfo()[1]
            total = cu.cuMemGetInfo()[2]
            # the retained reference keeps the memory: what is left must not take more
            err, extra = self._alloc_mem(total - held + 2 * 1024 * 1024)
            if err == cu.CUresult.CUDA_SUCCESS:
                cu.cuMemFree(extra)
            cu.cuMemRelease(again)  # the retained one: now the driver frees it
            cu.cuMemAddressFree(va, size)
            steps.append({"free_while_retained": held, "more_fit": err == cu.CUresult.CUDA_SUCCESS,
                          "free_after": cu.cuMemGetInfo()[1]})  # fmt: skip
        return {"steps": steps, "total": cu.cuMemGetInfo()[2]}

    def _exportable(self, size: int, exportable: bool = True):
        return cu.cuMemCreate(size, self._vmm_prop(exportable), 0)

    def vmm_share(self, size: int) -> dict:
        """A handle exported as a file descriptor and imported back by this
        process: free memory at each step as the references end."""
        posix = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        free = lambda: int(cu.cuMemGetInfo()[1])  # noqa: E731
        out = {"start": free()}
        err, handle = self._exportable(size)
        out["create"] = name_of(err)
        err, fd = cu.cuMemExportToShareableHandle(handle, posix, 0)
        out["export"] = name_of(err)
        err, again = cu.cuMemImportFromShareableHandle(int(fd), posix)
        out["import"], out["same_handle"] = name_of(err), int(again or 0) == int(handle)
        cu.cuMemRelease(handle)
        out["after_one_release"] = free()
        if err == cu.CUresult.CUDA_SUCCESS:
            cu.cuMemRelease(again)
        out["after_both"] = free()
        _, plain = self._exportable(size, exportable=False)
        out["export_unrequested"] = name_of(cu.cuMemExportToShareableHandle(plain, posix, 0)[0])
        cu.cuMemRelease(plain)
        return out

    def fd_inbox(self, path: str) -> dict:
        """A datagram socket at `path` that another process sends a descriptor to."""
        import socket

        self.inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.inbox.bind(path)
        return {}

    def vmm_export(self, size: int, send_to: str) -> dict:
        """Create, export, send the descriptor to another process's inbox, release."""
        import socket

        posix = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        err, handle = self._exportable(size)
        if err:
            return {"error": name_of(err)}
        err, fd = cu.cuMemExportToShareableHandle(handle, posix, 0)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
            out.connect(send_to)
            socket.send_fds(out, [b"fd"], [int(fd)])
        os.close(int(fd))
        cu.cuMemRelease(handle)
        return {"error": name_of(err), "free": int(cu.cuMemGetInfo()[1])}

    def vmm_import(self) -> dict:
        """Import the descriptor another process sent to this one's inbox."""
        import socket

        posix = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        _, fds, _, _ = socket.recv_fds(self.inbox, 16, 1)
        err, handle = cu.cuMemImportFromShareableHandle(fds[0], posix)
        os.close(fds[0])
        free = int(cu.cuMemGetInfo()[1])
        if err == cu.CUresult.CUDA_SUCCESS:
            cu.cuMemRelease(handle)
        return {"error": name_of(err), "free_while_held": free, "free_after": int(cu.cuMemGetInfo()[1])}

    def jit_link(self, path: str = "") -> dict:
        """cuLinkCreate -> add PTX -> complete -> cuModuleLoadData ->
        cuModuleGetFunction / cuModuleGetGlobal -> copy into the global -> launch."""
        ptx = (
            b".version 8.0\n.target sm_80\n.address_size 64\n"
            b".visible .global .align 4 .b32 table[256];\n"
            b".visible .entry scale()\n{\n .reg .f32 %f<2>;\n ld.global.f32 %f1, [table];\n ret;\n}\n"
        )
        steps = {}
        steps["create"], state = cu.cuLinkCreate(0, [], [])
        if path:  # the same PTX from a file, as cuLinkAddFile reads it
            with open(path, "wb") as f:
                f.write(ptx)
            (steps["add"],) = cu.cuLinkAddFile(state, cu.CUjitInputType.CU_JIT_INPUT_PTX, path.encode(), 0, [], [])
        else:
            (steps["add"],) = cu.cuLinkAddData(
                state, cu.CUjitInputType.CU_JIT_INPUT_PTX, ptx, len(ptx), b"scale.ptx", 0, [], []
            )
        steps["complete"], image, _size = cu.cuLinkComplete(state)
        steps["load"], mod = cu.cuModuleLoadData(image)
        (steps["destroy"],) = cu.cuLinkDestroy(state)  # the module keeps what it loaded
        steps["function"], fn = cu.cuModuleGetFunction(mod, b"scale")
        steps["global"], table, size = cu.cuModuleGetGlobal(mod, b"table")
        data = bytes(range(256)) * 4
        (steps["to_global"],) = cu.cuMemcpyHtoD(table, data, len(data))
        back = bytearray(len(data))
        (steps["from_global"],) = cu.cuMemcpyDtoH(back, table, len(data))
        (steps["launch"],) = cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0)
        (steps["sync"],) = cu.cuCtxSynchronize()
        missing = name_of(cu.cuModuleGetGlobal(mod, b"absent")[0])
        (steps["unload"],) = cu.cuModuleUnload(mod)
        return {"steps": {k: name_of(v) for k, v in steps.items()}, "size": int(size),
                "round_trip": bytes(back) == data, "absent": missing}  # fmt: skip

    def pool_reuse(self) -> dict:
        """Each CU_MEMPOOL_ATTR_REUSE_* of a new pool: as created, after setting 0, after setting 1."""
        props = cu.CUmemPoolProps()
        props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = 0
        _, pool = cu.cuMemPoolCreate(props)
        out = {}
        for attr in (
            cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
            cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
            cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
        ):
            seen = [int(cu.cuMemPoolGetAttribute(pool, attr)[1])]
            for value in (0, 1):
                assert cu.cuMemPoolSetAttribute(pool, attr, value)[0] == cu.CUresult.CUDA_SUCCESS
                seen.append(int(cu.cuMemPoolGetAttribute(pool, attr)[1]))
            out[attr.name] = seen
        cu.cuMemPoolDestroy(pool)
        return out

    def unmodelled(self) -> dict:
        """Calls the simulator does not model, made as programs make them."""
        calls = {
            "cuDeviceGetLuid": lambda: cu.cuDeviceGetLuid(0)[0],
            "cuGraphConditionalHandleCreate": lambda: cu.cuGraphConditionalHandleCreate(
                cu.cuGraphCreate(0)[1], self.ctx, 1, 0
            )[0],
        }
        return {name: name_of(call()) for name, call in calls.items()}

    def set_stack(self, size: int) -> dict:
        """cuCtxSetLimit(CU_LIMIT_STACK_SIZE): the driver grows local memory for every resident thread."""
        (err,) = cu.cuCtxSetLimit(cu.CUlimit.CU_LIMIT_STACK_SIZE, size)
        return {"error": name_of(err)}

    def internal_alloc(self, size: int) -> dict:
        """Device memory through the simulated driver's private table (cuGetExportTable), as a library
        that reaches the driver past its exported API: nothing an interposer charges sees it."""
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        table = ctypes.c_void_p()
        err = lib.cuGetExportTable(ctypes.byref(table), ctypes.c_char_p(b"gpuslice-sim-int"))
        if err:
            return {"error": f"cuGetExportTable {err}"}
        fns = ctypes.cast(table, ctypes.POINTER(ctypes.c_void_p * 3)).contents
        alloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)(fns[1])
        ptr = ctypes.c_uint64()
        err = alloc(ctypes.byref(ptr), size)
        return {"error": "CUDA_SUCCESS" if err == 0 else f"error {err}"}

    def module_launch(self, ptx: str, kernel: str) -> dict:
        """A module loaded from PTX and one of its kernels launched once (the
        driver loads a module's code lazily, at its first launch); kept loaded."""
        err, mod = cu.cuModuleLoadData(ptx.encode() + b"\0")
        if err:
            return {"error": name_of(err)}
        self.keep("module", mod)
        err, fn = cu.cuModuleGetFunction(mod, kernel.encode())
        if not err:
            (err,) = cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0)
        if not err:
            (err,) = cu.cuCtxSynchronize()
        return {"error": name_of(err)}

    def kernel_model(self, ptx: str, path: str) -> dict:
        """What a program learns of its kernels before launching them: names,
        parameters, attributes and occupancy, through a library loaded from a file."""
        with open(path, "w") as f:
            f.write(ptx)
        err, lib = cu.cuLibraryLoadFromFile(path.encode(), [], [], 0, [], [], 0)
        if err:
            return {"error": name_of(err)}
        _, count = cu.cuLibraryGetKernelCount(lib)
        _, kernels = cu.cuLibraryEnumerateKernels(count, lib)
        attrs = {a.name: a for a in cu.CUfunction_attribute if a.value <= 15}
        out: dict = {"count": int(count), "kernels": {}}
        for k in kernels:
            _, name = cu.cuKernelGetName(k)
            _, fn = cu.cuKernelGetFunction(k)
            params, i = [], 0
            while True:
                err, offset, size = cu.cuKernelGetParamInfo(k, i)
                if err:
                    params.append(name_of(err))
                    break
                params.append([int(offset), int(size)])
                i += 1
            info = {"params": params, "func_name": cu.cuFuncGetName(fn)[1].decode(),
                    "attrs": {n: int(cu.cuFuncGetAttribute(a, fn)[1]) for n, a in attrs.items()},
                    "kernel_attrs": {n: int(cu.cuKernelGetAttribute(a, k, 0)[1]) for n, a in attrs.items()},
                    "blocks": {b: int(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, b, 0)[1])
                               for b in (32, 128, 256, 512, 1024)},
                    "potential": [int(v) for v in cu.cuOccupancyMaxPotentialBlockSize(fn, None, 0, 0)[1:]],
                    "potential_128": [int(v) for v in cu.cuOccupancyMaxPotentialBlockSize(fn, None, 0, 128)[1:]],
                    "dyn_smem": {n: int(cu.cuOccupancyAvailableDynamicSMemPerBlock(fn, n, 256)[1]) for n in (1, 2, 4)},
                    "launch_512": name_of(cu.cuLaunchKernel(fn, 1, 1, 1, 512, 1, 1, 0, self.stream, None, 0)[0]),
                    }  # fmt: skip
            config = cu.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = 8, 1, 1
            config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = 2, 1, 1
            config.attrs, config.numAttrs = [attr], 1
            cluster = cu.cuOccupancyMaxPotentialClusterSize(fn, config)
            clusters = cu.cuOccupancyMaxActiveClusters(fn, config)
            info["cluster_size"] = [name_of(cluster[0]), int(cluster[1] or 0)]
            info["active_clusters"] = [name_of(clusters[0]), int(clusters[1] or 0)]
            out["kernels"][name.decode()] = info
        err, _, size = cu.cuLibraryGetGlobal(lib, b"table")
        out["global"] = [name_of(err), int(size)]
        out["missing_file"] = name_of(cu.cuLibraryLoadFromFile(b"/nonexistent.ptx", [], [], 0, [], [], 0)[0])
        cu.cuLibraryUnload(lib)
        return out

    def add_nodes(self) -> dict:
        """cuGraphAddNode (the generic form): a kernel, an empty node, a child graph and an
        event record; a kind the simulator lacks; then the graph instantiated and launched."""
        _, mod = cu.cuModuleLoadData(PTX)
        _, fn = cu.cuModuleGetFunction(mod, b"spin")
        _, graph = cu.cuGraphCreate(0)
        _, child = cu.cuGraphCreate(0)
        _, event = cu.cuEventCreate(0)
        params, nodes, errors = [], [], {}
        kernel = cu.CUgraphNodeParams()
        kernel.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
        kernel.kernel.func = fn
        kernel.kernel.gridDimX = kernel.kernel.gridDimY = kernel.kernel.gridDimZ = 1
        kernel.kernel.blockDimX, kernel.kernel.blockDimY, kernel.kernel.blockDimZ = 32, 1, 1
        params.append(kernel)
        empty = cu.CUgraphNodeParams()
        empty.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_EMPTY
        params.append(empty)
        sub = cu.CUgraphNodeParams()
        sub.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_GRAPH
        sub.graph.graph = child
        params.append(sub)
        record = cu.CUgraphNodeParams()
        record.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_EVENT_RECORD
        record.eventRecord.event = event
        params.append(record)
        for p in params:
            err, node = cu.cuGraphAddNode(graph, nodes[-1:], None, len(nodes[-1:]), p)
            errors[p.type.name] = name_of(err)
            nodes.append(node)
        host = cu.CUgraphNodeParams()
        host.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_HOST
        unmodelled = name_of(cu.cuGraphAddNode(graph, None, None, 0, host)[0])
        types = [cu.cuGraphNodeGetType(n)[1].name for n in nodes]
        _, execg = cu.cuGraphInstantiate(graph, 0)
        launched = name_of(cu.cuGraphLaunch(execg, self.stream)[0])
        cu.cuStreamSynchronize(self.stream)
        return {"errors": errors, "types": types, "unmodelled": unmodelled, "launch": launched,
                "event_after": name_of(cu.cuEventQuery(event)[0])}  # fmt: skip

    def primary_reset(self) -> dict:
        """The primary context through a reset, as cudaDeviceReset and the next
        runtime call drive it: its handle, what is current, what works."""
        cu.cuInit(0)
        _, dev = cu.cuDeviceGet(0)
        _, before = cu.cuDevicePrimaryCtxRetain(dev)
        cu.cuCtxSetCurrent(before)
        free0 = int(cu.cuMemGetInfo()[1])
        cu.cuMemAlloc(64 << 20)
        out = {"reset": name_of(cu.cuDevicePrimaryCtxReset(dev)[0])}
        out["current_after_reset"] = int(cu.cuCtxGetCurrent()[1]) == int(before)
        out["active_after_reset"] = int(cu.cuDevicePrimaryCtxGetState(dev)[2])
        out["alloc_while_inactive"] = name_of(cu.cuMemAlloc(1 << 20)[0])
        _, after = cu.cuDevicePrimaryCtxRetain(dev)
        out["same_handle"] = int(after) == int(before)
        out["alloc_after_retain"] = name_of(cu.cuMemAlloc(1 << 20)[0])
        out["freed_by_reset"] = int(cu.cuMemGetInfo()[1]) == free0 - (1 << 20)
        return out

    def capture_info(self) -> dict:
        """cuStreamGetCaptureInfo before, during (empty, then after each kernel) and after a capture."""
        _, mod = cu.cuModuleLoadData(PTX)
        _, fn = cu.cuModuleGetFunction(mod, b"spin")
        _, stream = cu.cuStreamCreate(0)

        def info() -> dict:
            err, status, cid, graph, deps, _, n = cu.cuStreamGetCaptureInfo(stream)
            return {"error": name_of(err), "status": status.name, "id": int(cid), "graph": int(graph or 0),
                    "deps": [int(d) for d in (deps or [])][: int(n)], "n": int(n)}  # fmt: skip

        seen = [info()]
        cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
        seen.append(info())
        for _ in range(2):
            cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, None, 0)
            seen.append(info())
        _, graph = cu.cuStreamEndCapture(stream)
        _, nodes, n = cu.cuGraphGetNodes(graph, 8)
        seen.append(info())
        cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
        second = info()
        cu.cuStreamEndCapture(stream)
        nodes = [int(x) for x in nodes[: int(n)]]
        return {"seen": seen, "graph": int(graph), "nodes": nodes, "second_id": second["id"]}

    def profiler(self) -> dict:
        return {"start": name_of(cu.cuProfilerStart()[0]), "stop": name_of(cu.cuProfilerStop()[0])}

    # -- errors ----------------------------------------------------------------
    def error_names(self, codes: list[int]) -> dict:
        """cuGetErrorName and cuGetErrorString of each code: [result, name, text]."""
        out = {}
        for code in codes:
            err, name = cu.cuGetErrorName(code)
            err2, text = cu.cuGetErrorString(code)
            out[str(code)] = [name_of(err), name.decode() if name else None, text.decode() if text else None,
                              name_of(err2)]  # fmt: skip
        return out

    def dlsym(self, names: list[str], path: str = "libcuda.so.1") -> dict:
        lib = ctypes.CDLL(path)
        out = {}
        for n in names:
            try:
                out[n] = ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
            except AttributeError:
                out[n] = None
        return out

    # -- NVML -----------------------------------------------------------------
    def nvml(self, device: int = 0) -> dict:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(device)
        m1 = pynvml.nvmlDeviceGetMemoryInfo(h)
        m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        procs = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
        util = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
        try:
            samples = {s.pid: s.smUtil for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)}
        except pynvml.NVMLError_NotFound:
            samples = {}
        try:  # the newer form of the samples (drivers of NVML 12.4+)
            info = sorted({s.pid for s in pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, 0)})
        except pynvml.NVMLError_NotFound:
            info = []
        details = {
            mode: {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetRunningProcessDetailList(
                h, pynvml.nvmlProcessDetailList_v1, getattr(pynvml, f"NVML_PROCESS_MODE_{mode.upper()}"))}
            for mode in ("compute", "graphics", "mps", "all")
        }  # fmt: skip
        graphics = [p.pid for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)]
        mps = [p.pid for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h)]
        pynvml.nvmlShutdown()
        return {
            "total": m1.total,
            "used": m1.used,
            "free": m1.free,
            "v2": [m2.total, m2.used, m2.free],
            "procs": {str(k): v for k, v in procs.items()},
            "util": util,
            "samples": {str(k): v for k, v in samples.items()},
            "sampled": info,
            "details": {mode: {str(k): v for k, v in d.items()} for mode, d in details.items()},
            "graphics": graphics,
            "mps": mps,
        }

    def accounting(self, enable: bool | None = None, device: int = 0) -> dict:
        """Accounting mode (set it first when `enable` is given), the pids with a record and
        each one's stats, as NVML gives them; {"error": ...} where it refuses."""
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(device)
        try:
            if enable is not None:
                pynvml.nvmlDeviceSetAccountingMode(h, int(enable))
            pids = pynvml.nvmlDeviceGetAccountingPids(h)
            stats = {}
            for pid in pids:
                try:
                    s = pynvml.nvmlDeviceGetAccountingStats(h, pid)
                except pynvml.NVMLError_NotFound:
                    continue
                stats[str(pid)] = {"gpu": s.gpuUtilization, "max_memory": s.maxMemoryUsage, "time_ms": s.time,
                                   "running": s.isRunning, "start_us": s.startTime}  # fmt: skip
            return {"pids": pids, "stats": stats}
        except pynvml.NVMLError as e:
            return {"error": str(e)}
        finally:
            pynvml.nvmlShutdown()

    def accounting_stats(self, pid: int, device: int = 0) -> str:
        """What NVML answers for one pid's accounting stats: "ok" or its error."""
        pynvml.nvmlInit()
        try:
            pynvml.nvmlDeviceGetAccountingStats(pynvml.nvmlDeviceGetHandleByIndex(device), pid)
            return "ok"
        except pynvml.NVMLError as e:
            return str(e)
        finally:
            pynvml.nvmlShutdown()

    def process_samples(self, last_seen_us: int, device: int = 0) -> list[list[int]]:
        """[pid, timeStamp, smUtil] of each per-process utilization sample after last_seen_us."""
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(device)
        try:
            samples = [
                [int(s.pid), int(s.timeStamp), int(s.smUtil)]
                for s in pynvml.nvmlDeviceGetProcessUtilization(h, last_seen_us)
            ]
        except pynvml.NVMLError_NotFound:
            samples = []
        pynvml.nvmlShutdown()
        return samples

    def monitor(self, device: int = 0) -> dict:
        return read_monitor(device)


MONITOR_CALLS = {  # what nvidia-smi-style monitors read, by name: the call on a handle
    "temperature": lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
    "fan": lambda h: pynvml.nvmlDeviceGetFanSpeed(h),
    "power": lambda h: pynvml.nvmlDeviceGetPowerUsage(h),
    "power_limit": lambda h: pynvml.nvmlDeviceGetPowerManagementLimit(h),
    "enforced_power_limit": lambda h: pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
    "encoder": lambda h: list(pynvml.nvmlDeviceGetEncoderUtilization(h)),
    "decoder": lambda h: list(pynvml.nvmlDeviceGetDecoderUtilization(h)),
    "pstate": lambda h: pynvml.nvmlDeviceGetPerformanceState(h),
    "persistence": lambda h: pynvml.nvmlDeviceGetPersistenceMode(h),
    "compute_mode": lambda h: pynvml.nvmlDeviceGetComputeMode(h),
    "ecc_mode": lambda h: list(pynvml.nvmlDeviceGetEccMode(h)),
    "ecc_uncorrected": lambda h: pynvml.nvmlDeviceGetTotalEccErrors(
        h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
    ),
    "sm_clock": lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
    "memory_clock": lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
    "max_sm_clock": lambda h: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
    "pcie_tx": lambda h: pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES),
}


def read_monitor(device: int = 0) -> dict:
    """Every monitoring call's value, or its NVML error's text."""
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(device)
    out: dict[str, object] = {}
    for name, call in MONITOR_CALLS.items():
        try:
            out[name] = call(h)
        except pynvml.NVMLError as e:
            out[name] = f"error: {e}"
    pynvml.nvmlShutdown()
    return out


def main() -> None:
    agent = Agent()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "exit":
            break
        try:
            reply = getattr(agent, op)(**cmd)
        except Exception as e:  # report, keep serving
            reply = {"exception": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
