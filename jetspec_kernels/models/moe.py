"""The sparse MLP of Qwen3-MoE targets: router, top-k, and the experts run grouped.

Semantics are transformers' ``Qwen3MoeSparseMoeBlock``: router logits in the model dtype, softmax
in fp32, the top ``k`` probabilities (optionally renormalised to sum to 1) cast back to the model
dtype, each chosen expert's SwiGLU output scaled by its weight and summed over the ``k`` choices.

Experts are stored fused, as transformers holds them: ``gate_up [E, 2I, H]`` (gate rows first,
then up rows) and ``down [E, H, I]``. :func:`fuse_expert_weights` turns the per-expert checkpoint
layout (``mlp.experts.{j}.{gate,up,down}_proj.weight``) into it.
"""
from __future__ import annotations

import functools
import re

import torch
import torch.nn.functional as F

from .. import checks
from ..python_ref.silu_mul import silu_mul
from .checkpoint import CheckpointError, take

__all__ = ["moe_shapes", "fuse_expert_weights", "route", "grouped_experts", "grouped_mm_impl"]

_PER_EXPERT = ("gate_proj", "up_proj", "down_proj")
_EXPERT_KEY = re.compile(r"mlp\.experts\.(\d+)\.")


def moe_shapes(num_experts: int, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    """Expected shape of the router and fused expert tensors of a sparse layer (keys after
    ``model.layers.{i}.``)."""
    return {"mlp.gate.weight": (num_experts, hidden),
            "mlp.experts.gate_up_proj": (num_experts, 2 * inter, hidden),
            "mlp.experts.down_proj": (num_experts, hidden, inter)}


def fuse_expert_weights(weights: dict[str, torch.Tensor], layer_prefix: str, num_experts: int,
                        hidden: int, inter: int, where: str) -> None:
    """Replace one sparse layer's per-expert tensors in ``weights`` by the fused pair, in place.

    The per-expert tensors are removed from ``weights`` as they are copied (so a caller that owns
    the only reference frees them layer by layer). A layer already in the fused layout is left as
    it is; a layer holding both layouts, a missing expert tensor or one of the wrong shape, or an
    expert index ``>= num_experts`` raises :class:`CheckpointError` naming the tensor.

    Parameters
    ----------
    weights : key -> tensor; layer_prefix : e.g. ``"model.layers.3."``
    num_experts, hidden, inter : E, H and the experts' intermediate size I
    """
    base = layer_prefix + "mlp.experts."
    per_expert = [k for k in weights if k.startswith(base) and _EXPERT_KEY.match(k, len(layer_prefix))]
    if not per_expert:
        return
    fused = [base + name for name in ("gate_up_proj", "down_proj") if base + name in weights]
    if fused:
        raise CheckpointError(f"{where}: {layer_prefix}mlp.experts holds both the fused tensor "
                              f"{fused[0]!r} and per-expert tensors such as {per_expert[0]!r}")
    for k in per_expert:
        j = int(_EXPERT_KEY.match(k, len(layer_prefix)).group(1))
        if j >= num_experts:
            raise CheckpointError(f"{where}: tensor {k!r} is beyond the num_experts={num_experts} "
                                  "experts config.json declares")
    shapes = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    first = take(weights, f"{base}0.gate_proj.weight", shapes["gate_proj"], where)
    gate_up = first.new_empty(num_experts, 2 * inter, hidden)
    down = first.new_empty(num_experts, hidden, inter)
    for j in range(num_experts):
        keys = {name: f"{base}{j}.{name}.weight" for name in _PER_EXPERT}
        g, u, d = (take(weights, keys[name], shapes[name], where) for name in _PER_EXPERT)
        gate_up[j, :inter] = g
        gate_up[j, inter:] = u
        down[j] = d
        for key in keys.values():
            del weights[key]
    weights[base + "gate_up_proj"] = gate_up
    weights[base + "down_proj"] = down


def route(x: torch.Tensor, router_weight: torch.Tensor, top_k: int,
          norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing of each token.

    Parameters
    ----------
    x : [T, H]; router_weight : [E, H]

    Returns
    -------
    weights : [T, k] in x.dtype     the chosen experts' probabilities (renormalised when asked)
    experts : int64 [T, k]          expert ids, most probable first
    """
    return route_logits(F.linear(x, router_weight), top_k, norm_topk_prob)


def route_logits(logits: torch.Tensor, top_k: int,
                 norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`route` from the router's logits ``[T, E]`` (its results in the logits' dtype).
    Each row alone: a softmax and a top-k over one row's E values (the exact mode's triton
    engine: ``triton.exact_route.route_rows``, the same semantics a program per row)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), experts


def exact_experts(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor,
                  gate_up: torch.Tensor, down: torch.Tensor, act, *, parts: int = 1,
                  reduce=None) -> torch.Tensor:
    """:func:`grouped_experts` for the exact mode on triton: every (token, choice) row through its
    expert by the fixed-tile grouped GEMM (``triton.exact_matmul.exact_grouped_linear``), so a
    token's output depends on its row and its experts alone; the k choices are weighted in the
    model dtype and summed in choice order in float32, rounded once. No host sync.

    Parameters
    ----------
    x : [T, H]; weights : [T, k] (x.dtype); experts : int64 [T, k]; gate_up : [E, 2I, H];
    down : [E, H, I]; act : ``[rows, 2I] -> [rows, I]`` (the exact silu_mul)
    parts, reduce : as :func:`exact_moe`'s

    Returns
    -------
    [T, H] in x.dtype.
    """
    from ..ops.exact import sum_in_order
    from ..triton.exact_matmul import exact_grouped_linear, expert_tiles, sum_parts_pairwise, tiles
    t, k = experts.shape
    plan = expert_tiles(experts, gate_up.shape[0], tiles(x.dtype)[0])      # both GEMMs' tiles
    h = act(exact_grouped_linear(x, gate_up, experts, per_token=k, plan=plan))
    if parts == 1 and reduce is None:
        y = exact_grouped_linear(h, down, experts, per_token=1, plan=plan)
    else:           # each (token, choice) row's down in K parts: float32 shares, summed once
        y = sum_parts_pairwise(exact_grouped_linear(h, down, experts, per_token=1, plan=plan,
                                                    parts=parts),
                               x.dtype if reduce is None else torch.float32)
        y = y if reduce is None else reduce(y)
    return sum_in_order((y.view(t, k, -1) * weights[..., None]).unbind(1))


def grouped_mm_impl():
    """torch's grouped GEMM, or None: ``torch.nn.functional.grouped_mm`` (public from torch 2.10),
    else ``torch._grouped_mm`` (the private op it wraps, in 2.8 and 2.9). Both take
    ``(rows [M, K], weights [G, K, N], offs=int32 [G] group ends)`` and read no value on the host."""
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _use_grouped_mm(x: torch.Tensor) -> bool:
    # torch's grouped GEMM kernel takes bf16 on CUDA; for other dtypes and on the CPU torch would
    # loop over the groups itself after copying the offsets to the host, as our loop does.
    return x.is_cuda and x.dtype == torch.bfloat16 and grouped_mm_impl() is not None


def grouped_experts(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor,
                    gate_up: torch.Tensor, down: torch.Tensor, *,
                    grouped_mm: bool | None = None, act=None) -> torch.Tensor:
    """Sum over each token's chosen experts of ``weight * down(silu(gate(x)) * up(x))``; ``act``:
    the activation ``[rows, 2I] -> [rows, I]`` (the models pass the fused ``silu_mul``), None:
    ``python_ref.silu_mul`` in x's dtype (``F.silu(gate) * up``).

    The ``T * k`` (token, choice) rows are sorted by expert (stable), so each expert's rows are
    contiguous, and each expert with rows runs as one matmul for gate+up and one for down. No
    Python loop over tokens.

    Host syncs: none when ``grouped_mm`` (one grouped GEMM per projection over all experts, with
    the group offsets on the device: :func:`grouped_mm_impl`; CUDA-graph capturable). Otherwise a
    loop over the experts that have rows, which reads the per-expert row counts on the host once
    per call (one sync per sparse layer on a GPU; such a forward cannot be captured in a CUDA
    graph, and this raises if asked to).

    Parameters
    ----------
    x : [T, H]; weights : [T, k] (x.dtype); experts : int64 [T, k]
    gate_up : [E, 2I, H]; down : [E, H, I]
    grouped_mm : None = when the device has a grouped GEMM for the dtype (CUDA bf16) and torch
        has one (:func:`grouped_mm_impl`); True without one raises ``RuntimeError``

    Returns
    -------
    [T, H] in x.dtype.
    """
    t, k = experts.shape
    num_experts = gate_up.shape[0]
    sorted_ids, order = torch.sort(experts.reshape(-1), stable=True)
    rows = x[order // k]
    # ends[j]: one past the last row of expert j (rows of expert j: ends[j-1] .. ends[j]-1).
    ends = torch.searchsorted(sorted_ids, torch.arange(num_experts, device=x.device), right=True)
    if act is None:
        act = functools.partial(silu_mul, dtype=x.dtype)
    if grouped_mm is None:
        grouped_mm = _use_grouped_mm(x)
    if grouped_mm:
        mm = grouped_mm_impl()
        if mm is None:
            raise RuntimeError(f"MoE experts: grouped_mm=True but torch {torch.__version__} has neither "
                               "torch.nn.functional.grouped_mm nor torch._grouped_mm")
        offs = ends.to(torch.int32)
        h = mm(rows, gate_up.transpose(1, 2), offs=offs)
        y = mm(act(h), down.transpose(1, 2), offs=offs)
    else:
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("MoE experts: the per-expert loop reads row counts on the host and "
                               "cannot run inside CUDA-graph capture (use bf16, which takes the "
                               "grouped GEMM, or cuda_graphs=False)")
        y = torch.empty_like(rows)
        start = 0
        for j, end in enumerate(ends.tolist()):
            if end > start:
                h = F.linear(rows[start:end], gate_up[j])
                y[start:end] = F.linear(act(h), down[j])
            start = end
    y = y * weights.reshape(-1)[order, None]
    out = torch.empty_like(y)
    out[order] = y                     # back to (token, choice) order: deterministic, no atomics
    return out.view(t, k, -1).sum(dim=1)


def exact_moe(x: torch.Tensor, router_weight: torch.Tensor, gate_up: torch.Tensor,
              down: torch.Tensor, top_k: int, norm_topk_prob: bool,
              backend: str | None = None, *, parts: int = 1, reduce=None) -> torch.Tensor:
    """A sparse layer's MLP in the exact mode: every token's output row the same bits whatever
    the other tokens are and where they are routed.

    On the reference backend (the CPU) routing runs a token at a time and each expert's (token,
    choice) rows as one-row calls; on triton the router's logits by the fixed-tile GEMM, then
    ``triton.exact_route.route_rows`` (a program per token) and :func:`exact_experts` (one
    launch per GEMM, no host sync). Other
    backends and devices: ``ExactModeError`` (``ops.exact.exact_backend``).

    Parameters
    ----------
    x : [T, H]; router_weight : [E, H]; gate_up : [E, 2I, H]; down : [E, H, I]
    parts : the experts' down projection reduces K (I) in this many fixed parts, summed along
        ``ops.exact.sum_pairwise``'s tree (a target's exact_k_parts over tp)
    reduce : None, or the tensor-parallel sum of the (token, choice) rows' float32 down shares
        ``[T * k, H] -> [T * k, H]`` in x.dtype (``tp.all_reduce_pairwise``), applied before the
        choices are weighted and summed; the layer's output is then whole, not a partial sum.
        Each choice's down output is rounded once, after the parts' and the ranks' sum, so tp t
        with S / t parts a rank gives tp 1's bits with S parts; the choices are then weighted in
        x.dtype and summed in choice order in float32 (``ops.exact.sum_in_order``)

    Returns
    -------
    [T, H] in x.dtype.
    """
    from ..limits import EXACT_MAX_K_PARTS
    from ..ops import exact as ex
    be = ex.exact_backend("MoE experts", x.device, backend)
    checks.integer("top_k", top_k, lo=1, hi=router_weight.shape[0])    # either engine alike
    if not ex.k_parts_ok(parts, down.shape[-1]):
        raise ValueError(f"parts must be a power of two <= {EXACT_MAX_K_PARTS} dividing the "
                         f"experts' intermediate size {down.shape[-1]}, got {parts!r}")
    if x.shape[0] == 0:         # no token (every rank alike: no collective is skipped on one)
        return torch.empty_like(x)
    if be == "triton":
        from ..triton.exact_route import route_rows
        weights, experts = route_rows(ex.linear(x, router_weight, backend=be), top_k,
                                      norm_topk_prob)
        return exact_experts(x, weights, experts, gate_up, down,
                             functools.partial(ex.silu_mul, backend=be), parts=parts,
                             reduce=reduce)
    # Routing a token at a time; then each expert's (token, choice) rows through its matrices as
    # one-row calls (ops.exact's linear and silu_mul), its weights prepared once a call.
    weights, experts = ex.per_row(
        lambda r: route(r, router_weight, top_k, norm_topk_prob), x)          # [T, k] each
    t, h = x.shape[0], down.shape[1]
    flat = experts.reshape(-1)
    shares = torch.empty(t * top_k, h, dtype=torch.float32)
    for e in flat.unique().tolist():    # the reference runs on the CPU: no device sync
        entries = (flat == e).nonzero()[:, 0]
        hidden = ex.silu_mul(ex.linear(x[entries // top_k], gate_up[e], backend=be), backend=be)
        shares[entries] = ex.linear(hidden, down[e], backend=be, parts=parts, partial=True)
    y = shares.to(x.dtype) if reduce is None else reduce(shares)
    return ex.sum_in_order((y.view(t, top_k, h) * weights[..., None]).unbind(1))
