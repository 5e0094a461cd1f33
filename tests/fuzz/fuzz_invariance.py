"""The exact mode's invariance property, fuzzed: for every op of the target's forward, row i of an
M-row exact call is the same bits as the one-row exact call on row i alone (DESIGN.md, 5a).

``check_invariance(name, seed, engine)`` draws case ``seed`` (the differential fuzzer's random
inputs of the op, fuzz_cases.make, for the public ops; its own for ``linear`` and ``argmax``),
runs the op's exact form on all of it, then on a few of its rows alone, each a fresh contiguous
one-row call, and compares the bits. For ``tree_attention(exact=True)`` the one-row call is the
decode step: the node's visible keys in logical order (the prefix, its ancestors by depth, itself)
in a cache of exactly that length, N = 1. Names are the op's with ``exact_`` before it
(``INVARIANCE_OPS``), so ``tests/fuzz/run.py --op exact_tree_attention --seed S`` replays a case.

Returns ``"ok"``, ``"unsupported: <reason>"`` (the engine has no exact form of the op: it raised
ExactModeError or BackendUnavailableError) or ``"not-applicable: <reason>"`` (the case is one the
exact form does not take, such as a call built to be refused); raises AssertionError on a row
whose bits differ.
"""
from __future__ import annotations

import functools
import random
import sys
from pathlib import Path

import torch

import jetspec_kernels as jk
from jetspec_kernels.ops import exact as ex
from jetspec_kernels.python_ref.tree_attention import gather_cache, visible_slots
from fuzz_cases import BF16, F16, F32, make, outer_layout
from fuzz_engines import Engine, engine_ready, interpreted, to_engine
from helpers import k_parts_as_ranks, poisoned_empty, root_path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.exact_invariance import same_bits  # noqa: E402

INVARIANCE_OPS = ("exact_rms_norm", "exact_silu_mul", "exact_qk_norm_rope_append",
                  "exact_tree_attention", "exact_linear", "exact_argmax", "exact_moe",
                  "exact_embedding", "exact_gated_delta")
ROWS_CHECKED = 6          # rows per case run alone (the first, the last, random others)


def check_invariance(name: str, seed: int, engine: Engine, monkeypatch=None) -> str:
    op = name.removeprefix("exact_")
    if op in ("argmax", "embedding") and engine.name != "reference":
        return "not-applicable: torch's op, no backend to choose"
    if op in ("linear", "moe", "gated_delta") and engine.name not in ("reference", "triton"):
        return f"not-applicable: the exact {op} is the reference's or triton's"
    if op in _TORCH_OPS:
        return _TORCH_OPS[op](seed, engine)
    case = make(op, seed)
    if "refuse" in case.meta:
        return "not-applicable: a call built to be refused (the differential check's case)"
    dtypes = {v.dtype for v in case.call.values() if isinstance(v, torch.Tensor)}
    if interpreted(engine) and op == "tree_attention" and BF16 in dtypes:
        return "unsupported: the Triton interpreter cannot run a bf16 tl.dot"
    call = to_engine(case.call, engine)
    picker = random.Random(f"{name}:{seed}:rows")
    try:
        with engine_ready(engine, monkeypatch), poisoned_empty():
            _PUBLIC_OPS[op](call, picker)
    except (ex.ExactModeError, jk.BackendUnavailableError) as e:
        return f"unsupported: {e}"
    except _NotApplicable as e:
        return f"not-applicable: {e}"
    return "ok"


class _NotApplicable(Exception):
    pass


def _rows(count: int, picker: random.Random) -> list[int]:
    """The rows run alone: the first, the last and up to ROWS_CHECKED - 2 others."""
    if count <= ROWS_CHECKED:
        return list(range(count))
    return sorted({0, count - 1, *picker.sample(range(1, count - 1), ROWS_CHECKED - 2)})


def _assert_row(got, want, what):
    assert same_bits(got, want), (f"{what}: the M-row exact call's row differs from the one-row "
                                  f"call's (first values {got.flatten()[:4].tolist()} vs "
                                  f"{want.flatten()[:4].tolist()})")


