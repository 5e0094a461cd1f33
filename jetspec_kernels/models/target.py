"""Load a target checkpoint by its ``model_type``: Qwen3 / Qwen3-MoE, or a Qwen3.5 hybrid."""
from __future__ import annotations

import torch

from .config import is_hybrid_config, read_config
from .qwen3 import Qwen3
from .qwen3_5 import Qwen3_5

__all__ = ["Target", "load_target"]


def load_target(path: str, *, dtype: torch.dtype = torch.float32, device="cpu", group=None):
    """:class:`Qwen3` for ``qwen3`` / ``qwen3_moe`` checkpoints, :class:`Qwen3_5` for ``qwen3_5`` /
    ``qwen3_5_moe`` ones (a multimodal export's text model); arguments as their
    ``from_pretrained``. Other model types raise :class:`CheckpointError` naming the type."""
    cls = Qwen3_5 if is_hybrid_config(read_config(path)) else Qwen3
    return cls.from_pretrained(path, dtype=dtype, device=device, group=group)


class Target:
    """Either target class, chosen by the checkpoint's ``model_type``: ``Target.from_pretrained``
    is :func:`load_target` (for code that loads through a class, as the CLI does)."""

    from_pretrained = staticmethod(load_target)
