"""Serving metrics per request, in the names and statistics of vLLM's ``bench serve``.

- TTFT: first_token - arrival; TPOT: (finish - first_token) / (tokens - 1); E2EL: finish -
  arrival, per request. Each as ``mean_``, ``median_``, ``std_`` (population), ``p90_``,
  ``p95_`` and ``p99_<name>_ms`` (numpy's linear percentiles, as vLLM computes them).
- ITL: the time between a request's consecutive tokens. A running request gets one token per
  forward, so each token after its first waited one step interval: the step intervals, each
  counted once per token its step produced that was not a request's first.
- completed, duration (s, first event to last), total_input_tokens and total_output_tokens (of
  the completed requests); request, output-token and total-token throughput over the duration;
  goodput: the completed requests that met every SLO bound given (config ``slo``) per second.
- offered load: the arrival rate of an online workload over the rate the engine took requests
  on (first tokens per second; both between the first and the last, so requests' lengths do
  not enter); above ``slo.overload_ratio`` the engine does not sustain the load: its queue
  grows and TTFT with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from cbsim.metrics.inputs import MetricInputs
from cbsim.metrics.timeline import step_times_ms, time_range
from cbsim.trace import schema as S
from cbsim.trace.fold import request_rows

SERVING = ("ttft", "tpot", "itl", "e2el")
# vLLM's statistics of each latency, in its key order: f"{stat}_{latency}_ms"
STATS = ("mean", "median", "std", "p90", "p95", "p99")
# the SLO fields a run config may set (config group ``slo``): bound in ms, None = no bound
SLO_BOUNDS = ("ttft_ms", "tpot_ms", "e2el_ms")
DEFAULT_OVERLOAD_RATIO = 1.1


def request_table(inst: pd.DataFrame) -> pd.DataFrame:
    """Per request (index rid): arrival, first_token, finish (us, NaN when it did not happen),
    tokens (from its finish instant) and prompt_len (from its arrival; NaN when not recorded)."""
    return request_rows(inst)


def latencies_ms(req: pd.DataFrame) -> dict[str, pd.Series]:
    """Per request TTFT, TPOT and E2EL (ms; NaN where a request has none)."""
    n = req["tokens"].astype(float) - 1
    return {
        "ttft": (req[S.FIRST_TOKEN] - req[S.ARRIVAL]) / 1e3,
        "tpot": ((req[S.FINISH] - req[S.FIRST_TOKEN]) / 1e3).where(n > 0) / n.where(n > 0),
        "e2el": (req[S.FINISH] - req[S.ARRIVAL]) / 1e3,
    }


def serving_metrics(inp: MetricInputs) -> dict[str, Any]:
    """vLLM's serving figures (see the module docstring), goodput and offered load."""
    req = inp.fold.requests()
    start, end = time_range(inp)
    duration_s = (end - start) / 1e6
    lat = latencies_ms(req)
    finished = req[req[S.FINISH].notna()]
    out: dict[str, Any] = {
        "requests_finished": int(len(finished)),
        **totals(finished, duration_s),
    }
    for key in ("ttft", "tpot", "itl", "e2el"):
        if key == "itl":
            itl, weights = itl_steps(inp, req, start)
            out.update(latency_stats(key, itl, weights))
        else:
            v = lat[key].dropna().to_numpy()
            out.update(latency_stats(key, v, np.ones(len(v), dtype=np.int64)))
    # the medians under the names validation compares by
    out["ttft_ms_p50"], out["tpot_ms_p50"] = out["median_ttft_ms"], out["median_tpot_ms"]
    slo = _slo(inp.config)
    out.update(goodput(req, lat["ttft"], lat["tpot"], lat["e2el"], slo, duration_s))
    out.update(offered_load(req, slo.get("overload_ratio", DEFAULT_OVERLOAD_RATIO)))
    return out


def totals(finished: pd.DataFrame, duration_s: float) -> dict[str, Any]:
    """The completed requests, their tokens and the throughputs over the run's duration."""
    out_tokens = finished["tokens"].dropna()
    prompts = finished["prompt_len"].dropna()
    known = len(finished) > 0 and len(prompts) == len(finished)
    total_in = int(prompts.sum()) if known else None
    total_out = int(out_tokens.sum()) if len(out_tokens) else None
    ok = duration_s > 0

    def rate(x: float | None) -> float | None:
        return x / duration_s if ok and x else None

    return {
        "completed": int(len(finished)),
        "duration": duration_s if ok else None,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": rate(len(finished)),
        "output_throughput": rate(total_out),
        "total_token_throughput": rate(total_in + total_out) if known and total_out else None,
    }


