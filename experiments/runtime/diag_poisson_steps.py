"""Where the simulator's online (Poisson) runs go wrong, step by step, in recorded traces.

Two tables, each row a trace:

- mixed: the eager steps with prompt tokens. Their host `launch` span (the host launching every
  kernel of the forward through transformers' layers), its microseconds per kernel (the cost
  model's kernel count), and the share of the run those launches take; the forward as the
  events timed it.
- decode: the graph-replayed decode steps past the run's first tenth, recorded over the cost
  model's forward with the given profile (`hardware=`), split by how uneven the batch's contexts
  are (longest over mean) and by the decode launch's programs (padded rows x kv heads x
  splits: at most 256 run in one wave on the H200's 132 SMs).

    python experiments/runtime/diag_poisson_steps.py 'h200_run2[123]/*/*poisson*/trace_*.json.gz'
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np
import pandas as pd

from cbsim.api import compose
from cbsim.calibration.recordings import load, recordings_root, resolve_traces
from cbsim.calibration.steps import StepShape
from cbsim.costs.model import CostModel
from cbsim.trace import schema as S

ONE_WAVE = 256  # the decode launch rule's target: two programs per SM of the H200's 132


def mixed_row(rec, cm: CostModel) -> dict:
    """The eager steps with prompt tokens: host launch against the forward."""
    sp, fwd = rec.spans, rec.forward
    mixed = fwd[fwd.kind != "decode"].set_index("step")
    host = sp[(sp.lane == S.HOST) & (sp.name == S.LAUNCH)].set_index("step")
    launch = host.dur.reindex(mixed.index).dropna()
    kernels = [
        cm.step_kernels(_shape(rec, int(s), r), False)
        for s, r in mixed.loc[launch.index].iterrows()
    ]
    run = sp.end.max() - sp.ts.min()
    return {
        "mixed": len(launch),
        "launch_ms": launch.median() / 1e3,
        "us_per_kernel": float(np.median(launch.to_numpy() / np.asarray(kernels))),
        "launch_share": launch.sum() / run,
        "forward_ms": mixed.dur.median() / 1e3,
    }


def _shape(rec, step: int, r) -> StepShape:
    lens = rec.batches.get(step)
    n, q, kv = int(r.requests), int(r.query_tokens), int(r.kv_tokens)
    return StepShape(n, q, kv, int(r.new_tokens), r.kind, lens)


def decode_row(rec, cm: CostModel) -> dict:
    """Recorded over predicted decode forwards, by context skew and launch wave."""
    fwd = rec.forward
    dec = fwd[(fwd.kind == "decode") & fwd.graph]
    dec = dec.iloc[len(dec) // 10 :]
    rows = []
    for r in dec.itertuples():
        lens = rec.batches.get(int(r.step))
        if lens is None:
            continue
        q, ctx = lens
        pad = cm.graph_size(len(q))
        shape = _shape(rec, int(r.step), r)
        pred = cm.forward(shape, graph=True, carry_over=bool(r.carry), padded_requests=pad)
        width = cm.graph_table(pad, int(ctx.max()))
        splits = -(-width // cm.partition(pad, width))
        rows.append((ctx.max() / ctx.mean(), pad * cm.kv_heads * splits, r.dur / pred.total_us))
    d = pd.DataFrame(rows, columns=["uneven_by", "programs", "ratio"])
    even, uneven = d[d.uneven_by <= 1.05], d[d.uneven_by > 1.3]
    return {
        "decode": len(d),
        "max/mean": d.uneven_by.median(),
        "programs": int(d.programs.median()),
        "one_wave": float((d.programs <= ONE_WAVE).mean()),
        "even": even.ratio.median() if len(even) else np.nan,
        "uneven": uneven.ratio.median() if len(uneven) else np.nan,
        "all": d.ratio.median(),
    }


def uneven_terms(rec, hw) -> tuple[float, float]:
    """(recorded - even, longest - even) summed over the run's uneven one-wave decode graph
    steps past its first tenth: the forward at its mean context and at its longest (the cost
    model with hardware.gpu.decode_uneven_share 0 and 1, decode_wave_programs ONE_WAVE)."""
    models = []
    for share in (0.0, 1.0):
        gpu = dataclasses.replace(hw.gpu, decode_wave_programs=ONE_WAVE, decode_uneven_share=share)
        cfg = dataclasses.replace(rec.config, hardware=dataclasses.replace(hw, gpu=gpu))
        models.append(CostModel(cfg))
    fwd = rec.forward
    dec = fwd[(fwd.kind == "decode") & fwd.graph]
    num = den = 0.0
    for r in dec.iloc[len(dec) // 10 :].itertuples():
        lens = rec.batches.get(int(r.step))
        if lens is None or lens[1].max() <= 1.05 * lens[1].mean():
            continue
        q, ctx = lens
        pad = models[0].graph_size(len(q))
        shape = _shape(rec, int(r.step), r)
        even, longest = (
            m.forward(shape, graph=True, carry_over=bool(r.carry), padded_requests=pad).total_us
            for m in models
        )
        if longest > even:  # a one-wave launch
            num, den = num + r.dur - even, den + longest - even
    return num, den


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", help="paths or globs under the recordings directory")
    ap.add_argument("--hardware", default="h200", help="the profile the steps are costed with")
    ap.add_argument(
        "--fit-uneven",
        action="store_true",
        help="print hardware.gpu.decode_uneven_share measured over the traces' async runs",
    )
    args = ap.parse_args(argv)
    root = recordings_root()
    hw = compose(f"hardware={args.hardware}").hardware
    recs = load(resolve_traces(args.traces, root), root)
    if args.fit_uneven:
        terms = [uneven_terms(r, hw) for r in recs if r.engine == "async"]
        num, den = (sum(t[i] for t in terms) for i in (0, 1))
        print(f"decode_uneven_share: {num / den:.3f} ({len(terms)} async runs)")
        return
    mixed, decode = [], []
    for rec in recs:
        cm = CostModel(dataclasses.replace(rec.config, hardware=hw))
        name = {"trace": rec.name.removeprefix("h200_"), "engine": rec.engine}
        if (rec.forward.kind != "decode").any():
            mixed.append(name | mixed_row(rec, cm))
        if rec.engine == "async":
            decode.append(name | decode_row(rec, cm))
    pd.set_option("display.width", 200)
    print(f"mixed steps (host launch of the eager forward), hardware={args.hardware}:")
    print(pd.DataFrame(mixed).round(3).to_string(index=False))
    print("\ndecode graph steps, recorded / predicted forward (async runs):")
    print(pd.DataFrame(decode).round(3).to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1:])
