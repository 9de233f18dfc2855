"""cbsim: will overlapping CPU batch preparation with GPU compute pay? Simulated and measured."""

__version__ = "0.1.0"
