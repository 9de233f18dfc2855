# Sourced by the device-call scripts, from the repo root with the wheels in .whl: the wheels the
# device image lacks (hydra, omegaconf, simpy, plotly) and this checkout installed into
# /tmp/site, and PYTHONPATH set to it. Its status is the installs': `source ... || exit 1`.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . &&
  export PYTHONPATH=/tmp/site
