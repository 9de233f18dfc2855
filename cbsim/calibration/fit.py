"""Least squares that a performance engineer can trust: identifiable terms are fitted, the rest
keep their prior (the base profile's value) and say so.

Two tools, both numpy only:

- ``linear_fit``: y = X @ b with b >= 0, where a column that the data cannot tell apart from the
  columns before it (exactly or nearly collinear, or too small to matter) keeps its prior value
  and only the others are fitted, to y minus the kept terms;
- ``curve_fit``: a bounded Levenberg-Marquardt on a black-box model (the simulator's own cost
  model), with the same rule for parameters the data does not constrain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# a column whose part not explained by the columns before it is below this share of its norm
# carries no information of its own
COLLINEAR_TOL = 1e-4
# weight of the pull towards the start values in curve_fit, relative to each parameter's own
# sensitivity: a bias of about RIDGE**2 on what the data determines
RIDGE = 1e-4
RIDGE_COLLINEAR = 0.03
# curve_fit stops when this many iterations in a row lowered the best cost by less than this share:
# a roofline assignment flipping back and forth at the optimum moves theta without gaining
STALL_ITERS, STALL_GAIN = 3, 1e-9


@dataclass
class Fit:
    """Fitted values by name, which of them were fitted (vs kept), and the relative residuals."""

    values: dict[str, float]
    fitted: dict[str, bool]
    residuals: np.ndarray  # (predicted - observed) / observed, per sample

    @property
    def rms_pct(self) -> float:
        r = self.residuals
        return float(np.sqrt(np.mean(r**2)) * 100) if len(r) else float("nan")

    @property
    def max_pct(self) -> float:
        return float(np.max(np.abs(self.residuals)) * 100) if len(self.residuals) else float("nan")


def weights(y: np.ndarray) -> np.ndarray:
    """1/y for relative residuals, with y floored at a tenth of the typical value (a copy timed
    at 0 us would otherwise weigh without bound)."""
    y = np.abs(np.asarray(y, float))
    floor = max(0.1 * float(np.median(y)) if len(y) else 0.0, 1e-9)
    return 1.0 / np.maximum(y, floor)


def independent_columns(X: np.ndarray, tol: float = COLLINEAR_TOL) -> list[int]:
    """Greedy, in column order: keep a column if it is not (nearly) in the span of those kept."""
    keep: list[int] = []
    for j in range(X.shape[1]):
        col = X[:, j]
        norm = np.linalg.norm(col)
        if norm == 0 or not np.isfinite(norm):
            continue
        if keep:
            basis = X[:, keep]
            coef, *_ = np.linalg.lstsq(basis, col, rcond=None)
            rest = np.linalg.norm(col - basis @ coef)
        else:
            rest = norm
        if rest > tol * norm:
            keep.append(j)
    return keep


def nnls(A: np.ndarray, b: np.ndarray, iters: int = 200) -> np.ndarray:
    """Non-negative least squares (Lawson-Hanson active set), small problems only."""
    n = A.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = A.T @ (b - A @ x)
    for _ in range(iters):
        if passive.all() or w[~passive].max(initial=0) <= 1e-12 * max(1.0, np.abs(w).max()):
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            bad = passive & (z <= 0)
            alpha = np.min(x[bad] / (x[bad] - z[bad]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
        w = A.T @ (b - A @ x)
    return x


def linear_fit(
    X: np.ndarray,
    y: np.ndarray,
    names: Sequence[str],
    prior: Sequence[float],
    min_share: float = 1e-3,
) -> Fit:
    """Fit y ~ X @ b, b >= 0, by relative least squares (each sample weighted by 1/y).

    Columns are taken in the given order (put the best-determined term first, e.g. the fixed
    cost); a column that is collinear with earlier ones, or whose contribution at the prior is
    below ``min_share`` of y, keeps its prior value.
    """
    X, y = np.asarray(X, float), np.asarray(y, float)
    prior = np.asarray(prior, float)
    w = weights(y)
    Xw = X * w[:, None]
    scale = np.linalg.norm(Xw, axis=0)
    # a term too small to see at its prior value (e.g. a bandwidth term of tiny copies) is kept;
    # an all-zero prior (a term the base profile says nothing about) is judged by the data alone
    visible = [
        j
        for j in range(X.shape[1])
        if scale[j] > 0 and (prior[j] == 0 or np.max(np.abs(X[:, j] * prior[j] * w)) >= min_share)
    ]
    cols = [visible[k] for k in independent_columns(Xw[:, visible] / scale[visible])]
    b = _solve(X, Xw, y, w, prior, cols)
    res = (X @ b - y) * w
    fitted = list(cols)
    if np.median(res) > 0.05:
        # the kept terms alone overshoot the spans (a base per-request cost above what a run of
        # one batch size takes in all): the data bound them, to zero, and the rest is refitted
        zeroed = [j for j in range(len(prior)) if j not in cols and prior[j] != 0]
        prior = np.where(np.isin(np.arange(len(prior)), zeroed), 0.0, prior)
        b = _solve(X, Xw, y, w, prior, cols)
        res = (X @ b - y) * w
        fitted += zeroed
    return Fit(
        {n: float(v) for n, v in zip(names, b)}, {n: j in fitted for j, n in enumerate(names)}, res
    )


def _solve(X, Xw, y, w, prior, cols) -> np.ndarray:
    """The prior, with the ``cols`` entries fitted (non-negative) to what the others leave."""
    b = prior.copy()
    kept = [j for j in range(X.shape[1]) if j not in cols]
    target = y - X[:, kept] @ prior[kept]
    if cols:
        b[cols] = nnls(Xw[:, cols], target * w)
    return b


def curve_fit(
    model: Callable[[np.ndarray], np.ndarray],
    y: np.ndarray,
    theta0: Sequence[float],
    names: Sequence[str],
    lower: Sequence[float],
    upper: Sequence[float],
    iters: int = 40,
    rel_step: float = 1e-6,
    anchored: Sequence[str] = (),
    prior: Sequence[float] | None = None,
) -> Fit:
    """Bounded Gauss-Newton on relative residuals (model(theta) - y) / y.

    Made for piecewise-linear models such as a sum of rooflines: within one assignment of
    rooflines to their bound (compute or memory) the model is linear, so each step solves the
    linearised problem exactly (bounded least squares) and the loop ends when no roofline
    changes side (or stops gaining, ``STALL_ITERS``). The Jacobian is by finite differences.
    Every parameter is free; a ridge towards the start values keeps those the data cannot tell
    apart where they were (faint, ``RIDGE``,
    for terms independent of the earlier ones; firmer, ``RIDGE_COLLINEAR``, for a term collinear
    with earlier ones), and the bounds may still determine a collinear one (a per-token term
    beside a fixed cost held at 0). Reported as fitted: independent of the others in some
    iteration, or moved by more than 1%; a term held between equal bounds never is.
    """
    y = np.asarray(y, float)
    w = weights(y)
    theta = np.asarray(theta0, float).copy()
    lo, hi = np.asarray(lower, float), np.asarray(upper, float)

    # what the ridge pulls towards: the prior when given (a fit restarted from elsewhere keeps
    # the prior's value for what the data leaves open, not its own start's)
    start = np.asarray(prior, float).copy() if prior is not None else theta.copy()
    m = model(theta)
    best = (float(np.sum(((m - y) * w) ** 2)), theta.copy(), m)
    seen: set[int] = set()  # determined by the data in some iteration
    stalled = 0  # iterations in a row that did not lower the best cost
    for _ in range(iters):
        J = _jacobian(model, theta, m, hi, rel_step)
        new, indep = _ridge_step(J, w, y, m, theta, start, names, anchored, lo, hi)
        seen.update(indep)
        m_new = model(new)
        cost = float(np.sum(((m_new - y) * w) ** 2))
        stalled = stalled + 1 if cost >= best[0] * (1 - STALL_GAIN) else 0
        if cost < best[0]:
            best = (cost, new.copy(), m_new)
        moved = np.max(np.abs(new - theta) / np.maximum(np.abs(theta), 1e-9))
        theta, m = new, m_new
        if moved < 1e-10 or stalled >= STALL_ITERS:
            break
    _, theta, m = best
    moved = np.abs(theta - start) > 0.01 * np.maximum(np.abs(start), 1e-3)
    return Fit(
        {n: float(v) for n, v in zip(names, theta)},
        {n: bool((j in seen or moved[j]) and lo[j] < hi[j]) for j, n in enumerate(names)},
        (m - y) * w,
    )


def _jacobian(model, t: np.ndarray, m0: np.ndarray, hi: np.ndarray, rel_step: float) -> np.ndarray:
    """Forward differences (backward where the step would cross the upper bound)."""
    J = np.empty((len(m0), len(t)))
    for j in range(len(t)):
        h = rel_step * max(abs(t[j]), 1.0)
        tj = t.copy()
        tj[j] = t[j] + h if t[j] + h <= hi[j] else t[j] - h
        J[:, j] = (model(tj) - m0) / (tj[j] - t[j])
    return J


def _ridge_step(J, w, y, m, theta, start, names, anchored, lo, hi) -> tuple[np.ndarray, set[int]]:
    """One bounded Gauss-Newton step with the pull towards ``start``; returns the new theta and
    which parameters the data determined in it."""
    Jw = J * w[:, None]
    norms = np.linalg.norm(Jw, axis=0)
    active = [j for j in range(len(theta)) if norms[j] > 0]
    indep = {active[k] for k in independent_columns(Jw[:, active] / norms[active])}
    # a pull towards the start value settles what the data leaves open: faint for the terms the
    # data determines, firmer for one collinear with earlier terms (it keeps its value unless a
    # bound on the others makes the data need it)
    ridge = np.where(np.isin(np.arange(len(theta)), list(indep)), RIDGE, RIDGE_COLLINEAR)
    # ``anchored`` terms are pulled back firmly throughout (a way into a basin near the start;
    # forward.best_of_starts refits from there without it)
    ridge = np.where(np.isin(np.asarray(names), list(anchored)), RIDGE_COLLINEAR, ridge)
    A = np.vstack([Jw, np.diag(ridge * norms)])
    b = np.concatenate([(y - m + J @ theta) * w, ridge * norms * start])
    return _bounded_lstsq(A, b, theta, active, lo, hi), indep


def _bounded_lstsq(
    A: np.ndarray, b: np.ndarray, theta: np.ndarray, free: list[int], lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """min |A x - b| over the free entries of x within [lo, hi]; the others stay as in theta.
    Non-negative least squares on x - lo; an entry that lands above hi is pinned there and the
    rest solved again."""
    x = theta.copy()
    free = list(free)
    while free:
        fixed = [j for j in range(len(x)) if j not in free]
        rhs = b - A[:, fixed] @ x[fixed] - A[:, free] @ lo[free]
        x[free] = lo[free] + nnls(A[:, free], rhs)
        over = [j for j in free if x[j] > hi[j]]
        if not over:
            break
        for j in over:
            x[j] = hi[j]
            free.remove(j)
    return x
