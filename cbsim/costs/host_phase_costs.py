"""CostModel's host phases: schedule, prepare, update, the periodic stall and a launch
(microseconds, at the host's fast level; the simulator scales them by the host's speed)."""

from __future__ import annotations


class HostPhaseCosts:
    """CostModel's host terms (it sets ``host``, the profile's HostCosts, and ``jitter``, a
    band's step-to-step host speed or None)."""

    def schedule_us(self, requests: int, tokens: int, blocks: int = 0) -> float:
        cost = self.host.schedule.cost(requests, tokens, blocks)
        return cost * self.jitter.step() if self.jitter else cost

    def prepare_us(self, requests: int, tokens: int, blocks: int = 0) -> float:
        cost = self.host.prepare.cost(requests, tokens, blocks)
        return cost * self.jitter.factor if self.jitter else cost

    def update_us(self, requests: int, tokens: int, blocks: int = 0) -> float:
        cost = self.host.update.cost(requests, tokens, blocks)
        return cost * self.jitter.factor if self.jitter else cost

    def stall_us(self, update_index: int) -> float:
        """The periodic host stall charged to the ``update_index``-th update (0-based)."""
        every = self.host.stall_every_steps
        return self.host.stall_us if every and (update_index + 1) % every == 0 else 0.0

    def launch_us(
        self, kernels: int, graph: bool, copies: int, event_ops: int, blocks: int = 0
    ) -> float:
        """Host time to enqueue one step: the kernels or one graph, the copies, the events,
        and the per-block staging of the block tables."""
        h = self.host
        body = h.graph_launch_us if graph else h.eager_forward_us + h.kernel_launch_us * kernels
        return (
            body
            + h.launch_per_block_us * blocks
            + h.copy_launch_us * copies
            + h.event_us * event_ops
        )
