"""Lossless speculative decoding: greedy output equals the autoregressive baseline token for token
(random draft head: low acceptance; oracle draft: high acceptance), across budgets, tree
algorithms, EOS inside an accepted path, max_new_tokens inside a round, ragged batches and paged
caches; sampled output follows the target's distribution."""
import math
from types import SimpleNamespace

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels.decode import generate, generate_ar
from jetspec_kernels.models import tiny_models
from helpers import rel_l2

pytestmark = pytest.mark.usefixtures("reference_backend")

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17]]


@pytest.fixture(scope="module")
def models():
    return tiny_models(seed=0)


@pytest.fixture(scope="module")
def ar_tokens(models):
    # Module-scoped fixtures run before the function-scoped backend fixture: set it here too.
    target, _ = models
    prev = jk.get_backend()
    jk.set_backend("reference")
    out = generate_ar(target, PROMPTS, max_new_tokens=24).tokens
    jk.set_backend(prev)
    return out


class OracleHead:
    """Test double for the draft head that proposes the target's own greedy continuation (known
    from the baseline), so acceptance is high. At stream positions where ``(b * 31 + i) % 7 == 0``
    the right token is only second-ranked, and where ``% 11 == 0`` it is absent, so accepted
    lengths vary. It also checks the loop's bookkeeping: the anchor must be the stream token at
    the context length the loop has appended."""

    def __init__(self, streams, vocab, block_size=5, hidden=64):
        self.streams = streams
        self.vocab = vocab
        self.block_size = block_size
        self.target_layer_ids = [1]
        self.config = SimpleNamespace(target_hidden_size=hidden, hidden_size=hidden, vocab_size=vocab,
                                      mask_token_id=vocab - 1, num_target_layers=0)
        self.device = torch.device("cpu")
        self.state = None

    def new_state(self, batch, capacity, *, page_size=None):
        self.state = SimpleNamespace(ctx_len=torch.zeros(batch, dtype=torch.int32))
        return self.state

    def append_context(self, state, taps, counts):
        assert taps.shape[0] == len(self.streams) and taps.shape[2] == 64
        assert bool(torch.isfinite(taps).all())
        state.ctx_len.add_(counts)

    def cached_logits(self, state, anchor_tokens, *, embed_weight, lm_head_weight):
        b_sz, d = len(self.streams), self.block_size - 1
        logits = torch.zeros(b_sz, d, self.vocab)
        for b, stream in enumerate(self.streams):
            t = int(state.ctx_len[b])
            if t < len(stream):
                assert int(anchor_tokens[b]) == stream[t], "anchor and draft context disagree"
            for depth in range(1, d + 1):
                i = t + depth
                if i >= len(stream):
                    break
                tok, wrong = stream[i], (stream[i] + 1) % self.vocab
                if (b * 31 + i) % 11 == 0:
                    logits[b, depth - 1, wrong] = 10.0
                    logits[b, depth - 1, tok] = -10.0
                elif (b * 31 + i) % 7 == 0:
                    logits[b, depth - 1, wrong] = 10.0
                    logits[b, depth - 1, tok] = 9.0
                else:
                    logits[b, depth - 1, tok] = 10.0
        return logits


def oracle(models, ar_tokens):
    target, _ = models
    return OracleHead([p + t for p, t in zip(PROMPTS, ar_tokens)], target.config.vocab_size)


@pytest.mark.parametrize("algorithm", ["topn", "accum_logp"])
@pytest.mark.parametrize("budget", [1, 2, 16, 64])
def test_greedy_lossless_random_head(models, ar_tokens, budget, algorithm):
    target, head = models
    out = generate(target, head, PROMPTS, max_new_tokens=10, budget=budget, topk=4, algorithm=algorithm)
    assert out.tokens == [t[:10] for t in ar_tokens]
    s = out.stats
    assert s.rounds >= 1 and len(s.accept_lengths) >= s.rounds
    assert sum(s.accept_histogram) == len(s.accept_lengths)
    # one count per accept length 0 .. max_depth, reached or not
    assert len(s.accept_histogram) == min(head.block_size - 1, budget - 1) + 1
    assert s.new_tokens == 30


