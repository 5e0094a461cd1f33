"""Seeded random inputs for every public op: ``make(op, seed)`` -> a :class:`Case`.

A case is a deterministic function of ``(op, seed)``, so a failure is replayed from the pair
alone (``tests/fuzz/run.py --op OP --seed SEED``). Every draw mixes the awkward corners:

* shapes: odd sizes, N not a power of two, ragged prefixes and node counts, one-node trees;
* layouts: strided and sliced views (padded vocabularies, fused qkv or q, k, v each in its own
  layout, K/V halves of one buffer, heads-major caches, outputs with outer strides), paged caches
  with shuffled block tables and spare pages, NaN in every cache slot no query may read;
* magnitudes: 1e-4 to 1e3 (and half the dtype's maximum where an op must take it), exact ties,
  rows of identical values, -inf, +inf and NaN where the contract gives them a meaning;
* trees: deep chains, wide fans, random and real draft trees, padding rows whose parents,
  tokens and depths look like real data (not -1);
* controls: temperature, top-k and top-p as numbers or per-sequence tensors, at and around
  each limit (top-k 1, V - 1, V, V + 1; top-p 1e-30, 1 - 2**-24, 1); a rope_theta that is no
  float32;
* non-finite inputs: about one draw in five puts NaN and +-inf into the float inputs of every op
  that takes them (``non_finite``), where the contract says how they propagate (DESIGN.md);
* refusals: a few draws break one rule (one past a limit, NaN where it has no meaning), and every
  engine must refuse them with the same exception naming the same argument.

``Case.call`` holds the public op's keyword arguments (CPU tensors; the runner moves them);
``Case.meta`` what the checker needs (the mode, the value-check setting, the expected refusal).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch

from jetspec_kernels import python_ref as ref
from jetspec_kernels.limits import MAX_BUDGET
from jetspec_kernels.ops.causal_conv1d_tree import MAX_CONV_WIDTH
from jetspec_kernels.tree import Tree, Verdict
from helpers import (after_rows, cache_layout, fused_qkv, random_tree, shuffled_table,
                     steering_logits, widened)

NAN, INF = float("nan"), float("inf")
I32 = torch.int32
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
MAGNITUDES = (1e-4, 1e-3, 1e-2, 1.0, 30.0, 1e3)
OPS = ("pack_mask", "draft_tree_from_topk", "draft_tree", "draft_tree_from_hidden",
       "tree_attention", "qk_norm_rope_append", "verify_tree", "commit_kv", "rms_norm", "silu_mul")


@dataclass
class Case:
    op: str
    seed: int
    call: dict
    meta: dict = field(default_factory=dict)

    def describe(self) -> str:
        def show(v):
            if isinstance(v, torch.Tensor):
                dense = v.is_contiguous()
                return f"{str(v.dtype)[6:]}{list(v.shape)}{'' if dense else f' strides {v.stride()}'}"
            if isinstance(v, (Tree, Verdict)):
                return f"{type(v).__name__}(N={v[1].shape[-1] if isinstance(v, Verdict) else v.tokens.shape[1]})"
            return repr(v)
        args = ", ".join(f"{k}={show(v)}" for k, v in self.call.items())
        return f"{self.op}({args}) meta={self.meta}"


def _rng(op, seed):
    r = random.Random(f"{op}:{seed}")
    return r, torch.Generator().manual_seed(r.getrandbits(62))


def make(op: str, seed: int) -> Case:
    """The case ``seed`` of public op ``op`` (a fresh copy each call: ops write in place)."""
    r, g = _rng(op, seed)
    return Case(op, seed, *MAKERS[op](r, g))


# ------------------------------------------------------------------ layouts


def swapped(x):
    """``x`` [A, B, ...] stored as [B, A, ...] (outer strides swapped)."""
    return x.transpose(0, 1).contiguous().transpose(0, 1)


def outer_layout(r, x, fill=NAN):
    """``x`` as is, or in one of the outer-strided layouts engines pass."""
    kind = r.choice(("contiguous", "widened", "shifted", "swapped"))
    if kind == "widened" and x.dim() >= 2:
        return widened(x, r.randint(1, 9), fill=fill)
    if kind == "shifted" and x.dim() >= 2:
        return after_rows(x, r.randint(1, 3), fill=fill)
    if kind == "swapped" and x.dim() >= 2:
        return swapped(x)
    return x


def int_layout(r, x):
    """An index tensor as is or sliced from a wider buffer (junk -1 past its columns)."""
    return widened(x, r.randint(1, 5), fill=-1) if x.dim() >= 2 and r.random() < 0.4 else x


def cache_pair(r, k, v):
    """K and V caches [B|P, L|page, H, D] in one of the engine layouts (helpers.cache_layout)."""
    return cache_layout(r.choice(("contiguous", "kv_halves", "kv_heads_major", "v_padded")), k, v)


def paged_cache(r, g, cache_list, page):
    """Contiguous caches [B, L, H, D] -> paged pools [B*pages + spare, page, H, D] (spare pages
    NaN) sharing one shuffled block table."""
    B, L = cache_list[0].shape[:2]
    pages = -(-L // page)
    spare = r.randint(0, 3)
    table = shuffled_table(B, pages, g, spare=spare)
    out = []
    for c in cache_list:
        pool = torch.full((B * pages + spare, page, *c.shape[2:]), NAN, dtype=c.dtype)
        for b in range(B):
            for p in range(pages):
                rows = c[b, p * page:(p + 1) * page]
                pool[table[b, p], :rows.shape[0]] = rows
        out.append(pool)
    return out, table


def dtype_choice(r, options=(F32, F16, BF16)):
    return r.choice(options)


def logit_fill(r, g, shape, dtype, mag):
    """Random logits of scale ``mag`` with exact ties, rows of identical values and -inf."""
    x = torch.randn(*shape, generator=g) * mag
    if r.random() < 0.3:                                  # a few levels: exact ties everywhere
        x = (x / mag * 2).round() * mag / 2
    rows = x.view(-1, shape[-1])
    for _ in range(r.randint(0, 2)):                      # a row of identical values
        rows[r.randrange(rows.shape[0])] = r.choice((0.0, mag, -mag))
    if shape[-1] > 1 and r.random() < 0.3:                # impossible tokens (never a whole row)
        row = rows[r.randrange(rows.shape[0])]
        row[torch.randperm(shape[-1], generator=g)[:r.randint(1, shape[-1] - 1)]] = -INF
    return x.to(dtype)


def non_finite(r, g, x, allowed=None, values=(NAN, INF, -INF), most=3):
    """Sets 1..``most`` random elements of ``x`` (in place) to values drawn from ``values``;
    ``allowed`` (bool, x's shape) limits where. Returns the ``[index, value]`` pairs placed."""
    flat = torch.arange(x.numel()).view(x.shape)
    where = flat.flatten() if allowed is None else flat[allowed]
    if where.numel() == 0:
        return []
    placed = []
    for i in where[torch.randint(0, where.numel(), (r.randint(1, most),), generator=g)].tolist():
        value = r.choice(values)
        x.view(-1)[i] = value
        placed.append([i, value])
    return placed


# ------------------------------------------------------------------ trees


def tree_shape(r, g, B, N):
    """parents int32 [B, N] and num_nodes [B]: chains, fans or random trees, ragged sizes, and
    padding rows whose parents are arbitrary indices (not -1) past num_nodes."""
    kind = r.choice(("random", "chain", "fan", "random"))
    parents, num_nodes = random_tree(B, N, g, min_nodes=1, pad=False)
    if kind == "chain":
        parents[:] = torch.arange(-1, N - 1, dtype=I32)
    elif kind == "fan":
        parents[:] = 0
        parents[:, 0] = -1
    if r.random() < 0.5:
        num_nodes[r.randrange(B)] = N
    for b in range(B):                                    # padding that looks like real data
        n = int(num_nodes[b])
        if n < N and r.random() < 0.8:
            parents[b, n:] = torch.randint(-1, N, (N - n,), generator=g, dtype=I32)
    return parents, num_nodes, kind


# ------------------------------------------------------------------ pack_mask


def make_pack_mask(r, g):
    B, N = r.randint(1, 4), r.choice((1, 2, 5, 31, 32, 33, 37, 64, 65, 70))
    parents, num_nodes, kind = tree_shape(r, g, B, N)
    if r.random() < 0.3:
        num_nodes[r.randrange(B)] = 1                     # the root alone
    meta = dict(kind=kind)
    if r.random() < 0.08:                                 # refusals
        bad = r.choice(("num_nodes", "parents", "root"))
        if bad == "num_nodes":
            num_nodes[0] = r.choice((N + 1, 0))           # 0: no root, refused as by verify_tree
        elif bad == "parents" and N > 1:
            num_nodes[0] = N
            parents[0, N - 1] = N - 1                     # not below its own index
        else:
            num_nodes[0] = max(int(num_nodes[0]), 1)
            parents[0, 0] = 0                             # the root has a parent
        meta["refuse"] = (ValueError, "num_nodes" if bad == "num_nodes" else "parents")
    return dict(parents=int_layout(r, parents), num_nodes=num_nodes), meta


# ------------------------------------------------------------------ draft trees


def sorted_logprobs(r, g, B, D, K):
    """log-probs [B, D, K] sorted descending: magnitudes 1e-4 .. 1e3, exact ties, exact zeros
    (and -0.0), -inf tails."""
    mag = r.choice(MAGNITUDES)
    lp = -torch.rand(B, D, K, generator=g) * mag
    if r.random() < 0.4:
        levels = r.choice((1, 2, 4))
        lp = (lp / mag * levels).round() * mag / levels
    if r.random() < 0.2:
        lp[..., 0] = r.choice((0.0, -0.0))
    if r.random() < 0.2 and K > 1:
        cut = r.randint(1, K - 1)
        lp[r.randrange(B), :, cut:] = -INF
    lp = lp.sort(-1, descending=True).values
    if r.random() < 0.1:                                  # -0.0 wherever it was 0
        lp = torch.where(lp == 0, torch.tensor(-0.0), lp)
    return lp.contiguous()


def budget_choice(r, D, K):
    total = ref.implicit_tree_size(D, K) if K ** D < 10 ** 6 else 10 ** 6
    return r.choice((1, 2, r.randint(1, 64), r.randint(1, 300), min(total, 4096),
                     min(total + 1, 4096), max(1, min(total - 1, 4096))))


def draft_dims(r):
    kind = r.choice(("random", "chain", "wide", "random"))
    if kind == "chain":
        return kind, r.randint(1, 40), 1
    if kind == "wide":
        return kind, r.randint(1, 3), r.choice((16, 33, 63, 64))
    return kind, r.randint(1, 9), r.randint(1, 12)


def make_draft_tree_from_topk(r, g):
    B = r.randint(1, 3)
    kind, D, K = draft_dims(r)
    budget = budget_choice(r, D, K)
    if budget > 600 and r.random() < 0.7:                 # large budgets: the long run mostly
        budget = r.randint(1, 600)
    lp = sorted_logprobs(r, g, B, D, K)
    tdt = r.choice((torch.int32, torch.int64))
    high = r.choice((5, 151936, 2 ** 31 - 1))
    tok = torch.randint(0, high, (B, D, K), generator=g).to(tdt)
    root = torch.randint(0, high, (B,), generator=g).to(r.choice((torch.int32, torch.int64)))
    call = dict(topk_tokens=outer_layout(r, tok, fill=-1) if r.random() < 0.5 else int_layout(r, tok),
                topk_logprobs=outer_layout(r, lp), root_tokens=root, budget=budget,
                algorithm=r.choice(("topn", "accum_logp")))
    meta = dict(kind=kind)
    if r.random() < 0.08:
        bad = r.choice(("budget", "logprobs_positive", "logprobs_order", "nan"))
        if bad == "budget":
            call["budget"] = r.choice((0, 4097))
            meta["refuse"] = (ValueError, "budget")
        elif bad == "logprobs_positive":
            lp2 = call["topk_logprobs"].clone()
            lp2[0, 0, 0] = 1e-30
            call["topk_logprobs"] = lp2
            meta["refuse"] = (ValueError, "topk_logprobs")
        elif bad == "nan":
            lp2 = call["topk_logprobs"].clone()
            lp2[-1, -1, -1] = NAN
            call["topk_logprobs"] = lp2
            meta["refuse"] = (ValueError, "topk_logprobs")
        elif K > 1:
            lp2 = torch.zeros(B, D, K)
            lp2[0, 0, 1] = -0.0
            lp2[0, 0, 0] = -1.0
            call["topk_logprobs"] = lp2
            meta["refuse"] = (ValueError, "topk_logprobs")
    return call, meta


def separated_logits(r, g, B, D, V, K, mag):
    """Logits whose fp32 log-softmax is exact (one 0 per row, candidates at -(30 + integers) *
    mag with ties, fillers at -1000 * mag): every backend must give the same tree bit for bit."""
    x = torch.full((B, D, V), -1000.0 * mag)
    for b in range(B):
        for d in range(D):
            where = torch.randperm(V, generator=g)[:min(V, K + 3)]
            vals = (torch.randint(0, 6, (len(where) - 1,), generator=g).float() + 30) * mag
            x[b, d, where[0]] = 0.0
            x[b, d, where[1:]] = -vals
    return x


def make_draft_tree(r, g):
    B = r.randint(1, 3)
    kind, D, K = draft_dims(r)
    D = min(D, 6)
    V = r.choice((1, 2, 5, 31, 100, 257, 1000, 1500))
    K = max(1, min(K, V))
    budget = min(budget_choice(r, D, K), 200)
    dtype = dtype_choice(r)
    mode = r.choice(("random", "random", "separated", "identical"))
    mag = r.choice(MAGNITUDES)
    if mode == "separated":                               # exact in every dtype (fp16 < 65504)
        mag = r.choice((1.0, 30.0))
        x = separated_logits(r, g, B, D, V, K, mag)
    elif mode == "identical":                             # every row constant (a different one)
        x = (torch.randn(B, D, 1, generator=g) * mag).expand(B, D, V).clone()
    else:
        if r.random() < 0.1:
            mag = float(torch.finfo(dtype).max) / 4       # near the dtype's range
        x = logit_fill(r, g, (B, D, V), torch.float32, mag)
    big = float(torch.finfo(dtype).max)
    x = x.clamp(-big, big).to(dtype)                      # -inf stays
    root = torch.randint(0, V, (B,), generator=g).to(r.choice((torch.int32, torch.int64)))
    call = dict(logits=outer_layout(r, x), root_tokens=root, budget=budget, topk=K,
                algorithm=r.choice(("topn", "accum_logp")))
    meta = dict(mode=mode, kind=kind, mag=mag)
    if r.random() < 0.1:
        bad = r.choice(("nan", "pos_inf", "all_inf", "topk", "topk_vocab", "budget"))
        if bad in ("nan", "pos_inf", "all_inf"):
            x2 = call["logits"].clone()
            if bad == "all_inf":
                x2[-1, -1] = -INF
            else:
                x2[r.randrange(B), r.randrange(D), r.randrange(V)] = NAN if bad == "nan" else INF
            call["logits"] = x2
            meta["refuse"] = (ValueError, "logits")
        elif bad == "topk":
            call["topk"] = r.choice((0, 65))
            meta["refuse"] = (ValueError, "topk")
        elif bad == "topk_vocab" and V < 64:
            call["topk"] = V + 1
            meta["refuse"] = (ValueError, "topk")
        elif bad == "budget":
            call["budget"] = r.choice((0, 4097))
            meta["refuse"] = (ValueError, "budget")
    return call, meta


def make_draft_tree_from_hidden(r, g):
    B = r.randint(1, 3)
    kind, D, K = draft_dims(r)
    D = min(D, 5)
    H = r.choice((8, 16, 24, 40, 64, 72))
    V = r.choice((3, 37, 300, 700))
    K = max(1, min(K, V))
    budget = min(budget_choice(r, D, K), 150)
    dtype = dtype_choice(r)
    mag = r.choice(MAGNITUDES)
    hidden = torch.randn(B, D, H, generator=g)
    weight = torch.randn(V, H, generator=g) / math.sqrt(H)
    if r.random() < 0.2:                                  # exact ties: repeated lm_head rows
        weight[torch.randperm(V, generator=g)[:min(V, 5)]] = weight[0].clone()
    hidden = (hidden * mag).to(dtype)
    weight = weight.to(dtype)
    root = torch.randint(0, V, (B,), generator=g, dtype=I32)
    call = dict(hidden=outer_layout(r, hidden), lm_head_weight=weight, root_tokens=root,
                budget=budget, topk=K, algorithm=r.choice(("topn", "accum_logp")))
    if r.random() < 0.3:
        call["lm_head_weight"] = widened(weight, r.choice((3, 8)))
    meta = dict(kind=kind, mag=mag)
    if r.random() < 0.08:
        h2 = call["hidden"].clone()
        h2[0, 0, 0] = r.choice((NAN, INF))
        call["hidden"] = h2
        meta["refuse"] = (ValueError, "hidden")
    if r.random() < 0.3:                                  # cuBLAS/torch logits, then the top-K
        call["method"] = "gemm"
    return call, meta


# ------------------------------------------------------------------ tree_attention


def make_tree_attention(r, g):
    B = r.randint(1, 3)
    N = r.choice((1, 2, 5, 7, 16, 19, 33, 40))
    hkv = r.randint(1, 3)
    hq = hkv * r.choice((1, 2, 3, 4))
    dh = r.choice((16, 32, 64, 64, 128, 128, 256))
    dtype = dtype_choice(r, (F32, F16, F16, BF16))
    prefix = torch.tensor([r.choice((0, 1, r.randint(0, 90))) for _ in range(B)], dtype=I32)
    L = int(prefix.max()) + N + r.randint(0, 5)
    mq, mk = r.choice(MAGNITUDES), r.choice(MAGNITUDES)
    mv = r.choice(MAGNITUDES if dtype != F16 else MAGNITUDES[2:])   # no fp16 subnormal outputs
    q = (torch.randn(B, N, hq, dh, generator=g) * mq).to(dtype)
    k = (torch.randn(B, L, hkv, dh, generator=g) * mk).to(dtype)
    v = (torch.randn(B, L, hkv, dh, generator=g) * mv).to(dtype)
    specials = {}
    if r.random() < 0.2:     # NaN / +-inf in q and K anywhere, NaN in V where every row looks
        specials["q"] = non_finite(r, g, q)
        specials["k"] = non_finite(r, g, k)
        prefix_rows = torch.arange(L)[None, :, None, None] < prefix[:, None, None, None]
        specials["v"] = non_finite(r, g, v, prefix_rows.expand_as(v), values=(NAN,))
    for b in range(B):                                    # past each sequence's end: never read
        k[b, int(prefix[b]) + N:] = NAN
        v[b, int(prefix[b]) + N:] = NAN
    table = None
    page = r.choice((None, None, 1, 3, 8, 16, 24))
    if page is not None:
        (k, v), table = paged_cache(r, g, [k, v], page)
    k, v = cache_pair(r, k, v)
    tail = r.choice(("mask", "mask", "causal", "full"))
    mask = None
    if tail == "mask":
        parents, num_nodes, _ = tree_shape(r, g, B, N)
        mask = int_layout(r, ref.pack_mask(parents, num_nodes).to(I32))
        tail = "causal"                                   # the mask decides
    qkind = r.choice(("contiguous", "transposed", "sliced"))
    if qkind == "transposed":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    elif qkind == "sliced":
        q = widened(q, r.randint(1, 3), dim=2)
    call = dict(q=q, k_cache=k, v_cache=v, prefix_lens=prefix, tree_mask=mask, tail=tail,
                block_table=None if table is None else int_layout(r, table))
    if r.random() < 0.3:
        call["scale"] = r.choice((0.01, 0.3, 1.0, 2.0))
    out_kind = r.choice(("none", "none", "out", "lse", "both"))
    if out_kind in ("out", "both"):
        call["out"] = widened(torch.full_like(q, NAN, memory_format=torch.contiguous_format), 2, dim=2)
    if out_kind in ("lse", "both"):
        call["lse"] = widened(torch.full((B, hq, N), NAN), 3)
    elif r.random() < 0.5:
        call["return_lse"] = True
    meta = dict(mags=(mq, mk, mv), page=page, specials=specials)
    if r.random() < 0.06:
        bad = r.choice(("prefix", "scale", "tail"))
        if bad == "tail" and mask is not None:
            call["tail"] = "full"                         # would be ignored: refused
            meta["refuse"] = (ValueError, "tail")
        elif bad == "prefix":
            p2 = prefix.clone()
            p2[-1] = L - N + 1 if table is None else p2[-1] + 10 ** 6
            call["prefix_lens"] = p2
            meta["refuse"] = (ValueError, "prefix_lens")
        else:
            call["scale"] = r.choice((0.0, -1.0, NAN))
            meta["refuse"] = (ValueError, "scale")
    return call, meta


# ------------------------------------------------------------------ qk_norm_rope_append


def make_qk_norm_rope_append(r, g):
    B, N = r.randint(1, 3), r.choice((1, 2, 5, 7, 9))
    hkv = r.randint(1, 3)
    hq = hkv * r.choice((1, 2, 3))
    dh = r.choice((2, 8, 16, 30, 64, 128, 256))
    dtype = dtype_choice(r)
    cache_dtype = r.choice((dtype, dtype, F32, F16))
    mag = r.choice(MAGNITUDES)
    with_q = r.random() < 0.75
    q = (torch.randn(B, N, hq, dh, generator=g) * mag).to(dtype)
    k = (torch.randn(B, N, hkv, dh, generator=g) * r.choice(MAGNITUDES)).to(dtype)
    v = (torch.randn(B, N, hkv, dh, generator=g) * r.choice(MAGNITUDES)).to(dtype)
    if r.random() < 0.2:
        k[..., :] = k[..., :1]                            # a head of identical values
    specials = {}
    if r.random() < 0.2:                                  # NaN / +-inf: per head through the norm
        specials = {name: non_finite(r, g, x) for name, x in (("q", q), ("k", k), ("v", v))}
    wdt = r.choice((dtype, F32))
    qw = (torch.rand(dh, generator=g) + 0.5).to(wdt)
    kw = (torch.rand(dh, generator=g) + 0.5).to(wdt)
    base = r.choice((0, 7, 4000, 40000, 2 ** 17))
    pre = torch.randint(0, 9, (B,), generator=g, dtype=I32)
    tree_rows = r.random() < 0.5
    if tree_rows:                                         # RoPE at prefix + depth, slots prefix + n
        depth = torch.randint(0, 4, (B, N), generator=g, dtype=I32)
        positions = base + pre[:, None] + depth
        start, cap = pre, 9 + N + r.randint(0, 3)
    else:
        positions = base + pre[:, None] + torch.randperm(N, generator=g).to(I32)[None]
        start, cap = None, base + 9 + N + r.randint(0, 3)
    positions = positions.to(r.choice((torch.int32, torch.int64)))
    cache = torch.full((B, cap, hkv, dh), NAN, dtype=cache_dtype)
    k_cache, v_cache, table = cache, cache.clone(), None
    page = r.choice((None, 1, 4, 16))
    if page is not None and cap < 5000:
        (k_cache, v_cache), table = paged_cache(r, g, [k_cache, v_cache], page)
    if r.random() < 0.5 and (cache_dtype == dtype):
        k_cache, v_cache = cache_pair(r, k_cache, v_cache)
    fused = r.random() < 0.4
    if fused:                                             # slices of one fused qkv projection
        q, k, v = fused_qkv(q, k, v)
    norm = r.random() < 0.75                              # else no QK-norm (Llama, Qwen2)
    call = dict(q=q if with_q else None, k=k, v=v, q_norm_w=qw if with_q and norm else None,
                k_norm_w=kw if norm else None,
                positions=int_layout(r, positions), k_cache=k_cache, v_cache=v_cache,
                rope_theta=r.choice((1e4, 5e5, 1e6)), eps=r.choice((1e-6, 1e-5, 1e-2, 0.0)),
                block_table=table, cache_start=start)
    if r.random() < 0.3:                                  # partial rotary (or all of it)
        call["rotary_dim"] = r.choice([d for d in range(2, dh + 1, 2)])
    meta = dict(mag=mag, with_q=with_q, specials=specials)
    if r.random() < 0.06:
        bad = r.choice(("eps", "theta", "positions"))
        if bad == "eps":
            call["eps"] = r.choice((-1e-6, NAN))
        elif bad == "theta":
            call["rope_theta"] = r.choice((0.0, INF))
            bad = "rope_theta"
        elif start is None:
            p2 = call["positions"].clone()
            p2[0, 0] = cap if table is None else table.shape[1] * k_cache.shape[1]
            call["positions"] = p2
        else:
            call["cache_start"] = start + 10 ** 6
            bad = "cache_start"
        meta["refuse"] = (ValueError, bad)
    if "refuse" not in meta and r.random() < 0.3:         # not a float32: the kernels need all of it
        call["rope_theta"] = r.choice((12345.678, 25000003.0))
    if not fused and r.random() < 0.6:                    # q, k, v apart: each its own strides
        for name in ("q", "k", "v"):
            if call[name] is not None:
                call[name] = outer_layout(r, call[name])
    return call, meta


# ------------------------------------------------------------------ verify_tree


def verify_tree_inputs(r, g, B):
    """(tokens, parents, num_nodes, depths, max_depth, vocab of tokens, kind)."""
    kind = r.choice(("random", "real", "chain", "fan"))
    if kind == "real":
        D, V = r.randint(1, 6), r.choice((4, 60, 300))
        t = ref.draft_tree(torch.randn(B, D, V, generator=g) * 3,
                           torch.randint(0, V, (B,), generator=g), r.randint(1, 40),
                           r.randint(1, min(V, 5)))
        tokens, parents, num_nodes = (t[k].to(I32) for k in ("tokens", "parents", "num_nodes"))
        depths = t["depths"].to(I32)
        max_depth = min(D, tokens.shape[1] - 1)
        return tokens, parents, num_nodes, depths, max_depth, V, kind
    N = r.choice((1, 2, 3, 7, 9, 16, 33, 40))
    parents, num_nodes, _ = tree_shape(r, g, B, N)
    if kind == "chain":
        parents[:] = torch.arange(-1, N - 1, dtype=I32)
    elif kind == "fan":
        parents[:] = 0
        parents[:, 0] = -1
    tv = r.choice((1, 2, 3, 4))
    tokens = torch.randint(0, tv, (B, N), generator=g, dtype=I32)
    max_depth = r.randint(0, N - 1)
    depths = torch.randint(-1, max_depth + 1, (B, N), generator=g, dtype=I32)   # not read
    return tokens, parents, num_nodes, depths, max_depth, tv, kind


def control(r, B, scalar_values, tensor_dtypes, tensor_values):
    """A sampling control: a number, a [] or [1] tensor, or a per-sequence [B] tensor."""
    form = r.choice(("number", "number", "tensor", "scalar_tensor", "one_tensor"))
    if form == "number":
        return r.choice(scalar_values)
    dt = r.choice(tensor_dtypes)
    if form == "scalar_tensor":
        return torch.tensor(r.choice(tensor_values), dtype=dt)
    if form == "one_tensor":                              # [1]: one value for every sequence
        return torch.tensor([r.choice(tensor_values)], dtype=dt)
    return torch.tensor([r.choice(tensor_values) for _ in range(B)], dtype=dt)


def make_verify_tree(r, g):
    B = r.randint(1, 4)
    tokens, parents, num_nodes, depths, max_depth, tv, kind = verify_tree_inputs(r, g, B)
    N = tokens.shape[1]
    meta = dict(kind=kind)
    tree_fields = dict(tokens=tokens, parents=parents, depths=depths,
                       scores=torch.zeros(B, N), num_nodes=num_nodes,
                       mask=ref.pack_mask(parents, num_nodes).to(I32))
    if r.random() < 0.25:
        target = torch.randint(0, tv, (B, N), generator=g, dtype=I32)
        tree = Tree(**{k: int_layout(r, v) if k != "num_nodes" else v for k, v in tree_fields.items()
                       if k != "mask"}, mask=tree_fields["mask"], max_depth=max_depth)
        return dict(tree=tree, target_tokens=int_layout(r, target)), meta
    V = max(tv, r.choice((1, 2, 3, 7, 64, 97, 300, 513)))
    dtype = dtype_choice(r)
    mag = r.choice(MAGNITUDES)
    temperature = control(r, B, (0.0, 0.0, 0.05, 0.7, 1.0, 2.5), (F32, torch.float64),
                          (0.0, 0.05, 0.7, 1.0, 2.5))
    sampled = torch.is_tensor(temperature) or temperature > 0
    T = 1.0 if not sampled else (float(temperature.max()) if torch.is_tensor(temperature)
                                 else temperature) or 1.0
    if r.random() < 0.8:                                  # most nodes point at a child: deep walks
        boost = max(25.0, 40 * T / mag)
        logits = steering_logits(tokens, parents, num_nodes, V, g, boost=boost) * mag
    else:
        logits = torch.randn(B, N, V, generator=g) * mag
    specials = r.sample(("ties", "identical", "-inf", "+inf", "nan", "max", "none", "none"), 2)
    rows = logits.view(-1, V)
    pick = lambda: r.randrange(rows.shape[0])
    if "ties" in specials:
        rows[pick(), torch.randperm(V, generator=g)[:max(1, V // 3)]] = float(rows.max())
    if "identical" in specials:
        rows[pick()] = r.choice((0.0, mag))
    if "-inf" in specials:
        row = pick()
        rows[row, torch.randperm(V, generator=g)[:r.randint(1, V)]] = -INF   # whole rows too
    if "+inf" in specials:
        rows[pick(), r.randrange(V)] = INF
    if "nan" in specials:                                 # the maximum, as torch.argmax
        for _ in range(r.randint(1, 2)):
            rows[pick(), r.randrange(V)] = NAN
    if "max" in specials:
        rows[pick(), r.randrange(V)] = float(torch.finfo(dtype).max) * r.choice((1, -1))
    logits = logits.to(dtype)
    call = dict(tree=Tree(**tree_fields, max_depth=max_depth), target_logits=outer_layout(r, logits),
                temperature=temperature)
    if sampled:
        seed_vals = (0, 1, -1, 2 ** 40 + 7, 2 ** 63 - 1, -2 ** 63)
        call["seed"] = control(r, B, seed_vals, (torch.int64, torch.int32), (0, 5, -3, 2 ** 31 - 1))
        call["offset"] = control(r, B, (0, 3, 2 ** 33 + 1), (torch.int64,), (0, 1, 2 ** 40))
        call["top_k"] = control(r, B, (0, 0, 1, 2, V - 1 if V > 1 else 0, V, V + 1, 2 ** 40),
                                (torch.int32, torch.int64), (0, 1, 3, max(V - 1, 0), V, V + 1))
        call["top_p"] = control(r, B, (1.0, 1.0, 0.5, 0.9, 1e-4, 1e-30, 1 - 2 ** -24),
                                (F32, torch.float64), (1.0, 0.5, 0.9, 1e-4, 1 - 2 ** -24))
    meta.update(mode="sampled" if sampled else "greedy", specials=specials, mag=mag)
    if r.random() < 0.08:
        bad = r.choice(("top_p", "top_k", "temperature", "tokens"))
        if bad == "top_p":
            call["top_p"] = r.choice((0.0, 1.0000001, -0.5, NAN))
        elif bad == "top_k":
            call["top_k"] = -1
        elif bad == "temperature":
            call["temperature"] = r.choice((-0.5, NAN, INF))
        else:
            t2 = call["tree"]
            toks = t2.tokens.clone()
            toks[0, 0] = V
            call["tree"] = Tree(toks, t2.parents, t2.depths, t2.scores, t2.num_nodes, t2.mask,
                                t2.max_depth)
            bad = "tree.tokens"
        meta["refuse"] = (ValueError, bad)
    return call, meta


# ------------------------------------------------------------------ commit_kv


def make_commit_kv(r, g):
    B = r.randint(1, 4)
    N = r.choice((1, 2, 5, 9, 13, 24))
    M = r.randint(1, N)
    path = torch.full((B, M), -1, dtype=I32)
    acc = torch.zeros(B, dtype=I32)
    for b in range(B):
        a = r.randint(0, M - 1)
        nodes = [0] + sorted(r.sample(range(1, N), min(a, N - 1)))
        path[b, :len(nodes)] = torch.tensor(nodes, dtype=I32)
        acc[b] = len(nodes) - 1
    prefix = torch.tensor([r.choice((0, r.randint(0, 30))) for _ in range(B)], dtype=I32)
    L = int(prefix.max()) + N + r.randint(0, 4)
    hkv, dh = r.randint(1, 3), r.choice((1, 6, 16, 64))
    dtype = dtype_choice(r)
    k = torch.randn(B, L, hkv, dh, generator=g).to(dtype)
    v = torch.randn(B, L, hkv, dh, generator=g).to(dtype)
    table = None
    page = r.choice((None, 1, 3, 8))
    if page is not None:
        (k, v), table = paged_cache(r, g, [k, v], page)
        k, v = k.nan_to_num(7.0), v.nan_to_num(-7.0)      # spare pages: values the op must keep
    specials = {}
    if r.random() < 0.2:                                  # moved bit for bit, NaN included
        specials = {"k": non_finite(r, g, k), "v": non_finite(r, g, v)}
    k, v = cache_pair(r, k, v)
    hidden = None
    if r.random() < 0.7:
        hh = r.choice((1, 7, 24))
        hidden = torch.randn(B, N, hh, generator=g)
        if specials:
            specials["hidden"] = non_finite(r, g, hidden)
        hidden = outer_layout(r, hidden.to(r.choice((F32, F16, BF16))))
    verdict = Verdict(acc, int_layout(r, path), torch.zeros(B, dtype=I32), path.clone())
    call = dict(k_cache=k, v_cache=v, prefix_lens=prefix, verdict=verdict, block_table=table,
                hidden=hidden)
    meta = dict(page=page, specials=specials)
    if r.random() < 0.06:
        bad = r.choice(("accept", "path"))
        if bad == "accept":
            call["verdict"] = Verdict(acc.clone().fill_(M), verdict.path, verdict.bonus,
                                      verdict.emitted)
            meta["refuse"] = (ValueError, "verdict.accept_len")
        elif M > 1:
            p2 = path.clone()
            p2[0, 0] = 1
            call["verdict"] = Verdict(acc, p2, verdict.bonus, verdict.emitted)
            meta["refuse"] = (ValueError, "verdict.path")
    return call, meta


# ------------------------------------------------------------------ rms_norm


def rows_layout(r, t):
    """``t`` [..., H] in an outer-strided layout that keeps its last dim contiguous (swapping the
    two outer dims of a 2-D tensor would not)."""
    if t.dim() >= 3:
        return outer_layout(r, t)
    return widened(t, r.randint(1, 9)) if r.random() < 0.5 else t


def make_rms_norm(r, g):
    lead = [r.choice((1, 2, 3, 5, 16)) for _ in range(r.randint(1, 3))]
    if r.random() < 0.1:
        lead[r.randrange(len(lead))] = 0                  # no rows at all
    H = r.choice((1, 3, 7, 64, 100, 257, 1024, 1032, 4096) + ((20000,) if r.random() < 0.1 else ()))
    dtype = dtype_choice(r)
    mag = r.choice(MAGNITUDES)
    x = torch.randn(*lead, H, generator=g) * mag
    if x.numel() and r.random() < 0.2:                    # a row of zeros: rsqrt(eps)
        x.view(-1, H)[0] = 0
    w = torch.randn(H, generator=g) * r.choice((0.1, 1.0, 3.0))
    w[::r.randint(2, 9)] = 0
    residual = None
    if r.random() < 0.6:
        residual = rows_layout(r, (torch.randn(*lead, H, generator=g) * mag).to(dtype))
    call = dict(x=rows_layout(r, x.to(dtype)), weight=w.to(dtype),
                eps=r.choice((1e-6, 1e-5, 1e-2, mag * mag)), residual=residual)
    meta = {}
    if r.random() < 0.06:
        bad = r.choice(("residual", "eps", "weight"))
        if bad == "residual":
            call["residual"] = torch.zeros(*lead, H + 1, dtype=dtype)
        elif bad == "eps":
            call["eps"] = r.choice((0.0, -1e-6, float("nan")))
        else:
            call["weight"] = w.to(F32 if dtype != F32 else F16)
        meta["refuse"] = (TypeError if bad == "weight" else ValueError, bad)
    return call, meta


# ------------------------------------------------------------------ silu_mul

SPECIALS = (-INF, INF, NAN, -0.0, 0.0, -100.0, -89.0)   # the last two: exp(-g) overflows float32


def make_silu_mul(r, g):
    lead = [r.choice((1, 2, 3, 5, 16)) for _ in range(r.randint(1, 3))]
    if r.random() < 0.1:
        lead[r.randrange(len(lead))] = 0                  # no rows at all
    inner = r.choice((1, 3, 7, 64, 100, 257, 1024, 1025, 3000)
                     + ((12289,) if r.random() < 0.1 else ()))
    dtype = dtype_choice(r)
    x = torch.randn(*lead, 2 * inner, generator=g) * r.choice(MAGNITUDES)
    if dtype == F16 and r.random() < 0.2:                 # silu(g) = g near fp16's max: inf products
        x[..., :inner] = x[..., :inner].sign() * (3e4 + x[..., :inner].abs() % 3e4)
    if x.numel() and r.random() < 0.3:                    # specials in the gate and the up columns
        flat = x.view(-1)
        for i in torch.randint(0, flat.numel(), (r.randint(1, 12),), generator=g).tolist():
            flat[i] = r.choice(SPECIALS)
    x = x.to(dtype)
    if r.random() < 0.3:                                  # rows from an odd column of a wider buffer
        off = r.randint(1, 5)
        buf = torch.full((*lead, off + 2 * inner + r.randint(0, 4)), NAN, dtype=dtype)
        buf[..., off:off + 2 * inner] = x
        x = buf[..., off:off + 2 * inner]
    else:
        x = rows_layout(r, x)
    meta = {}
    if r.random() < 0.06:
        if r.random() < 0.5:
            x = x[..., :2 * inner - 1]                    # an odd last dim
            meta["refuse"] = (ValueError, "x")
        else:
            x = x.double()
            meta["refuse"] = (TypeError, "x")
    return dict(x=x), meta


MAKERS = {
    "pack_mask": make_pack_mask,
    "draft_tree_from_topk": make_draft_tree_from_topk,
    "draft_tree": make_draft_tree,
    "draft_tree_from_hidden": make_draft_tree_from_hidden,
    "tree_attention": make_tree_attention,
    "qk_norm_rope_append": make_qk_norm_rope_append,
    "verify_tree": make_verify_tree,
    "commit_kv": make_commit_kv,
    "rms_norm": make_rms_norm,
    "silu_mul": make_silu_mul,
}


# ------------------------------------------------------------------ gated_delta_tree / _commit


def gated_delta_dims(r):
    """(H, Hv, Dk, Dv, dtype): Hv = H or 2H; head dims off the powers of two and past one tile."""
    H = r.randint(1, 2)
    return (H, H * r.choice((1, 2)), r.choice((1, 4, 16, 24, 64)), r.choice((1, 8, 16, 80)),
            dtype_choice(r))


def gated_delta_nodes(r, g, B, N, H, Hv, Dk, Dv, dtype, l2norm):
    """Per-node inputs q, k [B, N, H, Dk], v [B, N, Hv, Dv] and float32 g, beta [B, N, Hv] (beta
    in float32 or the dtype) and v's magnitude: magnitudes 1e-4 .. 1e3, gates from ~0 to -30 a
    node, betas from ~0 to 1. float16 keeps outputs in its normal range (a result below 6e-5 is
    subnormal there, past 65504 inf: no relative tolerance holds): q/k 0.1 .. 1, v 1 .. 30, gates
    to -2, betas not near 0. Without the op's l2norm, k rows of norm <= 1 (the delta rule's
    state grows without bound once beta |k|^2 > 2) and q rows as long."""
    half = dtype == F16
    qk_mag = r.choice((0.1, 1.0) if half else MAGNITUDES)
    v_mag = r.choice((1.0, 30.0) if half else MAGNITUDES)
    q = torch.randn(B, N, H, Dk, generator=g) * qk_mag
    k = torch.randn(B, N, H, Dk, generator=g) * qk_mag
    v = torch.randn(B, N, Hv, Dv, generator=g) * v_mag
    if not l2norm:
        q, k = (ref.l2norm(x) * r.choice((0.3, 1.0)) for x in (q, k))
    gate_scales = (1e-6, 0.1, 2.0) + (() if half else (30.0,))
    gate = -torch.rand(B, N, Hv, generator=g) * r.choice(gate_scales)
    beta = torch.rand(B, N, Hv, generator=g)
    edge = r.choice(("none", "near 1") + (() if half else ("near 0",)))
    if edge == "near 0":
        beta = beta * 1e-5
    elif edge == "near 1":
        beta = 1 - beta * 1e-6
    beta = beta.to(r.choice((F32, dtype)))
    return q.to(dtype), k.to(dtype), v.to(dtype), gate, beta, v_mag


def state_pool(r, g, B, Hv, Dk, Dv, v_mag):
    """A float32 pool [S, Hv, Dk, Dv] with S > B when slots are given (the slots a permutation,
    the other slots NaN), in an outer-strided layout now and then; slots None: S = B. The state's
    magnitude is v's times 1e-2 .. 30: with beta near 1 a step keeps (1 - beta k.k) of the old
    state, a cancellation that a state 1e7 times v's would turn into float32's rounding."""
    mag = v_mag * r.choice((1e-2, 1.0, 30.0))
    slots = None
    S = B
    if r.random() < 0.7:
        S = B + r.randint(0, 3)
        slots = torch.randperm(S, generator=g)[:B].to(I32)
    pool = torch.full((S * 2, Hv, Dk, Dv), NAN)[::2] if r.random() < 0.3 else torch.full(
        (S, Hv, Dk, Dv), NAN)
    live = slots.long() if slots is not None else torch.arange(B)
    pool[live] = torch.randn(B, Hv, Dk, Dv, generator=g) * mag
    return pool, slots


def make_gated_delta_tree(r, g):
    B = r.randint(1, 4)
    N = r.choice((1, 2, 5, 9, 17, 33, 40))
    H, Hv, Dk, Dv, dtype = gated_delta_dims(r)
    parents, num_nodes, _ = tree_shape(r, g, B, N)
    l2norm = r.random() < 0.9
    q, k, v, gate, beta, v_mag = gated_delta_nodes(r, g, B, N, H, Hv, Dk, Dv, dtype, l2norm)
    pad = torch.arange(N)[None, :] >= num_nodes[:, None]
    for x in (q, k, v, gate, beta):                      # padding nodes' inputs: poison
        x[pad] = r.choice((NAN, INF, 1e30))
    if r.random() < 0.2 and bool((num_nodes == N).all()):
        num_nodes = None
    state, slots = state_pool(r, g, B, Hv, Dk, Dv, v_mag)
    call = dict(q=outer_layout(r, q), k=outer_layout(r, k), v=outer_layout(r, v),
                g=outer_layout(r, gate), beta=beta, parents=int_layout(r, parents), state=state,
                state_slots=slots, num_nodes=num_nodes,
                scale=r.choice((None, None, 0.3, 1.0)), use_qk_l2norm=l2norm)
    meta = {}
    if r.random() < 0.06:
        bad = r.choice(("parents", "g", "state_slots"))
        if bad == "parents" and N > 1 and (num_nodes is None or int(num_nodes[0]) > 1):
            p2 = parents.clone()
            p2[0, 1] = 1                                  # its own parent
            call["parents"] = p2
            meta["refuse"] = (ValueError, "parents")
        elif bad == "g":
            call["g"] = gate.to(BF16)
            meta["refuse"] = (TypeError, "g")
        elif slots is not None:
            call["state_slots"] = slots.clone().fill_(state.shape[0])
            meta["refuse"] = (ValueError, "state_slots")
    return call, meta


def accepted_paths(r, g, B, N, P):
    """An accepted path of distinct nodes per sequence ([B, P] int32, -1 or junk past each
    sequence's accept_len, which commits never read) and the accept_len ([B] int32)."""
    path = torch.full((B, P), -1, dtype=I32)
    accept = torch.zeros(B, dtype=I32)
    for b in range(B):
        a = r.randint(0, P - 1)
        path[b, :a + 1] = torch.tensor(r.sample(range(N), a + 1), dtype=I32)
        if a + 1 < P and r.random() < 0.5:                # junk past accept_len, never read
            path[b, a + 1:] = torch.randint(-5, N + 5, (P - a - 1,), generator=g, dtype=I32)
        accept[b] = a
    return path, accept


def make_gated_delta_commit(r, g):
    B = r.randint(1, 4)
    N = r.choice((1, 2, 5, 9, 17))
    P = r.randint(1, N)
    H, Hv, Dk, Dv, dtype = gated_delta_dims(r)
    l2norm = r.random() < 0.9
    _, k, v, gate, beta, v_mag = gated_delta_nodes(r, g, B, N, H, Hv, Dk, Dv, dtype, l2norm)
    path, accept = accepted_paths(r, g, B, N, P)
    state, slots = state_pool(r, g, B, Hv, Dk, Dv, v_mag)
    call = dict(k=outer_layout(r, k), v=outer_layout(r, v), g=gate, beta=outer_layout(r, beta),
                path=int_layout(r, path), accept_len=accept, state=state, state_slots=slots,
                use_qk_l2norm=l2norm)
    meta = {}
    if r.random() < 0.06:
        bad = r.choice(("accept_len", "path", "state_slots"))
        if bad == "accept_len":
            call["accept_len"] = accept.clone().fill_(P)
            meta["refuse"] = (ValueError, "accept_len")
        elif bad == "path":
            p2 = path.clone()
            p2[0, 0] = N
            call["path"] = p2
            meta["refuse"] = (ValueError, "path")
        elif slots is not None and B > 1:
            call["state_slots"] = slots.clone().fill_(int(slots[0]))
            meta["refuse"] = (ValueError, "state_slots")
    return call, meta


OPS = OPS + ("gated_delta_tree", "gated_delta_commit")
MAKERS.update(gated_delta_tree=make_gated_delta_tree, gated_delta_commit=make_gated_delta_commit)


# ------------------------------------------------------------------ causal_conv1d_tree / _commit


def conv_dims(r):
    """(C, W, dtype): odd channel counts and counts past one 256-channel program; widths 2 .. 8."""
    return (r.choice((1, 3, 7, 32, 33, 100, 257, 300)), r.randint(2, MAX_CONV_WIDTH),
            dtype_choice(r))


def conv_inputs(r, g, B, N, C, W, dtype):
    """Node inputs x [B, N, C] and weight [C, W] (x's dtype or float32): magnitudes 1e-4 .. 1e3
    (float16: 1e-2 .. 30 with weights <= 1, so states 30 times x's and sums of 8 taps stay in its
    normal range), and the inputs' magnitude for the state and the bias."""
    half = dtype == F16
    mag = r.choice((1e-2, 1.0, 30.0) if half else MAGNITUDES)
    x = torch.randn(B, N, C, generator=g) * mag
    weight = torch.randn(C, W, generator=g) * r.choice((0.1, 1.0) if half else (0.1, 1.0, 3.0))
    return x, weight.to(r.choice((dtype, F32))), mag


def conv_state_pool(r, g, B, C, W, dtype, mag):
    """A contiguous pool [S, C, W - 1] in ``dtype`` (S > B when slots are given: the slots a
    permutation, the other slots NaN) and the slots (None: S = B)."""
    slots, S = None, B
    if r.random() < 0.7:
        S = B + r.randint(0, 3)
        slots = torch.randperm(S, generator=g)[:B].to(I32)
    pool = torch.full((S, C, W - 1), NAN)
    live = slots.long() if slots is not None else torch.arange(B)
    pool[live] = torch.randn(B, C, W - 1, generator=g) * mag * r.choice((1e-2, 1.0, 30.0))
    return pool.to(dtype), slots


def conv_tree_shape(r, g, B, N):
    """tree_shape's trees and padding, now and then a forest (more valid nodes whose parent is
    -1, children of the committed prefix)."""
    parents, num_nodes, kind = tree_shape(r, g, B, N)
    if N > 1 and r.random() < 0.15:
        for b in range(B):
            n = int(num_nodes[b])
            if n > 1:
                parents[b, r.randrange(1, n)] = -1
        kind += "+forest"
    return parents, num_nodes, kind


def make_causal_conv1d_tree(r, g):
    if r.random() < 0.02:                                 # at the node limit (slow interpreted)
        B, N = 1, MAX_BUDGET
        C, W, dtype = 1, r.randint(2, MAX_CONV_WIDTH), dtype_choice(r)
    else:
        B, N = r.randint(1, 4), r.choice((1, 2, 5, 9, 17, 33, 64, 100))
        C, W, dtype = conv_dims(r)
    parents, num_nodes, kind = conv_tree_shape(r, g, B, N)
    x, weight, mag = conv_inputs(r, g, B, N, C, W, dtype)
    state, slots = conv_state_pool(r, g, B, C, W, dtype, mag)
    bias = None
    if r.random() < 0.6:
        bias = (torch.randn(C, generator=g) * mag).to(weight.dtype)
    pad = torch.arange(N)[None, :] >= num_nodes[:, None]
    x[pad] = r.choice((NAN, INF, 1e30))                  # padding nodes' inputs: poison
    specials = {}
    if r.random() < 0.2:                                  # where python_ref puts them, NaN == NaN
        live = slots.long() if slots is not None else torch.arange(B)
        specials["x"] = non_finite(r, g, x, allowed=~pad[..., None].expand_as(x))
        state_live = torch.zeros(state.shape, dtype=torch.bool)
        state_live[live] = True
        wide = state.float()
        specials["conv_state"] = non_finite(r, g, wide, allowed=state_live)
        state = wide.to(dtype)
        if r.random() < 0.5:
            wide = weight.float()
            specials["weight"] = non_finite(r, g, wide, most=1)
            weight = wide.to(weight.dtype)
    x = x.to(dtype)
    if r.random() < 0.2 and bool((num_nodes == N).all()):
        num_nodes = None
    if r.random() < 0.3:                                  # rows of a wider buffer
        weight = widened(weight, r.randint(1, 3), fill=NAN)
    if bias is not None and r.random() < 0.3:             # a slice of a wider buffer
        buf = torch.full((C + 3,), NAN, dtype=bias.dtype)
        buf[2:2 + C] = bias
        bias = buf[2:2 + C]
    call = dict(x=outer_layout(r, x), parents=int_layout(r, parents), conv_state=state,
                weight=weight, bias=bias, state_slots=slots, num_nodes=num_nodes,
                activation=r.choice(("silu", "silu", None)))
    meta = dict(kind=kind, mag=mag, specials=specials)
    if r.random() < 0.08:
        bad = r.choice(("parents", "weight", "state_slots", "conv_state", "activation"))
        if bad == "parents" and N > 1 and (num_nodes is None or int(num_nodes[0]) > 1):
            p2 = parents.clone()
            p2[0, 1] = 1                                  # its own parent
            call["parents"] = p2
            meta["refuse"] = (ValueError, "parents")
        elif bad == "weight":
            call["weight"] = weight.to(F16 if dtype == BF16 else BF16)
            meta["refuse"] = (TypeError, "weight")
        elif bad == "state_slots" and slots is not None:
            call["state_slots"] = slots.clone().fill_(state.shape[0])
            meta["refuse"] = (ValueError, "state_slots")
        elif bad == "conv_state" and not widened(state, 1).is_contiguous():
            call["conv_state"] = widened(state, 1)        # the pool must be contiguous
            meta["refuse"] = (ValueError, "conv_state")
        elif bad == "activation":
            call["activation"] = r.choice(("relu", "SiLU", ""))
            meta["refuse"] = (ValueError, "activation")
    return call, meta


def make_causal_conv1d_commit(r, g):
    B = r.randint(1, 4)
    N = r.choice((1, 2, 5, 9, 17, 33))
    P = r.randint(1, N)
    C, W, dtype = conv_dims(r)
    x, _, mag = conv_inputs(r, g, B, N, C, W, dtype)
    path, accept = accepted_paths(r, g, B, N, P)
    state, slots = conv_state_pool(r, g, B, C, W, dtype, mag)
    specials = {}
    if r.random() < 0.2:                                  # moved bit for bit, NaN included
        specials["x"] = non_finite(r, g, x)
    call = dict(x=outer_layout(r, x.to(dtype)), path=int_layout(r, path), accept_len=accept,
                conv_state=state, state_slots=slots)
    meta = dict(specials=specials)
    if r.random() < 0.08:
        bad = r.choice(("accept_len", "path", "state_slots", "conv_state"))
        if bad == "accept_len":
            call["accept_len"] = accept.clone().fill_(P)
            meta["refuse"] = (ValueError, "accept_len")
        elif bad == "path":
            p2 = path.clone()
            p2[0, 0] = r.choice((N, -1))
            call["path"] = p2
            meta["refuse"] = (ValueError, "path")
        elif bad == "state_slots" and slots is not None and B > 1:
            call["state_slots"] = slots.clone().fill_(int(slots[0]))
            meta["refuse"] = (ValueError, "state_slots")
        elif bad == "conv_state":
            call["conv_state"] = state.to(F16 if dtype != F16 else F32)
            meta["refuse"] = (TypeError, "conv_state")
    return call, meta


OPS = OPS + ("causal_conv1d_tree", "causal_conv1d_commit")
MAKERS.update(causal_conv1d_tree=make_causal_conv1d_tree,
              causal_conv1d_commit=make_causal_conv1d_commit)
