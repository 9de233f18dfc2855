"""The compact recorded set shipped as package data: the same files as the recording it copies,
and what the default recordings directory falls back to where a working directory has none."""

from __future__ import annotations

import filecmp

from conftest import REPO, compose_cfg

from cbsim.calibration.recordings import (
    DEFAULT_RECORDINGS,
    PACKAGED_RECORDINGS,
    describe_root,
    recordings_root,
    resolve_traces,
)
from cbsim.config.store import load_config

SOURCE = REPO / "experiments" / "runtime"


def test_the_packaged_set_equals_the_recordings_it_copies():
    shipped = sorted(p.relative_to(PACKAGED_RECORDINGS) for p in PACKAGED_RECORDINGS.rglob("*.*"))
    shipped = [p for p in shipped if p.name != "README.md"]
    assert shipped, "no packaged recordings"
    for rel in shipped:
        assert filecmp.cmp(PACKAGED_RECORDINGS / rel, SOURCE / rel, shallow=False), rel
    # every trace and manifest of the recording is there
    for session in {rel.parts[0] for rel in shipped}:
        copied = {p for p in shipped if p.parts[0] == session}
        recorded = {p.relative_to(SOURCE) for p in (SOURCE / session).rglob("trace_*.json.gz")}
        assert (
            recorded | {p.relative_to(SOURCE) for p in (SOURCE / session).glob("manifest.yaml")}
            == copied
        )


def test_the_default_validation_reads_only_packaged_traces(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no experiments/runtime here
    root = recordings_root(None)
    assert root == PACKAGED_RECORDINGS == recordings_root(DEFAULT_RECORDINGS)
    assert "shipped with cbsim" in describe_root(root)
    for experiment in ("validate", "calibrate"):
        cfg = load_config(compose_cfg([f"+experiment={experiment}"]))
        assert resolve_traces(list(cfg.trace), recordings_root(cfg.extra["recordings"]))
    # another directory asked for by name is not replaced
    assert recordings_root("elsewhere") == tmp_path / "elsewhere"
    # from a checkout the checkout's recordings are used
    monkeypatch.chdir(REPO)
    assert recordings_root(None) == REPO / DEFAULT_RECORDINGS
    assert describe_root(recordings_root(None)) == f"recordings: {REPO / DEFAULT_RECORDINGS}"
