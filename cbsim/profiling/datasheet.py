"""The datasheet tier: profiles for GPUs nobody profiled, made from a profiled GPU's profile and
the two GPUs' datasheets (``+experiment=datasheet_profiles``).

The profiled GPU reaches a measured share of its own datasheet (copy rate over datasheet
bandwidth, matrix rate over datasheet FLOP/s); the unprofiled GPU is assumed to reach the same
share of its datasheet. Its kernel tables are the profiled ones, each kernel's time scaled by the
ratio of its roofline on the two GPUs (FLOPs and bytes at each datasheet's rates at those shares),
above the table's shortest kernel (a graph node's launch and latency, which no rate moves): a
decode GEMM or attention reads its bytes at the other memory's rate, a prompt's GEMMs and
attention compute at the other tensor cores' (a single copy-rate ratio would put an H200's prompt
steps 1.4x long on an H100 datasheet, whose FLOP/s are the H200's); the pinned copies, over
PCIe, are kept. Its host, efficiencies and copy engine are the profiled machine's. Nobody
measured any of it, so the profile says ``tier: datasheet`` and "not profiled", and its bands
are widened by a tier error (``extra.tier_error``) in quadrature with the profile's own model
error.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.hardware import HardwareConfig, kernel_table_files
from cbsim.config.model_error import ModelError
from cbsim.costs.kernel_table import roofline
from cbsim.profiling.profile_dir import HARDWARE_DIR, KERNELS_DIR, MANIFEST, PARTIAL
from cbsim.rundir import atomic_write_text

DATASHEETS = Path(str(files("cbsim") / "profiling" / "datasheets.yaml"))
# kernel-table rows timed over PCIe, not HBM: kept as the profiled machine measured them
COPY_OPS = ("h2d", "d2h")
Rates = tuple[float, float]  # a GPU's FLOP per us and bytes per us (kernel_table.roofline's)
EXTRA_KEYS = {
    "profiled_gpu": "the datasheet key of the profiled GPU (default: the one hardware.name "
    "starts with)",
    "gpus": "the datasheet keys to write profiles for (default: every other GPU)",
    "datasheets": "a datasheets YAML (default: cbsim/profiling/datasheets.yaml)",
    "tier_error": "the datasheet tier's extra model error: total_time, gpu_idle, speedup "
    "(std of log, as hardware.model_error), added in quadrature",
    "out": "the folder the profiles go to (default: the run directory)",
}
DATASHEET_KEYS = (
    "name",
    "memory_bandwidth",
    "bf16_dense_flops",
    "memory_bytes",
    "device_name",
    "source",
)


@dataclass(frozen=True)
class Datasheet:
    """One GPU's datasheet numbers and where they are printed."""

    key: str
    name: str
    memory_bandwidth: float  # bytes/s
    bf16_dense_flops: float  # FLOP/s, without sparsity
    memory_bytes: float
    device_name: str  # as torch names the card: hardware=auto matches it
    source: str


def load_datasheets(path: str | Path | None = None) -> dict[str, Datasheet]:
    p = Path(path) if path else DATASHEETS
    try:
        raw = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"extra.datasheets={str(p)!r}: not a readable YAML ({exc})") from None
    out = {}
    for key, row in (raw or {}).items():
        if not isinstance(row, dict) or set(row) != set(DATASHEET_KEYS):
            raise ConfigError(f"{p}: {key} needs exactly {', '.join(DATASHEET_KEYS)}")
        numbers = {k: float(row[k]) for k in DATASHEET_KEYS[1:4]}
        if not all(v > 0 and math.isfinite(v) for v in numbers.values()):
            raise ConfigError(f"{p}: {key}: bandwidth, FLOP/s and memory must be > 0")
        out[str(key)] = Datasheet(
            str(key),
            str(row["name"]),
            **numbers,
            device_name=str(row["device_name"]),
            source=str(row["source"]),
        )
    return out


