"""The one error every trace reader raises."""

from __future__ import annotations


class TraceError(ValueError):
    """A trace file that cannot be used, with the reason (the message names the file)."""
