"""A captured graph's memset nodes rewritten as fill kernels (engine.graph_memsets=kernels).

From 768 tokens on, cuBLAS's cooperative GEMMs on the H100 zero a 4-byte counter of their
workspace before they run, and a stream capture records each as a memset node: 28 to 112 of
them in a 3B's full mixed-step graph (runtime/README.md). The driver launches a graph's memset
nodes one by one, about 1.7 us of host time each against 0.03 us for a kernel node, so they are
most of a large bucket's replay (0.14 ms of 0.19 at 4,096 tokens). The same write as a kernel
node costs what a kernel node costs: each memset node becomes torch's fill kernel over the same
bytes, with the same edges, before the graph is instantiated. The fill kernel's node is taken
from a throwaway capture of ``fill_`` over a tensor that views the memset's bytes.

Driver API through ctypes (libcuda's versioned entry points: graph edges carry edge data since
CUDA 12.3); a node this cannot rewrite (2-D, or an element size not 1, 2 or 4 bytes) stays.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

KERNEL, MEMSET = 0, 2  # CUgraphNodeType
DTYPES = {1: ("|u1", torch.uint8), 2: ("<i2", torch.int16), 4: ("<i4", torch.int32)}


class _MemsetParams(ctypes.Structure):  # CUDA_MEMSET_NODE_PARAMS
    _fields_ = [
        ("dst", ctypes.c_uint64),
        ("pitch", ctypes.c_size_t),
        ("value", ctypes.c_uint),
        ("element_size", ctypes.c_uint),
        ("width", ctypes.c_size_t),
        ("height", ctypes.c_size_t),
    ]


class _KernelParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [
        ("func", ctypes.c_void_p),
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("kernel_params", ctypes.c_void_p),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    ]


class _Driver:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def __call__(self, name: str, *args) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} returned CUDA error {rc}")

    def nodes(self, graph: int) -> list[int]:
        n = ctypes.c_size_t(0)
        self("cuGraphGetNodes", ctypes.c_void_p(graph), None, ctypes.byref(n))
        arr = (ctypes.c_void_p * n.value)()
        self("cuGraphGetNodes", ctypes.c_void_p(graph), arr, ctypes.byref(n))
        return [int(v) for v in arr[: n.value]]

    def node_type(self, node: int) -> int:
        t = ctypes.c_int()
        self("cuGraphNodeGetType", ctypes.c_void_p(node), ctypes.byref(t))
        return t.value

    def edges(self, node: int, which: str) -> list[int]:
        """The nodes before (``dependencies``) or after (``dependents``) ``node``."""
        name = {
            "dependencies": "cuGraphNodeGetDependencies_v2",
            "dependents": "cuGraphNodeGetDependentNodes_v2",
        }[which]
        n = ctypes.c_size_t(0)
        self(name, ctypes.c_void_p(node), None, None, ctypes.byref(n))
        arr = (ctypes.c_void_p * max(n.value, 1))()
        if n.value:
            self(name, ctypes.c_void_p(node), arr, None, ctypes.byref(n))
        return [int(v) for v in arr[: n.value]]


class _View:
    """A device address as a tensor (``__cuda_array_interface__``), so torch can fill it."""

    def __init__(self, ptr: int, count: int, typestr: str) -> None:
        self.__cuda_array_interface__ = {
            "shape": (count,),
            "typestr": typestr,
            "data": (ptr, False),
            "version": 3,
        }


def _fill_node(p: _MemsetParams, cu: _Driver) -> tuple[_KernelParams, object] | None:
    """The kernel node of a ``fill_`` writing what the memset writes, and the throwaway graph
    that holds its arguments (alive while the node params are used); None where it cannot."""
    if p.height != 1 or p.element_size not in DTYPES:
        return None
    typestr, dtype = DTYPES[p.element_size]
    view = torch.as_tensor(_View(p.dst, p.width, typestr), device="cuda")
    value = int(p.value) & ((1 << (8 * p.element_size)) - 1)
    if dtype is not torch.uint8 and value >= 1 << (8 * p.element_size - 1):
        value -= 1 << (8 * p.element_size)  # the bit pattern as the signed element
    template = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(template):
        view.fill_(value)
    nodes = cu.nodes(template.raw_cuda_graph())
    if len(nodes) != 1 or cu.node_type(nodes[0]) != KERNEL:
        return None
    params = _KernelParams()
    cu("cuGraphKernelNodeGetParams_v2", ctypes.c_void_p(nodes[0]), ctypes.byref(params))
    return params, template


class MemsetRewriter:
    """Rewrites graphs' memset nodes; one fill node per distinct memset (cuBLAS zeroes the same
    bytes of its workspace before every cooperative GEMM), kept for every graph after."""

    def __init__(self) -> None:
        self.cu = _Driver()
        self.fills: dict[tuple[int, int, int, int], tuple[_KernelParams, object] | None] = {}
        self.rewritten = 0

    def __call__(self, graph: torch.cuda.CUDAGraph) -> int:
        """Rewrite ``graph``'s memset nodes (captured with keep_graph=True, not instantiated)
        as fill kernel nodes with the same edges; returns how many it rewrote."""
        cu, raw, done = self.cu, graph.raw_cuda_graph(), 0
        for node in cu.nodes(raw):
            if cu.node_type(node) != MEMSET:
                continue
            p = _MemsetParams()
            cu("cuGraphMemsetNodeGetParams", ctypes.c_void_p(node), ctypes.byref(p))
            key = (p.dst, p.width * p.height, p.element_size, p.value)
            if key not in self.fills:
                self.fills[key] = _fill_node(p, cu)
            if self.fills[key] is None:
                continue
            self._replace(raw, node, self.fills[key][0])
            done += 1
        self.rewritten += done
        return done

    def _replace(self, raw: int, node: int, params: _KernelParams) -> None:
        cu = self.cu
        before, after = cu.edges(node, "dependencies"), cu.edges(node, "dependents")
        deps = (ctypes.c_void_p * max(len(before), 1))(*before)
        new = ctypes.c_void_p()
        n_before = ctypes.c_size_t(len(before))
        cu("cuGraphAddKernelNode_v2", ctypes.byref(new), ctypes.c_void_p(raw), deps, n_before,
           ctypes.byref(params))  # fmt: skip
        if after:
            froms = (ctypes.c_void_p * len(after))(*([new.value] * len(after)))
            tos = (ctypes.c_void_p * len(after))(*after)
            n_after = ctypes.c_size_t(len(after))
            cu("cuGraphAddDependencies_v2", ctypes.c_void_p(raw), froms, tos, None, n_after)
        cu("cuGraphDestroyNode", ctypes.c_void_p(node))


def node_counts(graph: torch.cuda.CUDAGraph) -> dict[str, int]:
    """A graph's kernel and memset nodes (captured with keep_graph=True)."""
    cu = _Driver()
    types = [cu.node_type(n) for n in cu.nodes(graph.raw_cuda_graph())]
    return {"kernel": types.count(KERNEL), "memset": types.count(MEMSET), "all": len(types)}


def capture_graph(
    body: Callable[[], None],
    pool: tuple | None,
    stream: torch.cuda.Stream,
    rewriter: MemsetRewriter | None,
) -> torch.cuda.CUDAGraph:
    """One graph of ``body`` on ``pool``, its memset nodes rewritten where ``rewriter`` is
    given (engine.graph_memsets=kernels), instantiated."""
    graph = torch.cuda.CUDAGraph(keep_graph=rewriter is not None)
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        body()
    if rewriter is not None:
        rewriter(graph)
        graph.instantiate()
    return graph
