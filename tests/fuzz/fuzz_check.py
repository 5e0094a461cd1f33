"""The differential check: one fuzz case on one engine against python_ref.

``check(op, seed, engine)`` builds case ``seed`` of ``op`` (fuzz_cases.make), runs the public op on
the engine, and compares with python_ref: float64 for float outputs (relative L2 within the house
tolerance of the input dtype, DESIGN.md section 5), the input dtype's own compute where the
contract is bit-exact (tree building from top-K, the sampled tokens of verify_tree), integers
exactly, trees from logits up to score ties within rounding (helpers.tree_difference), and in-place
cache writes slot by slot (slots no one writes must keep their bytes). A case built to be refused
must raise the expected exception type naming the expected argument, on every engine.

Returns ``"ok"`` or ``"unsupported: <reason>"`` (the engine refused the call up front with
BackendUnavailableError, as the contract allows); raises AssertionError on a mismatch.
"""
from __future__ import annotations

import math
import re

import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from fuzz_cases import BF16, F32, OPS, make
from fuzz_engines import Engine, engine_ready, interpreted, to_engine
from helpers import (TOL, TREE_FIELDS, assert_rms_norm, assert_silu_mul, poisoned_empty, rel_l2,
                     tree_difference, tree_fields)

TL_DOT_OPS = ("tree_attention", "draft_tree_from_hidden")


def run(op: str, seed: int, engine: Engine, monkeypatch=None):
    """``(case, call as run, result)`` of ``op``'s case ``seed`` on ``engine`` (outputs from
    torch.empty are NaN-poisoned)."""
    case = make(op, seed)
    call = to_engine(case.call, engine)
    with engine_ready(engine, monkeypatch), poisoned_empty():
        got = getattr(jk, op)(**call)
    if engine.device == "cuda":
        torch.cuda.synchronize()
    return case, call, got


def check(op: str, seed: int, engine: Engine, monkeypatch=None) -> str:
    case = make(op, seed)
    dtypes = {v.dtype for v in case.call.values() if isinstance(v, torch.Tensor)}
    gemm = case.call.get("method") == "gemm"  # draft_tree_from_hidden's top-K without tl.dot
    if interpreted(engine) and op in TL_DOT_OPS and BF16 in dtypes and not gemm:
        return "unsupported: the Triton interpreter cannot run a bf16 tl.dot"
    if interpreted(engine) and op in ("rms_norm", "silu_mul") and BF16 in dtypes:
        return "unsupported: the Triton interpreter truncates float32 -> bfloat16 casts"
    refuse = case.meta.get("refuse")
    try:
        case, call, got = run(op, seed, engine, monkeypatch)
    except jk.BackendUnavailableError as e:
        if refuse is None:
            return f"unsupported: {e}"
        raise AssertionError(f"{engine}: expected {refuse[0].__name__} naming {refuse[1]!r}, "
                             f"got BackendUnavailableError: {e}") from None
    except (TypeError, ValueError) as e:
        if refuse is None:
            raise AssertionError(f"{engine} refused a valid call: {type(e).__name__}: {e}") from e
        kind, arg = refuse
        if type(e) is not kind or not re.match(rf"{re.escape(arg)}\b(?![.\w])", str(e)):
            raise AssertionError(f"{engine}: expected {kind.__name__} naming {arg!r}, got "
                                 f"{type(e).__name__}: {e}") from e
        return "ok"
    if refuse is not None:
        raise AssertionError(f"{engine} took a call that must be refused ({refuse[0].__name__} "
                             f"naming {refuse[1]!r})")
    COMPARE[op](make(op, seed), call, got)
    return "ok"


# ------------------------------------------------------------------ comparisons


def same(got, want, what):
    got, want = got.detach().cpu(), want.detach().cpu()
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)} != {list(want.shape)}"
    if not torch.equal(got.nan_to_num(123.0), want.nan_to_num(123.0)) or not torch.equal(
            got.isnan(), want.isnan()):
        bad = (got != want) & ~(got.isnan() & want.isnan())
        idx = bad.nonzero()[:5].tolist()
        raise AssertionError(f"{what} differs at {len(bad.nonzero())} places, first {idx}: "
                             f"got {[got[tuple(i)].item() for i in idx]}, "
                             f"want {[want[tuple(i)].item() for i in idx]}")


