"""The model: a transformers Llama built from the model config (seeded random weights) or loaded
offline from model.path, with its attention routed to the runtime's paged KV cache."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from cbsim.config.errors import ConfigError
from cbsim.config.schema import ModelConfig

from .attention import ATTN_NAME, register

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def hf_config(cfg: ModelConfig, attn_implementation: str = ATTN_NAME) -> LlamaConfig:
    """The transformers config of the model config's shape (EOS/BOS off: the runtime ignores EOS)."""
    hf = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
        initializer_range=cfg.init_std,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        use_cache=False,
    )
    hf._attn_implementation = attn_implementation
    return hf


def build_model(
    cfg: ModelConfig, device: torch.device, seed: int = 0, attn_implementation: str = ATTN_NAME
) -> LlamaForCausalLM:
    """The model on `device` in eval mode; random weights are drawn on the device from `seed`."""
    register()
    dtype = DTYPES[cfg.dtype]
    if cfg.path:
        try:
            model = AutoModelForCausalLM.from_pretrained(
                cfg.path, dtype=dtype, local_files_only=True, attn_implementation="sdpa"
            )
        except OSError as exc:
            raise ConfigError(
                f"model.path={cfg.path!r}: cannot load a checkpoint ({exc})"
            ) from None
        model.config._attn_implementation = attn_implementation
        model.config.use_cache = False
        model.to(device)
    else:
        torch.manual_seed(seed)
        if device.type == "cuda":
            torch.cuda.manual_seed_all(seed)
        with torch.device(device):
            model = LlamaForCausalLM._from_config(
                hf_config(cfg, attn_implementation),
                dtype=dtype,
                attn_implementation=attn_implementation,
            )
    model.eval().requires_grad_(False)
    return model


def model_shape(model: LlamaForCausalLM) -> dict[str, int]:
    """The shape the runtime needs from a built model (a checkpoint's may differ from model.*)."""
    c = model.config
    return {
        "num_layers": c.num_hidden_layers,
        "num_heads": c.num_attention_heads,
        "num_kv_heads": c.num_key_value_heads,
        "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings,
    }
