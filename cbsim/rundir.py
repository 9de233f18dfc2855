"""A run directory: its file names, atomic writes, the finished marker and the lock.

Ground floor (imports nothing of cbsim), so the app, the sweep, the trace writer and the reports
share one set of names and one way to write. A run is finished when its marker, written last,
names every file the run wrote with its checksum and those files still match: resume trusts only
what it can verify. A run holds the directory's lock while it writes, so a second run into the
same directory fails at once instead of mixing its files with the first one's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

METRICS_FILE = "metrics.json"
JOB_CONFIG_FILE = "job_config.json"
REPORT_FILE = "report.html"
# written last: the run's config and every file it wrote with its sha256
FINISHED_FILE = "finished.json"
LOCK_FILE = ".cbsim.lock"
PARTIAL = "_partial"
SUMMARY_FILE = "summary.csv"
COMPARISON_FILE = "comparison.csv"
SWEEP_HTML = "sweep.html"
# the sweep directory's record of which sweep it holds (its settings and job list)
SWEEP_FILE = ".cbsim_sweep.json"
# everything cbsim writes into a run directory: an earlier run's copies are removed before a
# new run starts there (Hydra's own .hydra/ is rewritten by Hydra itself)
RUN_OUTPUT_GLOBS = (
    FINISHED_FILE,
    METRICS_FILE,
    JOB_CONFIG_FILE,
    REPORT_FILE,
    "trace*.json",
    "trace*.json.gz",
)


_UMASK = os.umask(0o022)
os.umask(_UMASK)


class RunDirError(RuntimeError):
    """A run directory that cannot be used as asked; the message names it and why."""


def trace_name(engine: str, single: bool, gzip: bool, partial: bool = False) -> str:
    """trace.json for a one-engine run, trace_<engine>.json for a comparison; *_partial for a
    run that was interrupted (its trace so far, never under the final name)."""
    stem = "trace" if single else f"trace_{engine}"
    return stem + (PARTIAL if partial else "") + ".json" + (".gz" if gzip else "")


# --- atomic writes: a temporary name in the same directory, fsync, rename ---


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """A file object whose contents appear under ``path`` only if the block ends normally.

    An exception (or Ctrl-C) inside the block leaves nothing under the final name and removes
    the temporary file; a reader never sees a half-written file.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would create it (mkstemp makes it private)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (a crash after it keeps the new name)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    with atomic_open(path, "wb") as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Indented, key-sorted JSON (identical runs write identical bytes)."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


# --- the finished marker ---


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def config_digest(config: Any) -> str:
    """sha256 of the config as canonical JSON: the same config, the same digest."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def write_finished(
    run_dir: Path, config: Any, files: Iterable[str], job: dict[str, Any] | None = None
) -> Path:
    """The marker, written last: the digest of the run's resolved config and every file the
    run wrote with its size and sha256; ``job``: a sweep job's number and overrides (what the
    sweep's summary reads, without parsing Hydra's YAML)."""
    run_dir = Path(run_dir)
    listed = {
        name: {"bytes": (run_dir / name).stat().st_size, "sha256": file_digest(run_dir / name)}
        for name in sorted(set(files))
    }
    marker: dict[str, Any] = {"config_sha256": config_digest(config), "files": listed}
    if job is not None:
        marker["job"] = job
    return atomic_write_json(run_dir / FINISHED_FILE, marker)


def read_finished(run_dir: Path, config: Any = None, verify: bool = True) -> dict[str, Any] | None:
    """The marker of a run finished in ``run_dir`` (with this very config unless None), or None.

    None as well when any file it names is missing or changed (``verify``: checksums; without
    it sizes only, for a quick count of a large sweep).
    """
    run_dir = Path(run_dir)
    try:
        marker = json.loads((run_dir / FINISHED_FILE).read_text())
        files = marker["files"]
        if config is not None and marker["config_sha256"] != config_digest(config):
            return None
        for name, meta in files.items():
            path = run_dir / name
            if "/" in name or name.startswith(".") or path.stat().st_size != meta["bytes"]:
                return None
            if verify and file_digest(path) != meta["sha256"]:
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return marker if isinstance(marker, dict) else None


def read_json(path: Path) -> Any:
    """A JSON file's contents, or None when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def finished_metrics(run_dir: Path, config: Any = None, verify: bool = True) -> dict | None:
    """metrics.json of a verified finished run, else None."""
    marker = read_finished(run_dir, config, verify)
    if marker is None or METRICS_FILE not in marker["files"]:
        return None
    metrics = read_json(Path(run_dir) / METRICS_FILE)
    return metrics if isinstance(metrics, dict) else None


def clear_run_outputs(run_dir: Path) -> list[str]:
    """Remove what an earlier run left here: cbsim's outputs and every file its marker names
    (the marker first, so nothing reads as finished meanwhile); returns the names removed."""
    run_dir = Path(run_dir)
    marker = read_json(run_dir / FINISHED_FILE)
    listed = marker.get("files") if isinstance(marker, dict) else None
    named = [glob.escape(n) for n in listed if "/" not in n] if isinstance(listed, dict) else []
    removed = []
    for pattern in (*RUN_OUTPUT_GLOBS, *named):
        for path in sorted(run_dir.glob(pattern)):
            if path.is_file():
                path.unlink()
                removed.append(path.name)
    for tmp in run_dir.glob(".*.tmp"):  # an atomic write cut short by a kill -9
        tmp.unlink(missing_ok=True)
    return removed


# --- the lock ---


def check_not_busy(run_dir: Path) -> None:
    """Raise RunDirError when a run holds ``run_dir``'s lock now (a quick look: taken and
    released at once; the run itself takes the lock for good)."""
    if (Path(run_dir) / LOCK_FILE).is_file():
        RunLock(run_dir).acquire().release()


class RunLock:
    """An exclusive lock on a run directory while a run writes into it (fcntl, released by the
    kernel when the process dies, so a killed run never leaves the directory locked)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        path = self.run_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise RunDirError(
                    f"run directory {self.run_dir} is in use by another run (pid {holder}); "
                    "allowed: wait for it, or another hydra.run.dir"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
