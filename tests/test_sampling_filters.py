"""Sampling controls (temperature, top-k, top-p; scalars or one value per sequence).

python_ref.filter_keep against an independent walk down the sorted vocabulary (ties at both
boundaries, renormalisation after top-k, the "off" values); the filtered Gumbel sampler's
distribution; argument checks; and the decoding loop: per-sequence controls in one batch, and a
chi-square test of the joint law of the first three tokens of ``generate`` against the exact
filtered distribution computed from the target, which the same samples must reject unfiltered.
Backend parity (triton, cuda) is in tests/ops/test_verify_tree.py.
"""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from jetspec_kernels.decode import check_generate_args, generate, generate_ar
from jetspec_kernels.models import tiny_models
from test_decode import _chi2_pvalue, _sharp_tiny

pytestmark = pytest.mark.usefixtures("reference_backend")


# ----------------------------------------------------------------------------- the spec
def walk_keep(x, q, k, p):
    """The kept token ids of one row, by walking it in rank order with Python ints: x floats,
    q int masses, k int, p float (rounded to float32 as the spec does)."""
    V = len(x)
    order = sorted(range(V), key=lambda v: (-x[v], v))    # -0.0 == 0.0, so they tie by id
    top = order[:k] if 0 < k < V else order
    p32 = float(np.float32(p))
    budget = p32 * float(sum(q[v] for v in top))           # one float64 rounding
    kept, before = set(), 0
    for r, v in enumerate(top):
        if r > 0 and p32 < 1 and not before < budget:
            break
        kept.add(v)
        before += q[v]
    return kept


def keep_row(x, k=0, p=1.0):
    """python_ref.filter_keep on one row (list of floats) -> kept ids."""
    t = torch.tensor([x], dtype=torch.float32)
    keep = ref.filter_keep(t, torch.tensor([k]), torch.tensor([p]))[0]
    return set(torch.nonzero(keep).flatten().tolist())


def test_filter_keep_matches_a_walk_down_the_sorted_row():
    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        V = int(torch.randint(1, 40, (), generator=gen))
        x = (torch.randint(-4, 3, (V,), generator=gen) * 0.75).float()    # many ties
        x[torch.rand(V, generator=gen) < 0.1] = -math.inf
        x[torch.rand(V, generator=gen) < 0.1] = -0.0
        x[torch.rand(V, generator=gen) < 0.05] = -40.0                      # zero mass
        k = [0, 1, 2, V - 1, V, V + 3, int(torch.randint(0, V + 1, (), generator=gen))][trial % 7]
        p = [1.0, 0.5, 0.25, 0.9, 1e-30, float(torch.rand((), generator=gen))][trial % 6]
        q = ref.token_masses(x).tolist()
        want = walk_keep(x.tolist(), q, k, p)
        keep = ref.filter_keep(x[None], torch.tensor([k]), torch.tensor([p]))[0]
        assert set(torch.nonzero(keep).flatten().tolist()) == want, (x.tolist(), k, p)


def test_token_masses():
    x = torch.tensor([[1.0, 3.0, 3.0, -math.inf, 2.0, -30.0],
                      [-math.inf] * 6,
                      [math.inf, 1.0, math.inf, 0.0, -1.0, -math.inf]])
    q = ref.token_masses(x)
    assert q.dtype == torch.int64
    assert q[0, 1] == q[0, 2] == 2 ** 32 and q[0, 3] == 0 and q[0, 5] == 0   # e^-33 < 2^-32
    assert q[0, 4] == math.floor(float(torch.exp(torch.tensor(-1.0))) * 2 ** 32)
    assert q[1].eq(2 ** 32).all()                                # all -inf: all maxima, no NaN
    assert q[2].tolist() == [2 ** 32, 0, 2 ** 32, 0, 0, 0]


def test_top_k_ties_at_the_boundary_go_to_lower_ids():
    assert keep_row([1.0, 3.0, 3.0, 3.0, 2.0], k=2) == {1, 2}
    assert keep_row([0.0, -0.0, 0.0, -1.0], k=2) == {0, 1}       # -0.0 ties with +0.0
    assert keep_row([5.0, -math.inf, -math.inf, -math.inf], k=3) == {0, 1, 2}


