"""The machine a report names: the device its traces were recorded on (the title, the config
table), that device's and its host's figures, the profile's source in a line, and the rate the
HBM floor was measured against."""

from __future__ import annotations

import re
from typing import Any

from cbsim.trace.hardware import COPY_OF_HOST, hardware_of, measured_copy_rate, recorded_device
from cbsim.trace.model import Trace

# "... 60 runtime trace(s): h200/fit_a/8b_1x128+768/trace_sync.json.gz, ...": the list is named
# by its recorded sets (<gpu>/<set>, the folders above each case) in the report
TRACE_LIST = re.compile(r"^(?P<head>.*?\b(?P<n>\d+) runtime trace\(s\)):\s*(?P<paths>.+)$", re.S)
SESSIONS_SHOWN = 3
SOURCE_CHARS = 300


def recorded_on(traces: list[Trace]) -> str | None:
    """The device the traces were recorded on ("a / b" when they differ); None when none was
    (simulations)."""
    names = dict.fromkeys(d for t in traces if (d := recorded_device(t.other_data)))
    return " / ".join(names) or None


def profile_source(source: str) -> str:
    """A profile's source in one short line: a calibration's list of trace files becomes the
    count and the sessions they came from."""
    found = TRACE_LIST.match(source.strip())
    if found:
        paths = [p.strip() for p in found["paths"].split(",") if p.strip()]
        sessions = list(dict.fromkeys("/".join(p.split("/")[:-2]) or p for p in paths))
        shown = ", ".join(sessions[:SESSIONS_SHOWN])
        more = (
            f" and {len(sessions) - SESSIONS_SHOWN} more" if len(sessions) > SESSIONS_SHOWN else ""
        )
        return f"calibrated from {found['n']} runtime traces of {shown}{more}"
    if len(source) > SOURCE_CHARS:
        return source[: SOURCE_CHARS - 1].rstrip() + "…"
    return source


def device_summary(other: dict[str, Any]) -> str | None:
    """The recorded device in one line: name, SMs, memory, compute capability and the copy
    rate measured on it; None for a simulation."""
    name = recorded_device(other)
    if name is None:
        return None
    hw = hardware_of(other)
    parts = [name]
    if hw.get("sms"):
        parts.append(f"{hw['sms']} SMs")
    if hw.get("memory_bytes"):
        parts.append(f"{hw['memory_bytes'] / 2**30:.1f} GiB")
    if hw.get("capability"):
        parts.append(f"compute {hw['capability']}")
    copy = measured_copy_rate(hw)
    if copy is not None:
        rate, of = copy
        what = "host memory copy" if of == COPY_OF_HOST else "copy"
        cached = " (cached)" if hw.get("copy_cached") else ""
        parts.append(f"{what} {rate_text(rate)} measured{cached}")
    return " · ".join(parts)


def host_summary(other: dict[str, Any]) -> str | None:
    """The recording's host: CPU model, logical cores, RAM, its measured speed."""
    hw = hardware_of(other)
    if recorded_device(other) is None or not hw.get("host_cpu"):
        return None
    parts = [str(hw["host_cpu"])]
    if hw.get("host_cores"):
        parts.append(f"{hw['host_cores']} cores")
    if hw.get("host_ram_bytes"):
        parts.append(f"{hw['host_ram_bytes'] / 2**30:.0f} GiB RAM")
    if hw.get("host_python_us"):
        parts.append(f"Python work {hw['host_python_us'] / 1e3:.2f} ms")
    if hw.get("host_torch_op_us"):
        parts.append(f"torch op {hw['host_torch_op_us']:.2f} us")
    return " · ".join(parts)


def floor_basis(metrics: dict[str, Any]) -> str | None:
    """What "of the HBM floor" divides by: the rate and its basis."""
    rate, basis = metrics.get("hbm_floor_tbps"), metrics.get("hbm_floor_basis")
    if rate is None or not basis:
        return None
    return f"{rate_text(rate * 1e12)} ({basis})"


def rate_text(bytes_per_s: float) -> str:
    """TB/s for a GPU's memory, GB/s for a host's (0.00 TB/s would say nothing)."""
    if bytes_per_s >= 1e11:
        return f"{bytes_per_s / 1e12:.2f} TB/s"
    return f"{bytes_per_s / 1e9:.1f} GB/s"
