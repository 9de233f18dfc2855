"""The machine a runtime run is on, read once at its start: the GPU (name, SMs, memory, compute
capability) with its measured device-to-device copy rate, the host (CPU model, cores, RAM) and
the software. It becomes the trace's otherData.hardware (cbsim/trace/hardware.py), which the
metrics measure the HBM floor against and the report names in its title.

A profile's ``hbm_bandwidth`` may be fitted, or another GPU's; the copy rate measured here is
this GPU's. Measuring takes well under a second and is cached per device (name, UUID, driver) in
``$XDG_CACHE_HOME/cbsim/devices.json`` (default ``~/.cache``), so later runs only read it. On a
CPU (mode.device=cpu) there are no GPU fields and the copy rate is host memory's, labelled so.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from cbsim.config.hardware import HardwareConfig, device_matches
from cbsim.host import cpu_model, median_us, python_speed_us
from cbsim.trace.hardware import BASIS_DEVICE, COPY_OF_DEVICE, COPY_OF_HOST

log = logging.getLogger("cbsim.runtime")

CACHE_FORMAT = 1
# A timed copy reads and writes GPU_COPY_BYTES, COPY_REPEATS times between one pair of CUDA
# events (4 GiB moved: about 1 ms on an H200, long enough that launches do not count); the best
# of COPY_TRIALS counts. A host copy likewise, timed by perf_counter
GPU_COPY_BYTES = 256 << 20
COPY_REPEATS = 8
HOST_COPY_BYTES = 64 << 20  # past any CPU cache
HOST_COPY_REPEATS = 4
COPY_TRIALS = 3
# below this much free device memory for source and destination, no rate is measured
MIN_COPY_BYTES = 16 << 20
# the host's cost of one small torch op on the CPU (the dispatcher, as every eager kernel launch
# and the prepare phase's tensor work pay it): TORCH_OPS adds timed per trial, the median counts
TORCH_OPS = 400

_read: dict[str, dict[str, Any]] = {}  # per device, for this process (a compare runs twice)
_warned: set[tuple[str, str]] = set()


def cache_path() -> Path:
    """devices.json under $XDG_CACHE_HOME/cbsim (default ~/.cache/cbsim)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cbsim" / "devices.json"


def read_machine(device: torch.device, *, refresh: bool = False) -> dict[str, Any]:
    """otherData.hardware for a run on ``device``: read once per process and device
    (``refresh``: read again and measure the copy rate anew)."""
    key = str(device)
    if refresh or key not in _read:
        info: dict[str, Any] = {"basis": BASIS_DEVICE, "device": key}
        if device.type == "cuda":
            info.update(gpu_info(device))
        else:
            info["name"] = "cpu"
        info.update(host_info())
        info.update(copy_rate(device, info, refresh=refresh))
        info.update(software(device))
        _read[key] = info
    return dict(_read[key])


def gpu_info(device: torch.device) -> dict[str, Any]:
    """The GPU as the driver describes it; uuid and driver name it in the copy-rate cache."""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return {
        "name": props.name,
        "sms": int(props.multi_processor_count),
        "memory_bytes": int(props.total_memory),
        "capability": f"{props.major}.{props.minor}",
        "uuid": str(uuid) if uuid is not None else f"index {index}",
        "driver": driver_version(),
    }


def driver_version() -> str:
    """The NVIDIA kernel module's version, else the CUDA driver API's, else ""."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        found = re.search(r"Kernel Module\s+(\S+)", text)
        if found:
            return found.group(1)
    except OSError:
        pass
    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    try:
        return f"CUDA driver API {get()}" if get is not None else ""
    except RuntimeError:
        return ""


def host_info() -> dict[str, Any]:
    """The CPU model (/proc/cpuinfo), its logical cores and the RAM (total and free now)."""
    total, available = host_ram_bytes()
    return {
        "host": platform.node(),
        "host_cpu": cpu_model(),
        "host_cores": os.cpu_count() or 1,
        "host_ram_bytes": total,
        "host_ram_available_bytes": available,
        "host_python_us": python_speed_us(),
        "host_torch_op_us": torch_op_us(),
    }


def torch_op_us() -> float:
    """Microseconds one small CPU torch op costs this host, dispatch included (the median of
    trials of TORCH_OPS; about 10 ms in all)."""
    a, b = torch.ones(8), torch.ones(8)

    def ops() -> None:
        for _ in range(TORCH_OPS):
            torch.add(a, b, out=a)

    return round(median_us(ops) / TORCH_OPS, 3)


def host_ram_bytes() -> tuple[int, int]:
    """(total, available) RAM in bytes: /proc/meminfo, else sysconf (available = free pages)."""
    found: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    found[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    page = os.sysconf("SC_PAGE_SIZE")
    total = found.get("MemTotal") or os.sysconf("SC_PHYS_PAGES") * page
    available = found.get("MemAvailable") or os.sysconf("SC_AVPHYS_PAGES") * page
    return int(total), int(available)


def device_memory_bytes(device: torch.device) -> int:
    """The memory a run on ``device`` may fill: the GPU's total memory, or on a CPU the host
    RAM available now (the OS and other processes hold the rest; past it the run is killed)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return host_ram_bytes()[1]