@pytest.mark.parametrize("algorithm", ["topn", "accum_logp"])
@pytest.mark.parametrize("budget,topk", [(2, 1), (16, 4), (64, 3)])
def test_greedy_lossless_oracle_head(models, ar_tokens, budget, topk, algorithm):
    target, _ = models
    head = oracle(models, ar_tokens)
    out = generate(target, head, PROMPTS, max_new_tokens=24, budget=budget, topk=topk,
                   algorithm=algorithm, fused_draft=False)
    assert out.tokens == ar_tokens
    s = out.stats
    if budget >= 16:
        # Perfect proposals except the planted misses: long paths are accepted.
        assert s.mean_accept > 2.0
        assert s.accept_histogram[4] > 0 and s.rounds < 24 / 2
    assert max(s.accept_lengths) <= min(4, budget - 1)
    # The context holds the prompt and every emitted token but the last anchor (a sequence's last
    # round may commit up to 4 tokens past max_new_tokens; they are not returned).
    for p, toks, ctx in zip(PROMPTS, out.tokens, head.state.ctx_len.tolist()):
        assert len(p) + len(toks) - 1 <= ctx <= len(p) + len(toks) - 1 + 4


def _rigged_repeat_models():
    """A real Qwen3 + DraftHead pair rigged for full acceptance: the target's layers add nothing
    (o_proj = down_proj = 0) and its lm_head is its embedding, so it repeats its last token; the
    head's queries and fc are zero (uniform attention over context rows whose values are zero),
    the mask token embeds to zero, v_proj = o_proj = identity and the MLP adds nothing, so every
    block row carries the anchor's embedding and every depth predicts the anchor."""
    from jetspec_kernels.models import DraftHead, Qwen3
    from jetspec_kernels.models.tiny import (random_draft_weights, random_qwen3_weights,
                                             tiny_draft_config, tiny_qwen3_config)
    tcfg = tiny_qwen3_config()
    dcfg = tiny_draft_config(tcfg, num_attention_heads=4, num_key_value_heads=4, head_dim=16)
    tw = random_qwen3_weights(tcfg, seed=5)
    tw["model.embed_tokens.weight"][dcfg.mask_token_id] = 0.0
    tw["lm_head.weight"] = tw["model.embed_tokens.weight"].clone()
    tw["model.norm.weight"] = torch.ones(64)
    for i in range(tcfg.num_hidden_layers):
        tw[f"model.layers.{i}.self_attn.o_proj.weight"].zero_()
        tw[f"model.layers.{i}.mlp.down_proj.weight"].zero_()
    hw = random_draft_weights(dcfg, seed=6)
    hw["fc.weight"].zero_()
    hw["norm.weight"] = torch.ones(64)
    hw["layers.0.input_layernorm.weight"] = torch.ones(64)
    hw["layers.0.self_attn.q_proj.weight"].zero_()
    hw["layers.0.self_attn.v_proj.weight"] = torch.eye(64)
    hw["layers.0.self_attn.o_proj.weight"] = torch.eye(64)
    hw["layers.0.mlp.down_proj.weight"].zero_()
    return Qwen3(tcfg, tw), DraftHead(dcfg, hw)


@pytest.mark.parametrize("page_size", [None, 4])
def test_rigged_draft_head_full_acceptance(page_size):
    target, head = _rigged_repeat_models()
    prompts = [[3, 1, 4, 1, 5], [9, 2], [6, 5, 3, 5, 8, 9, 7]]
    ar = generate_ar(target, prompts, max_new_tokens=11).tokens
    assert ar == [[p[-1]] * 11 for p in prompts]
    out = generate(target, head, prompts, max_new_tokens=11, budget=8, topk=2, page_size=page_size)
    assert out.tokens == ar
    # 1 token from the prefill, then 2 rounds of 4 accepted + 1 bonus.
    assert out.stats.rounds == 2 and out.stats.accept_lengths == [4] * 6


