"""Where the simulator is short on the seed workload: recorded against simulated decode forwards,
by context, for the async seed runs of h200_run14 (fused epilogues) and h200_run12 (unfused).

    python experiments/runtime/diag_seed_steps.py [hardware=PROFILE]   (default h200_kernels_calibrated)

Each run is re-simulated as validation simulates it (cbsim.calibration.simulated.simulate_like);
the forwards are compared step by step and averaged over windows of the run (the context grows
from 256 to 8448 tokens as it goes).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra import compose, initialize_config_module

from cbsim.calibration.recordings import Recorded
from cbsim.calibration.simulated import simulate_like
from cbsim.config.store import load_config, register_configs
from cbsim.trace import read_trace

ROOT = Path(__file__).resolve().parent
RUNS = ("h200_run14/seed", "h200_run12/seed")
WINDOWS = ((1, 512), (512, 2048), (2048, 4096), (4096, 6144), (6144, 8192))


def forwards(trace):
    sp = trace.spans
    f = sp[(sp.lane == "compute") & sp.name.isin(["forward", "graph_replay"])]
    return f.sort_values("step").dur.to_numpy()


def main(argv: list[str]) -> None:
    register_configs()
    hw_arg = [a for a in argv if a.startswith("hardware=")] or ["hardware=h200_kernels_calibrated"]
    with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
        hw = load_config(compose(config_name="config", overrides=hw_arg)).hardware
    print(f"{hw_arg[0]}; decode forwards, mean us per window of steps (context = 256 + step)\n")
    print("| run | fused | steps | recorded us | simulated us | simulated / recorded |")
    print("| --- | --- | --- | --- | --- | --- |")
    for part in RUNS:
        path = ROOT / part / "seed_8192" / "trace_async.json.gz"
        rec = Recorded(path=path, trace=read_trace(str(path)), root=ROOT)
        real, sim = forwards(rec.trace), forwards(simulate_like(rec, hw))
        for a, b in WINDOWS:
            r, s = real[a:b].mean(), sim[a:b].mean()
            fused = rec.config.mode.fuse_epilogues
            print(f"| {part} | {fused} | {a}-{b} | {r:.0f} | {s:.0f} | {s / r:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
