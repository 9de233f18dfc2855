"""``Bench``: the run's state (common.py) with every section as a method, so the entry script's
``--sections`` names call ``getattr(bench, name)()``."""

from __future__ import annotations

from benchmarks.decode.check import CheckSection
from benchmarks.decode.common import BenchBase
from benchmarks.decode.env import EnvSection
from benchmarks.decode.gemm import GemmSection
from benchmarks.decode.hf_static import HFStatic
from benchmarks.decode.kernel import KernelSection
from benchmarks.decode.launches import LaunchSection
from benchmarks.decode.model import ModelSection
from benchmarks.decode.model_checks import ModelChecks
from benchmarks.decode.skinny import SkinnySection


class Bench(
    EnvSection,
    CheckSection,
    KernelSection,
    LaunchSection,
    GemmSection,
    SkinnySection,
    ModelSection,
    ModelChecks,
    HFStatic,
    BenchBase,
):
    """One benchmark run: sections env, check, kernel, launches, gemm, skinny, model (and table)."""
