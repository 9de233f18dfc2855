"""Why async pays or not, in one sentence: the host's work per step against the GPU's.

A sync step is the host's work (everything on the host lane but ``wait``) and then the forward,
one after the other; overlapping them can save at most the shorter of the two, so
``min(host, gpu) / (host + gpu)`` is the most of a sync step async has to hide. Measured from the
trace's spans, so a simulated, a runtime and an imported trace all get it.
"""

from __future__ import annotations

from typing import Any

from cbsim.metrics.inputs import MetricInputs
from cbsim.trace import schema as S

SHOWN_PHASES = 4  # an import's host lane names every runtime call: the largest few are named


def host_work_metrics(inp: MetricInputs) -> dict[str, Any]:
    """Host work and GPU forward time per step (ms), the phases by size, and the hideable share."""
    out: dict[str, Any] = {
        "host_work_ms_per_step": None,
        "gpu_ms_per_step": None,
        "host_work_phases": [],
        "hideable_fraction": None,
    }
    fold = inp.fold
    forwards = fold.forwards[fold.gpu_lane()]
    steps = len(forwards.per_step())
    if not steps:
        return out
    work = {name: us for name, us in sorted(fold.host_us.items()) if name != S.WAIT}
    by_phase = sorted(work, key=lambda name: -work[name])
    host_ms = sum(work.values()) / 1e3 / steps
    gpu_ms = forwards.dur_us / 1e3 / steps
    out["host_work_ms_per_step"] = host_ms
    out["gpu_ms_per_step"] = gpu_ms
    out["host_work_phases"] = by_phase[:SHOWN_PHASES]
    if host_ms + gpu_ms > 0:
        out["hideable_fraction"] = min(host_ms, gpu_ms) / (host_ms + gpu_ms)
    return out


def why_sentence(m: dict[str, Any]) -> str | None:
    """'the host works 0.49 ms a step (launch, prepare, schedule, update) against a 1.28 ms
    forward; at most 27% of a step is there to hide', or None where the trace has no host work
    or no forward to weigh."""
    host, gpu, share = m.get("host_work_ms_per_step"), m.get("gpu_ms_per_step"), None
    if host is None or gpu is None or not host or not gpu:
        return None
    share = m.get("hideable_fraction")
    phases = list(m.get("host_work_phases") or [])
    named = f" ({', '.join(phases)})" if phases else ""
    sentence = f"the host works {_ms(host)} a step{named} against a {_ms(gpu)} forward"
    if host > gpu:
        sentence += ", so the GPU waits on the host"
    return f"{sentence}; at most {share:.0%} of a step is there to hide"


def why_line(runs: dict[str, dict[str, Any]]) -> str | None:
    """The sentence for a run's report and terminal: the sync run's when there is one (what
    async has to hide), else each engine's."""
    if "sync" in runs:
        said = why_sentence(runs["sync"])
        return f"Why: in sync, {said}." if said else None
    said = {e: why_sentence(m) for e, m in runs.items() if isinstance(m, dict)}
    said = {e: s for e, s in said.items() if s}
    if not said:
        return None
    if len(said) == 1:
        return f"Why: {next(iter(said.values()))}."
    return "Why: " + "; ".join(f"in {e}, {s}" for e, s in said.items()) + "."


def _ms(value: float) -> str:
    return f"{value:.2f} ms" if value >= 0.1 else f"{value * 1e3:.0f} us"
