"""The triton verify_tree kernels' first steps on their own, for the tests: the target token per
node (steps 0 and 1 of jetspec_kernels/triton/verify_tree.py, one vocabulary split) and the
uniforms behind the Gumbel noise, each to compare with python_ref bit for bit. Production calls
only the backend's verify_tree; these reach the module's launch helpers directly."""
import torch
import triton
import triton.language as tl

from helpers import backend_module

_verify = backend_module("triton", "verify_tree")
_node_key = _verify._node_key    # jit functions the uniform kernel calls by these global names
_uniform = _verify._uniform


def sample_tokens(logits, temperature, seed=None, offset=None, top_k=None, top_p=None):
    """The target token per node that steps 0 and 1 compute (one vocabulary split).

    Parameters
    ----------
    logits : float ``[B, N, V]``; temperature : float or float32 ``[B]``;
    seed, offset : int64 ``[B]``; top_k : int32 ``[B]`` or None; top_p : float32 ``[B]`` or None

    Returns
    -------
    int32 ``[B, N]``: argmax (temperature 0) or the Gumbel-max sample over the kept tokens, ties
    to the lower id.
    """
    B, N, V = logits.shape
    temps = _verify._temperatures(temperature, B, logits.device)
    thresholds = None
    if temps is not None and (top_k is not None or top_p is not None):
        thresholds = _verify.filter_thresholds(logits, temps, top_k, top_p)
    _, partial_token, _ = _verify._launch_partials(logits, temps, seed, offset, 1,
                                                   _verify._block_v(V), thresholds)
    return partial_token.view(B, N)


@triton.jit
def _uniform_kernel(seed_ptr, off_ptr, u_ptr, N, V, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    b = row // N
    n = row % N
    key = _node_key(seed_ptr, off_ptr, b, n)
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        tl.store(u_ptr + row.to(tl.int64) * V + v, _uniform(key, v), mask=v < V)


def gumbel_uniform(seed, offset, N, V):
    """The uniforms behind the sampling kernel (the same jit functions), for checking against
    python_ref.gumbel_uniform.

    Parameters
    ----------
    seed, offset : int64 ``[B]``; N, V : int

    Returns
    -------
    float32 ``[B, N, V]`` in (0, 1).
    """
    B = seed.shape[0]
    u = torch.empty((B, N, V), dtype=torch.float32, device=seed.device)
    if u.numel():
        _uniform_kernel[(B * N,)](seed, offset, u, N, V, BLOCK_V=_verify._block_v(V))
    return u
