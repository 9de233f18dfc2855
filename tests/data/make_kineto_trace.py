"""Record the small Kineto (torch.profiler) traces under tests/data/ (provenance of the fixtures).

    python3 tests/data/make_kineto_trace.py OUT_DIR        # on a CUDA machine: kineto_h200_*.json.gz
    python tests/data/make_kineto_trace.py OUT_DIR         # without CUDA: kineto_cpu.json.gz

A tiny Llama (transformers, random weights) decodes a few steps the way cbsim's async engine does:
inputs copied on an H2D stream, the forward on a compute stream (eager, then graph-replayed), the
sampled tokens copied back on a D2H stream, streams ordered by events, the host blocking once per
step. Host phases are ``record_function`` ranges named like the trace format's host phases, and each
forward is a ``forward#N`` range so the importer can recover steps.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function


def tiny_model(device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(device).eval()


def run_cuda(out: Path) -> None:
    dev = "cuda"
    model = tiny_model(dev)
    bs = 8
    h2d, compute, d2h = (torch.cuda.Stream() for _ in range(3))
    host_in = torch.randint(0, 1024, (bs, 16), dtype=torch.long).pin_memory()
    dev_in = torch.empty_like(host_in, device=dev)
    host_out = torch.empty(bs, dtype=torch.long).pin_memory()

    def fwd():
        return model(input_ids=dev_in).logits[:, -1].argmax(-1)

    # warm up and capture one graph on the compute stream
    with torch.cuda.stream(compute), torch.no_grad():
        for _ in range(2):
            dev_out = fwd()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=compute):
            dev_out = fwd()
    torch.cuda.synchronize()

    for use_graph in (False, True):
        acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with profile(activities=acts) as prof, torch.no_grad():
            for step in range(4):
                with record_function("schedule"):
                    host_in.random_(0, 1024)
                with record_function("launch"):
                    h2d_done, compute_done, d2h_done = (torch.cuda.Event() for _ in range(3))
                    with torch.cuda.stream(h2d):
                        dev_in.copy_(host_in, non_blocking=True)
                        h2d_done.record()
                    compute.wait_event(h2d_done)
                    with torch.cuda.stream(compute), record_function(f"forward#{step}"):
                        if use_graph:
                            graph.replay()
                        else:
                            dev_out = fwd()
                        compute_done.record()
                    d2h.wait_event(compute_done)
                    with torch.cuda.stream(d2h):
                        host_out.copy_(dev_out, non_blocking=True)
                        d2h_done.record()
                with record_function("wait"):
                    d2h_done.synchronize()
                with record_function("update"):
                    host_out.tolist()
        name = "graph" if use_graph else "eager"
        _save(prof, out / f"kineto_h200_{name}.json.gz")


def run_cpu(out: Path) -> None:
    model = tiny_model("cpu")
    ids = torch.randint(0, 1024, (4, 8))
    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
        for step in range(3):
            with record_function("schedule"):
                ids.random_(0, 1024)
            with record_function(f"forward#{step}"):
                tok = model(input_ids=ids).logits[:, -1].argmax(-1)
            with record_function("update"):
                tok.tolist()
            prof.step()
    _save(prof, out / "kineto_cpu.json.gz")


def _save(prof, path: Path) -> None:
    raw = path.with_suffix("")
    prof.export_chrome_trace(str(raw))
    obj = json.loads(raw.read_text())
    raw.unlink()
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as g:
        g.write(json.dumps(obj, separators=(",", ":")).encode())
    print(path, path.stat().st_size, "bytes")


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    target.mkdir(parents=True, exist_ok=True)
    if torch.cuda.is_available():
        print(torch.cuda.get_device_name(), torch.__version__)
        run_cuda(target)
    else:
        run_cpu(target)
