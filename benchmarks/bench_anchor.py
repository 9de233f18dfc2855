"""The anchor, side by side: this runtime (sync, async) vs transformers' own continuous batching
(`generate_batch` with `paged|sdpa`, sync and async), same model, same prompts, one process.

    PYTHONUNBUFFERED=1 python benchmarks/bench_anchor.py [--model llama3_8b] [--batch 32]
        [--prompt 256] [--gen 1024] [--hf-gen 256] [--hf-async-gen 32] [--out results.json]

One model is built (seeded random weights) and shared: the runtime switches it to its paged
attention, transformers' CB to `paged|sdpa`. transformers' runs generate fewer tokens
(--hf-gen, --hf-async-gen: at 62 ms/step its sync mode would take over a minute for 1024, and its
async mode was seen failing or running 7x slower), so the table compares ms per decode step and
tokens/s. GPU busy comes from the trace for the runtime, and from NVML utilisation sampled every
20 ms for every run (the one measure that also covers transformers' loop). Prints one table.
"""

from __future__ import annotations

import argparse
import gc
import json
import threading
import time

import numpy as np
import torch


class NvmlSampler:
    """Mean NVML 'GPU utilisation' (share of time a kernel ran) over a run; None without NVML."""

    def __init__(self, period_s: float = 0.02) -> None:
        self.period_s, self.samples, self._stop = period_s, [], threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self._nvml = pynvml
        except Exception:
            self._nvml = None

    def __enter__(self):
        if self._nvml is not None:
            self._t = threading.Thread(target=self._run, daemon=True)
            self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._h).gpu)
            time.sleep(self.period_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._nvml is not None:
            self._t.join()

    @property
    def busy(self) -> float | None:
        return float(np.mean(self.samples)) / 100 if self.samples else None


def make_config(overrides: list[str]):
    """The checked config of ``python -m cbsim OVERRIDES`` (hardware=auto or a profile
    directory as the command line takes them)."""
    from cbsim.api import compose

    return compose(*overrides)


def run_ours(model, config, engine: str) -> dict:
    from cbsim.metrics import compute_metrics
    from cbsim.runtime.engine import execute

    with NvmlSampler() as nv:
        res = execute(config, engine, model=model)
    m = compute_metrics(res.trace)
    decode = res.trace.spans
    decode = decode[(decode.lane == "compute") & (decode.kind == "decode")]
    return {
        "engine": f"cbsim {engine}",
        "wall_s": res.summary["wall_s"],
        "steps": res.summary["steps"],
        "tokens": res.summary["generated_tokens"],
        "ms_per_step": m["step_time_ms_mean"],
        "tok_s": m["tokens_per_s"],
        "gpu_idle": m["gpu_idle_fraction"],
        "nvml_busy": nv.busy,
        "decode_forward_ms": float(decode.dur.mean() / 1e3) if len(decode) else None,
        "outputs": {k: v.tolist() for k, v in res.outputs.items()},
    }


def run_transformers(
    model, prompts: list[list[int]], gen: int, use_async: bool, **cb_kw: object
) -> dict:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model.config._attn_implementation = "sdpa"  # generate_batch turns it into paged|sdpa
    gc_ = GenerationConfig(
        max_new_tokens=gen, do_sample=False, eos_token_id=None, pad_token_id=0, use_cache=True
    )
    cb = ContinuousBatchingConfig(
        use_cuda_graph=True, use_async_batching=use_async, max_requests_per_batch=len(prompts)
    )
    name = f"transformers {'async' if use_async else 'sync'}"
    try:
        model.generate_batch(
            prompts[:2], generation_config=gc_, continuous_batching_config=cb, max_new_tokens=4
        )  # warm-up
        torch.cuda.synchronize()
        with NvmlSampler() as nv:
            t0 = time.perf_counter()
            out = model.generate_batch(
                prompts, generation_config=gc_, continuous_batching_config=cb, max_new_tokens=gen
            )
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
    except Exception as exc:  # report what we see
        return {"engine": name, "error": repr(exc)[:300]}
    toks = {
        int(k.split("_")[-1]) if k.split("_")[-1].isdigit() else k: v.generated_tokens
        for k, v in out.items()
    }
    n = sum(len(v) for v in toks.values())
    return {
        "engine": name,
        "wall_s": wall,
        "steps": gen,
        "tokens": n,
        "ms_per_step": 1e3 * wall / max(gen, 1),
        "tok_s": n / wall,
        "gpu_idle": None,
        "nvml_busy": nv.busy,
        "errors": sum(1 for v in out.values() if v.error),
        "outputs": toks,
    }


def agreement(a: dict, b: dict, n: int) -> float | None:
    """Share of requests whose first n greedy tokens agree (bf16 kernels differ: drift is normal)."""
    if "outputs" not in a or "outputs" not in b:
        return None
    keys = [k for k in a["outputs"] if k in b["outputs"]]
    if not keys:
        return None
    return float(np.mean([a["outputs"][k][:n] == list(b["outputs"][k][:n]) for k in keys]))


def print_table(rows: list[dict], ref: dict | None, a: argparse.Namespace) -> None:
    """The one table: ms/step, tok/s, GPU idle and busy per engine, and the token agreement."""
    print(
        f"\nanchor: {a.model}, {a.batch} x ({a.prompt} + {a.gen}) [transformers: "
        f"{a.hf_gen} / {a.hf_async_gen} new tokens], {torch.cuda.get_device_name()}"
    )
    print(
        f"{'engine':<20}{'ms/step':>10}{'tok/s':>10}{'GPU idle':>10}{'NVML busy':>11}"
        f"{'x vs hf sync':>14}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['engine']:<20} failed: {r['error']}")
            continue
        ratio = ref["ms_per_step"] / r["ms_per_step"] if ref else float("nan")
        idle = f"{r['gpu_idle']:.2%}" if r["gpu_idle"] is not None else "-"
        busy = f"{r['nvml_busy']:.1%}" if r["nvml_busy"] is not None else "-"
        print(
            f"{r['engine']:<20}{r['ms_per_step']:>10.2f}{r['tok_s']:>10.0f}{idle:>10}"
            f"{busy:>11}{ratio:>14.2f}"
        )
    n = min(a.hf_gen, 16)
    if ref:
        print(
            f"first {n} tokens agree (cbsim sync vs transformers sync): "
            f"{agreement(rows[0], ref, n)} of requests; cbsim sync vs async: "
            f"{agreement(rows[0], rows[1], a.gen)}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama3_8b")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--gen", type=int, default=1024)
    p.add_argument("--hf-gen", type=int, default=256)
    p.add_argument("--hf-async-gen", type=int, default=32)
    p.add_argument("--skip-async-hf", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    from cbsim.runtime.model import build_model
    from cbsim.workload import make_requests

    over = [
        "mode=runtime",
        f"model={a.model}",
        f"workload.batch_size={a.batch}",
        f"workload.prompt_len={a.prompt}",
        f"workload.gen_len={a.gen}",
    ]
    config = make_config(over)
    model = build_model(config.model, torch.device("cuda"), seed=config.workload.seed)
    from cbsim.runtime.kernels.fused_projections import fuse_qkv_and_gate_up

    fuse_qkv_and_gate_up(model)  # what the runtime does on CUDA; both engines then use it
    prompts = [
        list(map(int, r.prompt_ids))
        for r in make_requests(config.workload, config.model.vocab_size)
    ]
    rows = [run_ours(model, config, "sync"), run_ours(model, config, "async")]
    gc.collect()
    torch.cuda.empty_cache()
    rows.append(run_transformers(model, prompts, a.hf_gen, use_async=False))
    gc.collect()
    torch.cuda.empty_cache()
    if not a.skip_async_hf:
        rows.append(run_transformers(model, prompts, a.hf_async_gen, use_async=True))
    ref = next((r for r in rows if r["engine"] == "transformers sync" and "ms_per_step" in r), None)
    print_table(rows, ref, a)
    if a.out:
        for r in rows:
            r.pop("outputs", None)
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
