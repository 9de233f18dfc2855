"""The model section's last baseline: transformers' own ``sdpa`` over a ``StaticCache``."""

from __future__ import annotations

import gc
import traceback

import torch


class HFStatic:
    """transformers' ``sdpa`` + ``StaticCache`` timings (a ``Bench`` mixin)."""

    def hf_static_sdpa(self, model, config, ids, kv_per_token, weight_bytes):
        """transformers' own `sdpa` over a StaticCache (gpt-fast style: KV padded to the cache length)."""
        from transformers import StaticCache

        B = self.args.batch
        model.set_attn_implementation("sdpa")
        for ctx in self.contexts:
            if self.left() < self.args.reserve_s + 20:
                self.log("hf: out of time")
                break
            try:
                cache = StaticCache(config=config, max_cache_len=ctx)
                # fill the cache's lazy layers with one real forward, then decode at position ctx-1
                with torch.no_grad():
                    model(input_ids=ids, past_key_values=cache, use_cache=True,
                          cache_position=torch.tensor([ctx - 1], device=self.device))  # fmt: skip
                pos = torch.full((B, 1), ctx - 1, dtype=torch.long, device=self.device)
                cpos = torch.tensor([ctx - 1], device=self.device)

                def step(cache=cache, pos=pos, cpos=cpos):
                    out = model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True,
                                cache_position=cpos)  # fmt: skip
                    return out.logits[:, -1].argmax(-1)

                t = self.time_fn(step, iters=self.args.iters)
            except Exception as e:
                self.record(
                    section="model",
                    variant="transformers sdpa + StaticCache (qkv/gate_up fused)",
                    ctx=ctx,
                    error=repr(e)[:400],
                )
                self.log(f"hf sdpa ctx {ctx}: FAILED {e!r:.300}")
                traceback.print_exc()
                break
            finally:
                cache = None
                gc.collect()
                if self.cuda:
                    torch.cuda.empty_cache()
            moved = weight_bytes + B * ctx * kv_per_token
            floor_ms = moved / (self.copy_tbps * 1e12) * 1e3
            gbs = moved / (t["ms"] * 1e-3) / 1e9
            self.record(section="model", variant="transformers sdpa + StaticCache (qkv/gate_up fused)", ctx=ctx, batch=B, bytes=moved,
                        floor_ms=floor_ms, gbps=gbs, pct_floor=100 * floor_ms / t["ms"],
                        tok_per_s=B / (t["ms"] * 1e-3), **t)  # fmt: skip
            self.log(f"model {'transformers sdpa + StaticCache (fused)':34s} ctx {ctx:5d}: {t['ms']:8.3f} ms/step  "
                     f"{gbs:7.0f} GB/s  {100 * floor_ms / t['ms']:5.1f}% of floor")  # fmt: skip
