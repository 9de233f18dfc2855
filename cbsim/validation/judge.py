"""Judging a prediction against the noise: the recordings of one workload repeated across device
calls are grouped, and the prediction is compared with the mean of the repeats (their std shown),
beside a constant baseline, with the targets of issue #39 (cbsim.validation.targets).

One recording moves by about as much as the targets allow (the brief: async speedup std 1.0-1.5
points between calls), so a workload's truth is the mean of its repeats, and the simulator has to
beat predicting the same speedup for every workload to be worth asking.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from math import comb
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from cbsim.config.hardware import device_matches
from cbsim.validation.noise import means_noise
from cbsim.validation.speedup import Speedup
from cbsim.validation.targets import Targets


@dataclass
class Workload:
    """One workload's held-out recordings (one sync/async pair per repeat) and its prediction."""

    name: str
    model: str
    batch_size: int
    pairs: list[Speedup] = field(default_factory=list)

    @property
    def recorded(self) -> np.ndarray:
        return np.array([p.recorded for p in self.pairs if p.recorded is not None], float)

    @property
    def n(self) -> int:
        return len(self.recorded)

    @property
    def mean(self) -> float | None:
        return float(self.recorded.mean()) if self.n else None

    @property
    def std(self) -> float | None:
        """Sample std of the repeats' speedups (None with fewer than two)."""
        return float(self.recorded.std(ddof=1)) if self.n > 1 else None

    @property
    def predicted(self) -> float | None:
        """The repeats are one config simulated alike: their predictions' mean."""
        got = [p.predicted for p in self.pairs if p.predicted is not None]
        return float(np.mean(got)) if got else None

    @property
    def band(self) -> tuple[float, float] | None:
        got = [p.band for p in self.pairs if p.band is not None]
        if not got:
            return None
        lo, hi = np.mean(np.array(got, float), axis=0)
        return float(lo), float(hi)

    def engine_error(self, engine: str, metric: str, points: bool) -> float | None:
        """Predicted minus the mean recorded value of ``metric`` for ``engine``: percent of
        the mean, or (``points``) percentage points of a share."""
        runs = [p.sync if engine == "sync" else p.async_ for p in self.pairs]
        real = [r.real.get(metric) for r in runs]
        sim = [r.sim.get(metric) for r in runs]
        if not runs or any(v is None for v in (*real, *sim)):
            return None
        r, s = float(np.mean(real)), float(np.mean(sim))
        if points:
            return 100.0 * (s - r)
        return 100.0 * (s - r) / r if r else None

    @property
    def cold(self) -> bool:
        """Judged after the first step (the recordings' manifest marks it a one-off)."""
        return any(p.metric == "steady_time_s" for p in self.pairs)

    def errors(self) -> dict[str, float | None]:
        total = "steady_time_s" if self.cold else "total_time_s"
        idle = "steady_gpu_idle_fraction" if self.cold else "gpu_idle_fraction"
        pred, mean = self.predicted, self.mean
        return {
            "speedup_points": 100.0 * (pred - mean) if None not in (pred, mean) else None,
            "async_total_pct": self.engine_error("async", total, False),
            "sync_total_pct": self.engine_error("sync", total, False),
            "sync_idle_pp": self.engine_error("sync", idle, True),
        }


def case_of(pair: Speedup) -> str:
    """The workload's case name: the folder its traces sit in (``<repeat>/<case>/trace_*``)."""
    return PurePosixPath(pair.workload).name or pair.workload


def group(pairs: list[Speedup]) -> list[Workload]:
    """The held-out pairs grouped by workload: one case name, model shape, workload and graph
    setting (repeats of one workload in separate calls or machines), in first-seen order."""
    out: dict[tuple[str, ...], Workload] = {}
    for p in pairs:
        if not p.held_out:
            continue
        rec = p.sync.rec
        key = (case_of(p), rec.model_key, rec.workload_key, str(rec.config.engine.cuda_graphs))
        w = out.get(key)
        if w is None:
            batch = rec.config.workload.batch_size
            w = out[key] = Workload(case_of(p), rec.config.model.name, batch)
        w.pairs.append(p)
    return [w for w in out.values() if w.n]


