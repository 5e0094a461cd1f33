"""``python -m jetspec_kernels demo``: real speculative decoding with the shipped tiny models.

Loads the tiny byte-level Qwen3 target and its trained JetSpec draft head from
``jetspec_kernels/assets/tiny`` (see ``recipe.json`` there and ``python -m jetspec_kernels.train``),
decodes a few Python-source prompts with speculative decoding and autoregressively, checks that
the outputs are identical (exit status 1 if not), prints tokens/s of both, the speed-up and the
accepted length of every round, then measures the mean accepted length against the tree budget
for the causal head, the bidirectional (DFlash) head and a chain (top-1 path, budget = depth + 1),
prints the table and writes it as a PNG (and CSV).

``demo --random-round`` runs the older demo: one round end to end on random data at realistic
shapes (see its ``--help``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import jetspec_kernels as jk
from jetspec_kernels import backend as _backend

_RANDOM_DOC = """One speculative round end to end on random data.

Draft logits -> draft_tree -> tree K/V appended (qk_norm_rope_append) -> tree_attention ->
verify_tree -> commit_kv, at realistic shapes (D=15, V=151936, K=8, budget=64, Qwen3-8B heads
Hq=32, Hkv=8, Dh=128, a 1K prefix), printing the tree, the verdict and the time of each stage.
"""


def _timed(device, fn):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, (time.perf_counter() - t0) * 1e3


def _rigged_target_logits(tree: jk.Tree, vocab: int, agree_depth: int, gen) -> torch.Tensor:
    """Random target logits that agree with the draft's rank-0 child down to ``agree_depth``."""
    b, n = tree.tokens.shape
    logits = torch.randn(b, n, vocab, generator=gen, device=tree.tokens.device)
    idx = torch.arange(n, device=tree.tokens.device)
    # first child of each node (the rank-0 child comes first among its siblings in both orders)
    parents = tree.parents.long()
    is_child = (parents[:, None, :] == idx[None, :, None]) & (idx[None, None, :] < tree.num_nodes[:, None, None])
    first = torch.where(is_child, idx[None, None, :], torch.full_like(is_child, n, dtype=torch.long)).min(-1).values
    has_child = (first < n) & (tree.depths < agree_depth)
    child_tok = tree.tokens.long().gather(1, first.clamp(max=n - 1))
    boost = torch.zeros_like(logits)
    boost.scatter_(2, child_tok[..., None], 30.0)
    return logits + boost * has_child[..., None]


