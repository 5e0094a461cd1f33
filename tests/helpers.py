"""Helpers shared by tests: relative L2 error and tolerances, the eps-aware comparison of draft
trees, input builders (random trees, paged caches, filter cases) and the CUDA simulator switch."""
from __future__ import annotations

import contextlib
import importlib
import math
import shutil
from functools import lru_cache

import numpy as np
import pytest
import torch


def _poisoned(t):
    """``t`` filled with NaN (float) / -7 (signed int) / 0xA5 (uint8)."""
    if t.is_floating_point():
        return t.fill_(float("nan"))
    return t.fill_(0xA5 if t.dtype == torch.uint8 else -7)


@contextlib.contextmanager
def poisoned_empty():
    """Make torch.empty return NaN (float) / -7 (signed int) / 0xA5 (uint8) tensors, so unwritten
    outputs show."""
    real = torch.empty

    def empty(*size, dtype=None, **kw):
        return _poisoned(real(*size, dtype=dtype, **kw))

    torch.empty = empty
    try:
        yield
    finally:
        torch.empty = real


@contextlib.contextmanager
def fenced_empty(fence: int = 64):
    """poisoned_empty whose float tensors are the front of buffers ``fence`` elements longer, the
    rest holding the dtype's largest finite value; on exit (without an error) asserts it still
    does, so a kernel's write past the end of an output it allocated fails (the poison shows only
    what is left unwritten inside it). Other dtypes, and calls with keywords other than device:
    as poisoned_empty."""
    real = torch.empty
    tails = []

    def empty(*size, dtype=None, **kw):
        t = _poisoned(real(*size, dtype=dtype, **kw))
        if not t.is_floating_point() or set(kw) - {"device"}:
            return t
        buf = _poisoned(real(t.numel() + fence, dtype=t.dtype, device=t.device))
        buf[t.numel():] = torch.finfo(t.dtype).max
        tails.append(buf[t.numel():])
        return buf[:t.numel()].view(t.shape)

    torch.empty = empty
    try:
        yield
    finally:
        torch.empty = real
    for tail in tails:
        assert (tail == torch.finfo(tail.dtype).max).all(), "a write past an output's end"


@lru_cache(maxsize=None)
def sim_module():
    """The simulated ``_C`` (csrc built with g++ against tests/cuda_sim), built and loaded once."""
    from cuda_sim.build import load
    return load()


def rel_l2(out, want) -> float:
    """||out - want|| / ||want|| in float64 (the house tolerance metric)."""
    out = torch.as_tensor(out).detach().double().cpu()
    want = torch.as_tensor(want).detach().double().cpu()
    return float((out - want).norm() / want.norm().clamp_min(1e-300))


def undeferred(decoder_layer):
    """The models' ``decoder_layer`` (``models/layer.py``) as it ran before the models deferred the MLP's residual
    add to the next norm: the add of a ``residual`` passed in runs as its own op, and a
    ``defer_add`` call returns ``(zeros, output)`` (adding zeros is exact), so a model patched
    with it computes every sum where it did before."""
    def layer(h, w, *args, residual=None, defer_add=False, **kwargs):
        out = decoder_layer(h if residual is None else h + residual, w, *args, **kwargs)
        return (torch.zeros_like(out), out) if defer_add else out
    return layer


