"""mode.skinny_gemm on CUDA (marker gpu): the decode graphs' layer GEMMs on the Triton kernel, in
a bf16 model whose shapes it takes; async == sync with it on, the tokens those of cuBLAS's
graphs up to a rare bf16 argmax flip, and the trace saying which rule ran."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from test_runtime_gpu import GPU, MID  # noqa: E402
from test_runtime_sync import CASES, assert_same_tokens  # noqa: E402

from cbsim.runtime.engine import execute  # noqa: E402


def test_skinny_gemms_in_the_decode_graphs_keep_the_tokens(config_factory):
    over = GPU + MID + CASES["staggered"] + ["engine.graph_batch_sizes=[1,2,4,8]"]
    on = over + ["mode.skinny_gemm.enabled=true"]
    off = execute(config_factory(over + ["engine=sync"]), "sync")
    sync = execute(config_factory(on + ["engine=sync"]), "sync")
    asyn = execute(config_factory(on + ["engine=async"]), "async")
    assert_same_tokens(asyn, sync.outputs)
    same = [np.array_equal(sync.outputs[k], v) for k, v in off.outputs.items()]
    assert np.mean(same) >= 0.75, same
    rule = sync.trace.other_data["skinny_gemm"]
    assert (
        rule["max_rows"] == 128
        and rule["sms"] == torch.cuda.get_device_properties(0).multi_processor_count
    )
    assert off.trace.other_data["skinny_gemm"] is None
    assert sync.summary["graph_steps"] > 0
