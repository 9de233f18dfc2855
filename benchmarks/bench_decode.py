"""The runtime's decode step against the HBM floor, with its host work per phase and the
transformers continuous-batching anchor, in one process; prints ONE table.

    PYTHONUNBUFFERED=1 python3 benchmarks/bench_decode.py [--cases MODEL:BATCH:PROMPT:GEN,...]
        [--engines sync,async] [--anchor MODEL:BATCH:PROMPT:HF_GEN | none] [--set KEY=VALUE]
        [--deadline-s S] [--out FILE.json]

(a smoke test on a CPU: --cases tiny:2:8:6 --engines sync --anchor none --set mode.device=cpu)

Each case runs through `cbsim.runtime.run`, the function `python -m cbsim mode=runtime` calls
(its own model build, warm-up, collector handling: nothing harness-only), and is measured from
its trace: ms per step (wall / steps), the decode step (the mean interval between decode
forward ends: no prefill), the decode forward's mean, the floor of those forwards
((weights read + live KV) at the copy rate the run measured at its start, otherData.hardware,
else `--copy-tbps`), the share of it reached, GPU
idle, the median host microseconds per phase over decode steps, the longest compute-lane gap
after warm-up, and host stalls (cbsim.metrics). The anchor is transformers' own
`generate_batch` (`paged|sdpa`, CUDA graphs, sync) on the same model shape and prompts.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
from bench_anchor import make_config, run_transformers  # beside this script (sys.path[0])

# a run that measured no copy rate (an imported or CPU trace): the H200's device-to-device copy
# bandwidth (BRIEF)
COPY_TBPS = 4.27
DEFAULT_CASES = (
    "llama3_8b:32:256:1024,llama3_8b:4:256:512,llama3_8b:16:2048:256,"
    "llama3_1b:128:256:512,llama3_3b:64:512:256"
)
PHASES = ("schedule", "prepare", "launch", "update")


def case_overrides(spec: str, engine: str) -> list[str]:
    model, batch, prompt, gen = spec.split(":")
    return [
        "mode=runtime",
        f"engine={engine}",
        f"model={model}",
        f"workload.batch_size={batch}",
        f"workload.prompt_len={prompt}",
        f"workload.gen_len={gen}",
    ]


def weights_read_bytes(model) -> int:
    """Bytes a decode step must read: every weight but the embedding table, of which only the
    batch's rows are read (a tied table is read whole as the LM head)."""
    emb = 0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size
    return model.weight_bytes - emb * model.dtype_bytes


def copy_rate(other: dict, copy_tbps: float) -> tuple[float, str]:
    """(bytes/s, basis): the run's measured copy rate, else --copy-tbps."""
    from cbsim.trace.hardware import hardware_of, measured_copy_rate

    measured = measured_copy_rate(hardware_of(other))
    if measured is not None:
        return measured[0], f"measured ({measured[1]})"
    return copy_tbps * 1e12, "--copy-tbps"


def measure(spec: str, engine: str, copy_tbps: float, extra: list[str]) -> dict:
    from cbsim.metrics import compute_metrics
    from cbsim.runtime import run
    from cbsim.validation.measure import decode_time_s

    config = make_config(case_overrides(spec, engine) + extra)
    trace = run(config, engine)
    m = compute_metrics(trace)
    sp = trace.spans
    fwd = sp[(sp.lane == "compute") & (sp.kind == "decode")]
    kvb = config.model.kv_bytes_per_token
    rate, basis = copy_rate(trace.other_data, copy_tbps)
    floor_ms = (weights_read_bytes(config.model) + fwd.kv_tokens * kvb) / (rate / 1e3)
    host = sp[(sp.lane == "host") & (sp.kind == "decode")]
    comp = sp[sp.lane == "compute"].sort_values("ts")
    gaps = (comp.ts.to_numpy()[1:] - (comp.ts + comp.dur).to_numpy()[:-1]) / 1e3
    counters = trace.other_data["counters"]
    return {
        "case": spec,
        "engine": engine,
        "copy_tbps": rate / 1e12,
        "copy_basis": basis,
        "total_s": m["total_time_s"],
        "ms_per_step": m["step_time_ms_mean"],
        # the decode steps alone (between consecutive forward ends), without the prefill's
        "decode_step_ms": 1e3 * (decode_time_s(trace) or 0.0) / max(1, fwd.step.nunique()),
        "decode_fwd_ms": float(fwd.dur.mean() / 1e3),
        "floor_ms": float(floor_ms.mean()),
        "floor_share": float(floor_ms.sum() / (fwd.dur.sum() / 1e3)),
        "gpu_idle": m["gpu_idle_fraction"],
        "host_us": {p: float(host[host.name == p].dur.median()) for p in PHASES},
        "max_gap_ms": float(gaps[5:].max()) if len(gaps) > 5 else 0.0,
        "host_stalls": m.get("host_stalls"),
        "setup_s": counters["setup_s"],
        "gc_collections_in_loop": counters.get("gc_collections_in_loop"),
        "tokens": counters["generated_tokens"],
    }


