"""The argument parser of cbsim's small command-line tools (cbsim.report, cbsim.trace.kineto,
cbsim.sweep, cbsim.sweep.grid): argparse's help, and a wrong argument as one line and exit 2
instead of a usage block."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the tool and pointing to --help."""

    def __init__(self, prog: str, doc: str | None, **kwargs) -> None:
        super().__init__(
            prog=prog,
            description=(doc or "").strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kwargs,
        )

    def error(self, message: str) -> None:  # type: ignore[override]
        raise SystemExit(self.fail(message))

    def fail(self, message: str) -> int:
        """Print the one line; the exit code to return."""
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        return 2

    def parse(self, argv: list[str] | None) -> argparse.Namespace | int:
        """The parsed arguments, or the exit code when --help or an error ended the parse."""
        try:
            return self.parse_args(argv)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 2


class Once(argparse.Action):
    """An option given at most once (a second ``-o`` is a mistake, not an override)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if getattr(namespace, f"_seen_{self.dest}", False):
            parser.error(f"{option_string} given twice")
        setattr(namespace, f"_seen_{self.dest}", True)
        setattr(namespace, self.dest, values)


def writable_file(value: str) -> Path:
    """An output file that can be written (its folder, or the nearest one there to create it
    in), checked before any work."""
    path = Path(value)
    if path.is_dir() or value.endswith(("/", "\\")):
        raise argparse.ArgumentTypeError(f"{value} is a directory; give a file name")
    folder = path.absolute().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: {folder} is a file, not a directory")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{value}: cannot write into {folder}")
    return path


def existing_file(value: str) -> Path:
    """An input file that is there (a directory or a typo ends the command before any work)."""
    path = Path(value)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "no such file"
        raise argparse.ArgumentTypeError(f"{value}: {what}")
    return path


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value}: a whole number >= 1")
    return n