def profiled_key(hw: HardwareConfig, sheets: dict[str, Datasheet], asked: str | None) -> str:
    """The datasheet of the profiled GPU: asked, or the longest key hardware.name starts with."""
    if asked:
        if asked not in sheets:
            raise ConfigError(f"extra.profiled_gpu={asked!r}; allowed: {', '.join(sheets)}")
        return asked
    found = sorted((k for k in sheets if hw.name.lower().startswith(k)), key=len)
    if not found:
        raise ConfigError(
            f"hardware={hw.name}: no datasheet key it starts with; set extra.profiled_gpu to one "
            f"of {', '.join(sheets)}"
        )
    return found[-1]


def shares(hw: HardwareConfig, own: Datasheet) -> tuple[float, float, list[str]]:
    """The profiled GPU's measured share of its datasheet (bandwidth, FLOP/s), at most 1: a
    rate above the datasheet is not a physical quantity (a fitted one) and is held to it."""
    notes = []
    bw, fl = hw.hbm_bandwidth / own.memory_bandwidth, hw.peak_flops / own.bf16_dense_flops
    if bw > 1:
        notes.append(f"hbm_bandwidth {hw.hbm_bandwidth:.3g} is above the datasheet's: share 1")
    if fl > 1:
        notes.append(f"peak_flops {hw.peak_flops:.3g} is above the datasheet's: share 1")
    return min(bw, 1.0), min(fl, 1.0), notes


def widened(error: ModelError, tier: dict[str, float]) -> ModelError:
    return ModelError(
        **{
            f.name: math.hypot(getattr(error, f.name), float(tier.get(f.name, 0.0)))
            for f in dataclasses.fields(ModelError)
        }
    )


def roofline_ratio(row: list[str], own: Rates, target: Rates) -> float:
    """A table row's time on ``target`` over its time on ``own``: the ratio of its rooflines
    (cbsim.costs.kernel_table.roofline; an elementwise kernel's bytes only)."""
    op, n, k, g, rows, context = row[0], *(int(float(v)) for v in row[1:6])
    shape = (op, n, k, g)
    return roofline(shape, rows, context, *target) / roofline(shape, rows, context, *own)


def scaled_table(text: str, factor: Callable[[list[str]], float], note: str) -> str:
    """A kernel table's CSV with every kernel's time above the table's shortest kernel times
    ``factor(row)`` (copies kept): the shortest is a graph node's launch and latency, which
    no datasheet rate moves (a 2 us norm of a few rows is 2 us on either GPU). Its header
    lines are kept and one more says so."""
    lines = text.splitlines()
    header = [ln for ln in lines if ln.startswith("#")]
    body = [ln for ln in lines if ln.strip() and not ln.startswith("#")]
    rows = list(csv.reader(body))
    us = rows[0].index("us")
    floor = min((float(r[us]) for r in rows[1:] if r[0] not in COPY_OPS), default=0.0)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(rows[0])
    for row in rows[1:]:
        if row[0] not in COPY_OPS:
            t = floor + (float(row[us]) - floor) * factor(row)
            row = [*row[:us], f"{t:.4g}", *row[us + 1 :]]
        w.writerow(row)
    return "\n".join([*header, f"# {note}", out.getvalue()])


