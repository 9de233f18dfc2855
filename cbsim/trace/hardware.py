"""otherData.hardware: the machine a trace was recorded on, or the profile a simulation ran with.

A runtime trace reads its machine at the start (runtime/machine.py): ``basis`` "device", the
GPU's ``name``, ``sms``, ``memory_bytes``, ``capability``, ``uuid`` and ``driver``, its measured
copy rate (``copy_bytes_per_s``, read + write bytes counted, with ``copy_of`` and
``copy_method`` saying how), the host (``host_cpu``, ``host_cores``, ``host_ram_bytes``, and its
measured speed: ``host_python_us`` for a fixed scheduler-like piece of Python work,
``host_torch_op_us`` for one small CPU torch op; cbsim/host.py, runtime/machine.py) and the
software. On a CPU ``name`` is "cpu", there are no GPU fields and the copy rate is host
memory's. A simulated trace records ``basis`` "profile": the profile's ``name``, ``source``,
``device_name``, ``memory_bytes`` and ``hbm_bandwidth``, no measurement. A Kineto import
keeps the profiler's device names in otherData.kineto.devices.
"""

from __future__ import annotations

import math
from typing import Any

from cbsim.trace.errors import TraceError

BASIS_DEVICE, BASIS_PROFILE = "device", "profile"
BASES = (BASIS_DEVICE, BASIS_PROFILE)
COPY_OF_DEVICE, COPY_OF_HOST = "device memory", "host memory"
COPIES_OF = (COPY_OF_DEVICE, COPY_OF_HOST)
POSITIVE = (
    "sms",
    "memory_bytes",
    "copy_bytes_per_s",
    "host_cores",
    "host_ram_bytes",
    "host_python_us",
    "host_torch_op_us",
)
TEXT = ("name", "capability", "host_cpu", "copy_method", "source", "device_name")


def check_hardware(hw: Any) -> None:
    """otherData.hardware, when present: an object whose known fields have the types the
    metrics and the report rely on (a bad copy rate would divide every floor share)."""
    if hw is None:
        return
    if not isinstance(hw, dict):
        raise TraceError("otherData.hardware must be an object")
    if hw.get("basis", BASIS_DEVICE) not in BASES:
        raise TraceError(f"otherData.hardware.basis {hw['basis']!r}; allowed: {', '.join(BASES)}")
    if hw.get("copy_of", COPY_OF_DEVICE) not in COPIES_OF:
        raise TraceError(
            f"otherData.hardware.copy_of {hw['copy_of']!r}; allowed: {', '.join(COPIES_OF)}"
        )
    for key in POSITIVE:
        v = hw.get(key)
        if v is None:
            continue
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v <= 0:
            raise TraceError(f"otherData.hardware.{key} must be a positive number, not {v!r}")
    for key in TEXT:
        if hw.get(key) is not None and not isinstance(hw[key], str):
            raise TraceError(f"otherData.hardware.{key} must be a string")


def hardware_of(other: dict[str, Any]) -> dict[str, Any]:
    hw = other.get("hardware")
    return hw if isinstance(hw, dict) else {}


def recorded_device(other: dict[str, Any]) -> str | None:
    """The device a trace was recorded on: a runtime trace's GPU name (or "cpu, <model>"), a
    Kineto import's first device; None for a simulation (it ran on a profile)."""
    hw = hardware_of(other)
    if other.get("source") == "kineto":
        devices = (other.get("kineto") or {}).get("devices") or []
        names = [d for d in devices if isinstance(d, str) and d]
        return names[0] if names else None
    if hw.get("basis", BASIS_DEVICE) != BASIS_DEVICE or other.get("source") == "sim":
        return None
    name = hw.get("name")
    if not isinstance(name, str) or not name:
        return None
    cpu = hw.get("host_cpu") or hw.get("cpu")
    return f"CPU {cpu}" if name == "cpu" and cpu else name


def measured_copy_rate(hw: dict[str, Any] | None) -> tuple[float, str] | None:
    """(bytes/s, what was copied) of otherData.hardware when it measured its machine's copy
    rate; None for a profile's figures or a recording that measured none."""
    hw = hw if isinstance(hw, dict) else {}
    rate = hw.get("copy_bytes_per_s")
    if hw.get("basis", BASIS_DEVICE) != BASIS_DEVICE or not isinstance(rate, (int, float)):
        return None
    if isinstance(rate, bool) or rate <= 0:
        return None
    return float(rate), str(hw.get("copy_of", COPY_OF_DEVICE))