@pytest.mark.parametrize("max_new", [2, 7, 8])
def test_rounds_after_the_last_token_fit_the_cache(max_new):
    """Full acceptance past max_new_tokens (a round commits up to 4 tokens too many), then, with
    sync_every 3, more rounds before the loop reads the done flags: the finished sequences' trees
    are still written at their committed length, so the cache needs the room of a whole round
    past max_new_tokens plus a tree (a cache one round short was refused by the value checks)."""
    target, head = _rigged_repeat_models()
    prompts = [[3, 1, 4, 1, 5], [9, 2]]
    ar = generate_ar(target, prompts, max_new_tokens=max_new).tokens
    out = generate(target, head, prompts, max_new_tokens=max_new, budget=8, topk=2, sync_every=3)
    assert out.tokens == ar


def test_eos_inside_accepted_path_and_max_new_inside_round(models, ar_tokens):
    target, _ = models
    # EOS: a token of sequence 0's greedy output that is not its first few tokens; max_new: 13
    # ends inside a round (rounds of the oracle emit up to 5 tokens after the prefill's one).
    seq = ar_tokens[0]
    k = next(i for i in range(7, 12) if seq[i] not in seq[:i])
    eos = seq[k]
    ar = generate_ar(target, PROMPTS, max_new_tokens=13, eos_token_id=eos).tokens
    assert ar[0] == seq[:k + 1]
    for budget in (16, 64):
        head = oracle(models, ar_tokens)
        out = generate(target, head, PROMPTS, max_new_tokens=13, budget=budget, topk=3,
                       eos_token_id=[eos, 96], fused_draft=False)
        ar_multi = generate_ar(target, PROMPTS, max_new_tokens=13, eos_token_id=[eos, 96]).tokens
        assert out.tokens == ar_multi
        assert all(len(t) <= 13 for t in out.tokens)
    assert any(len(t) == 13 for t in ar_multi)



def test_stats_count_each_active_sequence_round_once(models, ar_tokens):
    """budget 1 (the root alone): every round emits exactly one token per unfinished sequence and
    accepts 0, so the statistics follow from the baseline: one accept length 0 per (sequence,
    round) while the sequence runs, and rounds until the longest output is complete. A sequence
    finished by EOS (the second id of the list) or by reaching max_new_tokens exactly is neither
    counted nor decoded further."""
    target, head = models
    max_new = 6
    seq = ar_tokens[0]
    k = next(i for i in range(2, max_new - 1) if seq[i] not in seq[:i])
    seen = {t for toks in ar_tokens for t in toks[:max_new]}
    unused = next(t for t in range(target.config.vocab_size) if t not in seen)
    eos = [unused, seq[k]]
    ar = generate_ar(target, PROMPTS, max_new_tokens=max_new, eos_token_id=eos).tokens
    assert ar[0] == seq[:k + 1] and max(len(t) for t in ar) == max_new
    out = generate(target, head, PROMPTS, max_new_tokens=max_new, budget=1, topk=2,
                   eos_token_id=eos)
    assert out.tokens == ar
    s = out.stats
    entries = sum(len(t) - 1 for t in ar)
    assert s.rounds == max_new - 1
    assert s.accept_lengths == [0] * entries and s.accept_histogram == [entries]
    assert s.mean_accept == 0.0 and s.tokens_per_round == 1.0
    assert s.new_tokens == sum(len(t) for t in ar)