def test_top_p_boundary_is_exact():
    """Four equal maxima (masses exactly 2**32 each) over zero-mass tokens: top-p p keeps the
    smallest prefix whose renormalised probability reaches p, ties by id."""
    x = [-60.0, 0.0, -60.0, 0.0, 0.0, 0.0, -60.0]
    assert keep_row(x, p=0.25) == {1}
    assert keep_row(x, p=0.5) == {1, 3}                  # 2/4 reaches 0.5: the third is out
    assert keep_row(x, p=float(np.nextafter(np.float32(0.5), np.float32(1)))) == {1, 3, 4}
    assert keep_row(x, p=0.75) == {1, 3, 4}
    assert keep_row(x, p=0.8) == {1, 3, 4, 5}
    assert keep_row(x, p=1.0) == set(range(7))           # off: zero-mass tokens too
    assert keep_row(x, p=1e-30) == {1}                   # the top token always stays


def test_top_p_applies_to_the_renormalised_top_k_set():
    """probabilities 0.5, 0.3, 0.2: top-p 0.6 alone keeps two tokens (0.5 < 0.6); after top-k 2
    the renormalised 0.625 alone reaches it (transformers' order)."""
    x = torch.log(torch.tensor([0.3, 0.5, 0.2], dtype=torch.float64)).float().tolist()
    assert keep_row(x, p=0.6) == {0, 1}
    assert keep_row(x, k=2, p=0.6) == {1}
    assert keep_row(x, k=2) == {0, 1} and keep_row(x) == {0, 1, 2}


def test_filtered_sampler_distribution():
    """12000 draws per sequence of one row: the filtered Gumbel sampler follows the renormalised
    kept probabilities (and never leaves the kept set); a temperature-0 sequence is greedy."""
    logits = torch.tensor([2.0, 1.5, 1.5, 0.3, -1.0, -3.0])
    V, N = logits.numel(), 200
    controls = [(0.8, 3, 1.0), (1.3, 0, 0.7), (1.0, 4, 0.8), (0.0, 2, 0.5)]
    B = 60 * len(controls)
    temp = torch.tensor([c[0] for c in controls]).repeat_interleave(60)
    top_k = torch.tensor([c[1] for c in controls]).repeat_interleave(60)
    top_p = torch.tensor([c[2] for c in controls]).repeat_interleave(60)
    x = logits.expand(B, N, V).contiguous()
    seed = torch.arange(B, dtype=torch.int64) * 131 + 7
    got = ref.sample_tokens(x, temp, seed, torch.zeros(B, dtype=torch.int64), top_k, top_p)
    for i, (T, k, p) in enumerate(controls):
        s = got[60 * i:60 * (i + 1)].flatten()
        if T == 0:
            assert s.eq(0).all()
            continue
        scaled = (logits / T)[None]
        keep = ref.filter_keep(scaled, torch.tensor([k]), torch.tensor([p]))[0]
        probs = torch.where(keep, torch.softmax(scaled[0].double(), 0), 0.0)
        probs /= probs.sum()
        counts = torch.bincount(s.long(), minlength=V).double()
        assert counts[~keep].sum() == 0 and keep.sum() < V
        assert _chi2_pvalue(counts[keep], probs[keep]) > 1e-3, (T, k, p, counts.tolist())


# ----------------------------------------------------------------------------- argument checks
def _tree_and_logits(B=3, N=4, V=11):
    gen = torch.Generator().manual_seed(0)
    t = ref.draft_tree(torch.randn(B, 3, V, generator=gen), torch.zeros(B, dtype=torch.int32), N, 2)
    tree = jk.Tree(*(t[k].to(torch.int32) for k in ("tokens", "parents", "depths")),
                   t["scores"].float(), t["num_nodes"].to(torch.int32), t["mask"].to(torch.int32), 3)
    return tree, torch.randn(B, N, V, generator=gen)


BAD_CONTROLS = [
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=float("nan")), "top_p"),
    (dict(top_p=-0.1), "top_p"), (dict(top_p=1e-50), "top_p"), (dict(top_k=-1), "top_k"),
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=torch.tensor([0.5, 0.7])), "temperature"),                  # length
    (dict(temperature=torch.tensor([1, 1, 1])), "temperature"),                   # dtype
    (dict(temperature=torch.tensor([0.5, -0.1, 1.0])), "temperature"),           # value
    (dict(temperature=torch.tensor([0.5, float("inf"), 1.0])), "temperature"),
    (dict(temperature=torch.ones(3, device="meta")), "temperature"),              # device
    (dict(top_k=torch.tensor([1.0, 2.0, 3.0])), "top_k"),
    (dict(top_k=torch.tensor([1, 2, 3, 4])), "top_k"),
    (dict(top_k=torch.tensor([1, -2, 3])), "top_k"),
    (dict(top_p=torch.tensor([1, 1, 1])), "top_p"),
    (dict(top_p=torch.tensor([0.5, 0.0, 1.0])), "top_p"),
    (dict(top_p=torch.tensor([0.5, 1.01, 1.0])), "top_p"),
    (dict(top_p=torch.ones(2, 3)), "top_p"),
]