def datasheet_profile(
    hw: HardwareConfig,
    own: Datasheet,
    target: Datasheet,
    tier_error: dict[str, float],
    kernel_table: str | None,
) -> tuple[HardwareConfig, list[str]]:
    """``target``'s profile from the profiled ``hw`` (of datasheet ``own``), and notes."""
    bw_share, fl_share, notes = shares(hw, own)
    bw = target.memory_bandwidth * bw_share
    source = (
        f"not profiled: datasheet tier. {target.name} datasheet ({target.source}) at the share "
        f"of its own datasheet that {hw.name} ({own.name}) measured (bandwidth {bw_share:.3f}, "
        f"FLOP/s {fl_share:.3f}); kernel tables by the ratio of each kernel's roofline "
        f"(x{own.memory_bandwidth / target.memory_bandwidth:.3f} memory-bound, "
        f"x{own.bf16_dense_flops / target.bf16_dense_flops:.3f} compute-bound); host, "
        f"efficiencies and copies of {hw.name} ({hw.source})"
    )
    out = dataclasses.replace(
        hw,
        name=f"{target.key}_datasheet",
        hbm_bandwidth=bw,
        peak_flops=target.bf16_dense_flops * fl_share,
        memory_bytes=target.memory_bytes,
        model_error=widened(hw.model_error, tier_error),
        kernel_table=kernel_table,
        source=source,
        device_name=target.device_name,
        tier="datasheet",
        provenance={**hw.provenance, **datasheet_provenance(hw, own, target)},
    )
    return out, notes


def datasheet_provenance(hw: HardwareConfig, own: Datasheet, target: Datasheet) -> dict[str, str]:
    """Where the values the datasheet tier changes come from."""
    sheet = f"datasheet: {target.name} ({target.source})"
    scaled = f"at the share of the {own.name} datasheet that {hw.name} measured"
    return {
        "hbm_bandwidth": f"{sheet}, {scaled}",
        "peak_flops": f"{sheet}, {scaled}",
        "memory_bytes": sheet,
        "kernel_table": f"{hw.name}'s tables scaled by each kernel's datasheet roofline ratio",
        "model_error.total_time": "the base's, widened by the tier error (extra.tier_error)",
        "model_error.gpu_idle": "the base's, widened by the tier error (extra.tier_error)",
        "model_error.speedup": "the base's, widened by the tier error (extra.tier_error)",
    }


def profile_text(hw: HardwareConfig, command: str) -> str:
    """A hardware profile YAML (every field, as hardware=<path> reads it)."""
    head = [
        f"# {hw.name}: NOT PROFILED. A datasheet-tier profile written by `{command}`",
        "# (cbsim/profiling/datasheet.py); its bands are widened by the tier's error.",
    ]
    body = {"defaults": ["hardware_schema", "_self_"], **dataclasses.asdict(hw)}
    if body["kernel_table"]:
        body["kernel_table"] = KERNELS_DIR  # relative to the profile directory
    return "\n".join(head) + "\n" + yaml.safe_dump(body, sort_keys=False, width=100)


def tier_error_of(value: Any) -> dict[str, float]:
    allowed = [f.name for f in dataclasses.fields(ModelError)]
    value = value or {}
    if not hasattr(value, "items") or set(value) - set(allowed):
        raise ConfigError(f"extra.tier_error={value!r}; allowed: a mapping of {', '.join(allowed)}")
    return {k: float(v) for k, v in value.items()}


def write_tables(hw: HardwareConfig, target: Datasheet, own: Datasheet, folder: Path) -> bool:
    """The profiled kernel tables scaled to ``target`` in ``folder``; whether there were any."""
    if hw.kernel_table is None:
        return False
    bw_share, fl_share, _ = shares(hw, own)

    def rates(sheet: Datasheet) -> Rates:
        return sheet.bf16_dense_flops * fl_share / 1e6, sheet.memory_bandwidth * bw_share / 1e6

    own_rates, target_rates = rates(own), rates(target)
    note = (
        f"not profiled: {hw.name}'s table, each kernel's time above the table's shortest "
        f"kernel's (launch and latency) times the ratio of its roofline on the "
        f"{target.name} and {own.name} datasheets at {hw.name}'s measured shares (bandwidth "
        f"{bw_share:.3f}, FLOP/s {fl_share:.3f}): x{own.memory_bandwidth / target.memory_bandwidth:.4f} "
        f"memory-bound, x{own.bf16_dense_flops / target.bf16_dense_flops:.4f} compute-bound "
        "(h2d and d2h rows kept)"
    )
    folder.mkdir(parents=True, exist_ok=True)
    for src in kernel_table_files(hw.kernel_table):
        table = scaled_table(
            src.read_text(), lambda row: roofline_ratio(row, own_rates, target_rates), note
        )
        atomic_write_text(folder / src.name, table)
    return True