@pytest.mark.parametrize("page_size", [1, 3, 4])
def test_paged_cache_holds_the_capacity_asked_for(models, page_size):
    """A paged cache rounds its capacity up to whole pages: a prompt that fills a capacity which
    is no multiple of the page size gives the contiguous cache's logits."""
    target, _ = models
    n = 7
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2]])
    lens = torch.tensor([n], dtype=torch.int32)
    cache = target.new_cache(1, n, page_size=page_size)
    pages = -(-n // page_size)
    assert cache.capacity == pages * page_size >= n
    assert cache.block_table.shape == (1, pages) and cache.k.shape[:2] == (pages, page_size)
    want, _ = target.prefill(tokens, lens, target.new_cache(1, n))
    got, _ = target.prefill(tokens, lens, cache)
    assert rel_l2(got, want) < 1e-5


@pytest.mark.parametrize("page_size", [3, 16])
def test_greedy_lossless_paged_cache(models, ar_tokens, page_size):
    target, head = models
    out = generate(target, head, PROMPTS, max_new_tokens=8, budget=16, topk=4, page_size=page_size)
    assert out.tokens == [t[:8] for t in ar_tokens]
    ar = generate_ar(target, PROMPTS, max_new_tokens=8, page_size=page_size)
    assert ar.tokens == [t[:8] for t in ar_tokens]


def test_fused_and_logits_draft_paths_agree(models):
    target, head = models
    a = generate(target, head, PROMPTS[:2], max_new_tokens=8, budget=8, topk=3, fused_draft=True)
    b = generate(target, head, PROMPTS[:2], max_new_tokens=8, budget=8, topk=3, fused_draft=False)
    assert a.tokens == b.tokens
    assert a.stats.accept_lengths == b.stats.accept_lengths


def test_sync_every_changes_nothing_but_rounds(models, ar_tokens):
    target, head = models
    a = generate(target, head, PROMPTS, max_new_tokens=9, budget=8, topk=3)
    b = generate(target, head, PROMPTS, max_new_tokens=9, budget=8, topk=3, sync_every=3)
    assert a.tokens == b.tokens == [t[:9] for t in ar_tokens]
    assert b.stats.rounds % 3 == 0 and a.stats.rounds <= b.stats.rounds < a.stats.rounds + 3
    assert a.stats.accept_lengths == b.stats.accept_lengths      # frozen sequences record nothing


def test_bad_arguments(models):
    target, head = models
    with pytest.raises(ValueError, match="prompt_ids"):
        generate(target, head, [], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"prompt_ids\[1\]"):
        generate(target, head, [[1], []], max_new_tokens=4)
    with pytest.raises(ValueError, match="outside"):
        generate(target, head, [[1, 97]], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_ar(target, [[1]], max_new_tokens=0)
    with pytest.raises(ValueError, match="algorithm"):
        generate(target, head, [[1]], max_new_tokens=2, algorithm="beam")
    with pytest.raises(ValueError, match="sync_every"):
        generate(target, head, [[1]], max_new_tokens=2, sync_every=0)


def _chi2_sf(x: float, dof: int) -> float:
    """Survival function of the chi-square distribution (regularised upper gamma)."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(x / 2.0, dtype=torch.float64)))


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value, cells with expectation < 5 pooled into one."""
    n = counts.sum()
    exp = probs * n
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([exp[big], exp[~big].sum().reshape(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return _chi2_sf(stat, int(keep.sum()) - 1)


def test_sampling_matches_target_distribution():
    """Tiny vocabulary, sharp-ish target: the first three sampled tokens (the first from the
    prefill, the others from speculative rounds) follow the exact law computed from the target:
    joint of (t1, t2), joint of (t2, t3), marginal of t3; for the speculative loop and, as a
    check of the test itself, for the baseline. Each batch row draws independent noise. (With
    these sizes, a loop that reuses the prefill's noise in its first round fails with p ~ 1e-19.)"""
    for name, tokens in sampling_law_runs(*_sharp_tiny()).items():
        check_sampling_law(name, tokens)


SHARP_PROMPT, SHARP_TEMPERATURE = [1, 4, 2], 0.8


def sampling_law_runs(target, head, n=600, group=None, runs=("topn", "ar")):
    """The first three sampled tokens of ``n`` copies of the prompt (list of B lists, per loop),
    speculative ("topn") and baseline ("ar"); ``group``: generate's process group."""
    kw = dict(max_new_tokens=3, temperature=SHARP_TEMPERATURE, seed=11, group=group)
    prompts = [SHARP_PROMPT] * n
    out = {}
    if "topn" in runs:
        spec = generate(target, head, prompts, budget=6, topk=3, algorithm="topn", **kw)
        assert sum(spec.stats.accept_histogram[1:]) >= 10, "the draft should get some tokens accepted"
        out["topn"] = spec.tokens
    if "ar" in runs:
        out["ar"] = generate_ar(target, prompts, **kw).tokens
    return out


def check_sampling_law(name, tokens, target=None):
    """Chi-square tests of (t1, t2), (t2, t3) and t3 of ``tokens`` (B lists of 3 sampled tokens)
    against the exact law of the sharp tiny target (``target``: that model, unsplit)."""
    target = target if target is not None else _sharp_tiny()[0]
    v, temp, prompt = 7, SHARP_TEMPERATURE, SHARP_PROMPT
    probs1 = _next_probs(target, [prompt], temp)[0]                                        # [V]
    probs2 = _next_probs(target, [prompt + [a] for a in range(v)], temp)                   # [V, V]
    probs3 = _next_probs(target, [prompt + [a, b] for a in range(v) for b in range(v)],
                         temp).view(v, v, v)
    joint = probs1[:, None, None] * probs2[:, :, None] * probs3
    counts = torch.zeros(v, v, v, dtype=torch.float64)
    for t in tokens:
        counts[t[0], t[1], t[2]] += 1
    checks = {"(t1, t2)": (counts.sum(2), joint.sum(2)), "(t2, t3)": (counts.sum(0), joint.sum(0)),
              "t3": (counts.sum((0, 1)), joint.sum((0, 1)))}
    for what, (c, p) in checks.items():
        pval = _chi2_pvalue(c.flatten(), p.flatten())
        assert pval > 1e-3, f"{name}: {what} does not follow the target (p = {pval:.2e})"


def _sharp_tiny(group=None):
    from jetspec_kernels.models import DraftHead, Qwen3
    from jetspec_kernels.models.tiny import (random_draft_weights, random_qwen3_weights,
                                             tiny_draft_config, tiny_qwen3_config)
    tcfg = tiny_qwen3_config(vocab_size=7)
    dcfg = tiny_draft_config(tcfg, block_size=4)
    return (Qwen3(tcfg, random_qwen3_weights(tcfg, seed=3, logit_scale=2.0), group=group),
            DraftHead(dcfg, random_draft_weights(dcfg, seed=4), group=group))


def _next_probs(target, seqs, temperature):
    """softmax(logits / T) of the next token after each sequence (float64 [len(seqs), V])."""
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    tokens = torch.tensor(seqs)
    cache = target.new_cache(len(seqs), tokens.shape[1])
    logits, _ = target.prefill(tokens, lens, cache)
    return torch.softmax(logits.double() / temperature, dim=-1)


def test_triton_backend_greedy_lossless(models, ar_tokens):
    """The same loop on the triton backend (under the interpreter on CPU), where its kernels exist."""
    target, head = models
    jk.set_backend("triton")
    try:
        out = generate(target, head, PROMPTS[:2], max_new_tokens=4, budget=4, topk=2)
    except jk.BackendUnavailableError as e:
        pytest.skip(str(e))
    assert out.tokens == [t[:4] for t in ar_tokens[:2]]
    assert not math.isnan(out.stats.mean_accept)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_lossless(dtype):
    """On a GPU (triton or cuda backend): graphed rounds give the eager rounds' tokens, and in
    fp32 the baseline's (bf16 rounding differs between tree and one-token shapes, so only the
    graphed-vs-eager identity is exact there)."""
    jk.set_backend("auto")
    target, head = tiny_models(seed=0, dtype=dtype, device="cuda")
    eager = generate(target, head, PROMPTS, max_new_tokens=16, budget=16, topk=4, cuda_graphs=False)
    graphed = generate(target, head, PROMPTS, max_new_tokens=16, budget=16, topk=4, cuda_graphs=True)
    assert not eager.stats.cuda_graphs and graphed.stats.cuda_graphs
    assert graphed.tokens == eager.tokens
    assert graphed.stats.accept_lengths == eager.stats.accept_lengths
    if dtype == torch.float32:
        assert eager.tokens == generate_ar(target, PROMPTS, max_new_tokens=16).tokens


class SpyHead:
    """Wraps a DraftHead: keeps the draft state the loop creates and records every
    ``append_context`` call (the taps and counts it was given, ctx_len after it)."""

    def __init__(self, head):
        self._head = head
        self.state = None
        self.appended = []      # (taps [B, M, n_taps * H], counts [B]) per call, prefill first
        self.ctx_after = []     # ctx_len [B] after each call

    def __getattr__(self, name):
        return getattr(self._head, name)

    def new_state(self, *args, **kw):
        self.state = self._head.new_state(*args, **kw)
        return self.state

    def append_context(self, state, taps, counts):
        self.appended.append((taps.clone(), counts.clone()))
        self._head.append_context(state, taps, counts)
        self.ctx_after.append(state.ctx_len.clone())


@pytest.fixture(scope="module")
def trained():
    """The shipped tiny target and its trained causal head: long accepted paths, so the accepted
    rows of a tree are rarely its first rows."""
    from jetspec_kernels.models.assets import load_tiny
    target, heads = load_tiny()
    return target, heads["head_causal"]


TEXT_PROMPTS = ["def area(self):\n    return self.", "import os\nimport sys\n\n\ndef main("]


@pytest.fixture(scope="module")
def trained_streams(trained):
    """(prompts, greedy continuations of 40 tokens) of TEXT_PROMPTS on the trained target."""
    from jetspec_kernels.models.byte_tokenizer import encode
    prompts = [encode(p) for p in TEXT_PROMPTS]
    prev = jk.get_backend()
    jk.set_backend("reference")
    streams = generate_ar(trained[0], prompts, max_new_tokens=40).tokens
    jk.set_backend(prev)
    return prompts, streams


def _check_context_rows(target, spy, prompts, streams):
    """The rows the loop appended to the draft context, and the draft K/V cache built from them,
    equal a full-prefill oracle: the target run once over prompt + committed tokens."""
    for b, (prompt, stream) in enumerate(zip(prompts, streams)):
        rows = torch.cat([taps[b, :int(counts[b])] for taps, counts in spy.appended])
        n = rows.shape[0]
        assert n == int(spy.state.ctx_len[b])
        seq = (prompt + stream)[:n]
        assert len(seq) == n, "the oracle stream is too short"
        cache = target.new_cache(1, n)
        _, want = target.prefill(torch.tensor([seq]), torch.tensor([n], dtype=torch.int32), cache,
                                 taps=spy.target_layer_ids)
        assert rel_l2(rows, want[0]) < 1e-5, f"sequence {b}: appended rows are not the accepted path's"
        state = spy._head.new_state(1, n + spy.block_size)
        spy._head.append_context(state, want, torch.tensor([n], dtype=torch.int32))
        for got, ref_cache in ((spy.state.cache.k, state.cache.k), (spy.state.cache.v, state.cache.v)):
            assert rel_l2(got[b, :n], ref_cache[0, :n]) < 1e-5


def test_draft_context_holds_the_accepted_paths_rows(trained, trained_streams):
    """After every round the draft context holds the target's taps of the accepted path (not,
    say, the tree's first rows), position for position, for sequences finishing in different
    rounds."""
    target, head = trained
    prompts, streams = trained_streams
    spy = SpyHead(head)
    out = generate(target, spy, prompts, max_new_tokens=20, budget=8, topk=3)
    assert out.tokens == [s[:20] for s in streams]
    assert max(out.stats.accept_lengths) >= 3, "the test needs paths that leave the first rows"
    _check_context_rows(target, spy, prompts, streams)
    for p, toks, ctx in zip(prompts, out.tokens, spy.state.ctx_len.tolist()):
        assert len(p) + len(toks) - 1 <= ctx


def test_finished_sequence_stops_growing_its_context(trained, trained_streams):
    """A sequence that hit EOS while the other decodes on appends nothing more: its context length
    stays where it was at the round it finished, and its rows still match the oracle."""
    target, head = trained
    prompts, streams = trained_streams
    max_new = 32
    # EOS: a token of sequence 0's output (not among its first tokens) that sequence 1 never emits.
    k = next(i for i in range(3, max_new) if streams[0][i] not in streams[0][:i]
             and streams[0][i] not in streams[1][:max_new])
    spy = SpyHead(head)
    out = generate(target, spy, prompts, max_new_tokens=max_new, budget=8, topk=3,
                   eos_token_id=streams[0][k])
    assert out.tokens == [streams[0][:k + 1], streams[1][:max_new]]
    ctx0 = [int(c[0]) for c in spy.ctx_after]
    # ctx = len(prompt) + tokens emitted - 1 while the sequence runs: EOS is out once ctx >= len + k.
    done_at = next(r for r, c in enumerate(ctx0) if c >= len(prompts[0]) + k)
    assert len(ctx0) - done_at >= 3, "the other sequence should run on for a few rounds"
    assert ctx0[done_at:] == [ctx0[done_at]] * (len(ctx0) - done_at), \
        f"a finished sequence's context kept growing: {ctx0}"
    _check_context_rows(target, spy, prompts, streams)


def test_acceptance_counts_every_prompt(trained):
    """decode.acceptance (the recipe's acceptance table) averages over all (sequence, round)
    pairs of every batch, the last partial batch included."""
    from jetspec_kernels.decode.acceptance import acceptance
    from jetspec_kernels.models.byte_tokenizer import EOS_ID, encode
    target, head = trained
    prompts = [encode(p) for p in TEXT_PROMPTS + ["class Point:\n    def __init__(self, x, y):\n"]]
    kw = dict(budget=8, topk=3, max_new_tokens=12, eos_token_id=EOS_ID)
    runs = [generate(target, head, prompts[:2], **kw).stats.accept_lengths,
            generate(target, head, prompts[2:], **kw).stats.accept_lengths]
    want = sum(map(sum, runs)) / sum(map(len, runs))
    assert want != sum(runs[0]) / len(runs[0]), "the test needs the last batch to move the mean"
    assert acceptance(target, head, prompts, batch=2, **kw) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("eos", [None, 5, [5, 9]])
def test_token_buffer_emit_against_a_list_model(eos):
    """TokenBuffer.emit appends emitted[b, :counts[b]] (counts 0: nothing), stops a sequence at
    max_new tokens or at an EOS id among its first max_new tokens (not one emitted past them),
    and never writes a token outside its row's first max_new + max_emit columns; checked against
    a list model over random rounds."""
    from jetspec_kernels.decode.output import TokenBuffer
    gen = torch.Generator().manual_seed(7)
    b, max_new, m = 5, 9, 4
    out = TokenBuffer(b, max_new, m, eos, "cpu")
    ids = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    rows, done = [[] for _ in range(b)], [False] * b
    for _ in range(8):
        emitted = torch.randint(0, 12, (b, m), generator=gen, dtype=torch.int32)
        counts = torch.randint(0, m + 1, (b,), generator=gen, dtype=torch.int32)
        counts[torch.tensor(done)] = 0        # the decode passes 0 for a finished sequence
        out.emit(emitted, counts)
        for i in range(b):
            new = emitted[i, :counts[i]].tolist()
            start = len(rows[i])
            rows[i] += new
            done[i] = done[i] or len(rows[i]) >= max_new or any(
                t in ids and start + j < max_new for j, t in enumerate(new))
        assert out.done.tolist() == done
        assert out.count.tolist() == [len(r) for r in rows]
        for i in range(b):
            n = min(len(rows[i]), max_new + m)
            assert out.tokens[i, :n].tolist() == rows[i][:n]
    want = []
    for r in rows:
        r = r[:max_new]
        cut = next((j for j, t in enumerate(r) if t in ids), None)
        want.append(r if cut is None else r[:cut + 1])
    assert out.to_lists() == want
    with pytest.raises(ValueError, match=r"^emitted must have at most 4 columns \(max_emit\)"):
        out.emit(torch.zeros(b, m + 1, dtype=torch.int32), counts)
