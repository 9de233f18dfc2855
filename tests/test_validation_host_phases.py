"""The host phases a validation prints: recorded over simulated mean per step, phase by phase.
A profile against the probes it was made from sits inside SAME_HOST in every phase; against a
separate machine's separate processes it does not, and the validation says so."""

from __future__ import annotations

from conftest import REPO, compose_cfg, load_config

from cbsim.validation.host_phases import PHASES, SAME_HOST, host_phase_lines
from cbsim.validation.tasks import run_validation_task

PROBES = REPO / "cbsim" / "profiles" / "h200_profiled" / "probes"
H100 = REPO / "experiments" / "recordings" / "h100" / "heldout" / "r1"


def validate(traces, tmp_path, *more: str) -> dict:
    cfg = load_config(
        compose_cfg(
            [
                "+experiment=validate",
                f"trace=[{','.join(map(str, traces))}]",
                "extra.holdout=profile",
                "extra.targets=null",
                "mode.bands=false",
                "extra.report=false",
                "output.print_table=false",
                *more,
            ]
        )
    )
    return run_validation_task(cfg, {}, tmp_path)


def test_the_probes_a_profile_was_made_from_are_its_host(tmp_path):
    traces = sorted(PROBES.glob("*/trace_*.json.gz"))
    got = validate(traces, tmp_path, "hardware=h200_profiled", f"extra.recordings={PROBES}")
    got = got["host_phases"]
    assert list(got) == list(PHASES)
    for phase, v in got.items():
        assert SAME_HOST[0] <= v["ratio_median"] <= SAME_HOST[1], (phase, v)
        assert v["runs"] == len(traces)
    assert not any("off by" in line for line in host_phase_lines(got))


def test_another_machines_processes_are_named_phase_by_phase(tmp_path):
    traces = sorted((H100 / "8b_32x256+1024").glob("trace_*.json.gz"))
    tables = REPO / "cbsim" / "kernel_tables" / "h100"
    got = validate(
        traces,
        tmp_path,
        "hardware=h200_profiled",
        f"hardware.kernel_table={tables}",
        "extra.report=true",
    )
    phases = got["host_phases"]
    assert phases["schedule"]["ratio_median"] > SAME_HOST[1]
    assert phases["prepare"]["ratio_median"] > SAME_HOST[1]
    lines = host_phase_lines(phases)
    assert lines[0].startswith("host phases") and "schedule" in lines[-1]
    assert "+experiment=profile_machine" in lines[-1]
    page = (tmp_path / "validation.html").read_text()
    assert 'id="host"' in page and '<td class="bad">x3.' in page
