"""Writes docs/SUPPORT.md, the support table of every public op, from the code that enforces it:
the integer dtypes each op takes for its index arguments (probed: the op called on the reference
backend with the argument cast), the float dtypes of checks.py, jetspec_kernels/limits.py, the
kernels' limits (csrc/include/jetspec/limits.h), the backends' ``supports()`` and the ops' own
checks (probed for head dims), which backend implements what and what ``auto`` picks
(backend.py).

    python docs/gen_support.py            # rewrite docs/SUPPORT.md
    python docs/gen_support.py --check    # exit 1 if docs/SUPPORT.md is stale (tests do this)
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

from jetspec_kernels import backend, checks, limits
from jetspec_kernels.python_ref.sampling import MAX_TOP_P_VOCAB

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "SUPPORT.md"
LIMITS_H = ROOT / "csrc" / "include" / "jetspec" / "limits.h"
KERNEL_BACKENDS = ("reference", "triton", "cuda")


def kernel_limits() -> dict:
    """The ``constexpr int`` scalars and ``int[]`` lists of limits.h, by C++ name."""
    text = LIMITS_H.read_text()
    found = {}
    for name, value in re.findall(r"constexpr int (k\w+) = ([^;]+);", text):
        # our own header's integer expressions (1 << 21, 2 * kAttnRows), in order
        found[name] = int(eval(value, {"__builtins__": {}}, dict(found)))  # noqa: S307
    for name, values in re.findall(r"constexpr int (k\w+)\[\] = \{([^}]*)\};", text):
        found[name] = tuple(int(v) for v in values.split(","))
    return found


def names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def triton_head_dims(op: str, arg: str) -> tuple[int, ...]:
    """The head dims in 1..1024 that the triton backend's supports() takes (probed on meta
    tensors: the answers read shapes only)."""
    from jetspec_kernels import triton as triton_backend
    shape = (1, 1, 1)
    return tuple(d for d in range(1, 1025) if triton_backend.supports(
        op, **{arg: torch.empty(*shape, d, device="meta")}) is None)


PROBED_INTS = (torch.int16, torch.int32, torch.int64)


def _round_inputs() -> dict:
    """Small valid CPU inputs of one round (B 1, N 4, two pages of 4), built afresh per probe."""
    import jetspec_kernels as jk
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 2, 16, generator=g)
    root = torch.tensor([3], dtype=torch.int32)
    tree = jk.draft_tree(logits, root, budget=4, topk=2, backend="reference")
    cache = torch.randn(1, 8, 1, 16, generator=g)
    pages = torch.randn(2, 4, 1, 16, generator=g)
    return dict(jk=jk, logits=logits, root=root, tree=tree, cache=cache, pages=pages,
                q=torch.randn(1, 4, 1, 16, generator=g), lens=torch.tensor([2], dtype=torch.int32),
                table=torch.tensor([[1, 0]], dtype=torch.int32), w=torch.ones(16),
                target=torch.randn(1, 4, 16, generator=g))


def _probe_calls() -> dict:
    """(op, argument) -> a function of the argument's dtype that calls the op on the reference
    backend with that argument cast (the rest as _round_inputs makes them)."""
    def call(build):
        def run(dtype):
            return build(_round_inputs(), lambda t: t.to(dtype))
        return run

    def draft_topk(x, cast, arg):
        tl, tt = torch.topk(x["logits"].log_softmax(-1), 2)
        tokens = tt.to(torch.int32)
        kw = dict(topk_tokens=tokens, root_tokens=x["root"])
        kw[arg] = cast(kw[arg])
        return x["jk"].draft_tree_from_topk(kw["topk_tokens"], tl, kw["root_tokens"], budget=4,
                                            backend="reference")

    def verify(x, cast, arg):
        if arg == "target_tokens":      # greedy, from the target's tokens
            tokens = cast(x["target"].argmax(-1))
            return x["jk"].verify_tree(x["tree"], target_tokens=tokens, backend="reference")
        kw = dict(seed=torch.tensor([1]), offset=torch.tensor([0]))
        kw[arg] = cast(kw[arg])
        return x["jk"].verify_tree(x["tree"], x["target"], **kw, temperature=0.5,
                                   backend="reference")

    def rope(x, cast, arg, paged):
        k = x["q"].clone()
        kc, vc = (x["pages"].clone(), x["pages"].clone()) if paged else (x["cache"].clone(),) * 2
        kw = dict(positions=x["tree"].positions(x["lens"]), cache_start=x["lens"],
                  block_table=x["table"] if paged else None)
        if kw.get(arg) is not None:
            kw[arg] = cast(kw[arg])
        return x["jk"].qk_norm_rope_append(x["q"], k, k, x["w"], x["w"], kw["positions"], kc, vc,
                                           rope_theta=1e4, cache_start=kw["cache_start"],
                                           block_table=kw["block_table"], backend="reference")

    def attention(x, cast, arg, paged):
        kw = dict(prefix_lens=x["lens"], tree_mask=x["tree"].mask,
                  block_table=x["table"] if paged else None)
        kw[arg] = cast(kw[arg])
        caches = (x["pages"], x["pages"]) if paged else (x["cache"], x["cache"])
        return x["jk"].tree_attention(x["q"], *caches, kw["prefix_lens"], kw["tree_mask"],
                                      block_table=kw["block_table"], backend="reference")

    def commit(x, cast, arg, paged):
        verdict = x["jk"].verify_tree(x["tree"], x["target"], backend="reference")
        kc = x["pages"].clone() if paged else x["cache"].clone()
        kw = dict(prefix_lens=x["lens"], block_table=x["table"] if paged else None)
        kw[arg] = cast(kw[arg])
        return x["jk"].commit_kv(kc, kc.clone(), kw["prefix_lens"], verdict,
                                 block_table=kw["block_table"], backend="reference")

    def pack(x, cast, arg):
        kw = dict(parents=x["tree"].parents, num_nodes=x["tree"].num_nodes)
        kw[arg] = cast(kw[arg])
        return x["jk"].pack_mask(kw["parents"], kw["num_nodes"], backend="reference")

    return {
        ("draft_tree", "root_tokens"): call(lambda x, c: x["jk"].draft_tree(
            x["logits"], c(x["root"]), budget=4, topk=2, backend="reference")),
        **{("draft_tree_from_topk", a): call(lambda x, c, a=a: draft_topk(x, c, a))
           for a in ("topk_tokens", "root_tokens")},
        **{("pack_mask", a): call(lambda x, c, a=a: pack(x, c, a)) for a in ("parents", "num_nodes")},
        **{("tree_attention", a): call(lambda x, c, a=a: attention(x, c, a, a == "block_table"))
           for a in ("prefix_lens", "tree_mask", "block_table")},
        **{("qk_norm_rope_append", a): call(lambda x, c, a=a: rope(x, c, a, a == "block_table"))
           for a in ("positions", "cache_start", "block_table")},
        **{("verify_tree", a): call(lambda x, c, a=a: verify(x, c, a))
           for a in ("target_tokens", "seed", "offset")},
        **{("commit_kv", a): call(lambda x, c, a=a: commit(x, c, a, a == "block_table"))
           for a in ("prefix_lens", "block_table")},
    }


def int_dtypes_taken() -> dict:
    """(op, argument) -> the integer dtypes of PROBED_INTS the op takes for it."""
    taken = {}
    for key, run in _probe_calls().items():
        ok = []
        for dtype in PROBED_INTS:
            try:
                run(dtype)
            except (TypeError, ValueError):
                continue
            ok.append(dtype)
        if not ok:
            raise AssertionError(f"{key}: no integer dtype was taken: the probe is broken")
        taken[key] = ok
    return taken


def reference_head_dims() -> str:
    """The q head dims in 1..1024 that tree_attention's own checks take (every backend's first
    step): "any" when all of them."""
    from jetspec_kernels.ops.tree_attention import check_tree_attention
    ok = []
    for d in range(1, 1025):
        q, cache = torch.zeros(1, 1, 1, d), torch.zeros(1, 2, 1, d)
        try:
            check_tree_attention(q, cache, cache, torch.zeros(1, dtype=torch.int32), None, "causal",
                                 None, None, None)
        except (TypeError, ValueError):
            continue
        ok.append(d)
    return "any" if len(ok) == 1024 else ", ".join(map(str, ok))


def runs_on(fn_names: tuple[str, ...]) -> str:
    have = [b for b in KERNEL_BACKENDS if all(backend.implements(b, fn) for fn in fn_names)]
    return ", ".join(f"`{b}`" for b in have)


def auto_on_cuda(fn: str) -> str:
    """auto's first pick on CUDA tensors where every backend loads (backend.auto_choice)."""
    return f"`{backend.auto_choice(fn, 'cuda', machine=False)[0]}`"