def software(device: torch.device) -> dict[str, Any]:
    import transformers

    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    if device.type == "cuda":
        out["cuda"] = torch.version.cuda
        try:
            import triton

            out["triton"] = triton.__version__
        except ImportError:
            pass
    return out


def device_key(info: dict[str, Any]) -> str:
    """What names one device in the cache: a GPU by name, UUID and driver; a CPU by model and
    host."""
    if "uuid" in info:
        return f"{info['name']} | {info['uuid']} | driver {info.get('driver', '')}"
    return f"cpu | {info.get('host_cpu', '')} | {info.get('host', '')}"


def copy_rate(device: torch.device, info: dict[str, Any], refresh: bool = False) -> dict[str, Any]:
    """The copy-rate fields: from the cache when this device is in it, else measured and
    cached (an unreadable or unwritable cache only costs the measurement)."""
    path, key = cache_path(), device_key(info)
    entries = load_cache(path)
    entry = entries.get(key)
    if refresh or not isinstance(entry, dict) or "copy_bytes_per_s" not in entry:
        entry = measure_gpu_copy(device) if device.type == "cuda" else measure_host_copy()
        if "copy_bytes_per_s" not in entry:
            return entry
        entry["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        entries[key] = entry
        save_cache(path, entries)
        return {**entry, "copy_cached": False}
    return {**entry, "copy_cached": True}


def load_cache(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(obj, dict) or obj.get("format") != CACHE_FORMAT:
        return {}
    devices = obj.get("devices")
    return devices if isinstance(devices, dict) else {}


def save_cache(path: Path, entries: dict[str, Any]) -> None:
    """Write the cache atomically (temp file + rename): a reader never sees half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".devices.", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"format": CACHE_FORMAT, "devices": entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("device cache %s not written: %s", path, exc)


def measure_gpu_copy(device: torch.device) -> dict[str, Any]:
    """Device-to-device copy rate, read + write bytes counted, timed by CUDA events on a stream
    of its own; the memory is given back before the run builds anything."""
    free, _ = torch.cuda.mem_get_info(device)
    size = min(GPU_COPY_BYTES, free // 4)  # source and destination, with room to spare
    if size < MIN_COPY_BYTES:
        return {"copy_skipped": f"{free / 2**30:.2f} GiB free on the device: not measured"}
    stream = torch.cuda.Stream(device)
    best_s = float("inf")
    with torch.cuda.device(device), torch.cuda.stream(stream):
        src = torch.empty(size, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        src.fill_(1)
        dst.copy_(src)  # first touch of both buffers, outside the timing
        for _ in range(COPY_TRIALS):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(COPY_REPEATS):
                dst.copy_(src)
            end.record(stream)
            end.synchronize()
            best_s = min(best_s, start.elapsed_time(end) / 1e3)
        stream.synchronize()
        del src, dst
    torch.cuda.empty_cache()
    return {
        "copy_bytes_per_s": 2 * size * COPY_REPEATS / best_s,
        "copy_of": COPY_OF_DEVICE,
        "copy_method": (
            f"device-to-device copy of {size >> 20} MiB x {COPY_REPEATS}, best of "
            f"{COPY_TRIALS}, CUDA events; read + write bytes counted"
        ),
    }


def measure_host_copy() -> dict[str, Any]:
    """Host memory's copy rate (a CPU run's stand-in for HBM), read + write bytes counted."""
    src = torch.ones(HOST_COPY_BYTES, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best_s = float("inf")
    for _ in range(COPY_TRIALS):
        t0 = time.perf_counter()
        for _ in range(HOST_COPY_REPEATS):
            dst.copy_(src)
        best_s = min(best_s, time.perf_counter() - t0)
    return {
        "copy_bytes_per_s": 2 * HOST_COPY_BYTES * HOST_COPY_REPEATS / best_s,
        "copy_of": COPY_OF_HOST,
        "copy_method": (
            f"host memory copy of {HOST_COPY_BYTES >> 20} MiB x {HOST_COPY_REPEATS}, best of "
            f"{COPY_TRIALS}, perf_counter; read + write bytes counted"
        ),
    }


def other_gpu_warning(hw: HardwareConfig, machine: dict[str, Any]) -> str | None:
    """One line when the profile names a GPU (hardware.device_name) other than the one this
    run is on; None on a match, an unnamed profile, or a CPU (a check of the engine's logic,
    never a timing to predict)."""
    gpu = machine.get("name", "")
    if "sms" not in machine or device_matches(hw.device_name, gpu):
        return None
    return (
        f"hardware={hw.name} is a profile of {hw.device_name!r} (hardware.device_name) and this "
        f"run is on {gpu!r}: its rates, memory and predictions are another GPU's; "
        "hardware=auto picks this GPU's profile where one is installed or shipped, and "
        "+experiment=profile_machine makes one"
    )


def warn_if_other_gpu(hw: HardwareConfig, machine: dict[str, Any]) -> None:
    """Log other_gpu_warning once per profile and device in this process."""
    text = other_gpu_warning(hw, machine)
    key = (hw.name, machine.get("device", ""))
    if text and key not in _warned:
        _warned.add(key)
        log.warning(text)
