"""Held-out validation: each run predicted by a profile fitted without it, and without every run
that shares with it what the question holds out (its workload, engine, model or device call).

Runs whose fit sets are the same share one fit (both engines of a workload held out by
workload), and the distinct fits run in parallel worker processes.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed

from cbsim.calibration.calibrate import Calibration, FitOptions, calibrate
from cbsim.calibration.progress import progress
from cbsim.calibration.recordings import Recorded
from cbsim.config.schema import HardwareConfig
from cbsim.validation.runs import RunResult, validate_run

log = logging.getLogger("cbsim")

# what each held-out run's profile leaves out, besides the run itself
LEAVE_OUT: dict[str, Callable[[Recorded], str]] = {
    "run": lambda r: str(r.path),
    "workload": lambda r: r.workload_key,
    "engine": lambda r: r.engine,
    "model": lambda r: r.model_key,
    "call": lambda r: r.call,
}
# the runs the forked fit workers read (set before the pool starts; fork shares them)
_RECS: list[Recorded] = []


def fit_sets(
    recs: list[Recorded], by: str, same_stack: bool = True, same_call: bool = False
) -> list[tuple[tuple[int, ...], str]]:
    """Per run, the indices of the runs its profile is fitted on and what it holds out.

    The pool is the other runs of its stack (one runtime version on one device host; all runs
    when ``same_stack`` is false, or when the stack has no other run; only its own device call's
    with ``same_call``), less every run that shares ``by`` with it. Where that leaves nothing (a stack of one workload, one model or one
    call), only the run itself is left out ("run")."""
    key = LEAVE_OUT[by]
    out = []
    for i, rec in enumerate(recs):
        pool = [j for j, r in enumerate(recs) if j != i]
        if same_stack:
            pool = [j for j in pool if recs[j].stack == rec.stack] or pool
        if same_call:
            pool = [j for j in pool if recs[j].call == rec.call] or pool
        others = tuple(j for j in pool if key(recs[j]) != key(rec))
        out.append((others, by) if others else (tuple(pool), "run"))
    return out


def leave_out(
    recs: list[Recorded],
    base: HardwareConfig,
    name: str,
    by: str = "workload",
    same_stack: bool = True,
    options: FitOptions | None = None,
    jobs: int = 1,
    show: bool = True,
    same_call: bool = False,
) -> tuple[list[RunResult], dict[tuple[int, ...], Calibration]]:
    """Each run simulated with a profile fitted on its fit set (``fit_sets``)."""
    if by not in LEAVE_OUT:
        raise ValueError(f"leave out {by!r}; allowed: {', '.join(LEAVE_OUT)}")
    sets = fit_sets(recs, by, same_stack, same_call)
    cals = fit_all(recs, sorted({s for s, _ in sets if s}), base, name, options, jobs, show)
    results = []
    runs = progress(zip(recs, sets), len(recs), f"simulating {len(recs)} run(s)", show)
    for rec, (others, kind) in runs:
        if not others:  # nothing else recorded: the base profile as it is
            result = validate_run(rec, base, False, [])
        else:
            cal = cals[others]
            result = validate_run(rec, cal.hardware, True, [recs[j].name for j in others])
            result.fit_table = cal.table()
            result.held_out_by = kind
            result.across_calls = rec.call not in {recs[j].call for j in others}
        results.append(result)
    return results, cals


def fit_all(
    recs: list[Recorded],
    sets: list[tuple[int, ...]],
    base: HardwareConfig,
    name: str,
    options: FitOptions | None,
    jobs: int,
    show: bool,
) -> dict[tuple[int, ...], Calibration]:
    """One calibration per distinct fit set, in ``jobs`` worker processes (1: here)."""
    for r in progress(recs, len(recs), f"reading {len(recs)} trace(s)", show):
        r.spans, r.config, r.forward, r.batches  # noqa: B018  built once; forked workers share them
    jobs = min(jobs if jobs > 0 else (os.cpu_count() or 1), len(sets))
    what = f"fitting {len(sets)} profile(s)"
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return {
            s: calibrate([recs[j] for j in s], base, name, options)
            for s in progress(sets, len(sets), what, show)
        }
    global _RECS
    _RECS = recs
    out: dict[tuple[int, ...], Calibration] = {}
    ctx = multiprocessing.get_context("fork")
    try:
        with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            futures = {pool.submit(_fit, s, base, name, options): s for s in sets}
            for fut in progress(as_completed(futures), len(sets), what, show):
                out[futures[fut]] = fut.result()
    finally:
        _RECS = []
    return out


def _fit(
    indices: tuple[int, ...], base: HardwareConfig, name: str, options: FitOptions | None
) -> Calibration:
    return calibrate([_RECS[j] for j in indices], base, name, options)