def write_profile_dir(
    hw: HardwareConfig,
    own: Datasheet,
    target: Datasheet,
    tier: dict[str, float],
    out: Path,
    command: str,
) -> tuple[Path, HardwareConfig, list[str]]:
    """``out/<gpu>_datasheet/`` as a profile directory (hardware/, kernels/, manifest.yaml), so
    hardware=<name> and hardware=auto find it; built aside and renamed when complete."""
    name = f"{target.key}_datasheet"
    final, partial = out / name, out / f"{name}{PARTIAL}"
    shutil.rmtree(partial, ignore_errors=True)
    tables = write_tables(hw, target, own, partial / KERNELS_DIR)
    table = str(partial / KERNELS_DIR) if tables else None
    profile, notes = datasheet_profile(hw, own, target, tier, table)
    (partial / HARDWARE_DIR).mkdir(parents=True, exist_ok=True)
    atomic_write_text(partial / HARDWARE_DIR / f"{name}.yaml", profile_text(profile, command))
    manifest = {
        "profile": name,
        "tier": "datasheet",
        "gpu": {"name": target.name, "device_name": target.device_name, "basis": "datasheet"},
        "datasheet": target.source,
        "base": {"profile": hw.name, "device_name": hw.device_name, "source": hw.source},
        "command": command,
        "notes": notes,
    }
    atomic_write_text(partial / MANIFEST, yaml.safe_dump(manifest, sort_keys=False, width=100))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
    return final / HARDWARE_DIR / f"{name}.yaml", profile, notes


def run_datasheet_task(config: CbsimConfig, run_dir: Path, command: str) -> dict[str, Any]:
    """Write a datasheet-tier profile per unprofiled GPU from the composed (profiled) hardware."""
    extra = config.extra
    for key in extra:
        if key not in EXTRA_KEYS:
            raise ConfigError(
                f"extra.{key}={extra[key]} is not a setting of task=datasheets; allowed: "
                + ", ".join(sorted(EXTRA_KEYS))
            )
    sheets = load_datasheets(extra.get("datasheets"))
    hw = config.hardware
    if hw.tier not in ("profiled", "fitted"):
        raise ConfigError(
            f"hardware={hw.name} is tier {hw.tier}: a datasheet profile starts from a measured "
            "one; allowed: a profiled or fitted profile (hardware=h200, or a profile_machine "
            "directory)"
        )
    own = sheets[profiled_key(hw, sheets, extra.get("profiled_gpu"))]
    gpus = list(extra.get("gpus") or [k for k in sheets if k != own.key])
    for g in gpus:
        if g not in sheets:
            raise ConfigError(f"extra.gpus: {g!r} has no datasheet; allowed: {', '.join(sheets)}")
    tier = tier_error_of(extra.get("tier_error"))
    out = Path(str(extra.get("out") or run_dir)).absolute()
    out.mkdir(parents=True, exist_ok=True)
    written, notes = [], []
    for g in gpus:
        path, profile, notes = write_profile_dir(hw, own, sheets[g], tier, out, command)
        written.append(str(path))
        print(
            f"{profile.name}: {profile.hbm_bandwidth / 1e12:.2f} TB/s, "
            f"{profile.peak_flops / 1e12:.0f} TFLOP/s, {profile.memory_bytes / 1e9:.0f} GB "
            f"(not profiled; from {hw.name}) -> {path}"
        )
    for n in notes:
        print(f"note: {n}")
    return {"task": "datasheets", "profiled": own.key, "profiles": written, "notes": notes}
