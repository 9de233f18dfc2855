"""A captured graph's memset nodes rewritten as fill kernels (runtime/graph_memsets.py,
engine.graph_memsets=kernels) on CUDA: the same GEMM result, replay after replay, and no memset
node left (marker gpu; skipped without CUDA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from test_runtime_gpu import GPU  # noqa: E402
from test_runtime_sync import CASES, assert_same_tokens  # noqa: E402

from cbsim.runtime.engine import execute  # noqa: E402
from cbsim.runtime.graph_memsets import MemsetRewriter, capture_graph, node_counts  # noqa: E402


def test_a_cooperative_gemms_memsets_become_kernels_and_it_computes_the_same():
    """The 3B's gate-up GEMM at 4,096 rows, where cuBLAS on the H100 zeroes a workspace
    counter before each cooperative GEMM: rewritten, the graph holds no memset node, one more
    kernel node per memset, and replays the eager result bit for bit, twice (the counter is
    zeroed before every replay, else a stream-K fix-up would read a stale count)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(4096, 3072, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(3072, 16384, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = torch.empty(4096, 16384, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()

    def body() -> None:
        torch.mm(a, b, out=out)

    with torch.cuda.stream(stream):
        body()  # warm-up: cuBLAS picks its kernel
    torch.cuda.synchronize()
    want = out.clone()
    plain = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(plain, stream=stream):
        body()
    before = node_counts(plain)
    if not before["memset"]:
        pytest.skip(
            f"cuBLAS captured no memset node for this GEMM on {torch.cuda.get_device_name()}"
        )
    rewriter = MemsetRewriter()
    graph = capture_graph(body, None, stream, rewriter)
    after = node_counts(graph)
    assert rewriter.rewritten == before["memset"] and after["memset"] == 0
    assert after["kernel"] == before["kernel"] + before["memset"]
    for _ in range(2):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


@pytest.mark.parametrize("memsets", ["kernels", "keep"])
def test_the_runtime_records_what_it_rewrote_and_the_tokens_do_not_move(config_factory, memsets):
    """engine.graph_memsets: the trace records the mode and how many nodes it rewrote; the
    tokens are the same either way (full mixed graphs, sync and async)."""
    over = GPU + CASES[sorted(CASES)[0]] + ["mode.attention=triton"]
    over += ["engine.graph_batch_sizes=[1,2,4]", "engine.eager_token_multiple=8"]
    ref = execute(config_factory(over + ["engine=sync", "engine.mixed_graphs=off"]), "sync")
    for engine in ("sync", "async"):
        cfg = config_factory(over + [f"engine={engine}", f"engine.graph_memsets={memsets}"])
        res = execute(cfg, engine)
        assert_same_tokens(res, ref.outputs)
        od = res.trace.other_data["graph_memsets"]
        assert od["mode"] == memsets and isinstance(od["rewritten"], int)
        if memsets == "keep":
            assert od["rewritten"] == 0
