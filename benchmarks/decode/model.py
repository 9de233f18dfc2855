"""Section model: the 8B Llama decode step (transformers' layers, paged KV), CUDA-graph replayed:
Triton vs gathered SDPA, unfused vs fused projections and norm/rope, and a weights-only step."""

from __future__ import annotations

import gc
import time
import traceback

import torch

from runtime.kernels.fused_elementwise import fuse_norm_and_rope, unfuse_norm_and_rope
from runtime.kernels.fused_projections import fuse_qkv_and_gate_up
from runtime.kernels.paged_attention import (
    paged_decode_attention,
    paged_decode_attention_sdpa,
    store_kv,
    triton_available,
)


class ModelSection:
    """Section ``model`` (a ``Bench`` mixin; its checks: model_checks.py, hf_static.py)."""

    def model(self):
        """The 8B decode step through transformers' Llama with a paged KV cache."""
        from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

        a = self.args
        B, bs = a.batch, a.block_size
        dtype = torch.bfloat16 if self.cuda else torch.float32
        config = LlamaConfig(**self.shape, max_position_embeddings=131072, rope_theta=500000.0,
                             tie_word_embeddings=False)  # fmt: skip
        t = time.perf_counter()
        with torch.device(self.device):
            model = LlamaForCausalLM._from_config(config, dtype=dtype).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.log(f"model: built in {time.perf_counter() - t:.1f}s")
        n_params = sum(p.numel() for p in model.parameters())
        embed = model.model.embed_tokens.weight.numel()
        elt = torch.finfo(dtype).bits // 8
        weight_bytes = (
            n_params - embed
        ) * elt  # every weight but the embedding table is read per step
        L, Hkv, D = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
        kv_per_token = L * Hkv * D * 2 * elt
        self.record(section="model", params=n_params, weight_bytes_read=weight_bytes,
                    weight_bytes_total=n_params * elt, kv_bytes_per_token=kv_per_token)  # fmt: skip

        state = {}

        def paged_attention(
            module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw
        ):
            # query [B, Hq, 1, D] (RoPE applied), key/value [B, Hkv, 1, D]: decode, one token each
            k_cache, v_cache = state["caches"][module.layer_idx]
            store_kv(k_cache, v_cache, key[:, :, 0], value[:, :, 0], state["slots"])
            out = state["fn"](query[:, :, 0], k_cache, v_cache, state["table"], state["lens"], scaling,
                              **state["kw"])  # fmt: skip
            return out.unsqueeze(1), None  # [B, 1, Hq, D]

        def no_attention(
            module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw
        ):
            return query.transpose(
                1, 2
            ), None  # weights-only timing: attention replaced by identity

        AttentionInterface.register("cbsim_paged", paged_attention)
        AttentionInterface.register("cbsim_none", no_attention)
        model.set_attn_implementation("cbsim_paged")

        contexts = self.contexts
        max_ctx = max(contexts)
        caches, table_full = self.make_cache(B, max_ctx, L, bs, Hkv, D, dtype)
        state["caches"] = caches
        ids = torch.randint(0, config.vocab_size, (B, 1), device=self.device)

        # -- correctness of the plumbing: token-by-token paged decode == one causal forward
        self.plumbing_check(model, config, state, dtype)

        def decode_step():
            logits = model(input_ids=ids, position_ids=state["pos"], use_cache=False).logits
            return logits[:, -1].argmax(-1)

        def set_context(ctx, fn, kw, full_table=False):
            pages = -(-ctx // bs)
            table = table_full if full_table else table_full[:, :pages].contiguous()
            pos = torch.full((B, 1), ctx - 1, dtype=torch.long, device=self.device)
            slots = table[:, (ctx - 1) // bs].long() * bs + (ctx - 1) % bs
            lens = torch.full((B,), ctx, dtype=torch.int32, device=self.device)
            state.update(table=table, pos=pos, slots=slots, lens=lens, fn=fn, kw=kw)

        def run(label, ctx, fn, kw, **extra):
            if self.left() < a.reserve_s:
                self.log(f"model {label} ctx {ctx}: skipped, out of time")
                return
            try:
                t = self.time_fn(decode_step, iters=a.iters)
            except Exception as e:
                self.record(section="model", variant=label, ctx=ctx, error=repr(e)[:400])
                self.log(f"model {label} ctx {ctx}: FAILED {e!r:.300}")
                traceback.print_exc()
                return
            kv = B * ctx * kv_per_token if fn is not None else 0
            moved = weight_bytes + kv
            floor_ms = moved / (self.copy_tbps * 1e12) * 1e3
            gbs = moved / (t["ms"] * 1e-3) / 1e9
            self.record(section="model", variant=label, ctx=ctx, batch=B, bytes=moved, kv_bytes=kv,
                        floor_ms=floor_ms, gbps=gbs, pct_floor=100 * floor_ms / t["ms"],
                        tok_per_s=B / (t["ms"] * 1e-3), **t, **extra)  # fmt: skip
            self.log(f"model {label:34s} ctx {ctx:5d}: {t['ms']:8.3f} ms/step  {gbs:7.0f} GB/s  "
                     f"{100 * floor_ms / t['ms']:5.1f}% of floor ({floor_ms:.2f} ms)")  # fmt: skip

        triton_ok = self.cuda and triton_available()
        tkw = getattr(self, "triton_kw", dict(partition_size="auto"))

        def sweep(prefix, sdpa=False, full_width=False):
            for ctx in contexts:
                if triton_ok:
                    set_context(ctx, paged_decode_attention, tkw)
                    run(f"{prefix} + triton paged", ctx, paged_decode_attention, tkw)
                    if full_width and ctx < max_ctx:
                        set_context(ctx, paged_decode_attention, tkw, full_table=True)
                        run(
                            f"{prefix} + triton, full-width table", ctx, paged_decode_attention, tkw
                        )
                if sdpa or not triton_ok:
                    set_context(ctx, paged_decode_attention_sdpa, {})
                    run(f"{prefix} + torch sdpa-gather", ctx, paged_decode_attention_sdpa, {})
                if self.cuda:
                    torch.cuda.empty_cache()

        def weights_only(prefix):
            # attention = identity: the GEMM + norm + rope + residual part of the step
            set_context(contexts[0], None, {})
            model.set_attn_implementation("cbsim_none")
            run(f"{prefix}, no attention", 0, None, {})
            model.set_attn_implementation("cbsim_paged")

        def step_logits(ctx=1024):
            set_context(
                min(ctx, max_ctx),
                paged_decode_attention if triton_ok else paged_decode_attention_sdpa,
                tkw if triton_ok else {},
            )
            with torch.no_grad():
                return (
                    model(input_ids=ids, position_ids=state["pos"], use_cache=False)
                    .logits[:, -1]
                    .float()
                )

        weights_only("unfused")
        sweep("unfused", sdpa=True)
        ref_logits = step_logits()

        fuse_qkv_and_gate_up(model)
        if self.cuda:
            torch.cuda.empty_cache()
        self.compare_logits(
            "fused qkv/gate_up vs unfused, one decode step", step_logits(), ref_logits
        )
        weights_only("fused proj")
        sweep("fused proj")

        counts = fuse_norm_and_rope(model)
        self.compare_logits(
            f"+ fused norm/rope ({counts}) vs unfused, one decode step", step_logits(), ref_logits
        )
        self.plumbing_check(model, config, state, dtype, label="all fusions")
        weights_only("fused proj+norm+rope")
        sweep("fused proj+norm+rope", full_width=True)
        try:
            self.profile_step(model, state, set_context, decode_step, tkw)
        except Exception as e:
            self.log(f"profile: FAILED {e!r:.300}")

        if not a.skip_hf:  # last: the least informative, and it needs its own KV allocation
            unfuse_norm_and_rope(model)
            state.clear()
            caches = table_full = None  # noqa: F841
            gc.collect()
            if self.cuda:
                torch.cuda.empty_cache()
            self.hf_static_sdpa(model, config, ids, kv_per_token, weight_bytes)
