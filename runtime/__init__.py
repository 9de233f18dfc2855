"""The real engine on the GPU (imported as cbsim.runtime; needs the `runtime` extra)."""
