"""Reading a JSON file with bounds: size, decompressed size, nesting; every failure a TraceError.

A gzip body is first streamed through without keeping it, counting its decompressed bytes: a
file that expands past the limit (a gzip bomb) is refused after reading ``max_bytes`` of it,
holding one chunk in memory; a corrupt or truncated body is refused the same way. Only a file
within the limit is decompressed again and parsed.

``stream_object`` reads a file too large to parse whole (a Kineto trace of 10^7 events): the
elements of one top-level list are decoded one at a time from a buffer of about one chunk and
handed to a callback, never kept; the other top-level keys come back whole.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import re
import zlib
from collections.abc import Callable, Iterator
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
    for _ in gunzip_pieces(path, max_bytes):
        pass
    return b"".join(gunzip_pieces(path, max_bytes))


def read_pieces(path: Path, max_bytes: int, chunk: int = CHUNK) -> Iterator[bytes]:
    """A file's bytes, decompressed when it is gzip, one piece of at most ``chunk`` bytes at a
    time: a reader that keeps none of them holds one piece. Past ``max_bytes`` (decompressed)
    it stops with a TraceError before reading the rest."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        gz = f.read(2) == GZIP_MAGIC
    if gz:
        yield from gunzip_pieces(path, max_bytes, chunk)
        return
    if size > max_bytes:
        raise TraceError(f"{path}: {size} bytes is over the limit of {max_bytes} (max_bytes)")
    with open(path, "rb") as f:
        while piece := f.read(chunk):
            yield piece


def gunzip_pieces(path: Path, max_bytes: int, chunk: int = CHUNK) -> Iterator[bytes]:
    """The decompressed pieces of a gzip file (every member); a corrupt or truncated body, or
    one that expands past ``max_bytes``, ends in a TraceError when it is reached."""
    total = 0
    d = zlib.decompressobj(wbits=31)
    with open(path, "rb") as f:
        pending = b""
        while True:
            data = pending or f.read(chunk)
            if not data and (d.eof or not _drain(d)):
                break  # the file is read and zlib holds no more output
            if data and d.eof:  # a gzip file may hold several members, one after the other
                if not data.strip(b"\0"):  # zero padding after the last one
                    pending = b""
                    continue
                d = zlib.decompressobj(wbits=31)
            try:
                piece = d.decompress(data, chunk)
            except zlib.error as exc:
                raise TraceError(f"{path}: corrupt gzip data ({exc})") from None
            total += len(piece)
            if total > max_bytes:
                raise TraceError(
                    f"{path}: over {max_bytes} bytes uncompressed, the limit (max_bytes); "
                    "refused before reading the rest"
                )
            if piece:
                yield piece
            pending = d.unused_data if d.eof else d.unconsumed_tail
    if not d.eof:
        raise TraceError(f"{path}: corrupt gzip data (truncated: the file ends mid-stream)")


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


# A JSON value cut by the end of a chunk fails to decode with one of these, or at most this many
# characters before the end of the text read so far: the reader reads on and decodes it again.
_CUT_MESSAGES = ("Unterminated string", "Invalid \\uXXXX escape")
_CUT_MARGIN = 32
# one value (an event, or a top-level key's value other than the streamed list) longer than
# this is refused: a stream reader that held it would hold the file
MAX_VALUE_CHARS = 64 << 20
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER_TAIL = re.compile(r"[0-9.eE+-]*")
_SEP = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_VALUE_START = set('[{"-0123456789tfnNI')


