"""The judged validation as text: the lead table (predicted, band, recorded mean +- std, the
constant baseline) and one line per target, with the noise the means carry beside them; the
console and the HTML report print these."""

from __future__ import annotations

from typing import Any


def _x(value: float | None) -> str:
    return f"x{value:.3f}" if value is not None else "-"


def judged_table(j: dict[str, Any]) -> str:
    """The lead table: per workload the predicted speedup and band, the recorded mean +- std
    (n), the miss over the mean's own error, and the constant baseline beside them."""
    head = (
        f"{'workload':<28}{'predicted':>10}{'P5-P95':>16}{'recorded mean +- std (n)':>27}"
        f"{'points':>8}{'z':>7}{'baseline':>10}"
    )
    lines = [head]
    for r in j["workloads"]:
        band = f"x{r['band'][0]:.3f}-x{r['band'][1]:.3f}" if r["band"] else "-"
        std = f"{100 * r['recorded_std']:.2f}" if r["recorded_std"] is not None else "-"
        rec = f"{_x(r['recorded_mean'])} +- {std} ({r['n']})"
        pts = r["speedup_points"]
        pts = f"{pts:+.2f}" if pts is not None else "-"
        z = r.get("speedup_z")
        z = f"{z:+.1f}" if z is not None else "-"
        lines.append(
            f"{r['workload'][:27]:<28}{_x(r['predicted']):>10}{band:>16}{rec:>27}{pts:>8}"
            f"{z:>7}{_x(r['baseline']):>10}"
        )
    lines.append(
        "std in points; points: 100 x (predicted - recorded mean); z: points over the mean's "
        f"own error (std / sqrt(n)); baseline: {j['baseline']['label']}"
    )
    return "\n".join(lines)


def _value(v: Any, unit: str) -> str:
    if v is None:
        return "-"
    return f"{v:.0%}" if unit == "share" else f"{v:.2f}"


def check_lines(j: dict[str, Any]) -> list[str]:
    """One line per target: value, what it wants, its interval where it has one, verdict."""
    out = [f"targets ({j['targets']['source']}):"]
    for c in j["checks"]:
        verdict = {True: "pass", False: "FAIL", None: "not judged"}[c["passed"]]
        ci, conf, u = c.get("interval"), 100 * j["targets"]["bootstrap_confidence"], c["unit"]
        ci = (
            f"; bootstrap {conf:.0f}%: {_value(ci[0], u)}..{_value(ci[1], u)}"
            if "RMSE" in c["target"] and ci
            else ""
        )
        out.append(
            f"  {verdict:<10} {c['target']}: {_value(c['value'], u)} (wants {c['wants']}){ci}"
        )
    floor = j.get("repeat_std_points")
    if floor is not None:
        out.append(f"  noise floor: the repeats' pooled speedup std {floor:.2f} points")
    means = j.get("means_noise_rmse_points")
    if means is not None:
        out.append(
            "  the means' own error: a predictor of each workload's true mean would score "
            f"RMSE {means:.2f} points against these means"
        )
    chi = j.get("means_chi2") or {}
    if chi.get("chi2") is not None:
        out.append(
            f"  the misses over the means' own errors: chi-square {chi['chi2']:.1f} on "
            f"{chi['dof']} workloads, p = {chi['p']:.2g} (small: larger than the means' noise)"
        )
    return out
