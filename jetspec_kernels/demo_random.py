"""``python -m jetspec_kernels demo --random-round``: one speculative round on random data.

Draft logits -> draft_tree -> tree K/V appended (qk_norm_rope_append) -> tree_attention ->
verify_tree -> commit_kv, at realistic shapes (D=15, V=151936, K=8, budget=64, Qwen3-8B heads
Hq=32, Hkv=8, Dh=128, a 1K prefix), printing the tree, the verdict and the time of each stage.
"""
from __future__ import annotations

import argparse
import time

import torch

import jetspec_kernels as jk
from jetspec_kernels import backend as _backend
from jetspec_kernels.generate_cli import PROG, Parser, UsageError, int_at_least, parse_device
from jetspec_kernels.limits import MAX_BUDGET, MAX_TOPK

def _timed(device, fn):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, (time.perf_counter() - t0) * 1e3


def _rigged_target_logits(tree: jk.Tree, vocab: int, agree_depth: int, gen) -> torch.Tensor:
    """Random target logits that agree with the draft's rank-0 child down to ``agree_depth``."""
    b, n = tree.tokens.shape
    logits = torch.randn(b, n, vocab, generator=gen, device=tree.tokens.device)
    idx = torch.arange(n, device=tree.tokens.device)
    # first child of each node (the rank-0 child comes first among its siblings in both orders)
    parents = tree.parents.long()
    is_child = (parents[:, None, :] == idx[None, :, None]) & (idx[None, None, :] < tree.num_nodes[:, None, None])
    first = torch.where(is_child, idx[None, None, :], torch.full_like(is_child, n, dtype=torch.long)).min(-1).values
    has_child = (first < n) & (tree.depths < agree_depth)
    child_tok = tree.tokens.long().gather(1, first.clamp(max=n - 1))
    boost = torch.zeros_like(logits)
    boost.scatter_(2, child_tok[..., None], 30.0)
    return logits + boost * has_child[..., None]


def random_round(argv=None) -> int:
    """The one-round random-data demo (``demo --random-round``); returns the exit status."""
    p = Parser(prog=f"{PROG} demo --random-round", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default=None, choices=_backend.BACKENDS)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int_at_least(1), default=2)
    p.add_argument("--prefix", type=int_at_least(0), default=1024)
    p.add_argument("--depth", type=int_at_least(1), default=15)
    p.add_argument("--vocab", type=int_at_least(1), default=151936)
    p.add_argument("--topk", type=int_at_least(1, MAX_TOPK), default=8)
    p.add_argument("--budget", type=int_at_least(1, MAX_BUDGET), default=64)
    p.add_argument("--algorithm", default="topn", choices=["topn", "accum_logp"])
    p.add_argument("--heads", type=int_at_least(1), nargs=3, default=[32, 8, 128],
                   metavar=("HQ", "HKV", "DH"))
    p.add_argument("--agree-depth", type=int_at_least(0), default=6,
                   help="the random target agrees with the draft's best child down to this depth")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.topk > args.vocab:
        raise UsageError(f"--topk {args.topk} exceeds --vocab {args.vocab}")
    hq, hkv, dh = args.heads
    if hq % hkv or dh % 2:
        raise UsageError(f"--heads {hq} {hkv} {dh}: HQ must be a multiple of HKV and DH even")

    device = parse_device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    backend = _backend.resolve(device, args.backend)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    b, hq, hkv, dh = args.batch, *args.heads
    n = args.budget
    print(f"jetspec_kernels {jk.__version__} demo: backend {backend!r} on {device} ({dtype}), "
          f"B={b}, D={args.depth}, V={args.vocab}, K={args.topk}, budget={n}, "
          f"heads {hq}/{hkv}x{dh}, prefix {args.prefix}")

    stages = {}
    logits = 4.0 * torch.randn(b, args.depth, args.vocab, generator=gen, device=device)
    roots = torch.randint(0, args.vocab, (b,), generator=gen, device=device, dtype=torch.int32)
    tree, stages["draft_tree"] = _timed(device, lambda: jk.draft_tree(
        logits.to(dtype), roots, budget=n, topk=args.topk, algorithm=args.algorithm, backend=backend))
    print(tree.pretty(0))

    prefix_lens = torch.tensor([args.prefix - 37 * i for i in range(b)], device=device,
                               dtype=torch.int32).clamp_min(0)
    cap = args.prefix + n
    k_cache = torch.randn(b, cap, hkv, dh, generator=gen, device=device).to(dtype)
    v_cache = torch.randn(b, cap, hkv, dh, generator=gen, device=device).to(dtype)
    q = torch.randn(b, n, hq, dh, generator=gen, device=device).to(dtype)
    k = torch.randn(b, n, hkv, dh, generator=gen, device=device).to(dtype)
    v = torch.randn(b, n, hkv, dh, generator=gen, device=device).to(dtype)
    norm_w = torch.ones(dh, device=device, dtype=dtype)
    q, stages["qk_norm_rope_append"] = _timed(device, lambda: jk.qk_norm_rope_append(
        q, k, v, norm_w, norm_w, tree.positions(prefix_lens), k_cache, v_cache,
        rope_theta=1e6, cache_start=prefix_lens, backend=backend))
    out, stages["tree_attention"] = _timed(device, lambda: jk.tree_attention(
        q, k_cache, v_cache, prefix_lens, tree.mask, backend=backend))

    target_logits = _rigged_target_logits(tree, args.vocab, args.agree_depth, gen)
    verdict, stages["verify_tree"] = _timed(device, lambda: jk.verify_tree(
        tree, target_logits, backend=backend))
    commit, stages["commit_kv"] = _timed(device, lambda: jk.commit_kv(
        k_cache, v_cache, prefix_lens, verdict, backend=backend))

    print(f"\ntree attention out {tuple(out.shape)} {out.dtype}, finite: {bool(torch.isfinite(out).all())}")
    for i in range(b):
        m = int(verdict.accept_len[i]) + 1
        print(f"seq {i}: accepted {m - 1} draft tokens, path {verdict.path[i, :m].tolist()}, "
              f"emitted {verdict.emitted[i, :m].tolist()}, prefix {int(prefix_lens[i])} -> "
              f"{int(commit.prefix_lens[i])}")
    print(f"\n{'stage':22s} {'backend':10s} {'ms':>9s}")
    for name, ms in stages.items():
        print(f"{name:22s} {backend:10s} {ms:9.2f}")
    print(f"{'round total':22s} {'':10s} {sum(stages.values()):9.2f}")
    return 0
