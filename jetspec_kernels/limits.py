"""Limits of the public contract that the ops check for every backend (no torch, no ``_C``).

csrc/include/jetspec/limits.h holds the same numbers for the kernels; tests/test_cuda_boundary.py
checks that ``_C.LIMITS`` agrees.
"""

MAX_BUDGET = 4096  # draft tree capacity N: the topn key packs a parent position in 12 bits
MAX_TOPK = 64      # children per node K: the topn key packs a rank in 6 bits

# The exact mode's GEMM tile shapes (triton/exact_matmul.py's ``tiles``; Python only, not in
# limits.h): narrow for small batches, wide for large ones; an engine fixes one for all its calls
# (a model's exact_gemm_tile).
EXACT_GEMM_TILES = ("narrow", "wide")
# The most parts the exact mode splits a GEMM's K into (ops.exact.linear's ``parts``, a model's
# exact_k_parts; powers of two): the tree kernel holds a block of every part's values at once.
EXACT_MAX_K_PARTS = 64