def baseline(workloads: list[Workload], calibration: list[float], kind: str) -> dict[str, Any]:
    """The constant guess per workload: the calibration set's median speedup, or the median of
    the other workloads' means (leave one out)."""
    use_cal = kind == "calibration" or (kind == "auto" and calibration)
    means = np.array([w.mean for w in workloads], float)
    if use_cal and calibration:
        value = float(np.median(calibration))
        return {
            "kind": "calibration",
            "label": f"median of the calibration set ({len(calibration)} pairs)",
            "per_workload": [value] * len(workloads),
        }
    guesses = [
        float(np.median(np.delete(means, i))) if len(means) > 1 else float("nan")
        for i in range(len(means))
    ]
    return {
        "kind": "others",
        "label": "median of the other workloads' means (leave one out)",
        "per_workload": guesses,
    }


def binomial_interval(confidence: float, n: int, p: float) -> tuple[int, int]:
    """The equal-tailed interval of a Binomial(n, p) count holding ``confidence`` of its mass
    (as scipy.stats.binom.interval: the alpha/2 and 1 - alpha/2 quantiles)."""
    pmf = np.array([comb(n, k) * p**k * (1.0 - p) ** (n - k) for k in range(n + 1)])
    cdf = np.cumsum(pmf)
    alpha = 1.0 - confidence
    eps = 1e-12  # the cumulative sum's rounding
    lo = int(np.searchsorted(cdf, alpha / 2 - eps))
    hi = int(np.searchsorted(cdf, 1.0 - alpha / 2 - eps))
    return lo, min(hi, n)


def _rmse(err: np.ndarray, axis: int | None = None) -> Any:
    return np.sqrt(np.mean(np.square(err), axis=axis))


