"""verify_tree: accept the longest tree path the target agrees with (greedy or sampling)."""
from __future__ import annotations

import struct

import torch

from .. import backend as _backend
from .. import checks
from ..tree import Tree, Verdict, mask_words
from ..python_ref.sampling import MAX_TOP_P_VOCAB

SEED_DTYPES = (torch.int64, torch.int32)


_STATIC: dict = {}  # signatures whose static checks passed (checks.signature)


def check_tree(tree, static: bool = True) -> None:
    """Shapes, dtypes and devices of a Tree's fields (``static`` False: skipped, the caller has
    seen them pass for this signature); values are the producer's responsibility, checked here
    only where value checks run."""
    if static:
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be a jetspec_kernels.Tree, got {type(tree).__name__}")
        checks.tensor("tree.tokens", tree.tokens, dtypes=checks.INDEX_DTYPES, ndim=2)
        b, n = tree.tokens.shape
        dev = tree.tokens.device
        checks.tensor("tree.parents", tree.parents, dtypes=checks.INDEX_DTYPES, shape=[b, n], device=dev)
        checks.tensor("tree.depths", tree.depths, dtypes=checks.INDEX_DTYPES, shape=[b, n], device=dev)
        checks.tensor("tree.scores", tree.scores, dtypes=(torch.float32,), shape=[b, n], device=dev)
        checks.tensor("tree.num_nodes", tree.num_nodes, dtypes=checks.INDEX_DTYPES, shape=[b], device=dev)
        checks.tensor("tree.mask", tree.mask, dtypes=checks.INDEX_DTYPES, shape=[b, n, mask_words(n)], device=dev)
        checks.integer("tree.max_depth", tree.max_depth, lo=0, hi=max(n - 1, 0))
    n = tree.tokens.shape[1]
    checks.value_range("tree.num_nodes", tree.num_nodes, 1 if n else 0, n)
    checks.value_range("tree.parents", tree.parents, -1, n - 1)
    checks.value_range("tree.depths", tree.depths, -1, tree.max_depth)


def _seed(name, t, b, dev):
    if t is None:
        raise ValueError(f"{name} is required when sampling (a temperature tensor, or temperature "
                         f"> 0): an int64 tensor [B] or [], or an int")
    if isinstance(t, int) and not isinstance(t, bool):
        t = torch.tensor(checks.integer(name, t, lo=-2**63, hi=2**63 - 1), dtype=torch.int64, device=dev)
    checks.tensor(name, t, dtypes=SEED_DTYPES, device=dev)
    if t.dim() == 0 or (t.dim() == 1 and t.shape[0] == 1):
        return t.reshape(1).to(torch.int64).expand(b).contiguous()
    checks.tensor(name, t, shape=[b])
    return t.to(torch.int64)


def _per_sequence(name, t, b, dev, dtypes, out_dtype):
    """A control given as a tensor: ``[B]`` or ``[]`` of one of ``dtypes`` on ``dev`` -> a
    contiguous ``out_dtype [B]`` copy. A wrong dtype or length is a ValueError naming ``name``."""
    if t.dtype not in dtypes:
        names = "/".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name} must be a number or a {names} tensor [B] or [], got dtype "
                         f"{str(t.dtype).replace('torch.', '')}")
    if not (t.dim() == 0 or (t.dim() == 1 and t.shape[0] in (1, b))):
        raise ValueError(f"{name} must hold one value per sequence: shape [{b}] or [], got "
                         f"{list(t.shape)}")
    if t.device != dev:
        raise ValueError(f"{name} must be on {dev} (like the other inputs), got {t.device}")
    return t.reshape(-1).to(out_dtype).expand(b).contiguous()


def _checked_values(name, t, ok, what):
    """``ok(t)`` holds for every value (only where value checks run: no host sync otherwise)."""
    if t.numel() and checks.values_checked(t) and not bool(ok(t).all()):
        bad = t[~ok(t)].reshape(-1)[0].item()
        raise ValueError(f"{name} values must be {what}, got {bad}")


