"""Writes docs/SUPPORT.md, the support table of every public op, from the code that enforces it:
the ops' dtype checks (checks.py and the ops' own constants), jetspec_kernels/limits.py, the
kernels' limits (csrc/include/jetspec/limits.h), the backends' ``supports()`` (probed), which
backend implements what and what ``auto`` picks (backend.py).

    python docs/gen_support.py            # rewrite docs/SUPPORT.md
    python docs/gen_support.py --check    # exit 1 if docs/SUPPORT.md is stale (tests do this)
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

from jetspec_kernels import backend, checks, limits
from jetspec_kernels.ops import draft_tree as draft_tree_op
from jetspec_kernels.ops import qk_norm_rope_append as rope_op
from jetspec_kernels.ops import verify_tree as verify_op
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
    """auto's first pick on CUDA tensors: hardware-verified backends first (backend.py)."""
    order = backend.verified_backends(fn) + ("triton", "reference")
    return next(f"`{b}`" for b in order
                if backend.hardware_verified(b, fn) and backend.implements(b, fn))


def ops_tables() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(public op, interface function, rows of (what, support))."""
    k = kernel_limits()
    floats, index = names(checks.FLOAT_DTYPES), names(checks.INDEX_DTYPES)
    tokens, positions = names(draft_tree_op.TOKEN_DTYPES), names(rope_op.POSITION_DTYPES)
    seeds = names(verify_op.SEED_DTYPES)
    attn_triton = triton_head_dims("tree_attention", "q")
    gdn_triton = triton_head_dims("gated_delta_tree", "k")
    budget = f"`budget` 1..{limits.MAX_BUDGET} nodes, `topk` 1..{limits.MAX_TOPK} (and <= V)"
    return [
        ("draft_tree", "draft_tree", [
            ("dtypes", f"`logits` {floats} (log-softmax in float32); `root_tokens` {tokens}"),
            ("limits", budget + "; `algorithm` topn or accum_logp")]),
        ("draft_tree_from_topk", "build_tree", [
            ("dtypes", f"`topk_tokens` {tokens}; `topk_logprobs` float32; `root_tokens` {tokens}"),
            ("limits", budget)]),
        ("draft_tree_from_hidden", "hidden_topk", [
            ("dtypes", f"`hidden` {floats}; `lm_head_weight` the same dtype; `root_tokens` {tokens}"),
            ("limits", budget + f"; the fused top-K runs on {runs_on(('hidden_topk',))}, the "
                                "GEMM method (float32 logits by torch, then `log_softmax_topk`) "
                                "on every backend")]),
        ("pack_mask", "pack_mask", [
            ("dtypes", f"`parents`, `num_nodes` {index}")]),
        ("tree_attention", "tree_attention", [
            ("dtypes", f"`q`, caches {floats} (`cuda`: float16, bfloat16; under `auto` other "
                       f"dtypes go to `triton`); `prefix_lens`, `tree_mask`, `block_table` {index}"),
            ("head dims", f"`reference`: {reference_head_dims()}; "
                          f"`triton`: {', '.join(map(str, attn_triton))}; "
                          f"`cuda`: {', '.join(map(str, k['kAttnHeadDims']))} (wgmma on sm_90a: "
                          f"{', '.join(map(str, k['kWgmmaHeadDims']))})"),
            ("limits", "GQA: Hq a multiple of Hkv; contiguous `[B, L, Hkv, D]` or paged "
                       "`[pages, page_size, Hkv, D]` caches (NHD); `cuda`: K/V rows on "
                       f"{k['kRowAlignBytes']}-byte boundaries, TMA kernels need a page size "
                       f"that is a multiple of {k['kAttnTmaPageMultiple']}")]),
        ("qk_norm_rope_append", "qk_norm_rope_append", [
            ("dtypes", f"`q`, `k`, `v`, norm weights {floats}; `positions` {positions}; "
                       f"`cache_start`, `block_table` {index}"),
            ("head dims", f"even; `cuda`: up to {k['kRopeMaxHeadDim']}")]),
        ("verify_tree", "verify_tree", [
            ("dtypes", f"`target_logits` {floats}; `target_tokens` and the tree {index}; "
                       f"`seed`, `offset` {seeds}"),
            ("limits", f"`cuda`: N <= {k['kWalkMaxNodes']} nodes; `top_p` needs V <= "
                       f"{MAX_TOP_P_VOCAB}")]),
        ("commit_kv", "commit_kv", [
            ("dtypes", f"caches and `hidden` {floats}; `prefix_lens`, `verdict` {index}")]),
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
