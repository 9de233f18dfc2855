"""Section e2e: the runtime's async engine end to end, every fusion applied to its model."""

from __future__ import annotations

import gc
import traceback

import torch

from runtime.kernels.fused_elementwise import fuse_norm_and_rope
from runtime.kernels.fused_projections import fuse_qkv_and_gate_up


class E2ESection:
    """Section ``e2e`` (a ``Bench`` mixin)."""

    def e2e(self):
        """The runtime's async engine (cbsim.runtime.engine.execute) at the seed shape, with every
        fusion applied to the model it is handed. Needs the cbsim package and its config deps."""
        if not self.cuda:
            self.log("e2e: skipped (needs CUDA)")
            return
        from cbsim.runtime.engine import execute
        from cbsim.runtime.model import build_model
        from hydra import compose, initialize_config_module

        from cbsim.config.store import load_config, register_configs
        from cbsim.metrics import compute_metrics

        register_configs()
        model = None
        for case in self.args.e2e.split(","):
            gen, engine = case.split(":")
            gen = int(gen)
            need = 30 + gen * 0.012  # seconds: setup + about 12 ms a step
            if self.left() < need:
                self.log(f"e2e gen {gen} {engine}: skipped, {self.left():.0f} s left < {need:.0f}")
                continue
            overrides = ["mode=runtime", f"engine={engine}", "model=llama3_8b", "workload.batch_size=32",
                         "workload.prompt_len=256", f"workload.gen_len={gen}"]  # fmt: skip
            with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
                config = load_config(compose(config_name="config", overrides=overrides))
            if model is None:
                model = build_model(
                    config.model, torch.device(config.mode.device), seed=config.workload.seed
                )
                fuse_qkv_and_gate_up(model)
                counts = fuse_norm_and_rope(model)
                self.log(f"e2e: model built and fused ({counts})")
            try:
                res = execute(config, engine, model=model)
            except Exception as e:
                self.record(section="e2e", overrides=overrides, error=repr(e)[:500])
                self.log(f"e2e {overrides}: FAILED {e!r:.400}")
                traceback.print_exc()
                continue
            m = compute_metrics(res.trace)
            n_params = sum(p.numel() for p in model.parameters())
            weight_bytes = (n_params - model.model.embed_tokens.weight.numel()) * 2
            kv_tok = 32 * 8 * 128 * 2 * 2
            B, prompt = 32, 256
            # floor of the decode steps: weights + live KV of each step at 4.27 TB/s
            floor_s = sum(weight_bytes + B * (prompt + i) * kv_tok for i in range(1, gen)) / (
                self.copy_tbps * 1e12
            )
            row = dict(section="e2e", overrides=overrides, engine=engine, gen_len=gen,
                       total_time_s=m["total_time_s"], step_time_ms_mean=m["step_time_ms_mean"],
                       step_time_ms_p50=m["step_time_ms_p50"], gpu_forward_ms_mean=m["gpu_forward_ms_mean"],
                       tokens_per_s=m["tokens_per_s"], gpu_idle_fraction=m["gpu_idle_fraction"],
                       host_ms_per_step=m["host_ms_per_step"], decode_floor_s=floor_s,
                       pct_floor=100 * floor_s / m["total_time_s"], counters=res.summary,
                       memory=res.trace.other_data.get("memory"),
                       attention=res.trace.other_data.get("attention"))  # fmt: skip
            self.record(**row)
            self.log(f"e2e {engine} 32x(256+{gen}): {m['total_time_s']:.2f} s, {m['step_time_ms_mean']:.3f} ms/step "
                     f"(p50 {m['step_time_ms_p50']:.3f}), forward {m['gpu_forward_ms_mean']:.3f} ms, "
                     f"{m['tokens_per_s']:.0f} tok/s, GPU idle {m['gpu_idle_fraction']:.3%}, "
                     f"decode floor {floor_s:.2f} s = {row['pct_floor']:.1f}% of the run")  # fmt: skip
            del res
            gc.collect()
            torch.cuda.empty_cache()