def latency_stats(key: str, values: np.ndarray, weights: np.ndarray) -> dict[str, Any]:
    """mean, median, std, p90, p95, p99 of ``values`` (ms) each counted ``weights`` times,
    under vLLM's keys (``mean_ttft_ms``, ...); None each when there is none."""
    total = int(weights.sum()) if len(weights) else 0
    if not total:
        return {f"{stat}_{key}_ms": None for stat in STATS}
    mean = float((values * weights).sum() / total)
    std = float(np.sqrt((weights * (values - mean) ** 2).sum() / total))
    out = {f"mean_{key}_ms": mean, f"median_{key}_ms": weighted_pct(values, weights, 50)}
    out[f"std_{key}_ms"] = std
    for q in (90, 95, 99):
        out[f"p{q}_{key}_ms"] = weighted_pct(values, weights, q)
    return out


def itl_ms(inp: MetricInputs, req: pd.DataFrame, start: float) -> np.ndarray:
    """Every inter-token latency (ms), one per token after a request's first (for CDFs)."""
    return np.repeat(*itl_steps(inp, req, start))


def itl_steps(inp: MetricInputs, req: pd.DataFrame, start: float) -> tuple[np.ndarray, np.ndarray]:
    """Inter-token latencies (ms) as (step interval, how many tokens waited it): each step
    interval counts once per token of the step that was not a request's first."""
    fold = inp.fold
    per_step = fold.forwards[fold.gpu_lane()].per_step()
    if per_step.empty:
        return np.array([]), np.array([], dtype=np.int64)
    intervals = step_times_ms(per_step, start)
    per_step = per_step.sort_values("end")
    ends = per_step["end"].to_numpy()
    firsts = req[S.FIRST_TOKEN].dropna().to_numpy()
    # a first token is delivered after its step's forward ended: the last step ended by then
    at = np.clip(np.searchsorted(ends, firsts, side="right") - 1, 0, len(ends) - 1)
    first_per_step = np.bincount(at, minlength=len(ends)) if len(firsts) else 0
    weights = np.maximum(per_step["tokens"].to_numpy().astype(np.int64) - first_per_step, 0)
    return intervals, weights


def weighted_pct(values: np.ndarray, weights: np.ndarray, q: float) -> float | None:
    """np.percentile (linear) of ``values`` each repeated ``weights`` times, without repeating
    them (a long run has millions of inter-token gaps)."""
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    total = int(weights.sum())
    if not total:
        return None
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(weights[order])
    h = (total - 1) * q / 100.0
    lo, hi = int(np.floor(h)), int(np.ceil(h))
    v_lo = values[np.searchsorted(cum, lo, side="right")]
    v_hi = values[np.searchsorted(cum, hi, side="right")]
    return float(v_lo + (h - lo) * (v_hi - v_lo))


def _slo(config: dict[str, Any] | None) -> dict[str, Any]:
    slo = (config or {}).get("slo")
    return slo if isinstance(slo, dict) else {}


def goodput(req, ttft, tpot, e2el, slo: dict[str, Any], duration_s: float) -> dict[str, Any]:
    """Finished requests per second that met every SLO bound set (None without any bound)."""
    bounds = {k: slo.get(k) for k in SLO_BOUNDS if slo.get(k) is not None}
    out: dict[str, Any] = {"request_goodput": None, "slo_met_fraction": None}
    finished = req[S.FINISH].notna()
    if not bounds or not finished.any() or duration_s <= 0:
        return out
    good = finished.copy()
    for key, series in (("ttft_ms", ttft), ("tpot_ms", tpot), ("e2el_ms", e2el)):
        if key in bounds:
            # a one-token request has no TPOT: it cannot miss a TPOT bound
            met = series <= float(bounds[key])
            good &= met | (series.isna() if key == "tpot_ms" else False)
    out["request_goodput"] = int(good.sum()) / duration_s
    out["slo_met_fraction"] = int(good.sum()) / int(finished.sum())
    return out


def offered_load(req: pd.DataFrame, overload_ratio: float) -> dict[str, Any]:
    """Arrival rate over the rate requests got their first token (online workloads; None
    offline). An engine that keeps up starts each request a TTFT after it arrives, so the two
    rates match; one that does not starts them at its own, slower, rate."""
    out: dict[str, Any] = {
        "offered_request_rate": None,
        "sustained_request_rate": None,
        "offered_load_ratio": None,
        "overloaded": None,
    }
    arrivals = np.sort(req[S.ARRIVAL].dropna().to_numpy())
    started = np.sort(req[S.FIRST_TOKEN].dropna().to_numpy())
    if len(arrivals) < 2 or len(started) < 2:
        return out
    arrival_span, start_span = arrivals[-1] - arrivals[0], started[-1] - started[0]
    if arrival_span <= 0 or start_span <= 0:
        return out
    offered = (len(arrivals) - 1) / (arrival_span / 1e6)
    sustained = (len(started) - 1) / (start_span / 1e6)
    out["offered_request_rate"] = float(offered)
    out["sustained_request_rate"] = float(sustained)
    out["offered_load_ratio"] = float(offered / sustained)
    out["overloaded"] = bool(offered / sustained > overload_ratio)
    return out