class _Text:
    """The decoded text of a byte stream, read on demand: ``buf[pos:]`` is what is not yet
    parsed, and the consumed part is dropped whenever more is read."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self.pieces = pieces
        self.utf8 = codecs.getincrementaldecoder("utf-8-sig")()
        self.buf, self.pos, self.base, self.eof = "", 0, 0, False

    def more(self) -> bool:
        """Read the next piece onto the unparsed text; False at the end of the stream."""
        while not self.eof:
            piece = next(self.pieces, None)
            try:
                text = self.utf8.decode(piece or b"", final=piece is None)
            except UnicodeDecodeError as exc:
                raise self.error(f"not UTF-8 ({exc.reason})") from None
            self.eof = piece is None
            if text:
                self.base += self.pos
                self.buf, self.pos = self.buf[self.pos :] + text, 0
                return True
        return False

    def peek(self) -> str:
        """The next character that is not whitespace, not consumed ('' at the end)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""

    def take(self, allowed: str, what: str) -> str:
        c = self.peek()
        if not c or c not in allowed:
            raise self.error(f"expected {what}, found {repr(c) if c else 'the end of the file'}")
        self.pos += 1
        return c

    def value(self) -> Any:
        """Decode the JSON value at the position, reading on while it is cut by the end of
        the text read so far."""
        self.peek()
        while True:
            try:
                v, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                cut = exc.msg.startswith(_CUT_MESSAGES) or exc.pos >= len(self.buf) - _CUT_MARGIN
                if cut and len(self.buf) - self.pos > MAX_VALUE_CHARS:
                    raise self.error(f"a value of over {MAX_VALUE_CHARS} characters") from None
                if cut and self.more():
                    continue
                self.pos = exc.pos
                raise self.error(exc.msg) from None
            except RecursionError:
                raise self.error("nested too deeply to be a trace") from None
            # a number may go on in the next piece ("1" of "1.5", of "1e5")
            cut = isinstance(v, (int, float)) and _NUMBER_TAIL.fullmatch(self.buf, end)
            if not cut or not self.more():
                self.pos = end
                return v

    def error(self, msg: str) -> TraceError:
        return TraceError(f"not JSON ({msg} at character {self.base + self.pos})")


def stream_object(
    pieces: Iterator[bytes],
    key: str,
    on_item: Callable[[int, Any], None],
    on_value: Callable[[str, Any], None] | None = None,
    max_items: int | None = None,
) -> tuple[dict[str, Any], int | None]:
    """Parse a JSON object from a stream of bytes, handing each element of its list ``key`` to
    ``on_item(index, element)`` as it is read, without keeping them; each other top-level value
    goes to ``on_value(key, value)`` as soon as it is read (to refuse a file early). Returns
    the other top-level keys and the number of elements, None when ``key`` is no list. A file
    that is not such an object, or past ``max_items`` elements, ends in a TraceError (before
    the rest is read)."""
    t = _Text(pieces)
    first = t.peek()
    if first != "{":
        if first in _VALUE_START:
            raise TraceError(f'expected a JSON object with a "{key}" list')
        raise t.error("expected a value") if first else TraceError("not JSON (an empty file)")
    t.pos += 1
    others: dict[str, Any] = {}
    count: int | None = None
    if t.peek() == "}":
        t.pos += 1
    else:
        while True:
            if t.peek() != '"':
                t.take('"', "a key in double quotes")
            name = t.value()
            t.take(":", "':'")
            if name == key and count is not None:
                raise TraceError(f'"{key}" is given twice')
            if name == key and t.peek() == "[":
                count = _stream_list(t, key, on_item, max_items)
            else:
                others[name] = t.value()
                if on_value is not None:
                    on_value(name, others[name])
            if t.take(",}", "',' or '}' after a value") == "}":
                break
    if t.peek():
        raise t.error("extra data after the top-level object")
    return others, count


def _stream_list(
    t: _Text, key: str, on_item: Callable[[int, Any], None], max_items: int | None
) -> int:
    """Hand each element of the list at the position to ``on_item``; the number of them."""
    t.pos += 1  # the '['
    if t.peek() == "]":
        t.pos += 1
        return 0
    limit = math.inf if max_items is None else max_items
    scan = _DECODER.scan_once
    n = 0
    while True:
        if n >= limit:
            raise TraceError(
                f'over {max_items} elements in "{key}", the limit (max_events); refused '
                "before reading the rest"
            )
        try:  # the fast path: the element and the separator after it are in the text read
            item, end = scan(t.buf, t.pos)
            sep = _SEP.match(t.buf, end)
        except (StopIteration, ValueError, RecursionError):
            sep = None
        if sep is None:  # cut by the end of the text read, or not JSON: the careful path
            item = t.value()
            last = t.take(",]", f"',' or ']' after an element of \"{key}\"") == "]"
        else:
            t.pos, last = sep.end(), sep.group(1) == "]"
        on_item(n, item)
        n += 1
        if last:
            return n
