"""Admission: the waiting queue and who of it joins the next batch.

FIFO by arrival: the head is admitted once it has arrived, its pending output (if preempted) is
filled, it fits the step's remaining token budget (whole, or as a first chunk with
``workload.chunked_prefill``; a recompute longer than ``max_batch_tokens`` is chunked anyway)
and its first chunk's KV blocks are free. A preempted request goes back to the front.
"""

from __future__ import annotations

import math
from collections import deque

from cbsim.scheduler.blocks import BlockTables
from cbsim.scheduler.table import RUNNING, RequestTable


class Admission:
    """The waiting queue (row indices, admission order) and the admission rule."""

    def __init__(
        self, table: RequestTable, blocks: BlockTables, max_batch_tokens: int, chunked: bool
    ) -> None:
        self.table, self.blocks = table, blocks
        self.max_batch_tokens = max_batch_tokens
        self.chunked_prefill = chunked
        self.waiting: deque[int] = deque()

    def queue(self, i: int) -> None:
        """Queue row ``i``; one that arrives earlier than the last queued one is slotted in by
        arrival time."""
        w, arrival = self.waiting, self.table.arrival
        if w and arrival[w[-1]] > arrival[i]:
            pos = len(w)
            while pos > 0 and arrival[w[pos - 1]] > arrival[i]:
                pos -= 1
            w.insert(pos, i)
        else:
            w.append(i)

    def requeue(self, i: int) -> None:
        """A preempted row: back to the front."""
        self.waiting.appendleft(i)

    def next_arrival_s(self) -> float:
        w = self.waiting
        return float(self.table.arrival[w[0]]) if w else math.inf

    def ready(self, i: int, now_s: float) -> bool:
        """Row ``i`` has arrived and has no output pending."""
        t = self.table
        return t.arrival[i] <= now_s and t.nfilled[i] == t.nsched[i]

    def first_chunk(self, i: int, budget: int) -> int | None:
        """Query tokens row ``i`` would get with ``budget`` left (None: it must wait to fit)."""
        total = int(self.table.plen[i] + self.table.nsched[i])
        if total <= budget:
            return total
        if self.chunked_prefill or total > self.max_batch_tokens:
            return budget
        return None

    def admit(
        self, now_s: float, budget: int, n_run: int, batch_size: int
    ) -> tuple[list[int], list[int]]:
        """Admit heads while ``batch_size`` (``n_run`` running now), the token budget and the
        free blocks allow; returns the rows and their query tokens."""
        adm: list[int] = []
        adm_q: list[int] = []
        waiting, kv = self.waiting, self.blocks.kv
        while waiting and n_run < batch_size and budget > 0:
            i = waiting[0]
            if not self.ready(i, now_s):
                break
            qi = self.first_chunk(i, budget)
            if qi is None:
                break
            need = kv.blocks_needed(qi)
            if need > kv.num_free:
                break
            waiting.popleft()
            self.blocks.open(i, need)
            self.table.state[i] = RUNNING
            adm.append(i)
            adm_q.append(qi)
            budget -= qi
            n_run += 1
        return adm, adm_q

    def check_stuck(self, now_s: float, max_batch_tokens: int) -> None:
        """Nothing was scheduled and nothing runs or is in flight: a head that has arrived can
        never be admitted (a bug, or a request larger than the cache)."""
        if not self.waiting:
            return
        i = self.waiting[0]
        t = self.table
        if t.arrival[i] > now_s:
            return
        raise RuntimeError(
            f"scheduler stuck: request {int(t.rid[i])} (prompt {int(t.plen[i])}, "
            f"{int(t.nsched[i])} outputs) cannot be admitted with {self.blocks.kv.num_free} free "
            f"KV blocks and a budget of {max_batch_tokens} tokens"
        )