@pytest.mark.parametrize("controls,name", BAD_CONTROLS, ids=[repr(c) for c, _ in BAD_CONTROLS])
def test_bad_controls_name_the_argument(controls, name):
    tree, logits = _tree_and_logits()
    kw = dict(temperature=0.8, seed=1, offset=0)
    kw.update(controls)
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        jk.verify_tree(tree, logits, **kw)
    target, head = tiny_models()
    gen_kw = dict(temperature=0.8)
    gen_kw.update(controls)
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        check_generate_args(target, head, [[1, 2]] * 3, max_new_tokens=2, **gen_kw)
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        generate_ar(target, [[1, 2]] * 3, max_new_tokens=2, **gen_kw)


def test_control_combinations_that_cannot_work():
    tree, logits = _tree_and_logits()
    tokens = torch.zeros(3, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="seed"):
        jk.verify_tree(tree, logits, temperature=torch.ones(3))   # a tensor may sample
    with pytest.raises(ValueError, match="target_logits"):
        jk.verify_tree(tree, target_tokens=tokens, temperature=torch.zeros(3), seed=1, offset=1)
    with pytest.raises(TypeError, match="top_k"):           # a wrong type, not a bad value
        jk.verify_tree(tree, logits, temperature=1.0, seed=1, offset=1, top_k=2.5)
    big = torch.zeros(1, 1, 2 ** 21 + 1)
    one = jk.Tree(*(f[:1, :1] for f in (tree.tokens, tree.parents, tree.depths, tree.scores)),
                  torch.ones(1, dtype=torch.int32), tree.mask[:1, :1], 0)
    with pytest.raises(ValueError, match="target_logits: top_p"):
        jk.verify_tree(one, big, temperature=1.0, seed=1, offset=1, top_p=0.9)
    jk.verify_tree(one, big, temperature=1.0, seed=1, offset=1, top_k=5)   # top-k alone: fine


def test_scalar_and_tensor_controls_agree_and_greedy_ignores_filters():
    tree, logits = _tree_and_logits()
    a = jk.verify_tree(tree, logits, temperature=0.9, seed=3, offset=2, top_k=3, top_p=0.8)
    b = jk.verify_tree(tree, logits, temperature=torch.tensor(0.9, dtype=torch.float64), seed=3,
                       offset=2, top_k=torch.tensor([3, 3, 3]), top_p=torch.tensor([0.8] * 3))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    greedy = jk.verify_tree(tree, logits)
    for kw in (dict(top_k=2, top_p=0.3), dict(temperature=torch.zeros(3), seed=1, offset=1, top_k=1)):
        assert all(torch.equal(x, y) for x, y in zip(jk.verify_tree(tree, logits, **kw), greedy))


# ----------------------------------------------------------------------------- the decoding loop
@pytest.fixture
def one_thread():
    """The tiny models' ops are small: one intra-op thread runs them fastest, and a busy machine
    cannot stall it (two threads on two shared cores ran these tests 10-20x slower)."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def test_per_sequence_controls_in_one_batch(one_thread):
    """One batch, four sequences of one prompt with their own controls: greedy (T 0), top-k 1 and
    a tiny top-p (both greedy too), and a sampled one; each sequence decodes as a batch whose
    scalar controls are that sequence's (the noise is keyed by the sequence)."""
    target, head = tiny_models(seed=0)
    prompts = [[1, 2, 3]] * 4
    temp = torch.tensor([0.0, 0.9, 1.2, 0.9])
    top_k = torch.tensor([0, 1, 5, 0])
    top_p = torch.tensor([1.0, 1.0, 0.9, 1e-6])
    kw = dict(max_new_tokens=8, seed=7)
    out = generate(target, head, prompts, budget=8, topk=3, temperature=temp, top_k=top_k,
                   top_p=top_p, **kw).tokens
    ar = generate_ar(target, prompts, temperature=temp, top_k=top_k, top_p=top_p, **kw).tokens
    greedy = generate_ar(target, prompts[:1], max_new_tokens=8).tokens[0]
    assert out[0] == out[1] == out[3] == greedy and ar[0] == ar[1] == ar[3] == greedy
    assert out[2] != greedy
    for b in range(4):
        scalar = dict(temperature=float(temp[b]), top_k=int(top_k[b]), top_p=float(top_p[b]))
        assert generate(target, head, prompts, budget=8, topk=3, **scalar, **kw).tokens[b] == out[b]
        assert generate_ar(target, prompts, **scalar, **kw).tokens[b] == ar[b]
    filtered_greedy = generate(target, head, prompts[:1], budget=8, topk=3, top_k=2, top_p=0.5,
                               max_new_tokens=8).tokens[0]
    assert filtered_greedy == greedy                            # filters never touch greedy


