"""mode.skinny_gemm: the decode graphs' layer GEMMs on cbsim's Triton kernel, in both back ends."""

from __future__ import annotations

from dataclasses import dataclass

from cbsim.config.errors import ConfigError, check_range


@dataclass
class SkinnyGemmConfig:
    """runtime/kernels/skinny_gemm.py for the q/k/v, o, gate/up and down GEMMs of the decode
    graphs (not the LM head, not steps with prompt tokens); the simulator prices them from the
    kernel table's ``triton`` gemm rows (what the profile measured with this rule)."""

    enabled: bool = False
    # graphs of at most this many requests; larger ones keep mode.graph_blas
    max_rows: int = 128
    # each program streams block_k columns of its weight rows a pipeline stage
    block_k: int = 128
    stages: int = 4
    warps: int = 4
    # the widest column tile (64, 32, 16) that still gives each SM this many programs or more
    programs_per_sm: float = 1.0

    def __post_init__(self) -> None:
        check_range("mode.skinny_gemm.max_rows", self.max_rows, 1, 128)
        if self.block_k not in (32, 64, 128, 256):
            raise ConfigError(f"mode.skinny_gemm.block_k={self.block_k}; allowed: 32, 64, 128, 256")
        check_range("mode.skinny_gemm.stages", self.stages, 1, 8)
        if self.warps not in (1, 2, 4, 8):
            raise ConfigError(f"mode.skinny_gemm.warps={self.warps}; allowed: 1, 2, 4, 8")
        check_range("mode.skinny_gemm.programs_per_sm", self.programs_per_sm, 0.125, 16)
