"""Whether a run's decode forward depends on its engine or on its place in the process.

    python experiments/runtime/diag_run_order.py OUTDIR SPEC ORDER [SPEC ORDER ...]

SPEC is bench_decode.py's MODEL:BATCH:PROMPT:GEN, ORDER the engines in turn (e.g. "sasaas"; an
upper-case letter first empties the allocator's cache: `gc.collect(); torch.cuda.empty_cache()`;
"h" heats the GPU for HEAT_S with bf16 GEMMs, "z" lets it cool for COOL_S, "k" does nothing
(the orders of h200_run19-20 have it where each run still took new streams; every run now
reuses the process's, runtime/streams.py); "o" runs the async loop with its H2D, forward and
D2H on one stream, engine.streams=one; "m" builds one
model, fused as the CLI's, that every later run of the SPEC is given instead of building its own,
as bench_decode.py and diag_engine_factors.py share one).
The recordings run sync then async in one process, each through `cbsim.runtime.run`, each
building its own model (experiments/runtime/record.py): their async decode forward was 17-221
us longer than the sync one, constant over a run, while with one model shared by both loops it
was 30-40 us (diag_engine_factors.py). Here the same calls run in the given order; per run the
median decode forward after the first steps (diag_engine_factors.SKIP), the decode step, the
bytes the allocator held before the run and the GPU's and HBM's temperatures (nvidia-smi) before
it. Writes OUTDIR/diag_run_order.json, prints a table.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_anchor import make_config  # noqa: E402
from bench_decode import case_overrides  # noqa: E402
from diag_engine_factors import forward_figures  # noqa: E402

ENGINES = {"s": "sync", "a": "async", "o": "async"}
HEAT_S = 20.0
COOL_S = 40.0


def heat() -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < HEAT_S:
        for _ in range(50):
            a @ a
        torch.cuda.synchronize()


def temperatures() -> str:
    q = ["nvidia-smi", "--query-gpu=temperature.gpu,temperature.memory", "--format=csv,noheader"]
    return subprocess.run(q, capture_output=True, text=True).stdout.strip()


def shared_model(spec: str):
    import torch

    from cbsim.runtime.runner import runtime_model

    return runtime_model(make_config(case_overrides(spec, "sync")), torch.device("cuda"), None)


def one_run(spec: str, engine: str, release: bool, one_stream: bool = False, model=None) -> dict:
    import torch

    if release:
        gc.collect()
        torch.cuda.empty_cache()

    from cbsim.runtime.engine import execute

    reserved = torch.cuda.memory_reserved()
    temps = temperatures()
    extra = ["engine.streams=one"] if one_stream else []
    config = make_config(case_overrides(spec, engine) + extra)
    trace = execute(config, engine, model=model).trace
    figures = forward_figures(trace)
    return {
        "engine": engine + ("/1" if one_stream else "") + ("/m" if model is not None else ""),
        "fwd_us": figures["fwd_us"],
        "decode_step_us": figures["decode_step_us"],
        "reserved_before_gb": reserved / 1e9,
        "released": release,
        "temperatures_before": temps,
    }


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for spec, order in zip(argv[1::2], argv[2::2], strict=True):
        result[spec] = []
        model = None
        for c in order:
            if c == "h":
                heat()
            elif c == "k":
                pass
            elif c == "z":
                time.sleep(COOL_S)
            elif c == "m":
                model = shared_model(spec)
            else:
                result[spec].append(
                    one_run(spec, ENGINES[c.lower()], c.isupper(), c.lower() == "o", model)
                )
        for i, r in enumerate(result[spec]):
            print(
                f"{spec:<24}{i:>3} {r['engine']:<9}{r['fwd_us']:>9.0f}{r['decode_step_us']:>9.0f}"
                f"{r['reserved_before_gb']:>8.1f} GB  {'released' if r['released'] else '':<9}"
                f"{r['temperatures_before']}"
            )
    (out / "diag_run_order.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