def _filtered_probs(target, seqs, temperature, top_k, top_p):
    """The exact filtered law of the next token after each sequence (float64 [len(seqs), V]):
    softmax(logits / T) restricted to python_ref.filter_keep's set, renormalised. Asserts that
    no top-k / top-p boundary lies within 1e-3 of a decision, so that the sampler's logits (a
    tree forward, rounded differently) keep the same set."""
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    cache = target.new_cache(len(seqs), max(lens))
    logits, _ = target.prefill(torch.tensor(seqs), lens, cache)
    x = logits.float() / temperature
    S, V = x.shape
    keep = ref.filter_keep(x[:, None], torch.full((S,), top_k), torch.full((S,), top_p))[:, 0]
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    srt = probs.sort(dim=-1, descending=True).values
    if 0 < top_k < V:
        assert (srt[:, top_k - 1] / srt[:, top_k]).min() > 1.001, "top-k boundary too close"
        srt = srt[:, :top_k]
    if top_p < 1:
        cum = torch.cumsum(srt / srt.sum(-1, keepdim=True), dim=-1)
        assert (cum - top_p).abs().min() > 1e-3, "top-p boundary too close"
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum(-1, keepdim=True), probs


def _joint(target, prompt, v, temperature, top_k, top_p):
    """(filtered, unfiltered) joint laws of the next three tokens, float64 [V, V, V]."""
    f1, u1 = _filtered_probs(target, [prompt], temperature, top_k, top_p)
    f2, u2 = _filtered_probs(target, [prompt + [a] for a in range(v)], temperature, top_k, top_p)
    f3, u3 = _filtered_probs(target, [prompt + [a, b] for a in range(v) for b in range(v)],
                             temperature, top_k, top_p)
    law = lambda p1, p2, p3: p1[0][:, None, None] * p2[:, :, None] * p3.view(v, v, v)
    return law(f1, f2, f3), law(u1, u2, u3)


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (0, 0.6), (4, 0.7)],
                         ids=["top_k", "top_p", "top_k+top_p"])
def test_generate_follows_the_filtered_target(top_k, top_p, one_thread):
    """3000 copies of one prompt in one batch (independent noise per sequence), three new
    tokens each (the first from the prefill, the others from speculative rounds): every sample
    lies in the filtered support, the joint counts fit the exact filtered law (chi-square, cells
    pooled below 5 expected), and the same counts reject the unfiltered law."""
    target, head = _sharp_tiny()
    v, temp, prompt, n = 7, 1.0, [1, 4, 2], 3000
    filtered, unfiltered = _joint(target, prompt, v, temp, top_k, top_p)
    assert (filtered == 0).sum() > 0, "the filters should remove some continuations"
    out = generate(target, head, [prompt] * n, max_new_tokens=3, budget=6, topk=3, seed=5,
                   temperature=temp, top_k=top_k, top_p=top_p)
    counts = torch.zeros(v, v, v, dtype=torch.float64)
    for t in out.tokens:
        counts[t[0], t[1], t[2]] += 1
    assert sum(out.stats.accept_histogram[1:]) >= 100, "the draft should get tokens accepted"
    assert counts[filtered == 0].sum() == 0, "a sample outside the filtered support"
    support = filtered > 0
    p_fit = _chi2_pvalue(counts[support], filtered[support])
    assert p_fit > 1e-3, f"the samples do not follow the filtered target (p = {p_fit:.2e})"
    p_unfiltered = _chi2_pvalue(counts.flatten(), unfiltered.flatten())
    assert p_unfiltered < 1e-6, f"the test cannot tell the unfiltered law (p = {p_unfiltered:.2e})"


