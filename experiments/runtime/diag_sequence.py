"""Run named matrix cases in one process, in order, as record.py does, printing each failure's
traceback (a device-side assert names its kernel under CUDA_LAUNCH_BLOCKING=1).

    CUDA_LAUNCH_BLOCKING=1 python3 experiments/runtime/diag_sequence.py OUTDIR CASE [CASE ...]
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import MATRIX, REFERENCE, REFERENCE_CASE  # noqa: E402
from record import run_case  # noqa: E402


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    cases = {
        REFERENCE: REFERENCE_CASE[0],
        **{k: v[0] for p in MATRIX.values() for k, v in p.items()},
    }
    hardware: dict = {}
    for name in argv[1:]:
        try:
            run_case(name, cases[name], out, [], hardware)
        except Exception:
            print(f"[{name}] FAILED:\n{traceback.format_exc()}", flush=True)
            return


if __name__ == "__main__":
    main(sys.argv[1:])
