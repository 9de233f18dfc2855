"""The runtime knows its machine: it reads the device and the host at its start, measures the copy
rate once per device (cached), records them in the trace, checks the run against the device's own
memory and warns when the profile was made on another GPU. Here on a CPU (mode.device=cpu)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
from conftest import make_config  # noqa: E402

from cbsim.config.errors import ConfigError  # noqa: E402
from cbsim.config.hardware import HardwareConfig, device_matches  # noqa: E402
from cbsim.metrics import compute_metrics  # noqa: E402
from cbsim.runtime import machine  # noqa: E402
from cbsim.runtime.engine import execute  # noqa: E402
from cbsim.trace import read_trace, write_trace  # noqa: E402

CPU = torch.device("cpu")
TINY = ["mode=runtime", "mode.device=cpu", "model=tiny", "engine=sync"]
SMALL = ["workload.batch_size=2", "workload.gen_len=4", "workload.prompt_len=16"]
H100 = {"device": "cuda:0", "name": "NVIDIA H100 80GB HBM3", "sms": 132}


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """A cache of its own under tmp_path, and nothing read earlier in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(machine, "_read", {})
    monkeypatch.setattr(machine, "_warned", set())
    return tmp_path / "cache" / "cbsim"


def test_the_copy_rate_is_measured_once_then_read_from_the_cache(cache_home):
    first = machine.read_machine(CPU)
    assert first["copy_cached"] is False and first["copy_bytes_per_s"] > 1e8
    cached = json.loads((cache_home / "devices.json").read_text())
    assert cached["format"] == machine.CACHE_FORMAT
    assert list(cached["devices"]) == [machine.device_key(first)]
    assert [p.name for p in cache_home.iterdir()] == ["devices.json"]  # no temp file left
    again = machine.read_machine(CPU, refresh=False)
    assert again == first  # one read per process and device
    machine._read.clear()
    later = machine.read_machine(CPU)  # a later process: from the cache, not measured
    assert later["copy_cached"] is True
    assert later["copy_bytes_per_s"] == first["copy_bytes_per_s"]


def test_a_corrupt_cache_is_measured_again_and_rewritten(cache_home):
    cache_home.mkdir(parents=True)
    (cache_home / "devices.json").write_text("{half a file")
    info = machine.read_machine(CPU)
    assert info["copy_cached"] is False
    assert json.loads((cache_home / "devices.json").read_text())["devices"]


def test_a_cpu_has_host_fields_no_gpu_fields_and_a_labelled_host_copy_rate(cache_home):
    info = machine.read_machine(CPU)
    assert info["basis"] == "device" and info["name"] == "cpu"
    assert not {"sms", "memory_bytes", "capability", "uuid"} & info.keys()
    assert info["copy_of"] == "host memory" and "host memory copy" in info["copy_method"]
    cpuinfo = open("/proc/cpuinfo").read()
    assert info["host_cpu"] in cpuinfo and info["host_cores"] >= 1
    assert 0 < info["host_ram_available_bytes"] <= info["host_ram_bytes"]
    assert machine.device_memory_bytes(CPU) <= info["host_ram_bytes"]
    # the host's measured speed: a few ms of Python work, a small torch op in microseconds
    assert 10 < info["host_python_us"] < 1e6 and 0 < info["host_torch_op_us"] < 1e3


def test_device_name_matches_a_case_insensitive_part_of_the_gpu_name():
    assert device_matches("h200", "NVIDIA H200")
    assert device_matches(" H100 ", "NVIDIA H100 80GB HBM3")
    assert not device_matches("H200", "NVIDIA H100 80GB HBM3")
    assert device_matches("", "anything at all")  # an unnamed profile is any GPU's


def test_a_profile_of_another_gpu_warns_once_in_one_line(cache_home, caplog):
    h200 = HardwareConfig(name="h200", device_name="H200")
    with caplog.at_level(logging.WARNING, logger="cbsim.runtime"):
        machine.warn_if_other_gpu(h200, H100)
        machine.warn_if_other_gpu(h200, H100)  # a compare run's second engine: said already
    (record,) = caplog.records
    text = record.getMessage()
    assert "\n" not in text and "hardware=h200" in text and "NVIDIA H100 80GB HBM3" in text
    assert "hardware=auto" in text and "+experiment=profile_machine" in text  # the way out
    assert machine.other_gpu_warning(HardwareConfig(device_name="h100"), H100) is None
    assert machine.other_gpu_warning(HardwareConfig(device_name=""), H100) is None
    cpu = machine.read_machine(CPU)
    assert machine.other_gpu_warning(h200, cpu) is None  # a CPU run checks logic, not timings


def test_the_fit_check_is_against_the_hosts_ram_not_the_profiles_memory(cache_home):
    # the profile says 100 kB; the tiny run needs more, and the host has it
    config = make_config([*TINY, *SMALL, "hardware.memory_bytes=1e5"])
    run = execute(config, "sync")
    fit = run.trace.other_data["device_fit"]
    assert fit["fits"] and fit["bytes_needed"] > 1e5
    assert fit["bytes_available"] > 1e9  # host RAM, not hardware.memory_bytes
    big = make_config([*TINY[:2], "engine=sync", "model=llama3_70b", *SMALL])
    with pytest.raises(ConfigError, match="RAM available") as info:
        execute(big, "sync")
    assert "hardware.memory_bytes" not in str(info.value)


def test_a_recording_carries_its_machine_and_its_floor_uses_the_measured_rate(cache_home, tmp_path):
    config = make_config([*TINY, *SMALL])
    trace = execute(config, "sync").trace
    trace.other_data["config"] = asdict(config)  # as the app records it
    back = read_trace(write_trace(trace, tmp_path / "t.json.gz"))  # the reader accepts it
    hw = back.other_data["hardware"]
    assert hw["basis"] == "device" and hw["copy_bytes_per_s"] > 0 and hw["host_cores"] >= 1
    m = compute_metrics(back)
    assert m["hbm_floor_basis"] == "measured copy rate"
    assert m["hbm_floor_tbps"] == pytest.approx(hw["copy_bytes_per_s"] / 1e12)
    by_copy = m["hbm_tbps_mean"] * 1e12 / hw["copy_bytes_per_s"]
    assert m["hbm_floor_fraction"] == pytest.approx(by_copy)
