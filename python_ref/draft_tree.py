"""Reference draft_tree: log_softmax_topk then build_tree, the fused op's specification."""

from .build_tree import build_tree
from .log_softmax_topk import log_softmax_topk

__all__ = ["draft_tree"]


def draft_tree(logits, root_tokens, budget, topk, algorithm="topn"):
    """``log_softmax_topk(logits, topk)`` then ``build_tree``.

    Parameters
    ----------
    logits : float ``[B, D, V]``; row d = the draft's logits for depth d + 1
    root_tokens : int ``[B]``
    budget, topk : int
    algorithm : ``"topn"`` or ``"accum_logp"``

    Returns
    -------
    the dict of :func:`build_tree`.
    """
    tt, tl = log_softmax_topk(logits, topk)
    return build_tree(tt, tl, root_tokens, budget, algorithm)
