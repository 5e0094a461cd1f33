"""Locate and load the tiny models shipped in ``jetspec_kernels/assets/tiny`` (the runtime's
``--tiny`` models; ``jetspec_kernels.train`` is the recipe that made them)."""
from __future__ import annotations

import json
import os

import torch

from .draft_head import DraftHead
from .qwen3 import Qwen3

__all__ = ["TINY_DIR", "HEAD_NAMES", "load_recipe", "load_tiny"]

TINY_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "tiny")
HEAD_NAMES = ("head_causal", "head_dflash")


def load_recipe(path: str = TINY_DIR) -> dict:
    """The ``recipe.json`` of a tiny-model directory (command, data manifest, losses, acceptance)."""
    with open(os.path.join(path, "recipe.json")) as f:
        return json.load(f)


def load_tiny(path: str = TINY_DIR, *, dtype: torch.dtype = torch.float32, device="cpu"):
    """The tiny target and both draft heads.

    Parameters
    ----------
    path : directory with ``target/``, ``head_causal/``, ``head_dflash/``
    dtype, device : as for ``from_pretrained`` (weights are stored in float16 and cast)

    Returns
    -------
    (target : Qwen3, heads : dict name -> DraftHead with keys ``HEAD_NAMES``)
    """
    target = Qwen3.from_pretrained(os.path.join(path, "target"), dtype=dtype, device=device)
    heads = {name: DraftHead.from_pretrained(os.path.join(path, name), dtype=dtype, device=device)
             for name in HEAD_NAMES}
    return target, heads
