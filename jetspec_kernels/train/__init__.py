"""Training recipe of the tiny models shipped in ``jetspec_kernels/assets/tiny``.

A byte-level Qwen3-style target trained on the Python standard library's own sources, and two
draft heads on that frozen target: JetSpec's causal head and the DFlash variant (bidirectional
block), both distilled to the target's per-position distributions. ``python -m
jetspec_kernels.train`` remakes them (CPU, minutes); ``recipe.json`` records the command, seeds,
the data manifest (file names + sha256), the final losses and the measured acceptance.
"""
from ..models.byte_tokenizer import BOS_ID, EOS_ID, MASK_ID, VOCAB_SIZE, decode, encode

__all__ = ["BOS_ID", "EOS_ID", "MASK_ID", "VOCAB_SIZE", "decode", "encode"]
