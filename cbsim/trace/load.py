"""Reading a JSON file with bounds: size, decompressed size, nesting; every failure a TraceError.

A gzip body is first streamed through without keeping it, counting its decompressed bytes: a
file that expands past the limit (a gzip bomb) is refused after reading ``max_bytes`` of it,
holding one chunk in memory; a corrupt or truncated body is refused the same way. Only a file
within the limit is decompressed again and parsed.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

from cbsim.trace.errors import TraceError

# Larger files (uncompressed) are refused before parsing; the seed workload's full trace is
# about 40 MB.
DEFAULT_MAX_BYTES = 256 << 20
# Files with more events are refused before parsing (counted as "ph" keys in the text): a
# parsed event and its row in the span table take about 1.6 KB, so a trace at this limit is
# read and measured in about 1.6 GB and 30 s (benchmarks/bench_trace_read.py); a 16K-step
# simulation writes about 150K events.
DEFAULT_MAX_EVENTS = 1_000_000
CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"


def load_json(
    path: str | os.PathLike[str],
    max_bytes: int = DEFAULT_MAX_BYTES,
    what: str = "trace",
    max_events: int = DEFAULT_MAX_EVENTS,
) -> Any:
    """Parse a JSON file, gzip or not, refusing it over the size limit (before or after
    decompression) or the event limit; every failure is a TraceError naming the file and the
    reason."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such {what} file")
    size = path.stat().st_size
    if size > max_bytes:
        raise TraceError(
            f"{path}: {size} bytes is over the limit of {max_bytes} bytes "
            f"(max_bytes; a {what} of that size would not fit in memory once parsed)"
        )
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == GZIP_MAGIC
        raw = _gunzip(path, max_bytes) if gz else path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    events = raw.count(b'"ph"')
    if events > max_events:
        raise TraceError(
            f"{path}: about {events} events is over the limit of {max_events} (max_events; "
            f"reading it would take about {events * 1.6e3 / 1e9:.1f} GB)"
        )
    return parse_json(raw, str(path))


def _gunzip(path: Path, max_bytes: int) -> bytes:
    """The decompressed bytes, after a first pass that keeps none of them and checks the size
    and the integrity of every member."""
    _stream(path, max_bytes, keep=False)
    return _stream(path, max_bytes, keep=True)


def _stream(path: Path, max_bytes: int, keep: bool) -> bytes:
    out: list[bytes] = []
    total = 0
    d = zlib.decompressobj(wbits=31)
    with open(path, "rb") as f:
        pending = b""
        while True:
            data = pending or f.read(CHUNK)
            if not data and (d.eof or not _drain(d)):
                break  # the file is read and zlib holds no more output
            if data and d.eof:  # a gzip file may hold several members, one after the other
                if not data.strip(b"\0"):  # zero padding after the last one
                    pending = b""
                    continue
                d = zlib.decompressobj(wbits=31)
            try:
                piece = d.decompress(data, CHUNK)
            except zlib.error as exc:
                raise TraceError(f"{path}: corrupt gzip data ({exc})") from None
            total += len(piece)
            if total > max_bytes:
                raise TraceError(
                    f"{path}: over {max_bytes} bytes uncompressed, the limit (max_bytes); "
                    "refused before reading the rest"
                )
            if keep:
                out.append(piece)
            pending = d.unused_data if d.eof else d.unconsumed_tail
    if not d.eof:
        raise TraceError(f"{path}: corrupt gzip data (truncated: the file ends mid-stream)")
    return b"".join(out)


def _drain(d: Any) -> bool:
    """Whether zlib still holds output for input it has consumed (a match longer than the
    last output chunk); the next decompress call gives it."""
    return bool(d.copy().decompress(b"", 1))


def parse_json(raw: bytes, where: str) -> Any:
    """json.loads with its failures as TraceErrors (bad syntax, bad UTF-8, nesting too deep)."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{where}: not JSON ({exc})") from None
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply to be a trace") from None
    except MemoryError:
        raise TraceError(f"{where}: not enough memory to parse it") from None
