"""Benchmark draft-tree building: per-depth log-softmax + top-K + tree + packed mask.

Three groups of rows per shape:
  ``.../logits``    ``draft_tree(logits [B, D, V])`` for each backend and algorithm (``topn``,
                    ``accum``) against ``host`` (JetSpec's published path: full log_softmax, topk,
                    ``.tolist()``, a Python heap, a NumPy ancestor matrix, H2D copies) and
                    ``torch_vec`` (a vectorised PyTorch top-n tree, no host sync).
  ``.../from_topk`` the tree stage alone, ``draft_tree_from_topk``, against the same two paths
                    started from the top-K.
  ``.../from_hidden`` ``draft_tree_from_hidden(hidden [B, D, H], lm_head [V, H])`` against the
                    same two paths after ``hidden @ lm_head.T`` (cuBLAS): ``<backend>:<algorithm>``
                    rows run ``method="fused"`` (the lm_head GEMM fused with the top-K, no logits
                    in memory; skipped for the cuda backend, which has no fused kernel),
                    ``<backend>:gemm`` rows ``method="gemm"`` (float32 logits by
                    cuBLAS, then the backend's log_softmax_topk; topn tree), the two sides of
                    launch_plan.hidden_topk_method's crossover (docs/perf/
                    hidden_topk.md).

``--groups`` keeps some of the three groups, ``--batches`` replaces the shapes by the headline
draft shape at those batch sizes (D 15, K 7, budget 64 at B 1, else 128; on the CPU: D 4, V 2048,
K 4, budget 16): ``--quick --graphs --groups from_hidden --batches 1,4,16`` measures the
crossover. Rows are written to the CSV as they finish (a run killed by a time limit keeps them).

Floor: bytes = B*D*V*elt for the logits group (one read of the logits; top-K and the tree are
tiny), FLOPs = 4*B*D*V (nominal: max, subtract, exp, sum; never the bound). The from_topk group's
floor counts its inputs and outputs only, so its time/floor shows launch and latency cost. The
from_hidden group's floor is one read of lm_head and hidden (bytes (V + B*D)*H*elt, FLOPs
2*B*D*V*H): at Qwen3-8B's V=151936, H=4096 in bf16 that is 1.24 GB, 260 us at 4.8 TB/s.
"""
from __future__ import annotations

import heapq
import itertools
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from bench import common as bc
from jetspec_kernels.generate_cli import int_at_least

BASELINES = ["host", "torch_vec"]
ALGOS = {"topn": "topn", "accum": "accum_logp"}


GROUPS = ("logits", "from_topk", "from_hidden")


def headline_shape(b: int, cuda: bool):
    """The headline draft shape at batch ``b`` (the CPU's stand-in off a GPU)."""
    if not cuda:
        return (b, 4, 2048, 4, 16)
    return (b, 15, 151936, 7, 64 if b == 1 else 128)


def shapes(opts: bc.Options):
    """(B, D, V, K, budget) tuples."""
    if opts.args.batches:
        return [headline_shape(b, opts.cuda) for b in opts.args.batches]
    if not opts.cuda:
        return [(1, 4, 2048, 4, 16), (2, 5, 2048, 4, 32)]
    if opts.quick:
        # (1, 15, V, 8, 256) is the shape draft_tree's target time is set at (under 20 us).
        return [(1, 15, 151936, 7, 64), (1, 15, 151936, 8, 256), (16, 15, 151936, 7, 128),
                (1, 20, 151936, 8, 512)]
    return [(b, d, 151936, k, n) for b, d, k, n in
            itertools.product((1, 16), (15, 20), (4, 7, 8, 16), (64, 128, 256, 512))]


# ----------------------------------------------------------------------------------------------
# Baselines
# ----------------------------------------------------------------------------------------------

def host_tree_from_topk(vals: torch.Tensor, idx: torch.Tensor, root: torch.Tensor, budget: int):
    """JetSpec's host path from per-depth top-K: ``.tolist()``, heap, NumPy ancestors, H2D.

    Parameters
    ----------
    vals : float32 [B, D, K] log-probs (descending); idx : int [B, D, K] tokens; root : int [B]

    Returns
    -------
    tokens int64 [B, N], parents int64 [B, N], positions int64 [B, N] (depths), mask bool [B, N, N],
    on the device of ``vals``.
    """
    dev = vals.device
    b_sz, d_max, k = vals.shape
    vals_l, idx_l, root_l = vals.tolist(), idx.tolist(), root.tolist()
    tok = np.zeros((b_sz, budget), np.int64)
    par = np.full((b_sz, budget), -1, np.int64)
    dep = np.full((b_sz, budget), -1, np.int64)
    anc = np.zeros((b_sz, budget, budget), np.bool_)
    for b in range(b_sz):
        tokens, parents, depths, scores = [root_l[b]], [-1], [0], [0.0]
        heap = [(-0.0, 0, 0)]
        counter = 1
        while heap and len(tokens) < budget:
            _, _, i = heapq.heappop(heap)
            d = depths[i]
            if d == d_max:
                continue
            for r in range(min(k, budget - len(tokens))):
                s = scores[i] + vals_l[b][d][r]
                tokens.append(idx_l[b][d][r])
                parents.append(i)
                depths.append(d + 1)
                scores.append(s)
                heapq.heappush(heap, (-s, counter, len(tokens) - 1))
                counter += 1
        n = len(tokens)
        tok[b, :n], par[b, :n], dep[b, :n] = tokens, parents, depths
        for i in range(n):
            if parents[i] >= 0:
                anc[b, i] = anc[b, parents[i]]
            anc[b, i, i] = True
    return (torch.from_numpy(tok).to(dev), torch.from_numpy(par).to(dev),
            torch.from_numpy(dep).to(dev), torch.from_numpy(anc).to(dev))


