"""A GPU kernel's category from its name: attention, GEMM, copy, elementwise, other.

Kernel names are library templates (``sm90_xmma_gemm_bf16...``, ``nvjet_hsh_...``,
``fmha_cutlassF...``, ``cudnn_generated_fort_native_sdpa...``, ``void at::native::
vectorized_elementwise_kernel<...>``, Triton's ``triton_poi_fused_...``): the category is what
an engineer reads them as. Attention is tested first (its kernels are GEMMs inside), then GEMM,
then copies, then elementwise; a name none of them matches is "other".
"""

from __future__ import annotations

import re

CATEGORIES = ("attention", "GEMM", "copy", "elementwise", "other")

_RULES = (
    (
        "attention",
        r"attn|attention|flash|fmha|sdpa|mha_|_mha|paged|decode_kernel|flashinfer|"
        r"softmax_warp",
    ),
    ("GEMM", r"gemm|matmul|mm_|_mm\b|cutlass|cublas|xmma|nvjet|wgmma|s16816|splitk|dot_"),
    ("copy", r"memcpy|memset|copy|cat_|catarray|transpose|permute|contiguous"),
    (
        "elementwise",
        r"elementwise|vectorized|reduce|norm|rope|rotary|silu|gelu|act_|add|mul|index|gather|"
        r"scatter|argmax|topk|sort|fill|triton_|sampl|embedding|where|exp|div",
    ),
)
_COMPILED = tuple((name, re.compile(pattern, re.IGNORECASE)) for name, pattern in _RULES)


def kernel_category(name: str, cat: str = "kernel") -> str:
    """The category of a kernel (``cat`` "kernel") or a profiler copy (gpu_memcpy/memset)."""
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "copy"
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return "other"
