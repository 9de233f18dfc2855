"""engine.mixed_graphs=buckets in the runtime, on the CPU (runtime/piecewise.py): steps with
prompt tokens run as piecewise graphs would, eagerly (the CPU emulation), over their token
bucket's padded layout with attention between the pieces; the same tokens as the eager path and
as transformers' generate, and the steps graphed are the ones the simulator graphs."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import assert_nests  # noqa: E402
from test_runtime_sync import BASE, CASES, assert_same_tokens, reference_tokens  # noqa: E402

from cbsim.config.errors import ConfigError  # noqa: E402
from cbsim.costs.mixed_graphs import bucket_of, token_buckets  # noqa: E402
from cbsim.run_setup import setup_run  # noqa: E402
from cbsim.runtime.engine import check_device, execute  # noqa: E402
from cbsim.runtime.io_slots import pack  # noqa: E402
from cbsim.runtime.piecewise import check_mixed_graphs, unowned  # noqa: E402
from cbsim.runtime.runner import ModelRunner  # noqa: E402
from cbsim.trace import schema as S  # noqa: E402

# buckets 8, 16, 24, ... (token_buckets(8, ...)): the cases' steps spread over several
MIXED = ["engine.mixed_graphs=buckets", "engine.graph_batch_sizes=[1,2,4]"]
MIXED += ["engine.eager_token_multiple=8"]


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def cpu_runner(config) -> tuple[ModelRunner, object]:
    setup = setup_run(config, engine="sync")
    runner = ModelRunner(
        config,
        torch.device("cpu"),
        num_kv_blocks=setup.num_kv_blocks,
        max_context=setup.max_context,
        num_slots=1,
        carry_over=False,
        graphs=True,
        emulate_graphs=True,
    )
    return runner, setup.scheduler


def eager_step(runner: ModelRunner, batch, slot) -> None:
    """The step as the eager path runs it: padded to engine.eager_token_multiple."""
    flat, layout = pack(
        batch,
        runner.cache.scratch_block,
        None,
        runner.carry_len,
        token_multiple=runner.token_multiple,
        short_max=runner.short_max,
    )
    slot.write(flat)
    dev, host = slot.input_views(flat.size)
    dev.copy_(host)
    runner.step_body(slot, layout)


def check_bucket_layout(runner: ModelRunner, plan) -> None:
    """The pieces' sections sit where the bucket's capture had them; padding rows write the
    scratch block; the sampled rows are padded to max_outputs with the last row."""
    batch, layout, bucket = plan.batch, plan.layout, plan.tokens_bucket
    assert layout.num_tokens == bucket and layout.num_sample == batch.num_samples
    assert layout.offsets[:5] == runner.mixed.dummies[bucket][1].offsets[:5]
    v = layout.views(plan.slot.dev_in)
    t, n = int(batch.query_tokens), int(batch.num_samples)
    assert (v["slots"][t:] == runner.cache.scratch_slot).all()
    assert v["logits_idx"][:n].tolist() == batch.logits_indices.tolist()
    assert (v["logits_idx"][n:] == bucket - 1).all()
    assert v["logits_idx"].numel() == runner.max_outputs


def replay_against_eager(runner: ModelRunner, sched, pieces: int, check_layout) -> set[int]:
    """The run stepped on one slot, each step with prompt tokens first run eagerly and then as
    the runner plans it: its token bucket, its ``pieces`` graphs, its layout
    (``check_layout``), its LM head over ``max_outputs`` rows whose sampled ones' logits are
    the eager step's, and its greedy tokens. Returns the buckets replayed."""
    seen = []
    runner.model.lm_head.register_forward_hook(lambda m, i, out: seen.append(out[0].clone()))
    slot, buckets = runner.slots[0], set()
    while sched.has_unfinished():
        batch = sched.schedule()
        n = int(batch.num_samples)
        mixed = batch.query_tokens > len(batch)
        if mixed:
            eager_step(runner, batch, slot)
            want_logits, want = seen[-1], slot.dev_out[:n].clone()
        plan = runner.plan(batch, slot, None)
        runner.copy_in(plan)
        runner.compute(plan)
        runner.copy_out(plan)
        if mixed:
            bucket = bucket_of(runner.mixed.buckets, batch.query_tokens)
            assert plan.tokens_bucket == bucket and plan.pieces == pieces
            check_layout(runner, plan)
            assert seen[-1].shape[0] == runner.max_outputs
            torch.testing.assert_close(seen[-1][:n], want_logits, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(runner.tokens(plan), want.numpy())
            buckets.add(bucket)
        sched.update(batch, runner.tokens(plan).copy())
    return buckets


@pytest.mark.parametrize("short_max", [0, 8])
def test_the_piecewise_forward_gives_the_eager_forwards_logits(config_factory, short_max):
    """Each step with prompt tokens, run eagerly (padded to the eager multiple) and then as
    the piecewise replay runs it (its bucket's layout, attention into the buffer the next piece
    reads): the sampled rows' logits agree and so do the greedy tokens."""
    # staggered prompts chunked at 20 tokens: steps of many sizes, over buckets 4, 8, ... 20
    config = config_factory(
        BASE
        + CASES["staggered"]
        + MIXED
        + ["workload.max_batch_tokens=20", "engine.eager_token_multiple=4"]
        + [f"engine.continuation_decode_max={short_max}"]
    )
    runner, sched = cpu_runner(config)
    assert runner.mixed.buckets == token_buckets(4, config.workload.max_batch_tokens)
    buckets = replay_against_eager(
        runner, sched, runner.shape["num_layers"] + 1, check_bucket_layout
    )
    assert len(buckets) >= 3, buckets


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("engine", ["sync", "async"])
def test_mixed_graphs_give_generates_tokens(config_factory, case, engine):
    """Whole runs, steps with prompt tokens on their buckets' pieces (the async loop's order
    and carry-over emulated): generate's tokens, as with the switch off (test_runtime_sync)."""
    config = config_factory(BASE + CASES[case] + MIXED + [f"engine={engine}"])
    result = execute(config, engine, cpu_emulation=True)
    assert_same_tokens(result, reference_tokens(config))
    s = result.summary
    assert 0 < s["mixed_graph_steps"] < s["graph_steps"] <= s["steps"]
    assert_nests(result.trace)


def test_mixed_graphs_tokens_equal_the_switch_off(config_factory):
    over = BASE + CASES["poisson"] + MIXED + ["engine=async"]
    on = execute(config_factory(over), "async", cpu_emulation=True)
    off = execute(config_factory(over + ["engine.mixed_graphs=off"]), "async", cpu_emulation=True)
    assert off.summary["mixed_graph_steps"] == 0 < on.summary["mixed_graph_steps"]
    assert_same_tokens(on, off.outputs)


@pytest.mark.parametrize("engine", ["sync", "async"])
def test_the_trace_marks_the_steps_the_simulator_graphs(config_factory, engine):
    """A piecewise step's forward is a graph_replay with args.pieces = layers + 1 (a decode
    graph's has none): step for step, the runtime graphs the steps the simulator does, and
    the graph-start correction leaves the piecewise replays as they are."""
    from cbsim.sim import run

    config = config_factory(BASE + CASES["chunked"] + MIXED + [f"engine={engine}"])
    result = execute(config, engine, cpu_emulation=True)
    layers = config.model.num_layers

    def forwards(trace):
        sp = trace.span_frame({"pieces": 0})
        f = sp[sp.lane == S.COMPUTE]
        return f, sorted(zip(f.step, f.name, f.kind, f.query_tokens))

    fwd, steps = forwards(result.trace)
    assert steps == forwards(run(config, engine))[1]
    prompt = fwd.query_tokens > fwd.requests
    assert (fwd.name == S.GRAPH_REPLAY).all()
    assert (fwd.pieces[prompt] == layers + 1).all() and (fwd.pieces[~prompt] == 0).all()
    od = result.trace.other_data
    assert od["mixed_graph_buckets"] == token_buckets(8, config.workload.max_batch_tokens)
    mem = od["memory"]
    assert mem["mixed_graphs"] == mem["mixed_graph_steps"] == 0  # nothing captured on a CPU
    heads, dim = config.model.num_heads, config.model.head_dim
    assert mem["mixed_attn_buffer_bytes"] == (max(od["mixed_graph_buckets"]) + 1) * heads * dim * 4


def test_unowned_aliases_the_memory_of_a_view():
    """The q/k/v a capture records: a strided view into a fused projection's output, read
    through an alias with its offset, shape and strides."""
    qkv = torch.arange(2 * 5 * 12, dtype=torch.float32).view(1, 5, 2, 12)
    v = qkv[..., 8:].transpose(1, 2)  # a slice, transposed: offset 8, non-contiguous
    alias = unowned(v)
    assert alias.data_ptr() == v.data_ptr() and alias.stride() == v.stride()
    torch.testing.assert_close(alias, v)
    qkv.mul_(3)
    torch.testing.assert_close(alias, v)


def test_the_switch_is_refused_where_it_cannot_run_in_one_line(config_factory):
    """On a CPU outside the tests' emulation: one line naming the key and what is allowed; on
    CUDA the switch is the runtime's (only a missing device refuses it)."""
    config = config_factory(["mode=runtime", "mode.device=cpu", "engine.mixed_graphs=buckets"])
    with pytest.raises(ConfigError, match=r"^engine\.mixed_graphs=buckets .*: off$") as exc:
        check_device(config, "sync", False)
    assert "\n" not in str(exc.value) and "mode.device=cpu" in str(exc.value)
    for device in ("cuda", "cuda:1"):
        config = config_factory(
            ["mode=runtime", f"mode.device={device}", "engine.mixed_graphs=buckets"]
        )
        check_mixed_graphs(config, torch.device(device), cpu_emulation=False)
    config = config_factory(BASE + ["engine.mixed_graphs=buckets"])
    assert check_device(config, "sync", cpu_emulation=True).type == "cpu"


def test_auto_runs_eagerly_on_a_cpu_and_the_trace_says_what_ran(config_factory):
    """engine.mixed_graphs=auto (the default) is off on a CPU, emulated or not: the runner
    builds no mixed graphs and the trace records off; on CUDA it stays as the device allows."""
    from cbsim.runtime.piecewise import resolve_mixed_graphs

    small = ["workload.batch_size=2", "workload.num_requests=2", "workload.prompt_len=8"]
    config = config_factory(BASE + small + ["workload.gen_len=4", "engine=async"])
    assert config.engine.mixed_graphs == "auto"
    assert resolve_mixed_graphs(config, torch.device("cpu")).engine.mixed_graphs == "off"
    check_mixed_graphs(config, torch.device("cpu"), cpu_emulation=False)
    result = execute(config, "async", cpu_emulation=True)
    assert result.trace.other_data["mixed_graphs"] == "off"
    assert result.trace.other_data["mixed_graph_buckets"] == []


def test_a_model_whose_layers_skip_the_paged_attention_is_refused(config_factory):
    """The pieces end at each layer's call of the runtime's attention function: a model that
    calls it in fewer layers than it has could not be split, and is refused naming the key."""
    import copy

    from cbsim.runtime.model import build_model

    config = config_factory(BASE + CASES["chunked"] + MIXED)
    model = build_model(config.model, torch.device("cpu"), seed=config.workload.seed)
    attn = model.model.layers[1].self_attn
    attn.config = copy.copy(attn.config)
    attn.config._attn_implementation = "sdpa"
    with pytest.raises(ConfigError, match=r"engine\.mixed_graphs=buckets: .* 1 times in 2 layers"):
        execute(config, "sync", cpu_emulation=True, model=model)
