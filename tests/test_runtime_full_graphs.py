"""engine.mixed_graphs=full in the runtime, on the CPU (runtime/full_graphs.py): a step with prompt
tokens runs as its full graph would, eagerly (the CPU emulation), over its token bucket's fixed
layout with every sequence's attention in one varlen call; the same tokens as the eager path and as
transformers' generate, and one graph a step, as the simulator charges it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import assert_nests  # noqa: E402
from test_runtime_mixed_graphs import cpu_runner, one_thread, replay_against_eager  # noqa: E402, F401
from test_runtime_sync import BASE, CASES, assert_same_tokens, reference_tokens  # noqa: E402

from cbsim.config.errors import ConfigError  # noqa: E402
from cbsim.costs.mixed_graphs import token_buckets  # noqa: E402
from cbsim.runtime.engine import execute  # noqa: E402
from cbsim.runtime.full_graphs import FULL_SECTIONS  # noqa: E402
from cbsim.runtime.piecewise import check_mixed_graphs  # noqa: E402
from cbsim.trace import schema as S  # noqa: E402

FULL = ["engine.mixed_graphs=full", "engine.graph_batch_sizes=[1,2,4]"]
FULL += ["engine.eager_token_multiple=8"]


def check_full_layout(runner, plan) -> None:
    """Every section sits where the bucket's capture had it; padding rows write the scratch
    block; sequences past the step's have no query tokens; tiles past its own are -1."""
    batch, layout, bucket = plan.batch, plan.layout, plan.tokens_bucket
    assert layout.offsets == runner.mixed.layouts[bucket].offsets
    assert [name for name, _, _ in layout.offsets] == list(FULL_SECTIONS)
    v = layout.views(plan.slot.dev_in)
    t, n, b = int(batch.query_tokens), int(batch.num_samples), len(batch)
    assert (v["slots"][t:] == runner.cache.scratch_slot).all()
    assert v["logits_idx"][:n].tolist() == batch.logits_indices.tolist()
    assert (v["logits_idx"][n:] == bucket - 1).all()
    assert v["var_qlen"][:b].tolist() == batch.query_lens.tolist()
    assert (v["var_qlen"][b:] == 0).all()
    assert v["var_ctx"][:b].tolist() == batch.context_lens.tolist()
    tiles = -(-batch.query_lens // runner.mixed.block_q)
    assert (v["var_tile_seq"] >= 0).sum() == tiles.sum()


@pytest.mark.parametrize("case", ["staggered", "chunked"])
def test_the_full_forward_gives_the_eager_forwards_logits(config_factory, case):
    """Each step with prompt tokens, run eagerly and then as its full graph runs it: the
    sampled rows' logits agree and so do the greedy tokens."""
    config = config_factory(
        BASE
        + CASES[case]
        + FULL
        + ["workload.max_batch_tokens=20", "engine.eager_token_multiple=4"]
    )
    runner, sched = cpu_runner(config)
    assert runner.mixed.buckets == token_buckets(4, config.workload.max_batch_tokens)
    buckets = replay_against_eager(runner, sched, 1, check_full_layout)
    assert len(buckets) >= 2, buckets


@pytest.mark.parametrize("case", ["staggered", "chunked", "poisson", "preempt"])
@pytest.mark.parametrize("engine", ["sync", "async"])
def test_full_graphs_give_generates_tokens(config_factory, case, engine):
    config = config_factory(BASE + CASES[case] + FULL + [f"engine={engine}"])
    result = execute(config, engine, cpu_emulation=True)
    assert_same_tokens(result, reference_tokens(config))
    s = result.summary
    assert 0 < s["mixed_graph_steps"] < s["graph_steps"] <= s["steps"]
    assert_nests(result.trace)


@pytest.mark.parametrize("engine", ["sync", "async"])
def test_a_full_step_is_one_graph_in_both_back_ends(config_factory, engine):
    """A full step's forward is a graph_replay without pieces, as a decode graph's: step for
    step the runtime graphs the steps the simulator does."""
    from cbsim.sim import run

    config = config_factory(BASE + CASES["chunked"] + FULL + [f"engine={engine}"])
    result = execute(config, engine, cpu_emulation=True)

    def forwards(trace):
        sp = trace.span_frame({"pieces": 0})
        f = sp[sp.lane == S.COMPUTE]
        return f, sorted(zip(f.step, f.name, f.kind, f.query_tokens))

    fwd, steps = forwards(result.trace)
    assert steps == forwards(run(config, engine))[1]
    assert (fwd.name == S.GRAPH_REPLAY).all() and (fwd.pieces == 0).all()
    od = result.trace.other_data
    assert od["mixed_graphs"] == "full"
    assert od["mixed_graph_buckets"] == token_buckets(8, config.workload.max_batch_tokens)


def test_full_graphs_without_the_triton_kernels_are_refused_up_front(config_factory):
    """Before anything is built: full graphs on CUDA need the Triton attention kernels."""
    over = ["mode=runtime", "mode.device=cuda", "engine.mixed_graphs=full"]
    config = config_factory([*over, "mode.attention=torch"])
    with pytest.raises(ConfigError, match=r"^engine\.mixed_graphs=full .*allowed: mode\.attention"):
        check_mixed_graphs(config, torch.device("cuda"), cpu_emulation=False)
    check_mixed_graphs(config_factory([*over, "mode.attention=auto"]), torch.device("cuda"), False)
    check_mixed_graphs(config, torch.device("cpu"), cpu_emulation=True)  # the emulation: torch
