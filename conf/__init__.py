# Hydra configs, shipped as the package cbsim.conf (pyproject maps this folder) and found
# through pkg://cbsim.conf from any working directory and from a non-editable install.

import warnings

# conf/config.yaml's hydra.searchpath names the user profile directory (~/.config/cbsim); until a
# profile is installed there it does not exist, which is normal, not worth a warning per run
warnings.filterwarnings(
    "ignore", message=r"provider=hydra\.searchpath in main, path=.* is not available"
)
