"""Which part of the async loop lengthens a small model's decode forward: the streams, the
carry-over's kernels, or the overlap itself.

    python experiments/runtime/diag_engine_factors.py OUTDIR SPEC [SPEC ...]

SPEC is bench_decode.py's MODEL:BATCH:PROMPT:GEN. h200_run15-18 recorded the sync loop's decode
forward 3-13% shorter than the async loop's on the 1B at 8-32 requests (under torch.profiler the
two took the same time, h200_run18/diag_engines). The product ties the factors together: sync
runs on one stream without the carry-over, async on three streams with it. Here each is set on
its own, through `cbsim.runtime.engine.execute` (the loop, recorder and runner the CLI runs), its
`build` given the two flags explicitly:

    loop   streams  carry-over
    sync   one      off          the product's sync
    sync   three    off          the streams alone
    sync   one      on           the carry-over's kernels alone (no tokens to carry: all -1)
    async  one      on           the overlap without the streams
    async  three    on           the product's async

Each variant runs REPEAT times, interleaved. Per run: the median decode forward (compute-lane
span, after the first SKIP decode steps) and the run's decode step. Writes
OUTDIR/diag_engine_factors.json and prints a table.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_anchor import make_config  # noqa: E402
from bench_decode import case_overrides  # noqa: E402

SKIP = 16
REPEAT = 2
VARIANTS = (  # (name, loop, three streams, carry-over)
    ("sync", "sync", False, False),
    ("sync+streams", "sync", True, False),
    ("sync+carry", "sync", False, True),
    ("async-streams", "async", False, True),
    ("async", "async", True, True),
)


def forward_figures(trace) -> dict:
    """The median and mean decode forward after the first SKIP steps, and the decode step."""
    from cbsim.validation.measure import decode_time_s

    sp = trace.spans
    fwd = sp[(sp.lane == "compute") & (sp.kind == "decode")].sort_values("ts")
    durs = fwd.dur.to_numpy()[SKIP:]
    return {
        "fwd_us": float(np.median(durs)),
        "fwd_mean_us": float(durs.mean()),
        "decode_step_us": 1e6 * (decode_time_s(trace) or 0.0) / max(1, fwd.step.nunique()),
    }


def measure(spec: str, loop: str, three: bool, carry: bool, model) -> dict:
    from cbsim.runtime import engine

    config = make_config(case_overrides(spec, loop))
    original = engine.build
    engine.build = functools.partial(original, three_streams=three, carry_over=carry)
    try:
        trace = engine.execute(config, loop, model=model).trace
    finally:
        engine.build = original
    return forward_figures(trace)


def main(argv: list[str]) -> None:
    import torch

    from cbsim.runtime.runner import runtime_model

    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"device": torch.cuda.get_device_name(), "skip": SKIP, "cases": {}}
    for spec in argv[1:]:
        config = make_config(case_overrides(spec, "sync"))
        model = runtime_model(config, torch.device("cuda"), None)  # fused, as the CLI's
        rows: dict[str, list[dict]] = {name: [] for name, *_ in VARIANTS}
        for _ in range(REPEAT):
            for name, loop, three, carry in VARIANTS:
                rows[name].append(measure(spec, loop, three, carry, model))
        result["cases"][spec] = rows
        del model
        torch.cuda.empty_cache()
    (out / "diag_engine_factors.json").write_text(json.dumps(result, indent=1))
    print(f"{'case':<24}{'variant':<16}{'fwd us (median, per run)':>30}{'step us':>18}")
    for spec, rows in result["cases"].items():
        for name, runs in rows.items():
            fwd = " / ".join(f"{r['fwd_us']:.0f}" for r in runs)
            step = " / ".join(f"{r['decode_step_us']:.0f}" for r in runs)
            print(f"{spec:<24}{name:<16}{fwd:>30}{step:>18}")


if __name__ == "__main__":
    main(sys.argv[1:])