def anchor(spec: str) -> dict:
    """transformers' own continuous batching, sync, on the spec's shape and prompts."""
    import torch

    from cbsim.runtime.model import build_model
    from cbsim.workload import make_requests

    model_name, batch, prompt, gen = spec.split(":")
    config = make_config(case_overrides(f"{model_name}:{batch}:{prompt}:{gen}", "sync"))
    model = build_model(config.model, torch.device("cuda"), seed=config.workload.seed)
    reqs = make_requests(config.workload, config.model.vocab_size)
    prompts = [list(map(int, r.prompt_ids)) for r in reqs]
    row = run_transformers(model, prompts, int(gen), use_async=False)
    row.pop("outputs", None)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return {"case": spec, **row}


def table(rows: list[dict], anchors: list[dict], device: str) -> str:
    head = (
        f"{'model:batch:prompt:gen':<26}{'engine':<7}{'total s':>8}{'ms/step':>9}{'decode':>8}"
        f"{'fwd ms':>8}{'floor':>7}{'share':>7}{'idle':>7}"
        + "".join(f"{p[:6]:>8}" for p in PHASES)
        + f"{'gap ms':>8}{'stalls':>7}"
    )
    rates = sorted(
        {f"{r['copy_tbps']:.3g} TB/s {r['copy_basis']}" for r in rows if "error" not in r}
    )
    lines = [
        f"decode step vs the HBM floor (copy rate {'; '.join(rates) or '-'}), host us per decode "
        f"step (median); {device}",
        head,
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['case']:<26}{r['engine']:<7} failed: {r['error']}")
            continue
        lines.append(
            f"{r['case']:<26}{r['engine']:<7}{r['total_s']:>8.2f}{r['ms_per_step']:>9.3f}"
            f"{r['decode_step_ms']:>8.3f}{r['decode_fwd_ms']:>8.3f}{r['floor_ms']:>7.2f}{r['floor_share']:>7.1%}"
            f"{r['gpu_idle']:>7.2%}"
            + "".join(f"{r['host_us'][p]:>8.0f}" for p in PHASES)
            + f"{r['max_gap_ms']:>8.2f}{r['host_stalls'] or 0:>7}"
        )
    for a in anchors:
        if "error" in a:
            lines.append(f"{a['case']:<26}{'hf cb':<7} failed: {a['error']}")
        else:
            lines.append(
                f"{a['case']:<26}{'hf cb':<7}{a['wall_s']:>8.2f}{a['ms_per_step']:>9.3f}"
                "   (transformers generate_batch, paged|sdpa, sync, CUDA graphs)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=DEFAULT_CASES)
    p.add_argument("--engines", default="sync,async")
    p.add_argument("--anchor", default="llama3_8b:32:256:64")
    p.add_argument("--copy-tbps", type=float, default=COPY_TBPS)
    p.add_argument("--deadline-s", type=float, default=1e9, help="start no case after this")
    p.add_argument("--set", action="append", default=[], help="one more override (repeatable)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import torch

    t0 = time.perf_counter()
    rows: list[dict] = []
    for spec in a.cases.split(","):
        for engine in a.engines.split(","):
            if time.perf_counter() - t0 > a.deadline_s:
                rows.append({"case": spec, "engine": engine, "error": "skipped: deadline"})
                continue
            try:
                rows.append(measure(spec, engine, a.copy_tbps, a.set))
            except Exception as exc:  # keep the other cases
                traceback.print_exc()
                rows.append({"case": spec, "engine": engine, "error": repr(exc)[:300]})
            print(json.dumps(rows[-1], default=str), flush=True)
    anchors = []
    if a.anchor != "none" and time.perf_counter() - t0 < a.deadline_s:
        gc.collect()  # transformers sizes its KV cache from the memory free now
        torch.cuda.empty_cache()
        try:
            anchors.append(anchor(a.anchor))
        except Exception as exc:
            anchors.append({"case": a.anchor, "error": repr(exc)[:300]})
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    text = table(rows, anchors, device)
    print("\n" + text, flush=True)
    if a.out:
        Path(a.out).write_text(
            json.dumps({"argv": sys.argv, "rows": rows, "anchors": anchors}, indent=2, default=str)
        )


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
