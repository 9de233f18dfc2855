"""python -m cbsim.sweep SWEEP_DIR [--min-speedup X]: (re)write summary.csv and sweep.html.

For a sweep whose last run did not reach its end (a failed job stops a Hydra multirun before the
callback runs), or to redraw with another threshold.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cbsim.config.cli import Parser
from cbsim.sweep.outputs import write_summary


def main(argv: list[str] | None = None) -> int:
    parser = Parser("python -m cbsim.sweep", __doc__)
    parser.add_argument("sweep_dir", type=Path, metavar="SWEEP_DIR", help="a multirun directory")
    parser.add_argument(
        "--min-speedup",
        type=float,
        default=1.05,
        help="the speedup above which async counts as paying (default 1.05)",
    )
    parser.add_argument("--no-html", action="store_true", help="only the CSV files")
    args = parser.parse(argv)
    if isinstance(args, int):
        return args
    if not args.sweep_dir.is_dir():
        print(f"cbsim.sweep: {args.sweep_dir}: no such directory", file=sys.stderr)
        return 2
    result = write_summary(args.sweep_dir, html=not args.no_html, min_speedup=args.min_speedup)
    print(
        f"{result.finished}/{len(result.jobs)} jobs finished: {result.summary}"
        + (f", {result.html}" if result.html else "")
    )
    print(result.verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
