"""Whether each recorded run lies inside the simulator's band (cbsim/bands.py).

    python experiments/kernels/band_coverage.py h200_kernels_calibrated [SESSION]

Every offline workload of experiments/runtime/SESSION (default h200_run8): its recorded config
re-simulated with the named hardware profile; P5 / median / P95 of total time and GPU idle per
engine and of the async speedup, against the recorded values. Prints one line per figure and
the count inside.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from cbsim.bands import predict_bands
from cbsim.calibration.run_config import config_of
from cbsim.config.store import load_config, register_configs
from cbsim.metrics import compute_metrics
from cbsim.trace import read_trace

REPO = Path(__file__).resolve().parents[2]
CASES = ("small_batch", "seed_1024", "batch_16_2048", "batch_64", "long_prompt", "continuous")


def hardware(name: str):
    from hydra import compose, initialize_config_module

    register_configs()
    with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
        return load_config(compose(config_name="config", overrides=[f"hardware={name}"])).hardware


def main(profile: str, session: str = "h200_run8") -> None:
    hw, inside, total = hardware(profile), 0, 0
    for case in CASES:
        rec, cfg = {}, None
        for engine in ("sync", "async"):
            trace = read_trace(
                REPO / "experiments" / "runtime" / session / case / f"trace_{engine}.json.gz"
            )
            rec[engine] = compute_metrics(trace)
            cfg = cfg or config_of(trace)
        cfg = dataclasses.replace(cfg, hardware=hw, mode=dataclasses.replace(cfg.mode, name="sim"))
        bands = predict_bands(cfg)
        figures = [
            (e, k, rec[e][k], bands[e][k])
            for e in ("sync", "async")
            for k in ("total_time_s", "gpu_idle_fraction")
        ]
        speedup = rec["sync"]["total_time_s"] / rec["async"]["total_time_s"]
        figures.append(("-", "speedup", speedup, bands["speedup"]))
        for engine, key, value, band in figures:
            ok = band["p5"] <= value <= band["p95"]
            inside, total = inside + ok, total + 1
            print(
                f"{case:14s} {engine:5s} {key:18s} recorded {value:.4f}  band {band['p5']:.4f} / "
                f"{band['median']:.4f} / {band['p95']:.4f}  {'inside' if ok else 'outside'}",
                flush=True,
            )
    print(f"inside: {inside} of {total}")


if __name__ == "__main__":
    main(*sys.argv[1:])
