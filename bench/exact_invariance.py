"""Row invariance of every op of the target's forward, normal and exact (docs/perf/exact_mode.md).

An op is row-invariant when row i of an M-row call is the same bits as the 1-row call on row i
alone, and as row i of another M-row call whose other rows hold other data. For tree attention
the 1-row call is the one-token decode step at the node's logical position (its ancestors
committed before it). ``python bench/exact_invariance.py`` prints, per op, shape and dtype, how
many of the M rows break that in the normal form and in the exact form (``ops.exact``); the
tests (tests/test_exact_ops.py) use :func:`row_mismatches` and :func:`tree_vs_decode_mismatches`.

    python bench/exact_invariance.py [--quick] [--backend reference|triton] [--csv PATH]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jetspec_kernels as jk  # noqa: E402
from jetspec_kernels import python_ref as ref  # noqa: E402
from jetspec_kernels.ops import exact as ex  # noqa: E402


def _bits(t: torch.Tensor) -> torch.Tensor:
    """An integer view of ``t``'s bits (so NaNs and signed zeros compare exactly)."""
    if not t.is_floating_point():
        return t
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def row_mismatches(fn, inputs, gen: torch.Generator) -> int:
    """How many rows i of ``fn(*inputs)`` (each input ``[M, ...]``, split along dim 0) differ in
    their bits from ``fn`` on row i alone, or from row i of a call whose other rows are redrawn.
    ``fn`` returns one tensor ``[M, ...]`` or a tuple of them (all compared)."""
    def outs(*args):
        o = fn(*args)
        return o if isinstance(o, tuple) else (o,)

    m = inputs[0].shape[0]
    full = outs(*inputs)
    bad = 0
    for i in range(m):
        alone = outs(*(t[i:i + 1].clone() for t in inputs))
        mixed_in = [_redrawn(t, i, gen) for t in inputs]
        mixed = outs(*mixed_in)
        ok = all(same_bits(f[i:i + 1], a) and same_bits(f[i:i + 1], x[i:i + 1])
                 for f, a, x in zip(full, alone, mixed))
        bad += not ok
    return bad


def _redrawn(t: torch.Tensor, keep: int, gen: torch.Generator) -> torch.Tensor:
    """``t`` with every row but ``keep`` replaced by new random data of its kind."""
    if t.is_floating_point():
        new = torch.randn(t.shape, generator=gen).to(t.dtype)
    else:
        new = torch.randint(0, int(t.max()) + 1, t.shape, generator=gen).to(t.dtype)
    new[keep] = t[keep]
    return new


def random_tree_mask(n: int, gen: torch.Generator, pad: int = 0):
    """parents int32 [1, n] (random, parents before children), num_nodes [1] (n - pad) and the
    packed mask [1, n, W] from python_ref."""
    parents = torch.full((1, n), -1, dtype=torch.int32)
    for i in range(1, n - pad):
        parents[0, i] = int(torch.randint(0, i, (1,), generator=gen))
    num = torch.tensor([n - pad], dtype=torch.int32)
    return parents, num, ref.pack_mask(parents, num).to(torch.int32)


