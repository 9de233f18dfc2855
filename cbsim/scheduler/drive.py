"""Driving the scheduler: the KV cache size a workload needs, and the reference offline driver."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from cbsim.config.schema import WorkloadConfig
from cbsim.scheduler.batch import Batch
from cbsim.scheduler.scheduler import Scheduler
from cbsim.workload import Request


def default_num_kv_blocks(workload: WorkloadConfig, requests: Iterable[Request]) -> int:
    """``workload.kv_num_blocks``, or (None) enough blocks for every request at once."""
    if workload.kv_num_blocks is not None:
        return int(workload.kv_num_blocks)
    bs = workload.kv_block_size
    return max(1, sum(-(-(r.prompt_len + r.max_new_tokens) // bs) for r in requests))


def run_to_completion(
    sched: Scheduler,
    sample: Callable[[Batch], np.ndarray],
    overlap: bool = False,
    on_batch: Callable[[Batch, Batch | None], None] | None = None,
) -> int:
    """The reference driver (tests, benchmarks): offline, every request already added.
    ``overlap`` = the async order (schedule N+1 before update N). ``sample(batch)`` returns the
    batch's tokens; it runs when the batch's forward would finish, i.e. after the next batch has
    been scheduled in the async order. ``on_batch(batch, prev)`` sees every batch as it is
    scheduled. Returns the number of steps."""
    steps = 0
    prev: Batch | None = None
    while sched.has_unfinished():
        batch = sched.schedule()  # raises when nothing can ever run
        if batch is not None:
            steps += 1
            if on_batch is not None:
                on_batch(batch, prev)
        if not overlap:
            if batch is not None:
                sched.update(batch, sample(batch))
            continue
        if prev is not None:
            sched.update(prev, sample(prev))
        prev = batch
    if prev is not None:  # outputs of requests already retired (EOS): dropped
        sched.update(prev, sample(prev))
    return steps
