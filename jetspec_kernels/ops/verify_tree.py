"""verify_tree: accept the longest tree path the target agrees with (greedy or sampling)."""
from __future__ import annotations

import torch

from .. import backend as _backend
from ..tree import Tree, Verdict, mask_words
from . import _checks as C

SEED_DTYPES = (torch.int64, torch.int32)
# Trees larger than this go to another backend (csrc verify.cuh: kWalkMaxNodes, staged in 48 KB).
MAX_NODES = {"cuda": 4096}


def _unsupported(name: str, n: int) -> str | None:
    """Why backend ``name``'s verify_tree cannot take a tree of capacity ``n`` (None if it can)."""
    limit = MAX_NODES.get(name)
    if limit is not None and n > limit:
        return f"verify_tree takes trees of at most {limit} nodes, got N={n}"
    return None


def check_tree(tree) -> None:
    """Shapes, dtypes and devices of a Tree's fields (values are the producer's responsibility,
    checked here only where value checks run)."""
    if not isinstance(tree, Tree):
        raise TypeError(f"tree must be a jetspec_kernels.Tree, got {type(tree).__name__}")
    C.tensor("tree.tokens", tree.tokens, dtypes=C.INDEX_DTYPES, ndim=2)
    b, n = tree.tokens.shape
    dev = tree.tokens.device
    C.tensor("tree.parents", tree.parents, dtypes=C.INDEX_DTYPES, shape=[b, n], device=dev)
    C.tensor("tree.depths", tree.depths, dtypes=C.INDEX_DTYPES, shape=[b, n], device=dev)
    C.tensor("tree.scores", tree.scores, dtypes=(torch.float32,), shape=[b, n], device=dev)
    C.tensor("tree.num_nodes", tree.num_nodes, dtypes=C.INDEX_DTYPES, shape=[b], device=dev)
    C.tensor("tree.mask", tree.mask, dtypes=C.INDEX_DTYPES, shape=[b, n, mask_words(n)], device=dev)
    C.integer("tree.max_depth", tree.max_depth, lo=0, hi=max(n - 1, 0))
    C.value_range("tree.num_nodes", tree.num_nodes, 1 if n else 0, n)
    C.value_range("tree.parents", tree.parents, -1, n - 1)
    C.value_range("tree.depths", tree.depths, -1, tree.max_depth)


def _seed(name, t, b, dev):
    if t is None:
        raise ValueError(f"{name} is required when temperature > 0 (an int64 tensor [B] or [])")
    if isinstance(t, int) and not isinstance(t, bool):
        t = torch.tensor(C.integer(name, t, lo=-2**63, hi=2**63 - 1), dtype=torch.int64, device=dev)
    C.tensor(name, t, dtypes=SEED_DTYPES, device=dev)
    if t.dim() == 0 or (t.dim() == 1 and t.shape[0] == 1):
        return t.reshape(1).to(torch.int64).expand(b).contiguous()
    C.tensor(name, t, shape=[b])
    return t.to(torch.int64)


def check_verify_tree(tree, target_logits, target_tokens, temperature, seed, offset):
    check_tree(tree)
    b, n = tree.tokens.shape
    dev = tree.tokens.device
    if n == 0:
        raise ValueError("tree must hold at least its root: tree.tokens has N=0 columns")
    if (target_logits is None) == (target_tokens is None):
        raise ValueError("pass exactly one of target_logits [B, N, V] and target_tokens [B, N]")
    temperature = C.number("temperature", temperature, lo=0.0)
    if target_logits is not None:
        C.tensor("target_logits", target_logits, dtypes=C.FLOAT_DTYPES, shape=[b, n, None], device=dev)
        if target_logits.shape[2] == 0:
            raise ValueError("target_logits must have a non-empty vocabulary dim")
        C.value_range("tree.tokens", tree.tokens, 0, target_logits.shape[2] - 1)
    else:
        C.tensor("target_tokens", target_tokens, dtypes=C.INDEX_DTYPES, shape=[b, n], device=dev)
        C.value_range("target_tokens", target_tokens, 0, None)
        C.value_range("tree.tokens", tree.tokens, 0, None)
        if temperature > 0:
            raise ValueError("sampling (temperature > 0) needs target_logits, not target_tokens")
    if temperature > 0:
        seed = _seed("seed", seed, b, dev)
        offset = _seed("offset", offset, b, dev)
    else:
        seed = offset = None
    return temperature, seed, offset


def verify_tree(tree: Tree, target_logits=None, *, target_tokens=None, temperature: float = 0.0,
                seed=None, offset=None, backend: str | None = None) -> Verdict:
    """Accept the longest path of ``tree`` that the target agrees with.

    Greedy (temperature 0): the target's token at a node is the argmax of its logits. Sampling:
    one Gumbel-max sample per node from softmax(logits / temperature), keyed by (seed, offset,
    sequence, node), then the same token matching; the output is distributed exactly as the
    target's own samples. Siblings with the same token: the lowest index wins. The root (node 0)
    is always verified: a row with ``num_nodes`` 0 (rejected where value checks run) is a
    one-node tree: accept_len 0, path [0, -1, ...], bonus = the target's token at node 0.

    Parameters
    ----------
    tree : Tree with capacity N
    target_logits : float [B, N, V], optional   the target's logits at each node (NaN-free:
        backends differ on where a NaN wins the argmax)
    target_tokens : int32 [B, N], optional      or the target's already chosen token per node
    temperature : float >= 0
    seed, offset : int64 tensors [B] or [] (or ints); required when temperature > 0

    Returns
    -------
    Verdict(accept_len int32 [B], path int32 [B, M], bonus int32 [B], emitted int32 [B, M]),
    M = tree.max_depth + 1.
    """
    temperature, seed, offset = check_verify_tree(tree, target_logits, target_tokens, temperature,
                                                  seed, offset)
    parts = _backend.select(tree.tokens.device, "verify_tree", backend,
                            lambda name: _unsupported(name, tree.tokens.shape[1]))(
        tree.tokens, tree.parents, tree.num_nodes, tree.max_depth, target_logits, target_tokens,
        temperature, seed, offset)
    return Verdict(*parts)
