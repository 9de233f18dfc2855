"""transformers' own continuous batching (`generate_batch`, paged|sdpa, CUDA graphs) under
torch.profiler on a GPU: a timeline of an engine not written here, for the Kineto importer.

    PYTHONUNBUFFERED=1 python experiments/kineto/profile_transformers_cb.py OUT.json.gz

Llama-3.2-1B shape, seeded random weights (bf16), 8 prompts of 64 tokens, 24 new tokens each, sync
batching. Then `python -m cbsim.trace.kineto OUT.json.gz trace.json.gz` and
`python -m cbsim.report trace.json.gz`.
"""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_anchor import make_config  # noqa: E402


def main() -> None:
    from torch.profiler import ProfilerActivity, profile
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from cbsim.runtime.model import build_model
    from cbsim.workload import make_requests

    out = Path(sys.argv[1])
    config = make_config(
        [
            "mode=runtime",
            "model=llama3_1b",
            "workload.batch_size=8",
            "workload.prompt_len=64",
            "workload.gen_len=24",
        ]
    )
    model = build_model(config.model, torch.device("cuda"), seed=0)
    model.config._attn_implementation = "sdpa"  # generate_batch makes it paged|sdpa
    prompts = [
        list(map(int, r.prompt_ids))
        for r in make_requests(config.workload, config.model.vocab_size)
    ]
    gen = GenerationConfig(
        max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0, use_cache=True
    )
    cb = ContinuousBatchingConfig(use_cuda_graph=True, max_requests_per_batch=len(prompts))
    kw = {"generation_config": gen, "continuous_batching_config": cb}
    model.generate_batch(prompts[:2], max_new_tokens=4, **kw)  # warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        result = model.generate_batch(prompts, max_new_tokens=24, **kw)
        torch.cuda.synchronize()
    raw = out.with_suffix("")  # OUT.json
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.GzipFile(out, "wb", mtime=0) as dst:
        dst.write(src.read())
    os.remove(raw)
    tokens = sum(len(v.generated_tokens) for v in result.values())
    print(f"{out}: {out.stat().st_size} bytes; {len(result)} requests, {tokens} tokens")


if __name__ == "__main__":
    main()