def _chain(parents: torch.Tensor, i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = int(parents[0, i])
    return out[::-1]


def tree_vs_decode_mismatches(prefix: int, n: int, dtype, gen, *, exact: bool, page_size=None,
                              pad: int = 0, heads=(4, 2), dh: int = 64, backend=None,
                              parents=None, device="cpu") -> int:
    """Tree nodes whose attention row differs in its bits from the one-token decode step at the
    same logical position: the prefix, then the node's ancestors and itself committed at
    ``prefix .. prefix + depth`` of a fresh cache (contiguous, or paged with ``page_size`` and a
    shuffled block table). Padding nodes (the last ``pad``) see the prefix and themselves: their
    decode step is the prefix and their own key. Inputs are drawn on the CPU, then moved to
    ``device``."""
    hq, hkv = heads
    if parents is None:
        parents, num, mask = random_tree_mask(n, gen, pad)
    else:
        num = torch.tensor([n - pad], dtype=torch.int32)
        mask = ref.pack_mask(parents, num).to(torch.int32)
    cap = prefix + n + 8
    if page_size is not None:
        cap = -(-cap // page_size) * page_size
    k = torch.randn(1, cap, hkv, dh, generator=gen).to(dtype)
    v = torch.randn(1, cap, hkv, dh, generator=gen).to(dtype)
    q = torch.randn(1, n, hq, dh, generator=gen).to(dtype)

    def layout(kc, vc):
        if page_size is None:
            return kc, vc, None
        pages = cap // page_size
        table = torch.randperm(pages, generator=gen).to(torch.int32)[None]
        kp, vp = torch.empty(pages, page_size, hkv, dh, dtype=dtype), torch.empty(
            pages, page_size, hkv, dh, dtype=dtype)
        for p in range(pages):
            kp[table[0, p]] = kc[0, p * page_size:(p + 1) * page_size]
            vp[table[0, p]] = vc[0, p * page_size:(p + 1) * page_size]
        return kp, vp, table

    def dev(*ts):
        return tuple(None if t is None else t.to(device) for t in ts)

    kt, vt, table = dev(*layout(k, v))
    tree = jk.tree_attention(*dev(q), kt, vt, *dev(torch.tensor([prefix], dtype=torch.int32), mask),
                             block_table=table, exact=exact, backend=backend)
    bad = 0
    for i in range(n):
        path = [i] if i >= n - pad else _chain(parents, i)
        k2, v2 = torch.zeros_like(k), torch.zeros_like(v)
        k2[0, :prefix], v2[0, :prefix] = k[0, :prefix], v[0, :prefix]
        for d, j in enumerate(path):
            k2[0, prefix + d], v2[0, prefix + d] = k[0, prefix + j], v[0, prefix + j]
        kd, vd, td = dev(*layout(k2, v2))
        step_prefix, = dev(torch.tensor([prefix + len(path) - 1], dtype=torch.int32))
        one = jk.tree_attention(*dev(q[:, i:i + 1].clone()), kd, vd, step_prefix, block_table=td,
                                exact=exact, backend=backend)
        bad += not same_bits(one[0, 0], tree[0, i])
    return bad


# --- the findings table ---------------------------------------------------------------------

LINEAR_SHAPES = {      # name: (K, N) of the shipped tiny target (H 192) and Qwen3-8B
    "qkv tiny": (192, 512), "o tiny": (256, 192), "gate_up tiny": (192, 1024),
    "down tiny": (512, 192), "lm_head tiny": (192, 259),
    "qkv 8B": (4096, 6144), "down 8B": (12288, 4096),
}


def op_cases(dtype, quick: bool):
    """(op, shape text, normal fn, exact fn, inputs) for every op of the forward but attention."""
    gen = torch.Generator().manual_seed(0)
    ms = 17 if quick else 64

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    h = 192
    w = rnd(h)
    emb = rnd(259, h)
    yield ("embedding", f"[{ms}] of [259, {h}]", lambda t: F.embedding(t, emb),
           lambda t: F.embedding(t, emb), [torch.randint(0, 259, (ms,), generator=gen)])
    yield ("rms_norm", f"[{ms}, {h}]", lambda x: jk.rms_norm(x, w, backend="reference"),
           lambda x: ex.rms_norm(x, w, backend="reference"), [rnd(ms, h)])
    yield ("rms_norm + residual", f"[{ms}, {h}]",
           lambda x, r: jk.rms_norm(x, w, residual=r, backend="reference"),
           lambda x, r: ex.rms_norm(x, w, residual=r, backend="reference"), [rnd(ms, h), rnd(ms, h)])
    yield ("silu_mul", f"[{ms}, 1024]", lambda x: jk.silu_mul(x, backend="reference"),
           lambda x: ex.silu_mul(x, backend="reference"), [rnd(ms, 1024)])
    for name, (k, n) in LINEAR_SHAPES.items():
        big = "8B" in name             # 16 rows: each row costs two M-row GEMMs at these sizes
        if big and (quick or dtype == torch.float16):      # (fp16 GEMMs crawl on this CPU)
            continue
        wt = rnd(n, k)
        m = 16 if big else ms
        yield (f"linear {name}", f"[{m}, {k}] x [{n}, {k}]^T", lambda x, wt=wt: F.linear(x, wt),
               lambda x, wt=wt: ex.linear(x, wt), [rnd(m, k)])
    yield ("argmax", f"[{ms}, 259]", lambda x: torch.argmax(x, dim=-1), lambda x: ex.argmax(x),
           [rnd(ms, 259)])
    yield ("qk_norm_rope_append", f"[1, {ms}, 4 + 2 + 2, 64]", _rope_case(dtype, False),
           _rope_case(dtype, True), [rnd(ms, 4, 64), rnd(ms, 2, 64), rnd(ms, 2, 64),
                                     torch.randint(0, 4000, (ms,), generator=gen)])
    yield from _moe_cases(dtype, ms, gen)


def _rope_case(dtype, exact):
    """qk_norm_rope_append of M tokens as one sequence [1, M] (q out, k and v cache rows)."""
    def run(q, k, v, pos):
        m = q.shape[0]
        qn, kn = torch.ones(64, dtype=dtype), torch.ones(64, dtype=dtype)
        kc = torch.zeros(1, m, 2, 64, dtype=dtype)
        vc = torch.zeros_like(kc)
        args = (q[None], k[None], v[None], qn, kn, pos[None].to(torch.int32), kc, vc)
        kw = dict(rope_theta=1e6, cache_start=torch.zeros(1, dtype=torch.int32), backend="reference")
        fn = ex.qk_norm_rope_append if exact else jk.qk_norm_rope_append
        qo = fn(*args, **kw)
        return qo[0], kc[0], vc[0]
    return run


def _moe_cases(dtype, ms, gen):
    from jetspec_kernels.models.moe import grouped_experts, route
    e, h, i = 8, 192, 128
    router = torch.randn(e, h, generator=gen).to(dtype)
    gate_up = (torch.randn(e, 2 * i, h, generator=gen) / h ** 0.5).to(dtype)
    down = (torch.randn(e, h, i, generator=gen) / i ** 0.5).to(dtype)

    def moe(x):
        wts, experts = route(x, router, 2, True)
        return grouped_experts(x, wts, experts, gate_up, down, grouped_mm=False)
    yield ("MoE route + experts", f"[{ms}, {h}], E {e}, top-2", moe,
           lambda x: ex.per_row(moe, x), [torch.randn(ms, h, generator=gen).to(dtype)])


def table(quick: bool = False, backend: str = "reference"):
    """Rows (op, shape, dtype, M, normal mismatches, exact mismatches), yielded as measured."""
    dtypes = (torch.bfloat16, torch.float32) if quick else (torch.bfloat16, torch.float16,
                                                           torch.float32)
    if backend == "triton" and not torch.cuda.is_available():
        dtypes = (torch.float32,)         # the interpreter's tl.dot cannot take 16-bit floats
    for dtype in dtypes:
        gen = torch.Generator().manual_seed(1)
        if backend == "reference":
            for op, shape, normal, exact, inputs in op_cases(dtype, quick):
                m = inputs[0].shape[0]
                yield (op, shape, str(dtype)[6:], m, row_mismatches(normal, inputs, gen),
                       row_mismatches(exact, inputs, gen))
        for prefix, n, page in ((5, 16, None), (37, 16, 16), (100, 64, None), (61, 64, 4)):
            if quick and n > 16:
                continue
            shape = f"prefix {prefix}, tree {n}" + (f", pages of {page}" if page else "")
            normal = tree_vs_decode_mismatches(prefix, n, dtype, torch.Generator().manual_seed(2),
                                               exact=False, page_size=page, backend=backend)
            exact = tree_vs_decode_mismatches(prefix, n, dtype, torch.Generator().manual_seed(2),
                                              exact=True, page_size=page, backend=backend)
            yield ("tree_attention (tree row vs decode row)", shape, str(dtype)[6:], n, normal,
                   exact)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rows, shapes and dtypes")
    p.add_argument("--backend", default="reference", choices=("reference", "triton"),
                   help="triton: the attention rows only (on a CPU: the interpreter, float32)")
    p.add_argument("--csv", help="also write the table here")
    a = p.parse_args(argv)
    head = ("op", "shape", "dtype", "M", "normal: rows differing", "exact: rows differing")
    print(" | ".join(head), flush=True)
    rows = []
    for r in table(a.quick, a.backend):
        rows.append(r)
        print(" | ".join(str(c) for c in r), flush=True)
    if a.csv:
        import csv
        with open(a.csv, "w", newline="") as f:
            csv.writer(f).writerows([head, *rows])


if __name__ == "__main__":
    main()