def np_rms_norm(x, w, eps):
    """RMSNorm of the last dim in numpy float64: the brute force python_ref's is checked against."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * np.asarray(w, dtype=np.float64)


def mask_bit(mask, b, i, j):
    """Bit ``j`` of row ``i`` of sequence ``b`` of a packed int32 mask ``[B, N, W]``, as 0 or 1."""
    return (int(mask[b, i, j // 32]) & 0xFFFFFFFF) >> (j % 32) & 1


def ancestor_set(parents_row, i):
    """Node ``i`` and its ancestors, by walking a list of parents (``-1`` ends the walk)."""
    s = {i}
    while parents_row[i] >= 0:
        i = parents_row[i]
        s.add(i)
    return s


def root_path(parents_row, node):
    """The nodes from a root down to ``node`` (itself last), by walking a sequence of parents
    (``-1`` ends the walk; a list or a tensor row)."""
    path = [node]
    while int(parents_row[path[-1]]) >= 0:
        path.append(int(parents_row[path[-1]]))
    return path[::-1]


TREE_FIELDS = ("tokens", "parents", "depths", "scores", "num_nodes", "mask")


def tree_fields(t):
    """A Tree, a python_ref dict or a backend tuple -> dict of CPU tensors keyed by TREE_FIELDS."""
    if isinstance(t, dict):
        return {k: t[k].detach().cpu() for k in TREE_FIELDS}
    if isinstance(t, (tuple, list)):
        return {k: v.detach().cpu() for k, v in zip(TREE_FIELDS, t)}
    return {k: getattr(t, k).detach().cpu() for k in TREE_FIELDS}


def _paths(f, b):
    """Token path (root first) -> (score, parent path) for the valid nodes of sequence b."""
    n = int(f["num_nodes"][b])
    tok = f["tokens"][b].tolist()
    par = f["parents"][b].tolist()
    dep = f["depths"][b].tolist()
    sc = f["scores"][b].tolist()
    out, path_of = {}, []
    for i in range(n):
        p = par[i]
        if i == 0:
            if p != -1 or dep[0] != 0:
                return None, f"node 0 is not a root (parent {p}, depth {dep[0]})"
            path = (tok[0],)
        else:
            if not 0 <= p < i or dep[i] != dep[p] + 1:
                return None, f"node {i}: parent {p}, depth {dep[i]} is not a valid tree"
            path = path_of[p] + (tok[i],)
        if path in out:
            return None, f"node {i} repeats the token path {path}"
        path_of.append(path)
        out[path] = (sc[i], path_of[p] if i else None)
    return out, None


def tree_difference(a, b, eps, score_tol=1e-5):
    """None when trees ``a`` and ``b`` are equivalent up to score ties within ``eps``, else why not.

    Both trees must have the same node counts; nodes are matched by token path. Matched nodes
    must have scores within ``eps`` each and, over all sequences, a relative L2 error (against
    ``b``) below ``score_tol`` (the house rule; the default is fp32's, as scores are float32);
    non-finite scores must be equal (a NaN never is). Nodes present in one tree only are
    accepted only when a near-tie at a selection decision explains them:

    * the cutoff (``topn``): each node missing from the other tree scores at most ``eps`` above
      that tree's lowest-scoring node (it could have been chosen instead), or
    * the pop order (``accum_logp``): the nodes only in ``a`` and those only in ``b`` have
      different parents, and every parent on one side ties within ``eps`` with every parent on
      the other (either could have been popped first).
    """
    fa, fb = tree_fields(a), tree_fields(b)
    if not torch.equal(fa["num_nodes"], fb["num_nodes"]):
        return f"num_nodes differ: {fa['num_nodes'].tolist()} vs {fb['num_nodes'].tolist()}"
    matched_a, matched_b = [], []
    for b_ in range(fa["num_nodes"].shape[0]):
        pa, err = _paths(fa, b_)
        if err:
            return f"seq {b_}, first tree: {err}"
        pb, err = _paths(fb, b_)
        if err:
            return f"seq {b_}, second tree: {err}"
        for path in pa.keys() & pb.keys():
            sa, sb = pa[path][0], pb[path][0]
            finite = math.isfinite(sa) and math.isfinite(sb)
            if (abs(sa - sb) > eps) if finite else sa != sb:  # NaN never matches
                return f"seq {b_}: node {path} scores {sa} vs {sb}"
            if finite:
                matched_a.append(sa)
                matched_b.append(sb)
        only_a = [pa[p] for p in pa.keys() - pb.keys()]
        only_b = [pb[p] for p in pb.keys() - pa.keys()]
        if not only_a and not only_b:
            continue
        min_a = min(s for s, _ in pa.values())
        min_b = min(s for s, _ in pb.values())
        cutoff = (all(s <= min_b + eps for s, _ in only_a)
                  and all(s <= min_a + eps for s, _ in only_b))
        score_of = lambda p: pa[p][0] if p in pa else pb[p][0]
        par_a = {p for _, p in only_a if p is not None}
        par_b = {p for _, p in only_b if p is not None}
        pop_order = bool(par_a) and bool(par_b) and not par_a & par_b and all(
            abs(score_of(x) - score_of(y)) <= eps for x in par_a for y in par_b)
        if not (cutoff or pop_order):
            return (f"seq {b_}: {len(only_a)} nodes differ without a tie within {eps} "
                    f"(scores {sorted(s for s, _ in only_a)} vs {sorted(s for s, _ in only_b)})")
    err = rel_l2(torch.tensor(matched_a, dtype=torch.float64),
                 torch.tensor(matched_b, dtype=torch.float64))
    if err >= score_tol:
        return f"matched nodes' scores differ: relative L2 {err:.3g} >= {score_tol}"
    return None


def trees_equivalent(a, b, eps):
    """True when :func:`tree_difference` finds no difference beyond ties within ``eps``."""
    return tree_difference(a, b, eps) is None


def assert_padding(f, budget):
    """Rows i >= num_nodes follow CONTRIBUTING.md: token 0, parent -1, depth -1, score -inf."""
    for b in range(f["num_nodes"].shape[0]):
        n = int(f["num_nodes"][b])
        assert f["tokens"][b, n:].eq(0).all()
        assert f["parents"][b, n:].eq(-1).all()
        assert f["depths"][b, n:].eq(-1).all()
        assert torch.isneginf(f["scores"][b, n:]).all()
        assert n <= budget and not math.isnan(float(f["scores"][b, :n].sum()))


# Per-sequence sampling controls of :func:`filter_case`: greedy, top-k alone, top-p alone, both,
# and values that mean "off" (top_k 0 or >= V, top_p 1) or "top-1" (top_k 1, a tiny top_p).
FILTER_TEMPERATURE = (0.7, 0.0, 1.0, 1.3, 0.5, 2.0)
FILTER_TOP_P = (0.5, 0.9, 0.8, 1.0, 0.95, 1e-4)


def filter_top_k(V):
    return (5, 3, 0, 1, V - 1, V + 5)


def filter_case(gen, N, V, dtype=torch.float32):
    """Logits ``[6, N, V]`` (N >= 3, V >= 64) and per-sequence controls (temperature float32 [6],
    top_k int32 [6], top_p float32 [6]) that put exact ties at the filters' boundaries.

    In every sequence, node 0 has ten equal maxima (top-k 5 keeps the five lowest ids, then
    top-p 0.5 three of them); node 1 has four equal maxima over a floor 60 below (zero mass: top-p
    0.5 keeps exactly two, top-p 0.8 all four, top-k 5 one floor token, the lowest id); node 2
    has -0.0 and +0.0 maxima (ties, by id); the other nodes are random (with the small ids
    boosted, for matches in trees of small tokens).
    """
    B = len(FILTER_TEMPERATURE)
    logits = torch.randn(B, N, V, generator=gen) * 2
    logits[..., :4] += 3.0
    perm = lambda: torch.randperm(V, generator=gen)
    for b in range(B):
        logits[b, 0, perm()[:10]] = 30.0
        logits[b, 1] = -60.0
        logits[b, 1, perm()[:4]] = 0.0
        logits[b, 2] = -torch.rand(V, generator=gen) - 1.0
        ids = perm()[:6]
        logits[b, 2, ids[:3]] = -0.0
        logits[b, 2, ids[3:]] = 0.0
    return (logits.to(dtype), torch.tensor(FILTER_TEMPERATURE, dtype=torch.float32),
            torch.tensor(filter_top_k(V), dtype=torch.int32),
            torch.tensor(FILTER_TOP_P, dtype=torch.float32))


def kept_by_thresholds(logits, temperature, thr_x, thr_id):
    """bool ``[B, N, V]``: token v of node (b, n) is kept iff x > thr_x or (x == thr_x and
    v <= thr_id), ``x = float32(logits) / temperature[b]`` (one float32 division)."""
    x = logits.float() / temperature.float()[:, None, None]
    v = torch.arange(logits.shape[-1])
    tx, ti = thr_x[..., None].cpu(), thr_id[..., None].cpu()
    return (x.cpu() > tx) | ((x.cpu() == tx) & (v <= ti))


# ---- shared by the op tests (tests/ops) and the other files that build the same inputs ----

# The house tolerances: relative L2 error against float64 python_ref, per dtype.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
# Where the triton and reference tests put their tensors.
DEV = "cuda" if torch.cuda.is_available() else "cpu"
VERIFY_KEYS = ("accept_len", "path", "bonus", "emitted")


def backends(*names):
    """Parametrise a test over the op backends ``names`` (reference, triton, sim, cuda): the
    ``backend`` fixture of tests/ops/conftest.py sets each up; cuda is gpu-marked."""
    params = [pytest.param(n, marks=pytest.mark.gpu) if n == "cuda" else n for n in names]

    def mark(fn):
        fn = pytest.mark.parametrize("backend", params, indirect=True)(fn)
        return pytest.mark.usefixtures("backend")(fn)
    return mark


def on(t, device):
    """``t`` on ``device`` with the same sizes, strides and storage offset (``.to`` would make a
    strided view contiguous); non-tensors pass through."""
    if not isinstance(t, torch.Tensor) or t.device == torch.device(device):
        return t
    storage = t.untyped_storage()
    flat = torch.empty(0, dtype=t.dtype).set_(storage, 0, (storage.nbytes() // t.element_size(),), (1,))
    return flat.to(device).as_strided(t.shape, t.stride(), t.storage_offset())


def api_backend(backend):
    """What the public ops' ``backend=`` gets for a test backend (sim runs the cuda backend)."""
    return "cuda" if backend.name == "sim" else backend.name


def skip_on_interpreter(backend, reason):
    """Skip a ``triton`` case under TRITON_INTERPRET (no GPU), where it would cost ``reason``; the
    same case still runs on triton on a GPU and on every other backend."""
    if backend.name == "triton" and DEV == "cpu":
        pytest.skip(f"triton under the interpreter: {reason} (runs on a GPU)")


def random_tree(b, n, gen, min_nodes=None, pad=True):
    """Random parents int32 [b, n] (parents[i] < i) and ragged num_nodes int32 [b], drawn from
    ``min_nodes`` (default max(1, n // 2)) to n; ``pad`` sets the parents past num_nodes to -1."""
    parents = torch.full((b, n), -1, dtype=torch.int32)
    for i in range(1, n):
        parents[:, i] = torch.randint(0, i, (b,), generator=gen, dtype=torch.int32)
    low = max(1, n // 2) if min_nodes is None else min_nodes
    num_nodes = torch.randint(low, n + 1, (b,), generator=gen, dtype=torch.int32)
    if pad:
        for bb in range(b):
            parents[bb, num_nodes[bb]:] = -1
    return parents, num_nodes


def shuffled_table(b, pages, gen, spare=0):
    """A block table int32 [b, pages]: a random permutation of ``b * pages + spare`` pool pages
    (``spare`` pages then belong to no sequence)."""
    perm = torch.randperm(b * pages + spare, generator=gen)
    return perm[:b * pages].view(b, pages).to(torch.int32)


def paged(cache, page_size, gen, table=None):
    """[B, L, H, D] -> (paged cache, block table); a shuffled table unless one is given."""
    b, l, h, d = cache.shape
    pages = l // page_size
    if table is None:
        table = shuffled_table(b, pages, gen)
    out = torch.empty(b * pages, page_size, h, d, dtype=cache.dtype)
    for bb in range(b):
        for p in range(pages):
            out[table[bb, p]] = cache[bb, p * page_size:(p + 1) * page_size]
    return out, table


def steering_logits(tokens, parents, num_nodes, V, gen, boost=25.0, dtype=torch.float32):
    """Random target logits [B, N, V] where most nodes favour one of their children's tokens, so
    the walk goes deep; some nodes keep random logits so it also stops early."""
    B, N = tokens.shape
    logits = torch.randn(B, N, V, generator=gen)
    for b in range(B):
        for i in range(int(num_nodes[b])):
            kids = [c for c in range(int(num_nodes[b])) if int(parents[b, c]) == i]
            if kids and torch.rand((), generator=gen) < 0.85:
                c = kids[int(torch.randint(0, len(kids), (), generator=gen))]
                logits[b, i, int(tokens[b, c])] += boost
    return logits.to(dtype)


def cu():
    """The cuda backend's Python wrappers (jetspec_kernels.cuda)."""
    import jetspec_kernels.cuda as c
    return c


def backend_module(backend: str, fn: str):
    """The module ``jetspec_kernels.<backend>.<fn>`` (the package's attribute ``fn`` is the
    function), for its other names: launchers, launch plans, samplers."""
    return importlib.import_module(f"jetspec_kernels.{backend}.{fn}")


def sync(dev):
    """Wait for the GPU when ``dev`` is "cuda" (the simulator runs synchronously)."""
    if dev == "cuda":
        torch.cuda.synchronize()


class DeviceGuardCheck:
    """Fails a simulated test whose op calls _C, or takes the stream, outside ``ext.on_device``: on a
    GPU that call would launch on (and plan for) whatever device is current, not the tensors'."""

    def __init__(self):
        self.depth = 0

    @contextlib.contextmanager
    def on_device(self, device):
        assert isinstance(device, torch.device)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def stream(self):
        assert self.depth > 0, "ext.stream() outside ext.on_device"
        return 0

    def wrap(self, module):
        check = self

        class Guarded:
            def __getattr__(self, name):
                fn = getattr(module, name)
                if not callable(fn):
                    return fn

                def call(*args, **kwargs):
                    assert check.depth > 0, f"_C.{name} called outside ext.on_device"
                    assert not args or name not in module.FIELDS, (
                        f"_C.{name} called with positional arguments (pass fields by name)")
                    return fn(*args, **kwargs)
                return call
        return Guarded()


def use_sim(monkeypatch):
    """Install the simulated kernels as _C for CPU tensors (skips the test without g++)."""
    import jetspec_kernels
    from jetspec_kernels import launch_plan
    from jetspec_kernels.cuda import extension as ext

    if shutil.which("g++") is None:
        pytest.skip("the CUDA simulator needs g++")
    guard = DeviceGuardCheck()
    monkeypatch.setattr(jetspec_kernels, "_C", guard.wrap(sim_module()), raising=False)
    monkeypatch.setattr(ext, "on_device", guard.on_device)
    monkeypatch.setattr(ext, "stream", guard.stream)
    monkeypatch.setattr(launch_plan, "sm_count", lambda device: 132)  # an H200's split-KV choices


def use_sim_backend(monkeypatch):
    """:func:`use_sim`, and the public ops allowed to send CPU tensors to the simulated kernels
    (``backend="cuda"`` on CPU tensors)."""
    from jetspec_kernels import backend as _backend

    use_sim(monkeypatch)
    real = _backend.unavailable_reason
    monkeypatch.setattr(_backend, "unavailable_reason",
                        lambda name, device: None if name == "cuda" else real(name, device))


# ---- engine layouts (built on the target device: .to() would make a strided view contiguous) ----

def widened(x, extra, dim=-1, fill=float("nan")):
    """``x`` copied into a buffer ``extra`` elements wider in ``dim``, viewed back to its size."""
    shape = list(x.shape)
    shape[dim] += extra
    wide = torch.full(shape, fill, dtype=x.dtype, device=x.device)
    view = wide.narrow(dim, 0, x.shape[dim])
    view.copy_(x)
    return view


def after_rows(x, extra, fill=float("nan")):
    """``x`` [B, R, ...] stored as rows ``extra ..`` of a ``[B, extra + R, ...]`` buffer."""
    buf = torch.full((x.shape[0], extra + x.shape[1], *x.shape[2:]), fill, dtype=x.dtype,
                     device=x.device)
    buf[:, extra:] = x
    return buf[:, extra:]


def heads_major(x):
    """``x`` [B|P, L|page, H, Dh] stored as ``[B|P, H, L|page, Dh]`` (the "HND" cache layout)."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def halves(k, v):
    """K and V as ``buf[:, :, 0]`` and ``buf[:, :, 1]`` of one [B|P, L|page, 2, Hkv, Dh] buffer."""
    buf = torch.empty(*k.shape[:2], 2, *k.shape[2:], dtype=k.dtype, device=k.device)
    buf[:, :, 0] = k
    buf[:, :, 1] = v
    return buf[:, :, 0], buf[:, :, 1]


def cache_layout(layout, k, v):
    """K and V caches in one of the cache layouts ("kv_halves", "kv_heads_major", "v_padded"), or
    unchanged for any other layout name."""
    if layout == "kv_halves":
        return halves(k, v)
    if layout == "kv_heads_major":
        return heads_major(k), heads_major(v)
    if layout == "v_padded":
        return k, widened(v, 16)
    return k, v


def fused_qkv(q, k, v):
    """q, k, v sliced from one ``[B, N, (Hq + 2 Hkv) * Dh]`` projection output, viewed as heads."""
    b, n, hq, dh = q.shape
    hkv = k.shape[2]
    qkv = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], dim=2)
    cuts = [0, hq * dh, (hq + hkv) * dh, (hq + 2 * hkv) * dh]
    return [qkv[..., lo:hi].view(b, n, -1, dh) for lo, hi in zip(cuts, cuts[1:])]


# ---- rms_norm's contract (DESIGN.md section 4) ----

# Relative slack on a row's rsqrt: float32 summation in any order over up to 8192 terms (pairwise
# or tree: about log2(H) roundings), the division and an approximate rsqrt.
RMS_R_SLACK = 2e-6


def _rms_rounded(h, w, r, dtype):
    """The contract's output for rsqrt values ``r`` (float32 [R, 1]): round(w * round(h * r))."""
    n = (h.float() * r).to(dtype)
    return (w.float() * n.float()).to(dtype)


def assert_rms_norm(out, total, x, residual, w, eps):
    """``out`` (and ``total``) of ``rms_norm(x, w, eps, residual)`` meet the contract: total is
    x + residual rounded to the dtype, bit for bit; each output lies between the contract's
    values for the row's rsqrt RMS_R_SLACK below and above its float64 value (the float32 sum
    of squares overflowing to inf as the contract's does)."""
    dtype = x.dtype
    x, w = x.cpu(), w.cpu()
    h = x if residual is None else x + residual.cpu()    # the contract's rounded sum
    if residual is not None:
        assert total.dtype == dtype and total.is_contiguous()
        assert torch.equal(total.cpu(), h), "total must be x + residual rounded to the dtype"
    assert out.dtype == dtype and out.is_contiguous() and out.shape == x.shape
    hf = h.reshape(-1, h.shape[-1]).double()
    r = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True).float().double() + eps)
    lo = _rms_rounded(hf, w, (r * (1 - RMS_R_SLACK)).float(), dtype).double()
    hi = _rms_rounded(hf, w, (r * (1 + RMS_R_SLACK)).float(), dtype).double()
    got = out.cpu().reshape(hf.shape).double()
    ok = (got >= torch.minimum(lo, hi)) & (got <= torch.maximum(lo, hi))
    bad = (~ok).nonzero()
    assert not len(bad), (f"{len(bad)} of {got.numel()} outputs outside the contract, first at "
                          f"{bad[0].tolist()}: {got[tuple(bad[0])]} not in "
                          f"[{lo[tuple(bad[0])]}, {hi[tuple(bad[0])]}]")