def _rms_norm(call, picker):
    x, residual = call["x"], call["residual"]
    kw = dict(eps=call["eps"], backend=call["backend"])
    full = ex.rms_norm(x, call["weight"], residual=residual, **kw)
    full = full if isinstance(full, tuple) else (full,)
    h = x.shape[-1]
    xs = x.reshape(-1, h)
    rs = None if residual is None else residual.reshape(-1, h)
    for r in _rows(xs.shape[0], picker):
        alone = ex.rms_norm(xs[r:r + 1].clone(), call["weight"],
                            residual=None if rs is None else rs[r:r + 1].clone(), **kw)
        alone = alone if isinstance(alone, tuple) else (alone,)
        for f, a, what in zip(full, alone, ("out", "total")):
            _assert_row(f.reshape(-1, h)[r:r + 1], a, f"rms_norm {what} row {r}")


def _silu_mul(call, picker):
    x = call["x"]
    full = ex.silu_mul(x, backend=call["backend"])
    xs = x.reshape(-1, x.shape[-1])
    out = full.reshape(-1, full.shape[-1])
    for r in _rows(xs.shape[0], picker):
        _assert_row(out[r:r + 1], ex.silu_mul(xs[r:r + 1].clone(), backend=call["backend"]),
                    f"silu_mul row {r}")