def check_sampling(temperature, top_k, top_p, batch: int, device):
    """Check and normalise the sampling controls of ``batch`` sequences on ``device``.

    Parameters
    ----------
    temperature : number >= 0, or float32/float64 tensor [B] or [] (values >= 0; 0 = greedy)
    top_k : int >= 0, or int32/int64 tensor [B] or [] (0 = off; k >= V keeps all)
    top_p : number in (0, 1], or float32/float64 tensor [B] or [] (1 = off); used as float32

    Returns
    -------
    ``(temperature, top_k, top_p)``: temperature a float, or float32 [B] when given as a tensor
    (then every sequence may sample, so seeds are needed); top_k int32 [B] or None (off);
    top_p float32 [B] or None (off). Filters are None when temperature is the number 0 (greedy:
    they cannot change an argmax). Tensor values are checked only where value checks run.
    """
    if (type(temperature) is float and temperature == 0.0 and type(top_k) is int and top_k == 0
            and type(top_p) is float and top_p == 1.0):
        return temperature, None, None  # the greedy defaults: what the checks below return
    if isinstance(temperature, torch.Tensor):
        temperature = _per_sequence("temperature", temperature, batch, device,
                                    (torch.float32, torch.float64), torch.float32)
        _checked_values("temperature", temperature, lambda t: torch.isfinite(t) & (t >= 0),
                        "finite and >= 0")
    else:
        temperature = checks.number("temperature", temperature, lo=0.0)
    if isinstance(top_k, torch.Tensor):
        top_k = _per_sequence("top_k", top_k, batch, device, (torch.int32, torch.int64),
                              torch.int64)
        _checked_values("top_k", top_k, lambda t: t >= 0, ">= 0 (0 = off)")
        top_k = top_k.clamp(max=checks.INT32_MAX).to(torch.int32)
    else:
        k = checks.integer("top_k", top_k, lo=0)
        top_k = None if k == 0 else torch.full((batch,), min(k, checks.INT32_MAX), dtype=torch.int32,
                                               device=device)
    if isinstance(top_p, torch.Tensor):
        top_p = _per_sequence("top_p", top_p, batch, device, (torch.float32, torch.float64),
                              torch.float32)
        _checked_values("top_p", top_p, lambda t: (t > 0) & (t <= 1), "in (0, 1] (as float32)")
    else:
        p = checks.number("top_p", top_p)
        if not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")
        p32 = struct.unpack("f", struct.pack("f", p))[0]  # p rounded to float32
        if not p32 > 0:
            raise ValueError(f"top_p must be in (0, 1] as a float32, got {top_p!r}")
        # A fill on the device, not a host-to-device copy (so it can be captured in a graph).
        top_p = None if p32 >= 1 else torch.full((batch,), p32, dtype=torch.float32, device=device)
    if isinstance(temperature, float) and temperature == 0.0:
        top_k = top_p = None
    return temperature, top_k, top_p


def sampling(temperature) -> bool:
    """Whether normalised controls may sample (a temperature tensor, or a number > 0)."""
    return isinstance(temperature, torch.Tensor) or temperature > 0


