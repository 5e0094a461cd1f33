"""Benchmark the verification stage: verify_tree (greedy and sampling), qk_norm_rope_append
(tree K/V into the cache) and commit_kv (accepted K/V compaction), per backend vs baselines.

Row groups per (B, N) shape, Qwen3-8B sizes (V 151936, Hq 32, Hkv 8, Dh 128, one layer):
  ``.../greedy``, ``.../sample``, ``.../sample_topk_topp``  verify_tree from target logits
      [B, N, V] (the last with top-k 50 and top-p 0.9), against ``host`` (argmax or multinomial
      on the device, after torch.topk and a cumulative sum for the filters, ``.tolist()``, a
      Python walk, the result copied back; what JetSpec and SGLang do) and ``torch_vec`` (the
      same walk as D vectorised steps, no host sync).
      Floor bytes = B*N*V*elt (one read of the logits); FLOPs nominal 1 (greedy) or 25 (sampling:
      hash + two logs) per logit, counted against the matmul peak, so never the bound here.
  ``.../rope_append``  against ``torch_eager`` (RMSNorm, RoPE and index_put in eager PyTorch).
      Floor bytes = (2*B*N*Hq*Dh + 4*B*N*Hkv*Dh)*elt (q in/out, k and v in, k and v to the cache).
  ``.../commit``  against ``torch_eager`` (advanced-index gather then scatter of the path's K/V).
      Floor bytes = 4*B*(max_depth+1)*Hkv*Dh*elt (K and V, read and written).
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench import common as bc

BASELINES = ["host", "torch_vec", "torch_eager"]
# The filtered sampling rows (the target: sampled verify with top-k / top-p at most 1.5x its
# floor, the one read of the logits): transformers' common generation settings.
TOP_K, TOP_P = 50, 0.9


def shapes(opts: bc.Options):
    """(B, N) pairs and (V, Hq, Hkv, Dh, prefix)."""
    if not opts.cuda:
        return [(1, 16), (2, 32)], (1024, 4, 2, 64, 64)
    if opts.quick:
        return [(1, 64), (1, 256), (16, 128)], (151936, 32, 8, 128, 4096)
    return list(itertools.product((1, 4, 16), (64, 128, 256, 512))), (151936, 32, 8, 128, 4096)


# ----------------------------------------------------------------------------------------------
# Baselines
# ----------------------------------------------------------------------------------------------

def _target_tokens(logits, temperature, top_k=None, top_p=None, gen=None):
    """One target token per node: argmax, or a multinomial draw at ``temperature``; with
    ``top_k`` / ``top_p`` (Python numbers), over the k largest logits, then the smallest prefix
    of their renormalised distribution reaching top_p (what serving engines run: torch.topk,
    then a cumulative sum over the k)."""
    if temperature == 0:
        return logits.argmax(-1)
    x = logits.float() / temperature
    if top_k is None:
        probs = torch.softmax(x, -1)
        return torch.multinomial(probs.flatten(0, 1), 1, generator=gen).view(logits.shape[:2])
    vals, idx = x.topk(top_k, dim=-1)                  # sorted, descending
    probs = torch.softmax(vals, -1)
    if top_p is not None:
        before = probs.cumsum(-1) - probs
        probs = torch.where(before < top_p, probs, torch.zeros_like(probs))
    pick = torch.multinomial(probs.flatten(0, 1), 1, generator=gen).view(*logits.shape[:2], 1)
    return idx.gather(-1, pick)[..., 0]


def host_verify(tree, logits, temperature, top_k=None, top_p=None):
    """Target tokens on the device, then ``.tolist()`` and a Python walk from the root.

    Returns emitted tokens int64 [B, max_depth + 1] (-1 padded) on the logits' device.
    """
    tgt = _target_tokens(logits, temperature, top_k, top_p).tolist()
    tok, par, num = tree.tokens.tolist(), tree.parents.tolist(), tree.num_nodes.tolist()
    rows = []
    for b in range(len(tok)):
        children: dict[int, list[int]] = {}
        for i in range(1, num[b]):
            children.setdefault(par[b][i], []).append(i)
        cur, out = 0, []
        while len(out) < tree.max_depth:
            t = tgt[b][cur]
            nxt = next((c for c in children.get(cur, ()) if tok[b][c] == t), None)
            if nxt is None:
                break
            out.append(t)
            cur = nxt
        out.append(tgt[b][cur])
        rows.append(out + [-1] * (tree.max_depth + 1 - len(out)))
    return torch.tensor(rows, device=logits.device)


def vec_verify(tree, logits, temperature, top_k=None, top_p=None):
    """The acceptance walk as ``max_depth`` vectorised steps on the device (no host sync).

    Returns (accept_len int64 [B], emitted int64 [B, max_depth + 1]).
    """
    tgt = _target_tokens(logits, temperature, top_k, top_p)
    b_sz, n = tree.tokens.shape
    idx = torch.arange(n, device=tgt.device)
    valid = idx[None, :] < tree.num_nodes[:, None]
    cur = torch.zeros(b_sz, dtype=torch.long, device=tgt.device)
    alive = torch.ones(b_sz, dtype=torch.bool, device=tgt.device)
    emitted = torch.full((b_sz, tree.max_depth + 1), -1, dtype=torch.long, device=tgt.device)
    accept = torch.zeros(b_sz, dtype=torch.long, device=tgt.device)
    for step in range(tree.max_depth):
        t = tgt.gather(1, cur[:, None])
        match = valid & (tree.parents == cur[:, None]) & (tree.tokens == t)
        found = match.any(1) & alive
        first = torch.where(match, idx[None, :], n).min(1).values
        emitted[:, step] = torch.where(found, t[:, 0], emitted[:, step])
        cur = torch.where(found, first, cur)
        accept += found
        alive = found
    bonus = tgt.gather(1, cur[:, None])[:, 0]
    emitted.scatter_(1, accept[:, None], bonus[:, None])
    return accept, emitted


def eager_rope_append(q, k, v, qw, kw, positions, k_cache, v_cache, theta, eps, cache_start):
    """RMSNorm + RoPE + cache write in eager PyTorch (several kernels, fp32 intermediates)."""
    dh = q.shape[-1]
    h = dh // 2

    def norm(x, w):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()

    inv = theta ** (-torch.arange(0, h, device=q.device, dtype=torch.float32) * 2 / dh)
    ang = positions.float()[..., None] * inv                                    # [B, N, h]
    cos, sin = ang.cos()[:, :, None], ang.sin()[:, :, None]

    def rope(x):
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    qr, kr = rope(norm(q, qw)), rope(norm(k, kw))
    b_sz, n = positions.shape
    slots = cache_start[:, None].long() + torch.arange(n, device=q.device)
    bidx = torch.arange(b_sz, device=q.device)[:, None].expand(b_sz, n)
    k_cache[bidx, slots] = kr.to(k_cache.dtype)
    v_cache[bidx, slots] = v
    return qr.to(q.dtype)


def eager_commit(k_cache, v_cache, prefix_lens, path):
    """Gather the path's K/V rows then scatter them to prefix_len + i (padding rows rewrite the
    root slot with itself, so no mask is needed)."""
    b_sz, m = path.shape
    pre = prefix_lens.long()[:, None]
    src = pre + path.long().clamp_min(0)
    dst = torch.where(path >= 0, pre + torch.arange(m, device=path.device), pre)
    src = torch.where(path >= 0, src, pre)
    bidx = torch.arange(b_sz, device=path.device)[:, None].expand(b_sz, m)
    k_cache[bidx, dst] = k_cache[bidx, src]
    v_cache[bidx, dst] = v_cache[bidx, src]
    return prefix_lens + (path >= 0).sum(1).to(prefix_lens.dtype)


# ----------------------------------------------------------------------------------------------

def target_logits(tree, v, dtype, gen, accept_p=0.8):
    """Random logits where each node's first child wins the argmax with probability accept_p,
    so walks accept several tokens."""
    b_sz, n = tree.tokens.shape
    dev = tree.tokens.device
    logits = torch.randn(b_sz, n, v, device=dev, generator=gen)
    _, first_child, _ = tree.to_sglang()
    has = first_child >= 0
    child_tok = tree.tokens.long().gather(1, first_child.clamp_min(0))
    boost = has & (torch.rand(b_sz, n, device=dev, generator=gen) < accept_p)
    logits.scatter_add_(2, child_tok[..., None], (boost.float() * 30.0)[..., None])
    return logits.to(dtype)


def _ours(table, status, shape, fn, flops, nbytes, si):
    for name, why in status.items():
        table.run_ours(shape, name, why, lambda name=name: fn(name), first_shape=si == 0,
                       flops=flops, nbytes=nbytes)


def main(argv=None) -> int:
    p = bc.parser(__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=sorted(bc.DTYPES), default=None,
                   help="logits / cache dtype (default bf16 on CUDA, fp32 on the CPU)")
    opts = bc.options(p, argv)
    dtype = bc.DTYPES[opts.args.dtype or ("bf16" if opts.cuda else "fp32")]
    dev = opts.device
    import jetspec_kernels as jk

    ceil = bc.measure_ceilings(dev, torch.bfloat16 if opts.cuda else torch.float32, opts.quick)
    table = bc.Table("verify", opts, ceil, BASELINES)
    grid, (v, hq, hkv, dh, prefix_len) = shapes(opts)
    table.header_lines.append(f"V {v}, Hq {hq}, Hkv {hkv}, Dh {dh}, prefix {prefix_len}, "
                              f"{str(dtype)[6:]}; shape = BxN/<stage>")
    status = bc.backend_status(opts)
    gen = torch.Generator(device=dev).manual_seed(0)
    e = bc.elt(dtype)

    for si, (b, n) in enumerate(grid):
        tree = bc.random_tree(b, n, dev, seed=si)
        logits = target_logits(tree, v, dtype, gen)
        seed = torch.full((b,), 1234, dtype=torch.int64, device=dev)
        offset = torch.arange(b, dtype=torch.int64, device=dev)
        for mode, temp, per_elt, k, top_p in (("greedy", 0.0, 1.0, None, None),
                                              ("sample", 1.0, 25.0, None, None),
                                              ("sample_topk_topp", 1.0, 25.0, TOP_K, TOP_P)):
            if k is not None and opts.cuda and opts.quick and b < 16:
                continue  # the quick GPU run (device_check's small_ops step): B 16 only
            shape = f"{b}x{n}/{mode}"
            flops, nbytes = per_elt * b * n * v, float(b * n * v * e)
            table.run(shape, "host", lambda: host_verify(tree, logits, temp, k, top_p), flops=flops,
                      nbytes=nbytes)
            table.run(shape, "torch_vec", lambda: vec_verify(tree, logits, temp, k, top_p),
                      flops=flops, nbytes=nbytes)
            kw = dict(temperature=temp, seed=seed, offset=offset) if temp > 0 else {}
            if k is not None:
                kw.update(top_k=torch.full((b,), k, dtype=torch.int32, device=dev),
                          top_p=torch.full((b,), top_p, dtype=torch.float32, device=dev))
            _ours(table, status, shape,
                  lambda name: jk.verify_tree(tree, logits, backend=name, **kw), flops, nbytes, si)
        del logits

        # qk_norm_rope_append: the tree's q/k/v into a cache of prefix_len + n slots.
        shape = f"{b}x{n}/rope_append"
        q = torch.randn(b, n, hq, dh, device=dev, dtype=dtype, generator=gen)
        k = torch.randn(b, n, hkv, dh, device=dev, dtype=dtype, generator=gen)
        vv = torch.randn(b, n, hkv, dh, device=dev, dtype=dtype, generator=gen)
        qw = torch.rand(dh, device=dev, generator=gen).to(dtype) + 0.5
        kw_ = torch.rand(dh, device=dev, generator=gen).to(dtype) + 0.5
        k_cache = torch.randn(b, prefix_len + n, hkv, dh, device=dev, dtype=dtype, generator=gen)
        v_cache = torch.randn_like(k_cache)
        prefix = torch.full((b,), prefix_len, dtype=torch.int32, device=dev)
        positions = tree.positions(prefix)
        nbytes = float((2 * b * n * hq * dh + 4 * b * n * hkv * dh) * e + b * n * 4)
        flops = float(b * n * (hq + hkv) * dh * 8)    # nominal: norm + rotate, a few ops per element
        table.run(shape, "torch_eager",
                  lambda: eager_rope_append(q, k, vv, qw, kw_, positions, k_cache, v_cache, 1e6,
                                            1e-6, prefix), flops=flops, nbytes=nbytes)
        _ours(table, status, shape,
              lambda name: jk.qk_norm_rope_append(q, k, vv, qw, kw_, positions, k_cache, v_cache,
                                                  rope_theta=1e6, cache_start=prefix, backend=name),
              flops, nbytes, si)

        # commit_kv: a real verdict (reference, on the CPU) on this tree.
        shape = f"{b}x{n}/commit"
        tree_cpu = bc.random_tree(b, n, torch.device("cpu"), seed=si)
        tt = torch.randint(0, 256, (b, n), dtype=torch.int32)
        _, fc, _ = tree_cpu.to_sglang()
        tt = torch.where(fc >= 0, tree_cpu.tokens.gather(1, fc.clamp_min(0)), tt).to(torch.int32)
        verdict = jk.verify_tree(tree_cpu, target_tokens=tt, backend="reference")
        verdict = jk.Verdict(*(x.to(dev) for x in verdict))
        m = verdict.path.shape[1]
        nbytes = float(4 * b * m * hkv * dh * e)
        table.run(shape, "torch_eager", lambda: eager_commit(k_cache, v_cache, prefix, verdict.path),
                  flops=0.0, nbytes=nbytes)
        _ours(table, status, shape,
              lambda name: jk.commit_kv(k_cache, v_cache, prefix, verdict, backend=name),
              0.0, nbytes, si)
        del q, k, vv, k_cache, v_cache
    return table.finish()


if __name__ == "__main__":
    bc.main_guard(main)