# ----------------------------------------------------------------------------- exact boundaries
# The filters are bit-exact, so their boundaries can be hit on purpose: masses of tokens tied at a
# row's maximum are exactly 2**32, -60 below it exactly 0, and a tail token far below (masses of a
# few hundred at most) has a floor its float32 exp cannot move when e * 2**32 is kept 0.2 from an
# integer. Each case is one sequence of one row of V tokens: (logits, temperature, top_k, top_p,
# the kept ids).
BOUNDARY_V = 64
F32_BELOW = lambda p: float(np.nextafter(np.float32(p), np.float32(0)))
F32_ABOVE = lambda p: float(np.nextafter(np.float32(p), np.float32(1)))


def _row(ties, tail=(), V=BOUNDARY_V):
    """Logits [V]: -60 everywhere, 0.0 at ids ``ties``, ``tail`` values from id 40 on."""
    x = torch.full((V,), -60.0)
    x[list(ties)] = 0.0
    x[40:40 + len(tail)] = torch.tensor(tail, dtype=torch.float32)
    return x


def _robust_tail(gen, n):
    """n distinct values in (-22, -15) whose masses e * 2**32 are 0.2 or more from an integer."""
    while True:
        t = (-15 - 7 * torch.rand(n, generator=gen)).float()
        m = torch.exp(t.double()) * 2 ** 32
        frac = m - m.floor()
        if ((frac > 0.2) & (frac < 0.8)).all() and t.unique().numel() == n:
            return t.tolist()


def _just_over_a_distinct_token():
    """Three ties (ids 3, 9, 20) over a robust tail, and a float32 top_p whose budget
    float64(top_p) * Z exceeds B = 3 * 2**32, the mass before the tail's first token, by less than
    one: that token is kept (its preceding mass is below the budget), though the budget's floor
    equals B. Returns (logits, top_p)."""
    gen = torch.Generator().manual_seed(11)
    B = 3 * 2 ** 32
    for _ in range(20000):
        x = _row((3, 9, 20), _robust_tail(gen, 6))
        Z = int(ref.token_masses(x).sum())
        p0 = np.float32(B / Z)
        for p in (p0, np.nextafter(p0, np.float32(1))):
            budget = Fraction(float(p)) * Z
            if B < budget < B + 1:
                return x, float(p)
    raise AssertionError("no row found")


def _boundary_cases():
    ties4 = _row((5, 6, 30, 63))                             # Z = 2**34
    one = _row((5, 6, 30, 63), (-21.8,))                     # Z = 2**34 + 1 (exp(-21.8) 2**32 = 1.46)
    over, p_over = _just_over_a_distinct_token()
    first_tail = 40 + int(torch.argmax(over[40:]))
    ranked = _row((), (4.0, 3.0, 3.0, 3.0, 2.0, 1.0))         # ids 40 > 41 = 42 = 43 > 44 > 45
    ranked[[7, 50]] = 3.0                                     # ties at ids 7 and 50 too
    cases = {
        # top-p at exactly the mass before a token (it is out), an ulp of top_p below and above
        "p_equal_budget": (ties4, 1.0, 0, 0.75, {5, 6, 30}),
        "p_ulp_below": (ties4, 1.0, 0, F32_BELOW(0.75), {5, 6, 30}),
        "p_ulp_above": (ties4, 1.0, 0, F32_ABOVE(0.75), {5, 6, 30, 63}),
        "p_half": (ties4, 1.0, 0, 0.5, {5, 6}),
        "p_quarter": (ties4, 1.0, 0, 0.25, {5}),
        # a budget 0.75 past a tie's preceding mass (integer masses: its ceiling, not its floor)
        "p_fraction_over_tie": (one, 1.0, 0, 0.75, {5, 6, 30, 63}),
        "p_fraction_ulp_below": (one, 1.0, 0, F32_BELOW(0.75), {5, 6, 30}),
        # the same past a token of its own value (the last key, not a tie)
        "p_fraction_over_token": (over, 1.0, 0, p_over, {3, 9, 20, first_tail}),
        "p_fraction_token_ulp_below": (over, 1.0, 0, F32_BELOW(p_over), {3, 9, 20}),
        # top-k at, one below and one above a run of ties (the lowest ids first), and at V - 1, V,
        # V + 1 (V and more: off)
        "k_1": (ranked, 1.0, 1, 1.0, {40}),
        "k_ties_first": (ranked, 1.0, 2, 1.0, {40, 7}),
        "k_ties_all_but_one": (ranked, 1.0, 5, 1.0, {40, 7, 41, 42, 43}),
        "k_ties_all": (ranked, 1.0, 6, 1.0, {40, 7, 41, 42, 43, 50}),
        "k_ties_one_more": (ranked, 1.0, 7, 1.0, {40, 7, 41, 42, 43, 50, 44}),
        "k_V_minus_1": (ranked, 1.0, BOUNDARY_V - 1, 1.0, set(range(BOUNDARY_V)) - {63}),
        "k_V": (ranked, 1.0, BOUNDARY_V, 1.0, set(range(BOUNDARY_V))),
        "k_V_plus_1": (ranked, 1.0, BOUNDARY_V + 1, 1.0, set(range(BOUNDARY_V))),
        # top-k then top-p of the top-k set's mass (4 ties): k 2, p 0.5 is exactly the first
        # token's mass (one kept); k 3, top_p the float32 just below and just above 2/3 (two, three)
        "k_then_p_equal": (ties4, 1.0, 2, 0.5, {5}),
        "k_then_p_below": (ties4, 1.0, 3, F32_BELOW(2 / 3), {5, 6}),
        "k_then_p_above": (ties4, 1.0, 3, float(np.float32(2 / 3)), {5, 6, 30}),
        # temperature: logits / T in float32 (exactly the rows above for T 2 and 0.5; T 1.5 rounds)
        "T_2": (ties4 * 2, 2.0, 0, 0.75, {5, 6, 30}),
        "T_half_fraction": (one * 0.5, 0.5, 0, 0.75, {5, 6, 30, 63}),
        "T_1.5_fraction": (one * 1.5, 1.5, 0, 0.75, {5, 6, 30, 63}),
    }
    return cases