def check_verify_tree(tree, target_logits, target_tokens, temperature, seed, offset, top_k=0,
                      top_p=1.0):
    key = None
    if isinstance(tree, Tree):
        key = checks.signature(tree.tokens, tree.parents, tree.depths, tree.scores, tree.num_nodes,
                               tree.mask, tree.max_depth, target_logits, target_tokens)
    static = key is None or key not in _STATIC
    check_tree(tree, static)
    b, n = tree.tokens.shape
    dev = tree.tokens.device
    if static:  # dtypes, shapes, devices: once per signature
        if n == 0:
            raise ValueError("tree must hold at least its root: tree.tokens has N=0 columns")
        if (target_logits is None) == (target_tokens is None):
            raise ValueError("pass exactly one of target_logits [B, N, V] and target_tokens [B, N]")
        if target_logits is not None:
            checks.tensor("target_logits", target_logits, dtypes=checks.FLOAT_DTYPES,
                          shape=[b, n, None], device=dev)
            if target_logits.shape[2] == 0:
                raise ValueError("target_logits must have a non-empty vocabulary dim")
        else:
            checks.tensor("target_tokens", target_tokens, dtypes=checks.INDEX_DTYPES, shape=[b, n],
                          device=dev)
        checks.remember(_STATIC, key, True)
    temperature, top_k, top_p = check_sampling(temperature, top_k, top_p, b, dev)
    if target_logits is not None:
        v = target_logits.shape[2]
        if top_p is not None and v > MAX_TOP_P_VOCAB:
            raise ValueError(f"target_logits: top_p takes vocabularies of at most {MAX_TOP_P_VOCAB} "
                             f"tokens (exact fixed-point masses), got V={v}")
        checks.value_range("tree.tokens", tree.tokens, 0, v - 1)
    else:
        checks.value_range("target_tokens", target_tokens, 0, None)
        checks.value_range("tree.tokens", tree.tokens, 0, None)
        if sampling(temperature):
            raise ValueError("sampling (a temperature tensor, or temperature > 0) needs "
                             "target_logits, not target_tokens")
    if sampling(temperature):
        seed = _seed("seed", seed, b, dev)
        offset = _seed("offset", offset, b, dev)
    else:
        seed = offset = None
    return temperature, seed, offset, top_k, top_p


def verify_tree(tree: Tree, target_logits=None, *, target_tokens=None, temperature=0.0,
                seed=None, offset=None, top_k=0, top_p=1.0, backend: str | None = None) -> Verdict:
    """Accept the longest path of ``tree`` that the target agrees with.

    Greedy (temperature 0): the target's token at a node is the argmax of its logits. Sampling:
    one Gumbel-max sample per node from softmax(logits / temperature) restricted to the tokens
    top-k then top-p keep (renormalised; python_ref.filter_keep), keyed by (seed, offset,
    sequence, node), then the same token matching; the output is distributed exactly as the
    target's own filtered samples. Each control may differ per sequence. Siblings with the
    same token: a greedy row accepts the longest agreeing chain (ties to the lower end index), a
    sampled row the lowest-index sibling (DESIGN.md). The root (node 0) is always verified: a row with ``num_nodes`` 0 (rejected where value checks run) is a
    one-node tree: accept_len 0, path [0, -1, ...], bonus = the target's token at node 0.

    Parameters
    ----------
    tree : Tree with capacity N
    target_logits : float [B, N, V], optional   the target's logits at each node (a NaN is
        the maximum, as in torch.argmax: a node whose row holds one gets its first NaN's token,
        greedy or sampled, whatever the filters)
    target_tokens : int32 [B, N], optional      or the target's already chosen token per node
    temperature : float >= 0, or float32/float64 tensor [B] or [] (0 = greedy for that sequence;
        filters do not apply to greedy sequences)
    seed, offset : int64 tensors [B] or [] (or ints); required when sampling (a temperature
        tensor, or temperature > 0)
    top_k : int >= 0 or int32/int64 tensor [B] or []: keep the k most likely tokens (0 = off)
    top_p : float in (0, 1] or float32/float64 tensor [B] or []: then keep the smallest set
        whose renormalised probability reaches top_p (1 = off; V <= 2**21 when on)

    Tensor controls are never read on the host (graph-capturable); their values are checked
    only where value checks run (CPU tensors by default).

    Returns
    -------
    Verdict(accept_len int32 [B], path int32 [B, M], bonus int32 [B], emitted int32 [B, M]),
    M = tree.max_depth + 1.
    """
    temperature, seed, offset, top_k, top_p = check_verify_tree(
        tree, target_logits, target_tokens, temperature, seed, offset, top_k, top_p)
    parts = _backend.select(tree.tokens.device, "verify_tree", backend, dict(tokens=tree.tokens))(
        tree.tokens, tree.parents, tree.num_nodes, tree.max_depth, target_logits, target_tokens,
        temperature, seed, offset, top_k, top_p)
    return Verdict(*parts)