def host_tree(logits, root, budget, k):
    """The full host path from logits [B, D, V]."""
    vals, idx = torch.log_softmax(logits.float(), -1).topk(k, -1)
    return host_tree_from_topk(vals, idx, root, budget)


def vec_tree_from_topk(vals: torch.Tensor, idx: torch.Tensor, root: torch.Tensor, budget: int):
    """A vectorised PyTorch top-n tree (no host sync): per depth keep the best ``budget - 1``
    children of the previous depth's survivors, then the best ``budget - 1`` over all depths.

    Returns tokens, parents, depths (int64 [B, N], depth-major order) and mask bool [B, N, N].
    """
    b_sz, d_max, k = vals.shape
    dev = vals.device
    keep = budget - 1
    scores, parents, tokens, depth_of = [], [], [], []
    prev = torch.zeros(b_sz, 1, device=dev)
    for d in range(d_max):
        cand = (prev[:, :, None] + vals[:, d, None, :]).flatten(1)               # [B, M*K]
        m = min(keep, cand.shape[1])
        if m == 0:
            break
        s, pos = cand.topk(m, dim=1)
        scores.append(s)
        parents.append(pos // k)
        tokens.append(idx[:, d].gather(1, pos % k))
        depth_of.append(torch.full_like(pos, d + 1))
        prev = s
    all_s = torch.cat(scores, 1)
    offsets = list(itertools.accumulate([0] + [s.shape[1] for s in scores]))
    # Parent index within the concatenation (the root is -1).
    par_global = torch.cat([torch.full_like(parents[0], -1)] +
                           [p + offsets[i] for i, p in enumerate(parents[1:])], 1)
    n_sel = min(keep, all_s.shape[1])
    sel = torch.zeros_like(all_s, dtype=torch.bool)
    sel.scatter_(1, all_s.topk(n_sel, dim=1).indices, True)
    out_pos = sel.cumsum(1) * sel                                             # 1..n, 0 = dropped
    par_out = torch.where(par_global >= 0,
                          out_pos.gather(1, par_global.clamp_min(0)), torch.zeros_like(par_global))
    n = budget
    tok = torch.zeros(b_sz, n, dtype=torch.int64, device=dev)
    par = torch.full((b_sz, n), -1, dtype=torch.int64, device=dev)
    dep = torch.full((b_sz, n), -1, dtype=torch.int64, device=dev)
    tok[:, 0], dep[:, 0] = root.long(), 0
    dst = torch.where(sel, out_pos, torch.zeros_like(out_pos))
    # Unselected candidates all land on slot 0 and are then overwritten by the root again.
    tok.scatter_(1, dst, torch.cat(tokens, 1).long())
    par.scatter_(1, dst, par_out)
    dep.scatter_(1, dst, torch.cat(depth_of, 1))
    tok[:, 0], par[:, 0], dep[:, 0] = root.long(), -1, 0
    eye = torch.eye(n, dtype=torch.bool, device=dev).expand(b_sz, n, n)
    mask = eye.clone()
    rows = par.clamp_min(0)[:, :, None].expand(b_sz, n, n)
    has_parent = (par >= 0)[:, :, None]
    for _ in range(d_max):
        mask = eye | (has_parent & mask.gather(1, rows))
    return tok, par, dep, mask


def vec_tree(logits, root, budget, k):
    vals, idx = torch.log_softmax(logits.float(), -1).topk(k, -1)
    return vec_tree_from_topk(vals, idx, root, budget)


# ----------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    p = bc.parser(__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=sorted(bc.DTYPES), default=None,
                   help="logits dtype (default bf16 on CUDA, fp32 on the CPU)")
    p.add_argument("--algorithms", default="topn,accum", help="comma list out of topn,accum")
    p.add_argument("--groups", type=bc.comma_list(bc.one_of(GROUPS)), default=list(GROUPS),
                   help=f"comma list out of {','.join(GROUPS)} (default: all)")
    p.add_argument("--batches", type=bc.comma_list(int_at_least(1)), default=None,
                   help="comma list of batch sizes: the headline draft shape at each (D 15, V "
                        "151936, K 7; the CPU: D 4, V 2048) instead of the sweep")
    opts = bc.options(p, argv)
    dtype = bc.DTYPES[opts.args.dtype or ("bf16" if opts.cuda else "fp32")]
    algos = [a for a in opts.args.algorithms.split(",") if a]
    dev = opts.device
    import jetspec_kernels as jk
    from jetspec_kernels.backend import implements

    ceil = bc.measure_ceilings(dev, torch.bfloat16 if opts.cuda else torch.float32, opts.quick)
    table = bc.Table("draft_tree", opts, ceil, BASELINES, stream=True)
    table.header_lines.append(f"logits {str(dtype)[6:]}; shape = BxDxV/k<K>/n<budget>/<group>; "
                              "backend labels <backend>:<algorithm>; from_hidden: fused, and "
                              "<backend>:gemm for method=\"gemm\" (topn)")
    status = bc.backend_status(opts)
    gen = torch.Generator(device=dev).manual_seed(0)
    e = bc.elt(dtype)
    hid = 4096 if opts.cuda else 64
    heads = {}  # one lm_head per vocabulary size, shared by the shapes
    hidden_done = set()


    for si, (b, d, v, k, budget) in enumerate(shapes(opts)):
        base = f"{b}x{d}x{v}/k{k}/n{budget}"
        scale = torch.linspace(6, 2, d, device=dev)[None, :, None]
        logits = (torch.randn(b, d, v, device=dev, generator=gen) * scale).to(dtype)
        root = torch.randint(0, v, (b,), device=dev, dtype=torch.int32, generator=gen)
        vals, idx = torch.log_softmax(logits.float(), -1).topk(k, -1)
        idx32 = idx.to(torch.int32)
        if v not in heads:
            heads[v] = (torch.randn(v, hid, device=dev, generator=gen) / hid ** 0.5).to(dtype)
        w = heads[v]
        hidden = (torch.randn(b, d, hid, device=dev, generator=gen) * 4).to(dtype)
        groups = {
            "logits": (4.0 * b * d * v, float(b * d * v * e),
                       lambda name, alg: jk.draft_tree(logits, root, budget=budget, topk=k,
                                                       algorithm=alg, backend=name),
                       lambda: host_tree(logits, root, budget, k),
                       lambda: vec_tree(logits, root, budget, k)),
            "from_topk": (0.0, float(b * d * k * 8 + b * budget * (4 * 4 + 4 * ((budget + 31) // 32))),
                          lambda name, alg: jk.draft_tree_from_topk(idx32, vals, root, budget=budget,
                                                                    algorithm=alg, backend=name),
                          lambda: host_tree_from_topk(vals, idx, root, budget),
                          lambda: vec_tree_from_topk(vals, idx, root, budget)),
            "from_hidden": (2.0 * b * d * v * hid, float((v + b * d) * hid * e),
                            lambda name, alg, method="fused": jk.draft_tree_from_hidden(
                                hidden, w, root, budget=budget, topk=k, algorithm=alg, backend=name,
                                method=method),
                            lambda: host_tree(hidden @ w.T, root, budget, k),
                            lambda: vec_tree(hidden @ w.T, root, budget, k)),
        }
        if opts.quick and (b, d, v) in hidden_done:
            del groups["from_hidden"]  # the lm_head read dominates; once per (B, D, V) in --quick
        hidden_done.add((b, d, v))
        for group, (flops, nbytes, ours, host, vec) in groups.items():
            if group not in opts.args.groups:
                continue
            shape = f"{base}/{group}"
            table.run(shape, "host", host, flops=flops, nbytes=nbytes)
            table.run(shape, "torch_vec", vec, flops=flops, nbytes=nbytes)
            for name, why in status.items():
                fused_why = why
                if group == "from_hidden" and why is None and not implements(name, "hidden_topk"):
                    fused_why = f"{name} has no fused hidden_topk: its path is {name}:gemm"
                for alg in algos:
                    table.run_ours(shape, name, fused_why,
                                   lambda name=name, alg=ALGOS[alg]: ours(name, alg),
                                   first_shape=si == 0, flops=flops, nbytes=nbytes,
                                   label=f"{name}:{alg}")
                if group == "from_hidden":  # the GEMM method, one tree algorithm (topn)
                    table.run_ours(shape, name, why,
                                   lambda name=name: ours(name, "topn", method="gemm"),
                                   first_shape=si == 0, flops=flops, nbytes=nbytes,
                                   label=f"{name}:gemm")
        del logits, vals, idx, idx32, hidden
    return table.finish()


if __name__ == "__main__":
    bc.main_guard(main)
