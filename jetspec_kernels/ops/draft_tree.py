"""draft_tree, draft_tree_from_topk and draft_tree_from_hidden: build the draft tree."""
from __future__ import annotations

import os

import torch

from .. import backend as _backend
from .. import checks
from .. import launch_plan
from ..limits import MAX_BUDGET, MAX_TOPK
from ..tree import Tree

ALGORITHMS = ("topn", "accum_logp")
TOKEN_DTYPES = (torch.int32, torch.int64)
# draft_tree_from_hidden's ``method``: how the per-depth top-K is computed (launch_plan.py,
# "Hidden top-K"); "auto" asks launch_plan.hidden_topk_method.
HIDDEN_TOPK_METHODS = ("auto",) + launch_plan.HIDDEN_TOPK_METHODS
HIDDEN_TOPK_ENV = "JETSPEC_HIDDEN_TOPK"  # the method when the call passes none


_STATIC: dict = {}  # signatures whose static checks passed (checks.signature)


def _check_common(root_tokens, budget, topk, algorithm, *, batch, vocab, device, static=True):
    """Checks shared by the draft_tree ops; ``vocab`` None: unknown (draft_tree_from_topk);
    ``static`` False: the value checks alone (the caller has seen the rest pass)."""
    if static:
        checks.tensor("root_tokens", root_tokens, dtypes=TOKEN_DTYPES, shape=[batch], device=device)
        checks.integer("budget", budget, lo=1, hi=MAX_BUDGET)
        if topk is not None:
            checks.integer("topk", topk, lo=1, hi=min(MAX_TOPK, vocab))
        checks.choice("algorithm", algorithm, ALGORITHMS)
    checks.value_range("root_tokens", root_tokens, 0, checks.INT32_MAX if vocab is None else vocab - 1)


def _nonempty(name: str, t, dim: int, what: str) -> None:
    if t.shape[dim] < 1:
        raise ValueError(f"{name} must have {what} in dim {dim}, got shape {list(t.shape)}")


def _log_softmax_defined(name: str, t) -> None:
    """Every row of ``t`` has a log-softmax: no NaN or +inf, and some value above -inf (only
    where value checks run; elsewhere such a row gives an unspecified tree)."""
    if not t.numel() or not checks.values_checked(t):
        return
    if bool(t.isnan().any()) or bool(t.isposinf().any()):
        raise ValueError(f"{name} must hold no NaN or +inf (a row with one has no log-softmax), "
                         f"got {int(t.isnan().sum())} NaN and {int(t.isposinf().sum())} +inf")
    if bool(t.isneginf().all(-1).any()):
        raise ValueError(f"{name} must hold a value above -inf in every row (a row of -inf has no "
                         f"log-softmax)")


def check_draft_tree(logits, root_tokens, budget, topk, algorithm):
    key = checks.signature("draft_tree", logits, root_tokens, budget, topk, algorithm)
    static = key is None or key not in _STATIC
    if static:  # dtypes, shapes, devices: once per signature
        checks.tensor("logits", logits, dtypes=checks.FLOAT_DTYPES, ndim=3)
        _nonempty("logits", logits, 1, "at least one draft depth")
        _nonempty("logits", logits, 2, "a non-empty vocabulary")
    b, _, v = logits.shape
    _check_common(root_tokens, budget, topk, algorithm, batch=b, vocab=v, device=logits.device,
                  static=static)
    if static:
        checks.remember(_STATIC, key, True)
    _log_softmax_defined("logits", logits)


