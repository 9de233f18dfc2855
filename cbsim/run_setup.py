"""One setup for both back ends: the requests, the KV cache, the device-fit estimate, the
scheduler, the arrivals and the IO slots of a run, decided once from the config.

The simulator (cbsim/sim/engine.py) and the runtime (runtime/engine.py) both start from
``setup_run``; whatever one of them refuses here, the other refuses the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from cbsim.config.errors import ConfigError
from cbsim.config.schema import CbsimConfig, EngineConfig
from cbsim.costs import CostModel
from cbsim.costs.eager_tokens import round_up
from cbsim.scheduler import Scheduler, default_num_kv_blocks
from cbsim.workload import Request, check_requests_fit, make_requests

ENGINES = ("sync", "async")


class Arrival(NamedTuple):
    """One request's arrival, as both back ends write it (the trace's ``arrival`` event)."""

    rid: int
    arrival_s: float
    prompt_len: int
    max_new_tokens: int


@dataclass(frozen=True)
class DeviceFit:
    """Whether weights + KV cache + IO buffers + graph pool fit ``hardware.memory_bytes``."""

    fits: bool
    bytes_needed: int
    bytes_available: int
    parts: dict[str, int]  # weight_bytes, kv_cache_bytes, io_buffer_bytes, graph_pool_bytes


@dataclass
class RunSetup:
    """Everything a back end needs before its loop starts."""

    engine: EngineConfig  # the settings this engine runs with (see engine_config)
    requests: list[Request]  # as drawn from the workload, sorted by arrival
    scheduler: Scheduler  # every request added
    num_kv_blocks: int
    io_slots: int
    fit: DeviceFit
    max_context: int  # the longest request, prompt + new tokens
    costs: CostModel  # the cost model of this config (the device-fit estimate uses it)

    def arrivals(self) -> Iterator[Arrival]:
        """Every request's arrival, in arrival order (a tuple a request, made as read)."""
        for r in self.requests:
            yield Arrival(r.rid, r.arrival_s, r.prompt_len, r.max_new_tokens)


def engine_config(cfg: CbsimConfig, engine: str | None = None) -> EngineConfig:
    """The engine settings a run of ``engine`` (None: ``cfg.engine.name``) uses. The sync engine
    of a comparison (or of an async config) runs as the baseline: one IO slot, no carry-over."""
    e = cfg.engine
    engine = e.name if engine is None else engine
    if engine not in ENGINES:
        raise ConfigError(f"engine={engine!r}; allowed: {', '.join(ENGINES)}")
    if engine == "sync" and e.name != "sync":
        return dataclasses.replace(e, name="sync", io_slots=1, carry_over=False)
    if engine == "async" and e.name == "sync":
        raise ConfigError(
            "a run of the async engine with engine.name=sync: use engine=async or engine=compare"
        )
    return dataclasses.replace(e, name=engine)


def setup_run(
    cfg: CbsimConfig,
    *,
    vocab_size: int | None = None,
    engine: str | None = None,
    eos_token_id: int | None = None,
    eos_headroom: bool = False,
    keep_tokens: bool = False,
) -> RunSetup:
    """Draw the requests (token ids below ``vocab_size``, default ``model.vocab_size``), size
    the KV cache, refuse a request that can never run (ConfigError naming it), estimate the
    device memory, and build the scheduler with every request added. ``eos_token_id`` ends a
    request early unless ``workload.ignore_eos``; ``eos_headroom``: the scheduler is told one
    more token may come after each drawn length (the simulator samples EOS as the last drawn
    token, and a server cannot know where that falls). ``keep_tokens``: the scheduler keeps
    every prompt's and every output's token ids (the runtime feeds and returns them); without
    them it keeps counts, and no prompt id is drawn (a simulation's memory per request)."""
    eng = engine_config(cfg, engine)
    w, model = cfg.workload, cfg.model
    requests = make_requests(w, model.vocab_size if vocab_size is None else vocab_size)
    max_context = max((r.prompt_len + r.max_new_tokens for r in requests), default=1)
    eos = None if w.ignore_eos else eos_token_id
    fixed_cache = None if w.kv_num_blocks is None else w.kv_num_blocks * w.kv_block_size
    queued = requests
    if eos is not None and eos_headroom:
        queued = with_eos_headroom(requests, model.max_position_embeddings, fixed_cache)
    num_kv_blocks = default_num_kv_blocks(w, queued)
    try:
        check_requests_fit(
            queued,
            model.max_position_embeddings,
            num_kv_blocks * w.kv_block_size,
            None if w.chunked_prefill else w.max_batch_tokens,
        )
    except ValueError as exc:  # a drawn request that can never run: the config's fault
        raise ConfigError(str(exc)) from None
    scheduler = Scheduler(w, num_kv_blocks, eos_token_id=eos, keep_tokens=keep_tokens)
    scheduler.add_all(queued)
    io_slots = 1 if eng.name == "sync" else eng.io_slots
    costs = CostModel(cfg, max_context=max_context, share_steps=True)
    return RunSetup(
        engine=eng,
        requests=requests,
        scheduler=scheduler,
        num_kv_blocks=num_kv_blocks,
        io_slots=io_slots,
        fit=device_fit(cfg, eng, costs, num_kv_blocks, max_context, io_slots),
        max_context=max_context,
        costs=costs,
    )


def with_eos_headroom(
    requests: list[Request], max_context: int, kv_capacity_tokens: int | None
) -> list[Request]:
    """The requests with one more token allowed each, where the context (and the KV cache of
    ``kv_capacity_tokens`` when it is fixed) has room for it: the extra token's KV entries are
    prompt + max_new_tokens."""
    room = max_context - 1
    if kv_capacity_tokens is not None:
        room = min(room, kv_capacity_tokens)
    return [
        r.with_max_new_tokens(r.max_new_tokens + 1)
        if r.prompt_len + r.max_new_tokens <= room
        else r
        for r in requests
    ]


def device_fit(
    cfg: CbsimConfig,
    engine: EngineConfig,
    costs: CostModel,
    num_kv_blocks: int,
    max_context: int,
    io_slots: int,
) -> DeviceFit:
    """The device memory a run needs: weights, the KV cache, an IO buffer per slot and one graph
    pool (both slots' graphs share it), against ``hardware.memory_bytes``."""
    w = cfg.workload
    tokens = round_up(w.max_batch_tokens, engine.eager_token_multiple)  # padded eager steps
    per_slot = costs.io_slot_bytes(w.batch_size, tokens, max_context)
    parts = {
        "weight_bytes": cfg.model.weight_bytes,
        "kv_cache_bytes": num_kv_blocks * w.kv_block_size * cfg.model.kv_bytes_per_token,
        "io_buffer_bytes": per_slot * io_slots,
        "graph_pool_bytes": costs.graph_pool_bytes_per_slot(w.batch_size)
        if engine.cuda_graphs
        else 0,
    }
    needed = sum(parts.values())
    available = int(cfg.hardware.memory_bytes)
    return DeviceFit(bool(needed <= available), needed, available, parts)