def bootstrap(model: np.ndarray, base: np.ndarray, t: Targets) -> dict[str, list[float]]:
    """Percentile intervals over workloads resampled with replacement (seeded): the model's
    RMSE, the baseline's, and the model's gain over it (1 - model / baseline)."""
    rng = np.random.default_rng(t.seed)
    idx = rng.integers(0, len(model), size=(t.bootstrap, len(model)))
    m, b = _rmse(model[idx], axis=1), _rmse(base[idx], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(b > 0, 1.0 - m / b, np.nan)
    q = 50.0 * (1.0 - t.bootstrap_confidence), 50.0 * (1.0 + t.bootstrap_confidence)

    def interval(x: np.ndarray) -> list[float]:
        x = x[np.isfinite(x)]
        return [float(v) for v in np.percentile(x, q)] if len(x) else [float("nan")] * 2

    return {"rmse_points": interval(m), "baseline_rmse_points": interval(b), "gain": interval(gain)}


def check(
    name: str, value: float | None, target: str, passed: bool | None, unit: str = "", **more
) -> dict:
    """One target's verdict; ``unit`` "share" prints as a percentage, else as a number."""
    return {"target": name, "value": value, "wants": target, "passed": passed, "unit": unit, **more}


def abs_stat(values: list[float | None], how) -> float | None:
    got = [abs(v) for v in values if v is not None]
    return float(how(got)) if got else None


def speedup_checks(workloads: list[Workload], base: dict[str, Any], t: Targets) -> list[dict]:
    err = np.array([w.errors()["speedup_points"] for w in workloads], float)  # None: nan
    means = np.array([w.mean for w in workloads], float)
    base_err = 100.0 * (np.array(base["per_workload"], float) - means)
    keep = np.isfinite(err) & np.isfinite(base_err)  # a prediction and a baseline to judge
    err, base_err = err[keep], base_err[keep]
    if not len(err):
        return [check("async speedup RMSE", None, f"<= {t.speedup_rmse_points:g} points", None)]
    rmse, base_rmse = float(_rmse(err)), float(_rmse(base_err))
    gain = 1.0 - rmse / base_rmse if base_rmse > 0 else None
    ci = bootstrap(err, base_err, t)
    return [
        check(
            "async speedup RMSE vs workload means (points)",
            rmse,
            f"<= {t.speedup_rmse_points:g}",
            rmse <= t.speedup_rmse_points,
            interval=ci["rmse_points"],
        ),
        check(
            f"RMSE below the constant baseline's ({base_rmse:.2f} points)",
            gain,
            f">= {t.speedup_rmse_gain:.0%}",
            gain is not None and gain >= t.speedup_rmse_gain,
            "share",
            interval=ci["gain"],
            baseline_rmse_points=base_rmse,
            baseline_interval=ci["baseline_rmse_points"],
        ),
    ]


def time_checks(workloads: list[Workload], t: Targets) -> list[dict]:
    errs = [w.errors() for w in workloads]
    a = [e["async_total_pct"] for e in errs]
    s = [e["sync_total_pct"] for e in errs]
    i = [e["sync_idle_pp"] for e in errs]
    rows = (
        ("async total median |error| (%)", abs_stat(a, np.median), t.async_total_median_pct),
        ("async total max |error| (%)", abs_stat(a, np.max), t.async_total_max_pct),
        ("sync total median |error| (%)", abs_stat(s, np.median), t.sync_total_median_pct),
        ("sync GPU idle median |error| (pp)", abs_stat(i, np.median), t.sync_idle_median_pp),
    )
    return [check(n, v, f"<= {lim:g}", None if v is None else v <= lim) for n, v, lim in rows]


# what a profile is to the recordings it is judged on (profile_scope): its own GPU's,
# another GPU's (that GPU's kernel tables), or the datasheet tier (nobody profiled the GPU)
SCOPES = ("own", "other_gpu", "datasheet")


def profile_scope(tier: str, device_name: str, devices: list[str | None]) -> str:
    """What a profile (its ``hardware.tier`` and ``device_name``) is to recordings made on
    ``devices`` (recorded_device of each; None: not known): the datasheet tier whatever they
    ran on; another GPU's where every known device is a GPU the profile does not name."""
    if tier == "datasheet":
        return "datasheet"
    known = [d for d in devices if d]
    gpus = [d for d in known if not d.startswith("CPU ")]
    if gpus and len(gpus) == len(known) and not any(device_matches(device_name, d) for d in gpus):
        return "other_gpu"
    return "own"


def scope_checks(workloads: list[Workload], t: Targets, scope: str) -> list[dict]:
    """Across GPUs and for the datasheet tier the issue asks every total within a bound: the
    largest |error| of any workload's async or sync total against its mean."""
    if scope == "own":
        return []
    if scope not in SCOPES:
        raise ValueError(f"scope={scope!r}; allowed: {', '.join(SCOPES)}")
    errs = [w.errors() for w in workloads]
    worst = abs_stat([e[k] for e in errs for k in ("async_total_pct", "sync_total_pct")], np.max)
    lim = t.datasheet_total_max_pct if scope == "datasheet" else t.other_gpu_total_max_pct
    what = "a datasheet profile" if scope == "datasheet" else "another GPU's profile"
    name = f"every total, {what} (max |error|, async and sync, %)"
    return [check(name, worst, f"<= {lim:g}", None if worst is None else worst <= lim)]


def band_checks(workloads: list[Workload], t: Targets) -> list[dict]:
    """Coverage over every recording, the bands' median half-width, and how often the band
    alone decides whether async pays."""
    banded = [w for w in workloads if w.band is not None]
    if not banded:
        return [check("P5-P95 bands", None, "drawn (extra.bands=true)", None)]
    inside = [lo <= x <= hi for w in banded for x in w.recorded for lo, hi in [w.band]]
    n, cov = len(inside), float(np.mean(inside))
    lo_k, hi_k = binomial_interval(t.coverage_confidence, n, t.coverage_nominal)
    lo_c, hi_c = float(lo_k) / n, float(hi_k) / n
    half = float(np.median([50.0 * (w.band[1] - w.band[0]) for w in banded]))
    decided = [w for w in banded if w.band[0] >= t.pays_at or w.band[1] < t.pays_at]
    wrong = [w for w in decided if (w.band[0] >= t.pays_at) != (w.mean >= t.pays_at)]
    share = len(decided) / len(banded)
    wrong_share = len(wrong) / len(decided) if decided else 0.0
    pays = f"async pays >= {100 * (t.pays_at - 1):g}%"
    return [
        check(
            f"recordings inside P5-P95 ({sum(inside)} of {n})",
            cov,
            f"in [{lo_c:.0%}, {hi_c:.0%}]",
            lo_c <= cov <= hi_c,
            "share",
            interval=[lo_c, hi_c],
        ),
        check(
            "median speedup band half-width (points)",
            half,
            f"<= {t.band_half_width_points:g}",
            half <= t.band_half_width_points,
        ),
        check(
            f"band alone decides '{pays}' (share of workloads)",
            share,
            f">= {t.decided_share:.0%}",
            share >= t.decided_share,
            "share",
        ),
        check(
            f"decisions contradicted by the mean ({len(wrong)} of {len(decided)})",
            wrong_share,
            f"<= {t.wrong_share:.0%}",
            wrong_share <= t.wrong_share,
            "share",
        ),
    ]


def workload_row(w: Workload, guess: float, t: Targets, z: float | None) -> dict[str, Any]:
    band = w.band
    decision = None
    if band is not None:
        decision = "pays" if band[0] >= t.pays_at else ("no" if band[1] < t.pays_at else "?")
    return {
        "workload": w.name,
        "model": w.model,
        "batch_size": w.batch_size,
        "predicted": w.predicted,
        "band": list(band) if band else None,
        "recorded_mean": w.mean,
        "recorded_std": w.std,
        "n": w.n,
        "recorded": w.recorded.tolist(),
        "baseline": guess,
        "band_decides": decision,
        "calls": sorted({p.sync.rec.call for p in w.pairs}),
        **w.errors(),
        "speedup_z": z,  # the miss over its mean's own error (std / sqrt(n))
    }


def judge(
    pairs: list[Speedup], t: Targets, source: str = "", scope: str = "own"
) -> dict[str, Any] | None:
    """The judged summary of a validation (validation.json's ``judged``): per workload the
    prediction against the mean of its repeats, the constant baseline beside it, and each
    target with its value and whether it passed (with ``scope``'s bound on every total, for
    another GPU's or a datasheet profile); None without a held-out workload."""
    workloads = group(pairs)
    if not workloads:
        return None
    calibration = [p.recorded for p in pairs if not p.held_out and p.recorded is not None]
    base = baseline(workloads, calibration, t.baseline)
    checks = [
        *speedup_checks(workloads, base, t),
        *time_checks(workloads, t),
        *scope_checks(workloads, t, scope),
        *band_checks(workloads, t),
    ]
    stds = [w.std for w in workloads if w.std is not None]
    errs = [w.errors()["speedup_points"] for w in workloads]
    noise = means_noise(errs, [w.std for w in workloads], [w.n for w in workloads])
    judged = [c["passed"] for c in checks if c["passed"] is not None]
    rows = zip(workloads, base["per_workload"], noise["z"])
    return {
        "workloads": [workload_row(w, g, t, z) for w, g, z in rows],
        "baseline": {k: v for k, v in base.items() if k != "per_workload"},
        # the noise floor: the repeats' pooled std (points), where there are repeats
        "repeat_std_points": 100.0 * float(np.sqrt(np.mean(np.square(stds)))) if stds else None,
        # the means' own error: the RMSE a predictor of each workload's true mean would expect
        # against means of this many repeats, and the misses' chi-square against it
        "means_noise_rmse_points": noise["rmse_points"],
        "means_chi2": {k: noise[k] for k in ("chi2", "dof", "p")},
        "scope": scope,
        "checks": checks,
        "passed": bool(judged) and all(judged),
        "targets": {**dataclasses.asdict(t), "source": source},
    }