def check_draft_tree_from_topk(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    checks.tensor("topk_tokens", topk_tokens, dtypes=TOKEN_DTYPES, ndim=3)
    b, d, k = topk_tokens.shape
    checks.tensor("topk_logprobs", topk_logprobs, dtypes=(torch.float32,), shape=[b, d, k],
             device=topk_tokens.device)
    _nonempty("topk_tokens", topk_tokens, 1, "at least one draft depth")
    if not 1 <= k <= MAX_TOPK:
        raise ValueError(f"topk_tokens must hold K in [1, {MAX_TOPK}] candidates in dim 2, got shape "
                         f"{list(topk_tokens.shape)}")
    _check_common(root_tokens, budget, None, algorithm, batch=b, vocab=None, device=topk_tokens.device)
    checks.value_range("topk_tokens", topk_tokens, 0, checks.INT32_MAX)
    if checks.values_checked(topk_logprobs) and topk_logprobs.numel():
        if not bool((topk_logprobs <= 0).all()):
            raise ValueError("topk_logprobs must be log-probabilities (<= 0)")
        if k > 1 and not bool((topk_logprobs[..., 1:] <= topk_logprobs[..., :-1]).all()):
            raise ValueError("topk_logprobs must be sorted in descending order along the last dim")


def requested_method(method: str | None) -> str:
    """The hidden top-K method a call asks for: ``method``, else the ``JETSPEC_HIDDEN_TOPK``
    environment variable, else "auto"; a ValueError names whichever holds a bad value."""
    if method is None:
        return checks.choice(HIDDEN_TOPK_ENV, os.environ.get(HIDDEN_TOPK_ENV, "auto"),
                             HIDDEN_TOPK_METHODS)
    return checks.choice("method", method, HIDDEN_TOPK_METHODS)


def check_draft_tree_from_hidden(hidden, lm_head_weight, root_tokens, budget, topk, algorithm,
                                 method=None) -> str:
    """The checks of :func:`draft_tree_from_hidden`; returns the method asked for ("auto",
    "fused" or "gemm"; see :func:`requested_method`)."""
    method = requested_method(method)
    checks.tensor("hidden", hidden, dtypes=checks.FLOAT_DTYPES, ndim=3)
    b, _, h = hidden.shape
    checks.tensor("lm_head_weight", lm_head_weight, dtypes=(hidden.dtype,), ndim=2, device=hidden.device)
    if lm_head_weight.shape[1] != h:
        raise ValueError(f"lm_head_weight must have shape [V, {h}] to match hidden, got "
                         f"{list(lm_head_weight.shape)}")
    _nonempty("hidden", hidden, 1, "at least one draft depth")
    _nonempty("hidden", hidden, 2, "a non-empty hidden size")
    _nonempty("lm_head_weight", lm_head_weight, 0, "a non-empty vocabulary")
    _check_common(root_tokens, budget, topk, algorithm, batch=b, vocab=lm_head_weight.shape[0],
                  device=hidden.device)
    for name, t in (("hidden", hidden), ("lm_head_weight", lm_head_weight)):
        if t.numel() and checks.values_checked(t) and not bool(t.isfinite().all()):
            raise ValueError(f"{name} must be finite (its logits would have no log-softmax), got "
                             f"{int((~t.isfinite()).sum())} NaN or infinite values")
    return method


def gemm_logits(hidden, lm_head_weight):
    """``hidden @ lm_head_weight.T`` as float32 logits: the "gemm" method's first step.

    Parameters
    ----------
    hidden : float32/bfloat16/float16 [B, D, H] (any strides)
    lm_head_weight : same dtype [V, H] (rows may be padded: any row stride)

    Returns
    -------
    float32 [B, D, V]: products of the inputs accumulated in float32, never rounded to the input
    dtype (the fused kernels' numerics). CUDA fp16/bf16: cuBLAS with a float32 output
    (``torch.mm(..., out_dtype=torch.float32)``, torch >= 2.8); CUDA fp32: ``torch.mm``, which
    follows ``torch.backends.cuda.matmul`` (TF32 is off by default); other devices: both operands
    converted to float32 first (exact: fp16/bf16 products fit float32), which costs a float32
    copy of lm_head_weight (V * H * 4 bytes). Memory: the B * D * V * 4-byte logits (146 MB at
    B 16, D 15, V 151936). No host sync (capturable in a CUDA graph).
    """
    b, d, h = hidden.shape
    x = hidden.reshape(b * d, h)
    w_t = lm_head_weight.t()
    if hidden.dtype == torch.float32:
        out = torch.mm(x, w_t)
    elif hidden.device.type == "cuda":
        out = torch.mm(x, w_t, out_dtype=torch.float32)
    else:
        out = torch.mm(x.float(), w_t.float())
    return out.view(b, d, lm_head_weight.shape[0])


def gemm_topk(hidden, lm_head_weight, k: int, log_softmax_topk):
    """The "gemm" method's per-depth top-K: :func:`gemm_logits`, then ``log_softmax_topk``
    (a backend's, taking float32 logits [B', D', V] and ``k``), over chunks of the B * D rows
    whose logits fit ``launch_plan.HIDDEN_TOPK_GEMM_MAX_LOGITS_BYTES`` (one row at least).

    Returns (int32 [B, D, K], float32 [B, D, K])."""
    b, d, h = hidden.shape
    step = max(1, launch_plan.HIDDEN_TOPK_GEMM_MAX_LOGITS_BYTES // (4 * lm_head_weight.shape[0]))
    if b * d <= step:
        return log_softmax_topk(gemm_logits(hidden, lm_head_weight), k)
    rows = hidden.reshape(1, b * d, h)
    parts = [log_softmax_topk(gemm_logits(rows[:, i:i + step], lm_head_weight), k)
             for i in range(0, b * d, step)]
    return tuple(torch.cat(p, dim=1).view(b, d, k) for p in zip(*parts))


def tree_from_checked_topk(topk_tokens, topk_logprobs, root_tokens, *, budget: int, algorithm: str,
                           backend: str | None = None) -> Tree:
    """The second half of :func:`draft_tree` (the first is :func:`checked_topk`): the tree of
    ``budget`` nodes from per-depth top-K whose arguments were already checked (int32
    [B, D, K] tokens, float32 [B, D, K] log-probs, root tokens [B]); no checks run here."""
    parts = _backend.select(topk_tokens.device, "build_tree", backend)(
        topk_tokens, topk_logprobs, checks.as_dtype(root_tokens, torch.int32), budget, algorithm)
    return Tree(*parts, max_depth=min(topk_tokens.shape[1], budget - 1))


def checked_topk(draft, lm_head_weight, root_tokens, *, budget: int, topk: int, algorithm: str,
                 backend: str | None = None, method: str | None = None):
    """The first half of :func:`draft_tree` (``lm_head_weight`` None: ``draft`` is logits
    [B, D, V]) or :func:`draft_tree_from_hidden` (``draft`` is hidden states [B, D, H];
    ``method`` as there, unused for logits): the same checks, then the per-depth top-K (int32
    [B, D, K], float32 [B, D, K])."""
    if lm_head_weight is None:
        check_draft_tree(draft, root_tokens, budget, topk, algorithm)
        return _backend.select(draft.device, "log_softmax_topk", backend)(draft, topk)
    asked = method
    method = check_draft_tree_from_hidden(draft, lm_head_weight, root_tokens, budget, topk,
                                          algorithm, method)
    fused = _backend.implements(backend, "hidden_topk")
    if method == "auto":
        b, d, _ = draft.shape
        method = launch_plan.hidden_topk_method(b * d, draft.dtype, draft.device)
        if not fused:
            method = "gemm"  # the cuda backend has no fused kernel (launch_plan.py)
    elif method == "fused" and not fused:
        where = "method" if asked is not None else HIDDEN_TOPK_ENV
        name = backend if backend is not None else _backend.get_backend()
        raise _backend.BackendUnavailableError(
            f"backend {name!r} has no fused hidden top-K ({where}='fused'; deleted: it lost to "
            f"Triton's on the H200): use 'gemm' or 'auto', which takes the GEMM method there")
    if method == "fused":
        kernel = _backend.select(draft.device, "hidden_topk", backend,
                                 dict(hidden=draft, lm_head_weight=lm_head_weight))
        return kernel(draft, lm_head_weight, topk)
    return gemm_topk(draft, lm_head_weight, topk,
                     _backend.select(draft.device, "log_softmax_topk", backend))


def draft_tree(logits, root_tokens, *, budget: int, topk: int, algorithm: str = "topn",
               backend: str | None = None) -> Tree:
    """Build a draft tree from per-depth draft logits.

    Parameters
    ----------
    logits : float32/bfloat16/float16 [B, D, V]
        Row d holds the draft's logits for depth d + 1 (log-softmax is taken in fp32).
    root_tokens : int32/int64 [B]
        The anchor (last committed token) of each sequence; becomes node 0.
    budget : int in [1, MAX_BUDGET] (jetspec_kernels.limits)
        Tree capacity N (root included).
    topk : int in [1, min(MAX_TOPK, V)]
        Children per node (the per-depth top-K).
    algorithm : "topn" | "accum_logp"
        "topn": the budget best nodes by cumulative log-prob; "accum_logp": JetSpec's heap rule.
    backend : str, optional
        "auto", "cuda", "triton" or "reference" (default: :func:`get_backend`).

    Returns
    -------
    Tree with capacity N = budget and max_depth = min(D, budget - 1).
    """
    check_draft_tree(logits, root_tokens, budget, topk, algorithm)
    parts = _backend.select(logits.device, "draft_tree", backend)(
        logits, topk, checks.as_dtype(root_tokens, torch.int32), budget, algorithm)
    return Tree(*parts, max_depth=min(logits.shape[1], budget - 1))


def draft_tree_from_topk(topk_tokens, topk_logprobs, root_tokens, *, budget: int,
                         algorithm: str = "topn", backend: str | None = None) -> Tree:
    """Build a draft tree from per-depth top-K candidates an engine already holds.

    Parameters
    ----------
    topk_tokens : int32/int64 [B, D, K]
    topk_logprobs : float32 [B, D, K]
        Log-probs (<= 0) normalised over the full vocabulary, sorted descending along K.
    root_tokens : int32/int64 [B]
    budget, algorithm, backend : as in :func:`draft_tree`.

    Returns
    -------
    Tree (bit-exact across backends).
    """
    check_draft_tree_from_topk(topk_tokens, topk_logprobs, root_tokens, budget, algorithm)
    return tree_from_checked_topk(topk_tokens.to(torch.int32), topk_logprobs, root_tokens,
                                  budget=budget, algorithm=algorithm, backend=backend)


def draft_tree_from_hidden(hidden, lm_head_weight, root_tokens, *, budget: int, topk: int,
                           algorithm: str = "topn", backend: str | None = None,
                           method: str | None = None) -> Tree:
    """Build a draft tree from draft hidden states: the tree of
    ``log_softmax(hidden @ lm_head_weight.T)`` (fp32 accumulation), by default without
    materialising the logits.

    Parameters
    ----------
    hidden : float32/bfloat16/float16 [B, D, H]
        Final-norm hidden states of the draft block rows for depths 1..D.
    lm_head_weight : same dtype [V, H]
    root_tokens, budget, topk, algorithm, backend : as in :func:`draft_tree`.
    method : "auto" | "fused" | "gemm", optional
        How the per-depth top-K is computed (the same tree either way, up to ties within float32
        rounding). "fused": the backend's hidden_topk kernel, no logits in memory (triton and
        reference; the cuda backend has none: BackendUnavailableError). "gemm": float32 logits
        by torch (cuBLAS on a GPU; B * D * V * 4 bytes, in row chunks of at most
        launch_plan.HIDDEN_TOPK_GEMM_MAX_LOGITS_BYTES), then the backend's log_softmax_topk.
        "auto": launch_plan.hidden_topk_method's rule, a function of B * D, dtype and device
        (fused until a GPU run measures the crossover; docs/perf/hidden_topk.md), and "gemm" on a backend
        without a fused kernel. None (default): the ``JETSPEC_HIDDEN_TOPK`` environment
        variable, else "auto". Another value is a ValueError naming ``method`` (or the
        variable).

    Returns
    -------
    Tree, as :func:`draft_tree`.
    """
    tk, lp = checked_topk(hidden, lm_head_weight, root_tokens, budget=budget, topk=topk,
                          algorithm=algorithm, backend=backend, method=method)
    return tree_from_checked_topk(tk, lp, root_tokens, budget=budget, algorithm=algorithm,
                                  backend=backend)