def close(got, want, tol, what):
    got = got.detach().cpu()
    assert not got.isnan().any(), f"{what} has NaN"
    err = rel_l2(got, want)
    assert err < tol, f"{what}: relative L2 error {err:.3g} >= {tol} (DESIGN.md section 5)"


def close_non_finite(got, want, tol, what):
    """:func:`close` where python_ref's answer may hold NaN and infinities: the same NaN, +inf and
    -inf places (NaN == NaN), the finite rest within ``tol``."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    if torch.isfinite(want).all():
        close(got, want, tol, what)
        return
    for name, kind in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        diff = (kind(got) != kind(want)).nonzero()
        assert not len(diff), (f"{what}: {name} at {len(diff)} other places than python_ref's, "
                               f"first {diff[:5].tolist()}")
    finite = torch.isfinite(want)
    if finite.any():
        close(got[finite], want[finite], tol, what)


def compare_pack_mask(case, call, got):
    same(got, ref.pack_mask(case.call["parents"], case.call["num_nodes"]).to(torch.int32), "mask")


def exact_tree(got, want, max_depth):
    g, w = tree_fields(got), tree_fields(want)
    for key in TREE_FIELDS:
        same(g[key], w[key].to(torch.float32 if key == "scores" else torch.int32), f"tree.{key}")
    assert got.max_depth == max_depth, f"max_depth {got.max_depth} != {max_depth}"


def assert_padding(tree):
    f = tree_fields(tree)
    for b, n in enumerate(f["num_nodes"].tolist()):
        assert f["tokens"][b, n:].eq(0).all() and f["parents"][b, n:].eq(-1).all(), "padding"
        assert f["depths"][b, n:].eq(-1).all() and f["scores"][b, n:].isneginf().all(), "padding"


def compare_draft_tree_from_topk(case, call, got):
    c = case.call
    want = ref.build_tree(c["topk_tokens"], c["topk_logprobs"].float(), c["root_tokens"], c["budget"],
                          c["algorithm"])
    exact_tree(got, want, min(c["topk_tokens"].shape[1], c["budget"] - 1))


def tree_vs_float64(case, got, logits, eps_scale):
    """A tree from logits against python_ref: bit for bit (fp32 spec) where the case is built
    without near-ties, else equal up to ties within float32 rounding of the float64 spec."""
    c = case.call
    D = logits.shape[1]
    max_depth = min(D, c["budget"] - 1)
    assert got.max_depth == max_depth, f"max_depth {got.max_depth} != {max_depth}"
    assert_padding(got)
    if case.meta.get("mode") in ("separated", "identical"):
        want = ref.draft_tree(logits.float(), c["root_tokens"], c["budget"], c["topk"], c["algorithm"])
        g, w = tree_fields(got), tree_fields(want)
        for key in ("tokens", "parents", "depths", "num_nodes", "mask"):
            same(g[key], w[key].to(torch.int32), f"tree.{key}")
        fin = w["scores"].isfinite()
        assert torch.equal(g["scores"].isfinite(), fin)
        close(g["scores"][fin], w["scores"][fin].double(), TOL[F32], "tree.scores")
        return
    big = case.meta.get("mag", 1.0) > 1e6
    want = ref.draft_tree(logits.float() if big else logits.double(), c["root_tokens"], c["budget"],
                          c["topk"], c["algorithm"])
    finite = logits.double()[logits.double().isfinite()]
    scale = float(finite.abs().max()) if finite.numel() else 1.0
    # float32 rounding of the log-softmax grows with the logits' magnitude: eps bounds each
    # node's absolute error, and so the relative L2 of small scores.
    eps = 1e-5 + eps_scale * D * max(1.0, scale)
    s = tree_fields(want)["scores"].double()
    s = s[s.isfinite() & (s != 0)]
    rms = float(s.square().mean().sqrt()) if s.numel() else 1.0
    why = tree_difference(got, want, eps, score_tol=max(TOL[F32], 2 * eps / max(rms, 1e-300)))
    assert why is None, f"tree differs from python_ref (eps {eps:.3g}): {why}"
    f = tree_fields(got)
    same(f["mask"], ref.pack_mask(f["parents"], f["num_nodes"]).to(torch.int32), "tree.mask")


def compare_draft_tree(case, call, got):
    tree_vs_float64(case, got, case.call["logits"], 4e-7)


def compare_draft_tree_from_hidden(case, call, got):
    c = case.call
    logits = c["hidden"].double() @ c["lm_head_weight"].double().T
    tree_vs_float64(case, got, logits, 2e-6 * math.sqrt(c["hidden"].shape[-1]))


def compare_tree_attention(case, call, got):
    c = case.call
    out, lse = got if isinstance(got, tuple) else (got, None)
    if "out" in c:
        assert out is call["out"], "out= must be written in place and returned"
    if "lse" in c:
        assert lse is call["lse"], "lse= must be written in place and returned"
    want_lse = "lse" in c or c.get("return_lse", False)
    assert (lse is not None) == want_lse, "lse returned iff return_lse or lse="
    w_out, w_lse = ref.tree_attention(c["q"].double(), c["k_cache"].double(), c["v_cache"].double(),
                                      c["prefix_lens"], c["tree_mask"], c["tail"], c["block_table"],
                                      c.get("scale"))
    tol = TOL[c["q"].dtype]
    assert out.dtype == c["q"].dtype
    close_non_finite(out, w_out, tol, "out")
    if lse is not None:
        assert lse.dtype == torch.float32
        close_non_finite(lse, w_lse, tol, "lse")


def compare_cache(got, want, tol, what, exact=False):
    """In-place cache writes: the slots python_ref wrote match, every other slot kept its value."""
    got = got.detach().cpu()
    written = ~want.isnan()
    assert torch.equal(~got.isnan(), written), f"{what}: written slots differ from python_ref's"
    if exact:
        same(got[written], want[written].to(got.dtype), what)
    elif written.any():
        close_non_finite(got[written], want[written], tol, what)


def compare_qk_norm_rope_append(case, call, got):
    c = case.call
    dbl = lambda t: None if t is None else t.double()
    kr, vr = c["k_cache"].double(), c["v_cache"].double()
    want = ref.qk_norm_rope_append(dbl(c["q"]), c["k"].double(), c["v"].double(), dbl(c["q_norm_w"]),
                                   dbl(c["k_norm_w"]), c["positions"], kr, vr, c["rope_theta"],
                                   c["eps"], c["block_table"], c["cache_start"],
                                   c.get("rotary_dim"))
    dtype, cache_dtype = c["k"].dtype, c["k_cache"].dtype
    if c["q"] is None:
        assert got is None, "the K/V-only form returns None"
    else:
        assert got.dtype == dtype and got.shape == c["q"].shape
        close_non_finite(got, want, TOL[dtype], "q_out")
    tol = max(TOL[dtype], TOL[cache_dtype])
    compare_cache(call["k_cache"], kr, tol, "k_cache")
    compare_cache(call["v_cache"], vr, tol, "v_cache", exact=True)


def _per_sequence(v, B, dtype):
    """A control as python_ref takes it: a tensor [B] (numbers and [] tensors expanded)."""
    return torch.as_tensor(v).to(dtype).reshape(-1).expand(B).contiguous()


def compare_verify_tree(case, call, got):
    c = case.call
    tree = c["tree"]
    B = tree.tokens.shape[0]
    kw = dict(target_tokens=c.get("target_tokens"), target_logits=c.get("target_logits"))
    t = c.get("temperature", 0.0)
    if c.get("target_logits") is not None and (torch.is_tensor(t) or t > 0):
        kw.update(temperature=_per_sequence(t, B, F32) if torch.is_tensor(t) else float(t),
                  seed=_per_sequence(c["seed"], B, torch.int64),
                  offset=_per_sequence(c["offset"], B, torch.int64),
                  top_k=_per_sequence(c.get("top_k", 0), B, torch.int64).clamp(max=2 ** 31 - 1),
                  top_p=_per_sequence(c.get("top_p", 1.0), B, F32))
    want = ref.verify_tree(tree.tokens, tree.parents, tree.num_nodes, tree.max_depth, **kw)
    for name, g in zip(("accept_len", "path", "bonus", "emitted"), got):
        same(g, want[name].to(torch.int32), name)


def compare_commit_kv(case, call, got):
    c = case.call
    kr, vr = c["k_cache"].clone(), c["v_cache"].clone()
    v = c["verdict"]
    lens, rows = ref.commit_kv(kr, vr, c["prefix_lens"], v.path, v.accept_len, c["block_table"],
                               c["hidden"])
    same(got.prefix_lens, lens, "prefix_lens")
    same(call["k_cache"], kr, "k_cache")
    same(call["v_cache"], vr, "v_cache")
    assert (got.hidden is None) == (rows is None)
    if rows is not None:
        same(got.hidden, rows, "hidden")


def compare_rms_norm(case, call, got):
    c = case.call
    out, total = got if c["residual"] is not None else (got, None)
    assert_rms_norm(out, total, c["x"], c["residual"], c["weight"], c["eps"])


def compare_silu_mul(case, call, got):
    x = case.call["x"]
    assert got.shape == (*x.shape[:-1], x.shape[-1] // 2) and got.is_contiguous()
    assert_silu_mul(got.reshape(-1, got.shape[-1]), x.reshape(-1, x.shape[-1]))


def _float64(call, keys):
    return [call[key].double() if call[key] is not None and call[key].is_floating_point()
            else call[key] for key in keys]


def compare_gated_delta_tree(case, call, got):
    c = case.call
    want = ref.gated_delta_tree(*_float64(c, ("q", "k", "v", "g", "beta", "parents", "state")),
                                state_slots=c["state_slots"], num_nodes=c["num_nodes"],
                                scale=c["scale"], use_qk_l2norm=c["use_qk_l2norm"])
    got = got.detach().cpu()
    assert got.dtype == c["v"].dtype and got.shape == want.shape and got.is_contiguous()
    n = want.shape[1]
    num = torch.full((want.shape[0],), n) if c["num_nodes"] is None else c["num_nodes"]
    pad = torch.arange(n)[None, :] >= num[:, None]
    assert (got[pad] == 0).all(), "gated_delta_tree: a padding row is not 0"
    close(got, want, TOL[c["v"].dtype], "o")


def compare_gated_delta_commit(case, call, got):
    c = case.call
    want = c["state"].double().clone()
    ref.gated_delta_commit(*_float64(c, ("k", "v", "g", "beta", "path", "accept_len")), want,
                           state_slots=c["state_slots"], use_qk_l2norm=c["use_qk_l2norm"])
    state = call["state"].detach().cpu()
    used = torch.zeros(want.shape[0], dtype=torch.bool)
    used[c["state_slots"].long() if c["state_slots"] is not None else torch.arange(
        c["k"].shape[0])] = True
    same(state[~used], c["state"][~used], "state (slots not committed)")
    close(state[used], want[used], TOL[c["k"].dtype], "state")


def compare_causal_conv1d_tree(case, call, got):
    c = case.call
    want = ref.causal_conv1d_tree(*_float64(c, ("x", "parents", "conv_state", "weight", "bias")),
                                  state_slots=c["state_slots"], num_nodes=c["num_nodes"],
                                  activation=c["activation"])
    got = got.detach().cpu()
    assert got.dtype == c["x"].dtype and got.shape == want.shape and got.is_contiguous()
    n = want.shape[1]
    num = torch.full((want.shape[0],), n) if c["num_nodes"] is None else c["num_nodes"]
    pad = torch.arange(n)[None, :] >= num[:, None]
    assert (got[pad] == 0).all(), "causal_conv1d_tree: a padding row is not 0"
    close_non_finite(got, want, TOL[c["x"].dtype], "y")


def compare_causal_conv1d_commit(case, call, got):
    c = case.call
    assert got is None, "causal_conv1d_commit returns None"
    want = c["conv_state"].clone()
    ref.causal_conv1d_commit(c["x"], c["path"], c["accept_len"], want, state_slots=c["state_slots"])
    same(call["conv_state"], want, "conv_state")      # moved bit for bit; other slots kept


COMPARE = {
    "pack_mask": compare_pack_mask,
    "draft_tree_from_topk": compare_draft_tree_from_topk,
    "draft_tree": compare_draft_tree,
    "draft_tree_from_hidden": compare_draft_tree_from_hidden,
    "tree_attention": compare_tree_attention,
    "qk_norm_rope_append": compare_qk_norm_rope_append,
    "verify_tree": compare_verify_tree,
    "commit_kv": compare_commit_kv,
    "rms_norm": compare_rms_norm,
    "silu_mul": compare_silu_mul,
    "gated_delta_tree": compare_gated_delta_tree,
    "gated_delta_commit": compare_gated_delta_commit,
    "causal_conv1d_tree": compare_causal_conv1d_tree,
    "causal_conv1d_commit": compare_causal_conv1d_commit,
}
assert set(COMPARE) == set(OPS)
