"""Section env: device, versions, the measured copy bandwidth (the floor's denominator)."""

from __future__ import annotations

import datetime
import platform
import statistics
import sys

import torch

from runtime.kernels.paged_attention import (
    triton_available,
)


class EnvSection:
    """Section ``env`` (a ``Bench`` mixin)."""

    def env(self):
        info = dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            host=platform.node(),
            python=platform.python_version(),
            torch=torch.__version__,
            cuda=torch.version.cuda,
            device=torch.cuda.get_device_name() if self.cuda else "cpu",
            argv=sys.argv,
        )
        try:
            import transformers

            info["transformers"] = transformers.__version__
        except ImportError:
            pass
        if triton_available():
            import triton

            info["triton"] = triton.__version__
        if self.cuda:
            props = torch.cuda.get_device_properties(0)
            info["sms"] = props.multi_processor_count
            info["mem_gib"] = round(props.total_memory / 2**30, 1)
            # eager copies timed with events (a graph-captured memcpy node measured 2.7 TB/s in
            # run 1, against 4.3 for an eager copy in KINDS.md); 4 GiB read + 4 GiB written
            a = torch.randn(1 << 31, device="cuda", dtype=torch.bfloat16)
            b = torch.empty_like(a)
            for _ in range(3):
                b.copy_(a)
            ev = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(10)
            ]
            for e0, e1 in ev:
                e0.record()
                b.copy_(a)
                e1.record()
            torch.cuda.synchronize()
            ms = statistics.median(e0.elapsed_time(e1) for e0, e1 in ev)
            info["copy_tbps_measured_eager"] = round(2 * a.numel() * 2 / (ms * 1e-3) / 1e12, 3)
            info["copy_tbps_floor"] = self.copy_tbps
            self.measured_tbps = info["copy_tbps_measured_eager"]
            del a, b
        self.record(section="env", **info)
        self.log(f"env: {info}")