# ---- silu_mul's contract (tests/ops/test_silu_mul.py, tests/test_cuda_silu_mul.py) ----

SILU_REL = 2e-6
_LN_F32_MAX = math.log(torch.finfo(torch.float32).max)


def _down32(v):
    """The largest float32 <= v (float64 in, float32 out)."""
    f = v.float()
    return torch.where(f.double() > v, torch.nextafter(f, torch.full_like(f, -math.inf)), f)


def _up32(v):
    f = v.float()
    return torch.where(f.double() < v, torch.nextafter(f, torch.full_like(f, math.inf)), f)


def silu_bounds(g):
    """The least and greatest float32 silu(g) the contract accepts (g in any float dtype)."""
    g64 = g.double()
    exact = g64 / (1 + torch.exp(-g64))
    tol = SILU_REL * exact.abs()
    lo = torch.minimum(_up32(exact - tol), _down32(exact))
    hi = torch.maximum(_down32(exact + tol), _up32(exact))
    fixed = ~exact.isfinite() | (exact == 0)  # NaN, +-inf, +-0: exactly these
    lo = torch.where(fixed, exact.float(), lo)
    hi = torch.where(fixed, exact.float(), hi)
    overflow = g64.isfinite() & (-g64 > _LN_F32_MAX)  # float32 exp(-g) = inf: s = g / inf = -0.0
    neg0 = torch.full_like(lo, -0.0)
    return torch.where(overflow, neg0, lo), torch.where(overflow, neg0, hi)


