"""python -m cbsim, and the ``cbsim`` command: ``--version`` here, everything else in cbsim.app."""

import sys

from cbsim import __version__
from cbsim.app import main as run


def main() -> int | None:
    if "--version" in sys.argv[1:]:
        print(f"cbsim {__version__}")
        return 0
    return run()


if __name__ == "__main__":
    sys.exit(main())