def random_round(argv=None) -> int:
    """The one-round random-data demo (``demo --random-round``); returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m jetspec_kernels demo --random-round", description=_RANDOM_DOC,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default=None, help="auto | cuda | triton | reference")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prefix", type=int, default=1024)
    p.add_argument("--depth", type=int, default=15)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--budget", type=int, default=64)
    p.add_argument("--algorithm", default="topn", choices=["topn", "accum_logp"])
    p.add_argument("--heads", type=int, nargs=3, default=[32, 8, 128], metavar=("HQ", "HKV", "DH"))
    p.add_argument("--agree-depth", type=int, default=6,
                   help="the random target agrees with the draft's best child down to this depth")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    backend = _backend.resolve(device, args.backend)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    b, hq, hkv, dh = args.batch, *args.heads
    n = args.budget
    print(f"jetspec_kernels {jk.__version__} demo: backend {backend!r} on {device} ({dtype}), "
          f"B={b}, D={args.depth}, V={args.vocab}, K={args.topk}, budget={n}, "
          f"heads {hq}/{hkv}x{dh}, prefix {args.prefix}")

    stages = {}
    logits = 4.0 * torch.randn(b, args.depth, args.vocab, generator=gen, device=device)
    roots = torch.randint(0, args.vocab, (b,), generator=gen, device=device, dtype=torch.int32)
    tree, stages["draft_tree"] = _timed(device, lambda: jk.draft_tree(
        logits.to(dtype), roots, budget=n, topk=args.topk, algorithm=args.algorithm, backend=backend))
    print(tree.pretty(0))

    prefix_lens = torch.tensor([args.prefix - 37 * i for i in range(b)], device=device,
                               dtype=torch.int32).clamp_min(0)
    cap = args.prefix + n
    k_cache = torch.randn(b, cap, hkv, dh, generator=gen, device=device).to(dtype)
    v_cache = torch.randn(b, cap, hkv, dh, generator=gen, device=device).to(dtype)
    q = torch.randn(b, n, hq, dh, generator=gen, device=device).to(dtype)
    k = torch.randn(b, n, hkv, dh, generator=gen, device=device).to(dtype)
    v = torch.randn(b, n, hkv, dh, generator=gen, device=device).to(dtype)
    norm_w = torch.ones(dh, device=device, dtype=dtype)
    q, stages["qk_norm_rope_append"] = _timed(device, lambda: jk.qk_norm_rope_append(
        q, k, v, norm_w, norm_w, tree.positions(prefix_lens), k_cache, v_cache,
        rope_theta=1e6, cache_start=prefix_lens, backend=backend))
    out, stages["tree_attention"] = _timed(device, lambda: jk.tree_attention(
        q, k_cache, v_cache, prefix_lens, tree.mask, backend=backend))

    target_logits = _rigged_target_logits(tree, args.vocab, args.agree_depth, gen)
    verdict, stages["verify_tree"] = _timed(device, lambda: jk.verify_tree(
        tree, target_logits, backend=backend))
    commit, stages["commit_kv"] = _timed(device, lambda: jk.commit_kv(
        k_cache, v_cache, prefix_lens, verdict, backend=backend))

    print(f"\ntree attention out {tuple(out.shape)} {out.dtype}, finite: {bool(torch.isfinite(out).all())}")
    for i in range(b):
        m = int(verdict.accept_len[i]) + 1
        print(f"seq {i}: accepted {m - 1} draft tokens, path {verdict.path[i, :m].tolist()}, "
              f"emitted {verdict.emitted[i, :m].tolist()}, prefix {int(prefix_lens[i])} -> "
              f"{int(commit.prefix_lens[i])}")
    print(f"\n{'stage':22s} {'backend':10s} {'ms':>9s}")
    for name, ms in stages.items():
        print(f"{name:22s} {backend:10s} {ms:9.2f}")
    print(f"{'round total':22s} {'':10s} {sum(stages.values()):9.2f}")
    return 0


PROMPTS = (
    "import os\nimport sys\n\n\ndef main(argv=None):\n    \"\"\"Parse the arguments and run.\"\"\"\n    ",
    "class Queue:\n    \"\"\"A simple first-in first-out queue.\"\"\"\n\n    def __init__(self, maxsize=0):\n"
    "        self.",
    "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__, ",
    "        if not isinstance(name, str):\n            raise TypeError(",
)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _tiny_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jetspec_kernels demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--random-round", action="store_true",
                   help="run the one-round random-data demo instead (its own flags follow)")
    p.add_argument("--backend", default=None, help="auto | cuda | triton | reference")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    p.add_argument("--models", default=None, help="tiny-model directory (default: the shipped one)")
    p.add_argument("--prompts", type=int, default=3, help=f"how many built-in prompts (1..{len(PROMPTS)})")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--budget", type=int, default=64, help="tree budget of the timed speculative run")
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--budgets", type=int, nargs="*", default=[1, 4, 16, 64, 256],
                   help="budgets of the acceptance table (none: skip the table)")
    p.add_argument("--table-tokens", type=int, default=32, help="new tokens per prompt for the table")
    p.add_argument("--out", default=os.path.join("bench", "results", "demo"),
                   help="directory for demo_acceptance.png / .csv")
    return p


def _decode_each(fn, target, prompts, **kw):
    """Decode prompts one at a time (clean per-round statistics); returns (outputs, seconds)."""
    outs, seconds = [], 0.0
    for p in prompts:
        o = fn(target, prompt_ids=[p], **kw)
        outs.append(o)
        seconds += o.stats.seconds
    return outs, seconds


def _write_table(table: dict, budgets, out_dir: str) -> list[str]:
    """CSV and (when matplotlib is installed) PNG of the acceptance table; returns written paths."""
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "demo_acceptance.csv")
    with open(csv_path, "w") as f:
        f.write("drafter," + ",".join(f"budget_{b}" for b in budgets) + "\n")
        for name, row in table.items():
            f.write(name + "," + ",".join(f"{row[str(b)]:.4f}" for b in budgets) + "\n")
    written = [csv_path]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no PNG written")
        return written
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    labels = {"head_causal": "JetSpec causal head (tree)", "head_dflash": "DFlash bidirectional head (tree)",
              "chain": "causal head, chain (top-1)"}
    for name, row in table.items():
        ax.plot(budgets, [row[str(b)] for b in budgets], marker="o", label=labels.get(name, name))
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.set_xlabel("tree budget (nodes, root included)")
    ax.set_ylabel("mean accepted draft tokens / round")
    ax.set_title("tiny byte-level Qwen3 on stdlib-style Python (greedy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = os.path.join(out_dir, "demo_acceptance.png")
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return written + [png]


def tiny_demo(argv=None) -> int:
    """The real-model demo (see the module docstring); returns the exit status (1 if lossy)."""
    args = _tiny_parser().parse_args(argv)
    if not 1 <= args.prompts <= len(PROMPTS):
        raise SystemExit(f"error: --prompts must be in 1..{len(PROMPTS)}")
    device = torch.device(args.device)
    previous = jk.get_backend()
    if args.backend is not None:
        jk.set_backend(args.backend)
    try:
        return _run_tiny(args, device)
    finally:
        jk.set_backend(previous)


def _run_tiny(args, device) -> int:
    from .decode import generate, generate_ar
    from .train.assets import TINY_DIR, load_tiny
    from .train.evaluate import acceptance_table
    from .train.tokenizer import EOS_ID, decode, encode

    backend = _backend.resolve(device)
    target, heads = load_tiny(args.models or TINY_DIR, dtype=DTYPES[args.dtype], device=device)
    head = heads["head_causal"]
    tc = target.config
    n_params = sum(t.numel() for t in [target.embed_weight, target.norm_weight]
                   + [t for layer in target.layers for t in layer.values()])
    print(f"jetspec_kernels {jk.__version__} demo: tiny byte-level Qwen3 ({tc.num_hidden_layers} layers, "
          f"hidden {tc.hidden_size}, {n_params / 1e6:.2f}M parameters) + JetSpec causal head "
          f"({head.config.num_hidden_layers} layers, block {head.block_size}, taps "
          f"{head.target_layer_ids}); backend {backend!r} on {device} ({args.dtype})")
    prompts = [encode(p) for p in PROMPTS[:args.prompts]]
    kw = dict(max_new_tokens=args.max_new_tokens, eos_token_id=EOS_ID)
    spec, spec_s = _decode_each(generate, target, prompts, head=head, budget=args.budget,
                                topk=args.topk, **kw)
    ar, ar_s = _decode_each(generate_ar, target, prompts, **kw)

    same = True
    for i, (s, a) in enumerate(zip(spec, ar)):
        ok = s.tokens == a.tokens
        same &= ok
        print(f"\nprompt {i}: {PROMPTS[i]!r}")
        print(f"  continuation: {decode(s.tokens[0])!r}")
        print(f"  accepted per round: {s.stats.accept_lengths}  (mean {s.stats.mean_accept:.2f}, "
              f"{s.stats.rounds} rounds for {s.stats.new_tokens} tokens)  "
              f"{'identical to' if ok else 'DIFFERS FROM'} autoregressive")
    n_spec = sum(o.stats.new_tokens for o in spec)
    n_ar = sum(o.stats.new_tokens for o in ar)
    acc = [a for o in spec for a in o.stats.accept_lengths]
    print(f"\nspeculative (budget {args.budget}, topk {args.topk}): {n_spec} tokens in {spec_s:.2f}s = "
          f"{n_spec / spec_s:.1f} tokens/s, mean accepted length {sum(acc) / max(1, len(acc)):.2f} "
          f"({1 + sum(acc) / max(1, len(acc)):.2f} tokens/round)")
    print(f"autoregressive: {n_ar} tokens in {ar_s:.2f}s = {n_ar / ar_s:.1f} tokens/s")
    print(f"speed-up: {(n_spec / spec_s) / (n_ar / ar_s):.2f}x (batch 1, {backend} backend on {device})")
    print(f"lossless check: {'PASS, outputs identical' if same else 'FAIL, outputs differ'}")

    if args.budgets:
        budgets = sorted(set(args.budgets))
        table = acceptance_table(target, heads, prompts, budgets=budgets, topk=args.topk,
                                 max_new_tokens=args.table_tokens, chain_head="head_causal")
        print(f"\nmean accepted length per round vs budget (topk {args.topk}; chain: topk 1, "
              f"depth = budget - 1 up to {head.block_size - 1}), {len(prompts)} prompts x "
              f"{args.table_tokens} tokens")
        print(f"{'drafter':14s}" + "".join(f"{b:>8d}" for b in budgets))
        for name, row in table.items():
            print(f"{name:14s}" + "".join(f"{row[str(b)]:8.2f}" for b in budgets))
        for path in _write_table(table, budgets, args.out):
            print(f"wrote {path}")
    return 0 if same else 1


def main(argv=None) -> int:
    """``python -m jetspec_kernels demo [--random-round] ...``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--random-round" in argv:
        argv.remove("--random-round")
        return random_round(argv)
    return tiny_demo(argv)
