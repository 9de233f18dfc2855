# Hydra configs, shipped as the package cbsim.conf (pyproject maps this folder) and found
# through pkg://cbsim.conf from any working directory and from a non-editable install.