BOUNDARY_CASES = _boundary_cases()


def _stacked(names):
    """(logits [B, 1, V], temperature [B], top_k int32 [B], top_p float32 [B]) of the named cases."""
    cs = [BOUNDARY_CASES[n] for n in names]
    return (torch.stack([c[0] for c in cs])[:, None], torch.tensor([c[1] for c in cs]),
            torch.tensor([c[2] for c in cs], dtype=torch.int32),
            torch.tensor([c[3] for c in cs], dtype=torch.float32))


@pytest.mark.parametrize("name", list(BOUNDARY_CASES))
def test_filter_keep_at_exact_boundaries(name):
    """The spec on each constructed boundary: the kept set as built, and as the walk down the
    sorted row finds it."""
    x, T, k, p, want = BOUNDARY_CASES[name]
    xs = (x / T).tolist()
    assert keep_row(xs, k, p) == want
    assert walk_keep(xs, ref.token_masses(x / T).tolist(), k, p) == want


def test_boundary_rows_are_what_they_claim():
    """The constructions: the budget equals the preceding mass exactly, exceeds it by a fraction,
    or falls short by at least an ulp's worth."""
    q = ref.token_masses(BOUNDARY_CASES["p_fraction_over_tie"][0]).sum()
    assert int(q) == 2 ** 34 + 1
    budget = Fraction(0.75) * int(q)
    assert budget - 3 * 2 ** 32 == Fraction(3, 4)
    assert Fraction(0.75) * 2 ** 34 == 3 * 2 ** 32
    assert Fraction(F32_BELOW(2 / 3)) * 3 < 2 < Fraction(float(np.float32(2 / 3))) * 3


@pytest.mark.parametrize("kernel", ["triton", "sim"])
def test_filter_kernels_at_exact_boundaries(kernel, monkeypatch):
    """Every backend's filter step (Triton under the interpreter, the cuda kernel in the
    simulator) on all the constructed boundaries at once, one sequence each: exactly
    python_ref.filter_keep's kept set."""
    from helpers import backend_module, kept_by_thresholds, use_sim
    if kernel == "sim":
        use_sim(monkeypatch)
    fn = backend_module("triton" if kernel == "triton" else "cuda", "verify_tree").filter_thresholds
    names = list(BOUNDARY_CASES)
    logits, temp, top_k, top_p = _stacked(names)
    x = logits / temp[:, None, None]
    want = ref.filter_keep(x, top_k, top_p)
    for b, n in enumerate(names):
        assert set(torch.nonzero(want[b, 0]).flatten().tolist()) == BOUNDARY_CASES[n][4], n
    got = kept_by_thresholds(logits, temp, *fn(logits, temp, top_k, top_p))
    bad = [n for b, n in enumerate(names) if not torch.equal(got[b], want[b])]
    assert not bad, bad
