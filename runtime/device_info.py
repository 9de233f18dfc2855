"""Facts the runtime reads from outside the config: for a checkpoint or a model passed in, the
model's own vocabulary, context and EOS token (they may differ from model.*), and the BLAS
library torch's GEMMs go to. The machine itself is runtime/machine.py."""

from __future__ import annotations

from typing import Any

import torch

from cbsim.config.errors import ConfigError
from cbsim.config.schema import ModelConfig


def checkpoint_facts(cfg: ModelConfig, model: torch.nn.Module | None = None) -> dict[str, Any]:
    """vocab_size, max_position_embeddings and eos_token_id of the model passed in or of the
    checkpoint at model.path (read without loading its weights); {} for random weights built
    from model.*, whose facts are the config's."""
    if model is not None:
        hf = model.config
    elif cfg.path:
        from transformers import AutoConfig

        try:
            hf = AutoConfig.from_pretrained(cfg.path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"model.path={cfg.path!r}: cannot load a checkpoint ({exc})"
            ) from None
    else:
        return {}
    eos = hf.eos_token_id
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return {
        "vocab_size": int(hf.vocab_size),
        "max_position_embeddings": int(hf.max_position_embeddings),
        "eos_token_id": eos,
    }


def select_blas(choice: str, device: torch.device) -> str:
    """Point torch's GEMMs at ``choice`` (mode.blas) on CUDA; returns the library in use."""
    if device.type != "cuda":
        return "none"
    torch.backends.cuda.preferred_blas_library(choice)
    return str(torch.backends.cuda.preferred_blas_library()).rsplit(".", 1)[-1].lower()