def candidates(x):
    """The two outputs of the contract's form at the ends of the accepted silu window, in x's
    dtype ([R, I] each)."""
    inner = x.shape[1] // 2
    g, u = x[:, :inner], x[:, inner:]
    lo, hi = silu_bounds(g)
    return tuple((s.to(x.dtype).float() * u.float()).to(x.dtype) for s in (lo, hi))


def same(a, b):
    """Elementwise: equal with the sign of zero, or both NaN."""
    return ((a == b) & (a.signbit() == b.signbit())) | (a.isnan() & b.isnan())


def assert_silu_mul(out, x):
    """silu_mul's contract: ``out`` of x's dtype [R, I] contiguous, each element the contract's
    form of some float32 silu within relative ``SILU_REL`` of the exact one (test_cuda_silu_mul's
    docstring says how); zero signs, infinities and NaN positions exact."""
    rows, inner = x.shape[0], x.shape[1] // 2
    assert out.dtype == x.dtype and out.shape == (rows, inner) and out.is_contiguous()
    p_lo, p_hi = candidates(x)
    if x.dtype == torch.float32:
        lo, hi = torch.minimum(p_lo, p_hi), torch.maximum(p_lo, p_hi)
        ok = ((out >= lo) & (out <= hi) & ((out != 0) | (out.signbit() == p_lo.signbit())))
        ok |= out.isnan() & p_lo.isnan()
    else:
        ok = same(out, p_lo) | same(out, p_hi)
    assert ok.all(), (ok.logical_not().nonzero()[:4].tolist(), out[~ok][:6], p_lo[~ok][:6],
                      p_hi[~ok][:6])