def ops_tables() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(public op, interface function, rows of (what, support))."""
    k = kernel_limits()
    floats, index = names(checks.FLOAT_DTYPES), names(checks.INDEX_DTYPES)
    taken = int_dtypes_taken()

    def ints(op, *args):
        """``arg`` dtypes; arguments taking the same dtypes share one entry."""
        groups = {}
        for a in args:
            groups.setdefault(names(taken[(op, a)]), []).append(f"`{a}`")
        return "; ".join(f"{', '.join(a)} {d}" for d, a in groups.items())
    attn_triton = triton_head_dims("tree_attention", "q")
    gdn_triton = triton_head_dims("gated_delta_tree", "k")
    budget = f"`budget` 1..{limits.MAX_BUDGET} nodes, `topk` 1..{limits.MAX_TOPK} (and <= V)"
    return [
        ("draft_tree", "draft_tree", [
            ("dtypes", f"`logits` {floats} (log-softmax in float32); "
                       f"{ints('draft_tree', 'root_tokens')}"),
            ("limits", budget + "; `algorithm` topn or accum_logp")]),
        ("draft_tree_from_topk", "build_tree", [
            ("dtypes", f"`topk_logprobs` float32; "
                       f"{ints('draft_tree_from_topk', 'topk_tokens', 'root_tokens')}"),
            ("limits", budget)]),
        ("draft_tree_from_hidden", "hidden_topk", [
            ("dtypes", f"`hidden` {floats}; `lm_head_weight` the same dtype; `root_tokens` as "
                       "`draft_tree`'s"),
            ("limits", budget + f"; the fused top-K runs on {runs_on(('hidden_topk',))}, the "
                                "GEMM method (float32 logits by torch, then `log_softmax_topk`) "
                                "on every backend")]),
        ("pack_mask", "pack_mask", [
            ("dtypes", ints("pack_mask", "parents", "num_nodes"))]),
        ("tree_attention", "tree_attention", [
            ("dtypes", f"`q`, caches {floats} (`cuda`: float16, bfloat16; under `auto` other "
                       f"dtypes go to `triton`); "
                       f"{ints('tree_attention', 'prefix_lens', 'tree_mask', 'block_table')}"),
            ("head dims", f"`reference`: {reference_head_dims()}; "
                          f"`triton`: {', '.join(map(str, attn_triton))}; "
                          f"`cuda`: {', '.join(map(str, k['kAttnHeadDims']))} (wgmma on sm_90a: "
                          f"{', '.join(map(str, k['kWgmmaHeadDims']))})"),
            ("limits", "GQA: Hq a multiple of Hkv; contiguous `[B, L, Hkv, D]` or paged "
                       "`[pages, page_size, Hkv, D]` caches (NHD); `cuda`: K/V rows on "
                       f"{k['kRowAlignBytes']}-byte boundaries, TMA kernels need a page size "
                       f"that is a multiple of {k['kAttnTmaPageMultiple']}")]),
        ("qk_norm_rope_append", "qk_norm_rope_append", [
            ("dtypes", f"`q`, `k`, `v`, norm weights {floats}; "
                       f"{ints('qk_norm_rope_append', 'positions', 'cache_start', 'block_table')}"),
            ("head dims", f"even; `cuda`: up to {k['kRopeMaxHeadDim']}")]),
        ("verify_tree", "verify_tree", [
            ("dtypes", f"`target_logits` {floats}; the tree's fields as `draft_tree` makes "
                       f"them; {ints('verify_tree', 'target_tokens', 'seed', 'offset')}"),
            ("limits", f"`cuda`: N <= {k['kWalkMaxNodes']} nodes; `top_p` needs V <= "
                       f"{MAX_TOP_P_VOCAB}")]),
        ("commit_kv", "commit_kv", [
            ("dtypes", f"caches and `hidden` {floats}; `verdict` as `verify_tree` makes it; "
                       f"{ints('commit_kv', 'prefix_lens', 'block_table')}")]),
        ("rms_norm", "rms_norm", [
            ("dtypes", f"`x` {floats}; `weight`, `residual` the same dtype")]),
        ("silu_mul", "silu_mul", [
            ("dtypes", f"`x` {floats} (`[..., 2H]`, gate then up)")]),
        ("gated_delta_tree", "gated_delta_tree", [
            ("dtypes", f"`q`, `k`, `v` {floats}; `g` float32; `state` float32; `parents`, "
                       f"`num_nodes` {index}"),
            ("head dims", "`reference`: any; `triton`: Dk up to "
                          f"{max(gdn_triton) if gdn_triton else 0}")]),
        ("gated_delta_commit", "gated_delta_commit", [
            ("dtypes", f"`k`, `v` {floats}; `state` float32; `path`, `accept_len` {index}")]),
        ("causal_conv1d_tree", "causal_conv1d_tree", [
            ("dtypes", f"`x` {floats}; `weight` the same dtype or float32; `parents` {index}")]),
        ("causal_conv1d_commit", "causal_conv1d_commit", [
            ("dtypes", f"`x` {floats}; `path`, `accept_len` {index}")]),
    ]


def render() -> str:
    lines = [
        "# Support table: what each public op takes, on which backend",
        "",
        "Generated by `python docs/gen_support.py` from the code that enforces it (the ops' checks,",
        "`jetspec_kernels/limits.py`, `csrc/include/jetspec/limits.h`, the backends' `supports()`,",
        "`backend.py`); `tests/test_support_doc.py` fails when it is stale. Every op checks its",
        "arguments on every backend first (a `TypeError`/`ValueError` naming the argument); a",
        "backend asked for explicitly that cannot take a call raises `BackendUnavailableError`",
        "with the reason, and `auto` moves on to the next backend. Contracts: `docs/DESIGN.md`",
        "section 4; engines: `docs/INTEGRATION.md`.",
        "",
        "`reference` runs on any device (plain PyTorch); `triton` on CUDA GPUs (and on the CPU",
        "under `TRITON_INTERPRET=1`); `cuda` on GPUs that `_C` was built for. `auto` on CPU",
        "tensors runs `reference` (`triton` under the interpreter); on CUDA tensors the backend",
        "shown below (hardware-verified backends first, `python -m jetspec_kernels info`).",
        "",
    ]
    for op, fn, rows in ops_tables():
        chain = ("log_softmax_topk",) if fn == "hidden_topk" else backend.CHAINS.get(fn, (fn,))
        lines += [f"## `{op}`", "", "| | |", "|---|---|",
                  f"| backends | {runs_on(chain)} |",
                  f"| auto on CUDA tensors | {auto_on_cuda(fn)} |"]
        lines += [f"| {what} | {text} |" for what, text in rows]
        lines.append("")
    return "\n".join(lines)


def main(argv) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if OUT.read_text() != text:
            print(f"{OUT} is stale: run python docs/gen_support.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
