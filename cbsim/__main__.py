"""python -m cbsim: see cbsim.app."""

from cbsim.app import main

if __name__ == "__main__":
    main()
