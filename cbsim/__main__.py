"""python -m cbsim: see cbsim.app."""

import sys

from cbsim.app import main

if __name__ == "__main__":
    sys.exit(main())
