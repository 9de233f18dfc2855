"""A host phase's cost over its batch (``hardware.host.schedule``, ``prepare``, ``update``),
beside hardware.py (which re-exports it): one linear form that the simulator charges and
calibration fits column by column."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class PhaseCost:
    """A host phase's cost over the batch it handles (microseconds), one form from batch 1 to 256:

    fixed + per_request x R + per_request_sq x R^2 + per_token x T + per_block x B
          + per_prefill_step x [T > R]

    R requests, T tokens (query tokens; for update the sampled tokens), B KV-cache blocks; T > R:
    the step holds prompt tokens beyond one per request (never a decode step, so the fit tells it
    from the fixed cost by the prefill and mixed steps alone). Linear in its coefficients, so
    calibration fits it by least squares from runs that span the range
    (cbsim/calibration/host.py); the profile's comment on each says what fitted it."""

    # the phase's Python and driver overhead per step, whatever the batch
    fixed_us: float = 0.0
    # per-request work: list and dict updates, per-request numpy rows (the scheduler's slow path)
    per_request_us: float = 0.0
    # per query token: packing token ids and positions into the pinned buffer
    per_token_us: float = 0.0
    # per KV-cache block in the batch's block tables (sum over requests of ceil(context / block),
    # counted as kv_tokens // block_size + requests): building and packing the tables grows with
    # the context (the H200's recordings: prepare 280 -> 370 us, launch 650 -> 850 us over seed_8192). 0 = none
    per_block_us: float = 0.0
    # per request squared: host work that grows faster than the batch (an H200 recording's async decode
    # medians: prepare 80 / 83 / 126 us at 16 / 32 / 64 requests); a fit up to 64 requests hardly
    # tells it from per_request_us, one over batch 1-256 does. 0 = linear in the requests
    per_request_sq_us: float = 0.0
    # once per step that holds prompt tokens (T > R): admitting requests, and the eager step's
    # full packing where a graph step writes only what changed (the H200's recordings: schedule and prepare
    # 270-290 us each at 1-3000 prompt tokens, against 32 and 71 us a decode step); 0 = none
    per_prefill_step_us: float = 0.0

    def cost(self, requests: int, tokens: int, blocks: int = 0) -> float:
        return (
            self.fixed_us
            + (self.per_request_us + self.per_request_sq_us * requests) * requests
            + self.per_token_us * tokens
            + self.per_block_us * blocks
            + (self.per_prefill_step_us if tokens > requests else 0.0)
        )

    @staticmethod
    def counts(requests, tokens, blocks=0) -> dict[str, object]:
        """What each coefficient multiplies (numbers or numpy arrays): the columns a least-squares
        fit of the form uses; ``cost`` is the sum of coefficient x count."""
        return {
            "fixed_us": 1.0,
            "per_request_us": requests,
            "per_token_us": tokens,
            "per_block_us": blocks,
            "per_request_sq_us": requests * requests,
            "per_prefill_step_us": (np.asarray(tokens) > requests).astype(float),
        }
