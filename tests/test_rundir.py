"""Run directories: atomic writes, the verified finished marker, the lock, stale outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cbsim import rundir
from cbsim.rundir import (
    FINISHED_FILE,
    RunDirError,
    RunLock,
    atomic_open,
    atomic_write_json,
    atomic_write_text,
    clear_run_outputs,
    finished_metrics,
    read_finished,
    trace_name,
    write_finished,
)


def test_trace_names():
    assert trace_name("async", True, False) == "trace.json"
    assert trace_name("sync", False, True) == "trace_sync.json.gz"
    assert trace_name("sync", False, True, partial=True) == "trace_sync_partial.json.gz"
    assert trace_name("async", True, False, partial=True) == "trace_partial.json"


def test_an_interrupted_write_leaves_nothing_under_the_final_name(tmp_path):
    target = tmp_path / "metrics.json"
    with pytest.raises(KeyboardInterrupt), atomic_open(target) as f:
        f.write(b'{"half": ')
        raise KeyboardInterrupt
    assert not target.exists()
    assert list(tmp_path.iterdir()) == [], "the temporary file is removed too"
    atomic_write_text(target, "old")
    with pytest.raises(ValueError), atomic_open(target) as f:
        f.write(b"new, half")
        raise ValueError
    assert target.read_text() == "old", "a failed rewrite keeps the previous file whole"


def test_finished_marker_is_trusted_only_while_its_files_match(tmp_path):
    atomic_write_json(tmp_path / "metrics.json", {"total_time_s": 1.0})
    atomic_write_text(tmp_path / "trace.json", "[]")
    write_finished(tmp_path, {"a": 1}, ["metrics.json", "trace.json"])
    assert read_finished(tmp_path, {"a": 1}) is not None
    assert finished_metrics(tmp_path, {"a": 1}) == {"total_time_s": 1.0}
    assert read_finished(tmp_path, {"a": 2}) is None, "another config is not this run"
    (tmp_path / "trace.json").write_text("{}")  # same size, other bytes
    assert read_finished(tmp_path, {"a": 1}, verify=False) is not None
    assert read_finished(tmp_path, {"a": 1}) is None, "the checksum no longer matches"
    (tmp_path / "trace.json").unlink()
    assert read_finished(tmp_path, {"a": 1}, verify=False) is None
    (tmp_path / FINISHED_FILE).write_text("{not json")
    assert read_finished(tmp_path) is None


def test_clear_removes_an_earlier_runs_outputs_only(tmp_path):
    for name in ("trace_sync.json", "trace_async_partial.json.gz", "metrics.json", FINISHED_FILE):
        (tmp_path / name).write_text("x")
    (tmp_path / ".metrics.json.abc.tmp").write_text("x")
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ".hydra").mkdir()
    removed = clear_run_outputs(tmp_path)
    assert removed[0] == FINISHED_FILE, "the marker goes first"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hydra", "notes.txt"]


def test_a_second_lock_on_the_same_directory_fails_naming_it(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunDirError, match="is in use by another run"):
            RunLock(tmp_path).acquire()
        # another process is refused as well
        code = (
            "import sys; from cbsim.rundir import RunLock, RunDirError\n"
            f"try: RunLock({str(tmp_path)!r}).acquire()\n"
            "except RunDirError as e: print(e); sys.exit(3)\n"
        )
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert other.returncode == 3 and str(tmp_path) in other.stdout
    with RunLock(tmp_path):  # released: free again
        pass


def test_the_lock_dies_with_its_process(tmp_path):
    code = f"from cbsim.rundir import RunLock; RunLock({str(tmp_path)!r}).acquire(); import os; os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True)
    with RunLock(tmp_path):
        pass


def test_json_is_key_sorted_and_stable(tmp_path):
    a = atomic_write_json(tmp_path / "a.json", {"b": 1, "a": 2}).read_text()
    assert a.index('"a"') < a.index('"b"') and json.loads(a) == {"a": 2, "b": 1}
    assert rundir.read_json(tmp_path / "missing.json") is None