def k_parts_as_ranks(linear, x, w, parts, ranks):
    """``linear(x, w, parts=parts)`` as ``ranks`` tensor-parallel ranks compute it: rank r takes
    the r-th slice of K of x and w (contiguous copies, as ``tp.rowwise``), reduces its
    ``parts / ranks`` parts unrounded (``partial=True``), and the ranks' float32 shares are summed
    along ``ops.exact.sum_pairwise``'s tree, rounded once to x.dtype."""
    from jetspec_kernels.ops.exact import sum_pairwise
    k = x.shape[-1] // ranks
    shares = [linear(x[..., r * k:(r + 1) * k].contiguous(), w[:, r * k:(r + 1) * k].contiguous(),
                     parts=parts // ranks, partial=True) for r in range(ranks)]
    assert all(s.dtype == torch.float32 for s in shares)
    return sum_pairwise(shares, x.dtype)


def moe_as_ranks(exact_moe, backend, dtype, ranks, parts, seed=13):
    """``exact_moe`` on a random block (T 9, H 32, I 48, E 4, top-2) with ``parts`` K parts, and
    as ``ranks`` tensor-parallel ranks compute it: rank r keeps the r-th slice of every expert's
    I (gate and up rows, down's columns; contiguous copies, as ``models.sharding``), reduces
    ``parts / ranks`` parts, and the reduce sums the ranks' float32 down shares along
    ``ops.exact.sum_pairwise``'s tree. Returns (rank 0's output, the one-rank output, the block
    without parts)."""
    from jetspec_kernels.ops.exact import sum_pairwise
    gen = torch.Generator().manual_seed(seed)
    t, h, i, e, k = 9, 32, 48, 4, 2
    x = torch.randn(t, h, generator=gen).to(dtype)
    router = torch.randn(e, h, generator=gen).to(dtype)
    gate_up = (torch.randn(e, 2 * i, h, generator=gen) / 6).to(dtype)
    down = (torch.randn(e, h, i, generator=gen) / 7).to(dtype)
    step = i // ranks
    split = [(torch.cat([gate_up[:, r * step:(r + 1) * step], gate_up[:, i + r * step:i + (r + 1) * step]],
                        1).contiguous(), down[..., r * step:(r + 1) * step].contiguous())
             for r in range(ranks)]
    shares = []
    for gu, dn in split:           # each rank's float32 shares, collected by its reduce
        exact_moe(x, router, gu, dn, k, True, backend, parts=parts // ranks,
                  reduce=lambda s: shares.append(s) or s.to(dtype))
    total = sum_pairwise(shares, dtype)
    got = exact_moe(x, router, *split[0], k, True, backend, parts=parts // ranks,
                    reduce=lambda s: total)
    return got, exact_moe(x, router, gate_up, down, k, True, backend, parts=parts), \
        exact_moe(x, router, gate_up, down, k, True, backend)