def _cache_slot(cache, table, b, slot):
    """Slot ``slot`` of sequence ``b`` of a contiguous cache or a paged pool with ``table``."""
    if table is None:
        return cache[b, slot]
    page = cache.shape[1]
    return cache[int(table[b, slot // page]), slot % page]


def _qk_norm_rope_append(call, picker):
    if call["q"] is None:
        raise _NotApplicable("the exact form takes q (the K/V-only form is the draft head's)")
    kc0, vc0 = call["k_cache"].clone(), call["v_cache"].clone()
    table, start = call["block_table"], call["cache_start"]
    kw = dict(rope_theta=call["rope_theta"], eps=call["eps"], rotary_dim=call.get("rotary_dim"),
              backend=call["backend"])
    q, k, v, pos = call["q"], call["k"], call["v"], call["positions"]
    full = ex.qk_norm_rope_append(q, k, v, call["q_norm_w"], call["k_norm_w"], pos,
                                  call["k_cache"], call["v_cache"], block_table=table,
                                  cache_start=start, **kw)
    b_count, n = k.shape[:2]
    for flat in _rows(b_count * n, picker):
        b, i = divmod(flat, n)
        one = (slice(b, b + 1), slice(i, i + 1))
        kc, vc = (kc0.clone(), vc0.clone()) if table is not None else (kc0[b:b + 1].clone(),
                                                                      vc0[b:b + 1].clone())
        start1 = None if start is None else start[b:b + 1] + i
        alone = ex.qk_norm_rope_append(q[one].clone(), k[one].clone(), v[one].clone(),
                                       call["q_norm_w"], call["k_norm_w"], pos[one].clone(), kc,
                                       vc, block_table=None if table is None else table[b:b + 1],
                                       cache_start=start1, **kw)
        slot = int(pos[b, i]) if start is None else int(start[b]) + i
        _assert_row(full[b, i], alone[0, 0], f"qk_norm_rope_append q row ({b}, {i})")
        table1 = None if table is None else table[b:b + 1]
        for name, got, mine in (("k", call["k_cache"], kc), ("v", call["v_cache"], vc)):
            _assert_row(_cache_slot(got, table, b, slot), _cache_slot(mine, table1, 0, slot),
                        f"qk_norm_rope_append {name}_cache slot {slot} of sequence {b}")


def _tree_attention(call, picker):
    full = jk.tree_attention(**call, exact=True)
    out, lse = full if isinstance(full, tuple) else (full, None)
    q, table, mask = call["q"], call["block_table"], call["tree_mask"]
    b_count, n, _, dh = q.shape
    hkv = call["k_cache"].shape[2]
    for flat in _rows(b_count * n, picker):
        b, i = divmod(flat, n)
        p = int(call["prefix_lens"][b])
        slots = visible_slots(p, n, None if mask is None else mask[b].cpu(),
                                            call["tail"])[i].to(q.device)
        length = slots.numel()
        kc, vc = (gather_cache(c, b, p + n, table)[slots].reshape(
            1, length, hkv, dh).contiguous() for c in (call["k_cache"], call["v_cache"]))
        step = jk.tree_attention(q[b:b + 1, i:i + 1].clone(), kc, vc,
                                 torch.full((1,), length - 1, dtype=torch.int32, device=q.device),
                                 scale=call.get("scale"), return_lse=True, exact=True,
                                 backend=call["backend"])
        _assert_row(out[b, i], step[0][0, 0], f"tree_attention out row ({b}, {i}) vs its decode step")
        if lse is not None:
            _assert_row(lse[b, :, i], step[1][0, :, 0],
                        f"tree_attention lse row ({b}, {i}) vs its decode step")


_PUBLIC_OPS = {"rms_norm": _rms_norm, "silu_mul": _silu_mul,
               "qk_norm_rope_append": _qk_norm_rope_append, "tree_attention": _tree_attention}


def _linear(seed, engine):
    r = random.Random(f"exact_linear:{seed}")
    g = torch.Generator().manual_seed(r.getrandbits(62))
    lead = [r.choice((1, 2, 3, 7, 16, 33)) for _ in range(r.randint(1, 2))]
    k, n = r.choice((1, 8, 30, 64, 192, 513)), r.choice((1, 5, 64, 259))
    dtype = r.choice((F32, F16, BF16))
    mag = r.choice((1e-3, 1.0, 30.0))
    x = outer_layout(r, (torch.randn(*lead, k, generator=g) * mag).to(dtype))
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    if interpreted(engine) and dtype != F32:
        return "unsupported: the Triton interpreter cannot run a 16-bit tl.dot"
    tile = r.choice(ex.GEMM_TILES)
    parts = r.choice([p for p in (1, 1, 2, 4, 8) if k % p == 0])     # an engine's exact_k_parts
    x, w = x.to(engine.device), w.to(engine.device)
    kw = dict(backend=engine.name, tile=tile, parts=parts)
    full = ex.linear(x, w, **kw).reshape(-1, n)
    xs = x.reshape(-1, k)
    for row in _rows(xs.shape[0], r):
        _assert_row(full[row:row + 1], ex.linear(xs[row:row + 1].clone(), w, **kw),
                    f"linear row {row} ({tile} tile, {parts} K parts)")
    if parts > 1:       # tp ranks each reducing their K slice's parts: the one-rank bits
        ranks = r.choice([t for t in (2, 4, 8) if parts % t == 0])
        split = k_parts_as_ranks(functools.partial(ex.linear, backend=engine.name, tile=tile),
                                 x, w, parts, ranks)
        _assert_row(full, split.reshape(-1, n),
                    f"linear: {ranks} ranks' shares of {parts} K parts ({tile} tile)")
    return "ok"


def _argmax(seed, engine):
    r = random.Random(f"exact_argmax:{seed}")
    g = torch.Generator().manual_seed(r.getrandbits(62))
    lead = [r.choice((1, 2, 5, 16)) for _ in range(r.randint(1, 2))]
    v = r.choice((1, 2, 7, 259, 4096))
    x = (torch.randn(*lead, v, generator=g) * r.choice((1e-3, 1.0, 1e3))).to(
        r.choice((F32, F16, BF16)))
    flat = x.view(-1)
    for _ in range(r.randint(0, 6)):          # ties, -inf and NaN (the maximum) somewhere
        flat[r.randrange(flat.numel())] = r.choice((float("nan"), float("-inf"), float(flat.max())))
    x = outer_layout(r, x, fill=0.0)
    full = ex.argmax(x).reshape(-1)
    xs = x.reshape(-1, v)
    for row in _rows(xs.shape[0], r):
        alone = ex.argmax(xs[row:row + 1].clone())
        _assert_row(full[row:row + 1], alone, f"argmax row {row}")
        assert int(alone[0]) == int(torch.argmax(xs[row].float())), f"argmax row {row}: not the first maximum"
    return "ok"


def _moe(seed, engine):
    """A sparse layer's MLP (``models.moe.exact_moe``): router, top-k, experts, weighted sum."""
    from jetspec_kernels.models.moe import exact_moe
    r = random.Random(f"exact_moe:{seed}")
    g = torch.Generator().manual_seed(r.getrandbits(62))
    t, h, inter = r.choice((1, 2, 5, 17, 40)), r.choice((16, 48, 64)), r.choice((8, 32))
    e = r.choice((2, 4, 9))
    k = r.randint(1, min(e, 4))
    dtype = F32 if interpreted(engine) else r.choice((F32, F16, BF16))
    mag = r.choice((1e-2, 1.0, 20.0))
    x = (torch.randn(t, h, generator=g) * mag).to(dtype)
    if r.random() < 0.3 and t > 1:
        x[r.randrange(t)] = x[0]                           # two tokens alike: routing ties their picks
    router = (torch.randn(e, h, generator=g) / h ** 0.5).to(dtype)
    if r.random() < 0.3:
        router[-1] = router[0]                             # two experts tie for every token
    gate_up = (torch.randn(e, 2 * inter, h, generator=g) / h ** 0.5).to(dtype)
    down = (torch.randn(e, h, inter, generator=g) / inter ** 0.5).to(dtype)
    dev = engine.device
    args = [a.to(dev) for a in (router, gate_up, down)]
    norm = r.random() < 0.5
    parts = r.choice((1, 1, 2, 4, 8))                      # an engine's exact_k_parts (down's K)
    kw = dict(backend=engine.name, parts=parts)
    try:
        full = exact_moe(x.to(dev), *args, k, norm, **kw)
        for row in _rows(t, r):
            alone = exact_moe(x[row:row + 1].clone().to(dev), *args, k, norm, **kw)
            _assert_row(full[row:row + 1], alone, f"moe row {row} ({parts} K parts)")
    except (ex.ExactModeError, jk.BackendUnavailableError) as err:
        return f"unsupported: {err}"
    return "ok"


def _embedding(seed, engine):
    """The embedding (a gather: exact by nature, checked like the others)."""
    r = random.Random(f"exact_embedding:{seed}")
    g = torch.Generator().manual_seed(r.getrandbits(62))
    v, h = r.choice((3, 97, 259)), r.choice((8, 192))
    table = torch.randn(v, h, generator=g).to(r.choice((F32, F16, BF16)))
    tokens = torch.randint(0, v, (r.choice((1, 2, 16)), r.choice((1, 7, 33))), generator=g)
    full = torch.nn.functional.embedding(tokens, table).reshape(-1, h)
    flat = tokens.reshape(-1)
    for row in _rows(flat.numel(), r):
        _assert_row(full[row:row + 1],
                    torch.nn.functional.embedding(flat[row:row + 1].clone(), table),
                    f"embedding row {row}")
    return "ok"


def _gated_delta(seed, engine):
    """The hybrids' exact Gated DeltaNet walk (``models.hybrid_exact``: the reference's, or
    ``triton.exact_gated_delta.walk``): every node of a random forest, whatever the batch, the
    padding and the slots around it, is the bits of its own path walked alone as a chain from
    the same committed state (B 1, N its depth + 1, slot 0): the decode steps' bits."""
    from jetspec_kernels.models import hybrid_exact
    from jetspec_kernels.python_ref.gated_delta_tree import l2norm
    r = random.Random(f"exact_gated_delta:{seed}")
    g = torch.Generator().manual_seed(r.getrandbits(62))
    b, n = r.randint(1, 3), r.choice((1, 2, 5, 13, 24))
    h, rep = r.choice((1, 2)), r.choice((1, 2, 3))
    hv, dk, dv = h * rep, r.choice((4, 8, 16)), r.choice((3, 8, 24, 40))
    dtype = F32 if interpreted(engine) else r.choice((F32, BF16))
    parents = torch.full((b, n), -1, dtype=torch.int32)
    counts = torch.tensor([r.randint(1, n) for _ in range(b)], dtype=torch.int32)
    for s in range(b):
        shape = r.choice(("chain", "random", "star"))
        for i in range(1, int(counts[s])):
            parents[s, i] = {"chain": i - 1, "star": 0, "random": r.randrange(-1, i)}[shape]
    mag = r.choice((1e-3, 1.0, 30.0))
    q = l2norm(torch.randn(b, n, h, dk, generator=g) * mag) * dk ** -0.5
    k = l2norm(torch.randn(b, n, h, dk, generator=g) * mag)
    v = (torch.randn(b, n, hv, dv, generator=g) * mag).to(dtype)
    gate = r.choice(("near 0", "mixed", "very negative"))
    g_ = -torch.rand(b, n, hv, generator=g) * {"near 0": 1e-4, "mixed": 3.0, "very negative": 60.0}[gate]
    beta = torch.rand(b, n, hv, generator=g)
    beta[..., 0] = r.choice((0.0, 1.0, 0.5))                       # beta at its limits
    for t in (q, k, v, g_, beta):                                  # padding that is not data
        for s in range(b):
            t[s, int(counts[s]):] = float("nan")
    pool_size = b + r.randint(0, 2)
    pool = torch.randn(pool_size, hv, dk, dv, generator=g) * r.choice((0.0, 0.1, 3.0))
    slots = torch.tensor(r.sample(range(pool_size), b), dtype=torch.int32)
    depth = max(len(root_path(parents[s], i)) - 1 for s in range(b) for i in range(int(counts[s])))
    bound = r.random() < 0.5
    dev = engine.device
    q, k, v, g_, beta, parents, counts, pool, slots = (
        t.to(dev) for t in (q, k, v, g_, beta, parents, counts, pool, slots))

    def run(q, k, v, g_, beta, parents, counts, pool, slots):
        if engine.name == "triton":
            from jetspec_kernels.models.walk_plan import tree_plan
            from jetspec_kernels.triton.exact_gated_delta import walk
            plan = tree_plan(parents, counts, depth if bound else None)   # the depth's slots or N's
            return walk(q, k, v, g_, beta, plan, counts, pool, slots, out=True, store_last=False)
        rq, rk = (x.repeat_interleave(rep, dim=2) for x in (q, k))
        return hybrid_exact._reference_walk(rq, rk, v, g_, beta, parents, counts, pool, slots,
                                            store_last=False)
    try:
        before = pool.clone()
        full = run(q, k, v, g_, beta, parents, counts, pool, slots)
    except (ex.ExactModeError, jk.BackendUnavailableError) as err:
        return f"unsupported: {err}"
    assert same_bits(pool, before), "gated_delta walk: the tree walk wrote the pool"
    for s in range(b):
        for node in _rows(int(counts[s]), r):
            path = root_path(parents[s], node)
            sub = [t[s:s + 1, path].clone() for t in (q, k, v, g_, beta)]
            chain = torch.arange(-1, len(path) - 1, dtype=torch.int32, device=dev)[None]
            alone = run(*sub, chain, counts.new_full((1,), len(path)),
                        pool[int(slots[s])][None].clone(), slots.new_zeros(1))
            _assert_row(full[s, node], alone[0, -1],
                        f"gated_delta sequence {s} node {node} (path {path}, {gate} gates)")
    return "ok"


_TORCH_OPS = {"linear": _linear, "argmax": _argmax, "moe": _moe, "embedding": _embedding,
              "gated_delta": _gated_delta}
