"""What the model section checks besides its timings: logits against a reference, the paged
plumbing against one causal forward, and a profile of one eager decode step."""

from __future__ import annotations

import torch

from runtime.kernels.paged_attention import (
    paged_decode_attention,
    paged_decode_attention_reference,
    triton_available,
)


class ModelChecks:
    """Checks the model section runs (a ``Bench`` mixin)."""

    def profile_step(self, model, state, set_context, decode_step, tkw, ctx=1024):
        """Kernels per decode step and GPU time by kind (eager, torch.profiler), at one context."""
        if not self.cuda or self.left() < self.args.reserve_s + 10:
            return
        from torch.profiler import ProfilerActivity, profile

        set_context(min(ctx, max(self.contexts)), paged_decode_attention, tkw)
        with torch.no_grad():
            decode_step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                decode_step()
                torch.cuda.synchronize()
        kinds: dict[str, list[float]] = {}
        for ev in prof.events():
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                continue
            n = ev.name.lower()
            kind = (
                "gemm" if any(w in n for w in ("gemm", "gemv", "cutlass", "sm90", "splitk", "nvjet"))
                else "attention" if "paged_decode" in n
                else "norm/rope (triton)" if ("rmsnorm" in n or "rope" in n)
                else "memcpy/memset" if ("memcpy" in n or "memset" in n)
                else "other elementwise/index"
            )  # fmt: skip
            kinds.setdefault(kind, []).append(ev.time_range.elapsed_us())
        summary = {k: dict(kernels=len(v), us=round(sum(v), 1)) for k, v in kinds.items()}
        self.record(section="profile", ctx=ctx, kinds=summary)
        self.log(f"profile (eager, ctx {ctx}): {summary}")
        (self.out / "profile.txt").write_text(
            prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
        )

    def plumbing_check(self, model, config, state, dtype, label="unfused"):
        """Feed a short sequence token by token through the paged decode path (each step writes its
        K/V and attends to the prefix); the last logits must match one causal forward with sdpa."""
        if self.left() < self.args.reserve_s:
            return
        B, T, bs = 2, 24, self.args.block_size
        L, Hkv, D = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
        caches, table = self.make_cache(B, T, L, bs, Hkv, D, dtype)
        saved = dict(state)
        seq = torch.randint(0, config.vocab_size, (B, T), device=self.device)
        fn = (
            paged_decode_attention
            if (self.cuda and triton_available())
            else paged_decode_attention_reference
        )
        state.update(caches=caches, table=table, fn=fn, kw={})
        with torch.no_grad():
            for t in range(T):
                state["slots"] = table[:, t // bs].long() * bs + t % bs
                state["lens"] = torch.full((B,), t + 1, dtype=torch.int32, device=self.device)
                pos = torch.full((B, 1), t, dtype=torch.long, device=self.device)
                paged = model(
                    input_ids=seq[:, t : t + 1], position_ids=pos, use_cache=False
                ).logits[:, -1]
            model.set_attn_implementation("sdpa")
            dense = model(input_ids=seq, use_cache=False).logits[:, -1]
            model.set_attn_implementation("cbsim_paged")
        err = ((paged.double() - dense.double()).norm() / dense.double().norm()).item()
        same_argmax = bool((paged.argmax(-1) == dense.argmax(-1)).all())
        self.record(
            section="plumbing",
            label=label,
            attention=fn.__name__,
            rel_err=err,
            same_argmax=same_argmax,
        )
        self.log(f"plumbing ({label}, {fn.__name__}): paged decode vs causal sdpa rel err {err:.2e}, "
                 f"argmax equal {same_argmax}")  # fmt: skip
        state.clear()
        state.update(saved)
