"""``python -m jetspec_kernels generate``: speculative decoding with real (or built-in tiny) models.

Examples::

    python -m jetspec_kernels generate --target Qwen3-8B/ --head JetSpec-Qwen3-8B/ \\
        --prompt "The capital of France is" --max-new-tokens 64 --budget 128 --device cuda
    python -m jetspec_kernels generate --tiny --prompt "1 2 3" --max-new-tokens 16

Prompts are text when the target directory has a ``tokenizer.json`` and the ``tokenizers``
package is installed (the output is then printed as text); otherwise they are token ids
separated by spaces or commas, and ids are printed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jetspec_kernels generate",
                                description="JetSpec speculative decoding with a Qwen3 target and "
                                            "a draft head.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--target", help="Hugging Face Qwen3 checkpoint directory")
    src.add_argument("--tiny", action="store_true", help="use the built-in tiny random models")
    p.add_argument("--head", help="JetSpec / DFlash draft-head checkpoint directory (with --target)")
    p.add_argument("--prompt", action="append", required=True,
                   help="a prompt (repeat for a batch): text with a tokenizer, else token ids")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--budget", type=int, default=64, help="tree nodes per round (root included)")
    p.add_argument("--topk", type=int, default=8, help="children per tree node")
    p.add_argument("--algorithm", choices=("topn", "accum_logp"), default="topn")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eos", type=int, action="append",
                   help="EOS token id (repeatable); default: eos_token_id of the target's "
                        "generation_config.json, else of its config.json")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", choices=("auto", "cuda", "triton", "reference"), default=None)
    p.add_argument("--page-size", type=int, default=None, help="use paged KV caches")
    p.add_argument("--ar", action="store_true", help="also run the autoregressive baseline and compare")
    p.add_argument("--token-ids", action="store_true",
                   help="treat prompts as token ids even with a tokenizer")
    return p


def _load_tokenizer(target_dir: str | None):
    """A ``tokenizers.Tokenizer`` from ``target_dir/tokenizer.json``, or None."""
    if target_dir is None or not os.path.isfile(os.path.join(target_dir, "tokenizer.json")):
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("note: tokenizer.json found but the 'tokenizers' package is not installed; "
              "prompts are token ids", file=sys.stderr)
        return None
    return Tokenizer.from_file(os.path.join(target_dir, "tokenizer.json"))


def _parse_ids(prompt: str) -> list[int]:
    try:
        return [int(tok) for tok in prompt.replace(",", " ").split()]
    except ValueError:
        raise SystemExit(f"error: prompt {prompt!r} is not a list of token ids (no tokenizer: "
                         "give ids separated by spaces, or a target directory with tokenizer.json)")


def _default_eos(target_dir: str | None, target):
    """EOS ids from ``generation_config.json`` when present (chat models list several there),
    else from the target's config.json."""
    if target_dir is not None and os.path.isfile(os.path.join(target_dir, "generation_config.json")):
        with open(os.path.join(target_dir, "generation_config.json")) as f:
            eos = json.load(f).get("eos_token_id")
        if eos is not None:
            return eos
    return target.config.eos_token_id


def _format_stats(name: str, stats) -> str:
    stages = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in stats.stage_seconds.items())
    line = (f"[{name}] {stats.new_tokens} tokens in {stats.seconds:.3f} s "
            f"({stats.tokens_per_s:.1f} tok/s), {stats.rounds} rounds")
    if name == "jetspec":
        line += (f", mean accepted {stats.mean_accept:.2f}, tokens/round {stats.tokens_per_round:.2f}, "
                 f"accept histogram {stats.accept_histogram}")
    return line + f"\n  stages: {stages}"


def main(argv=None) -> int:
    """Run the CLI; returns the process exit status."""
    args = _parser().parse_args(argv)
    import jetspec_kernels as jk
    from .decode import generate, generate_ar
    from .models import DraftHead, Qwen3, tiny_models

    if args.backend is not None:
        jk.set_backend(args.backend)
    dtype = DTYPES[args.dtype]
    if args.tiny:
        target, head = tiny_models(dtype=dtype, device=args.device)
    else:
        if not args.head:
            raise SystemExit("error: --head is required with --target")
        target = Qwen3.from_pretrained(args.target, dtype=dtype, device=args.device)
        head = DraftHead.from_pretrained(args.head, dtype=dtype, device=args.device)

    tokenizer = None if (args.tiny or args.token_ids) else _load_tokenizer(args.target)
    if tokenizer is not None:
        prompts = [tokenizer.encode(p).ids for p in args.prompt]
    else:
        prompts = [_parse_ids(p) for p in args.prompt]
    eos = args.eos if args.eos else _default_eos(None if args.tiny else args.target, target)

    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, eos_token_id=eos,
              seed=args.seed, page_size=args.page_size)
    out = generate(target, head, prompts, budget=args.budget, topk=args.topk, algorithm=args.algorithm, **kw)
    for i, toks in enumerate(out.tokens):
        text = tokenizer.decode(toks) if tokenizer is not None else " ".join(map(str, toks))
        print(f"--- prompt {i}: {args.prompt[i]!r}\n{text}")
    print(_format_stats("jetspec", out.stats))
    if args.ar:
        base = generate_ar(target, prompts, **kw)
        print(_format_stats("autoregressive", base.stats))
        if args.temperature == 0.0:
            same = base.tokens == out.tokens
            print(f"greedy outputs {'match' if same else 'DIFFER'}; speed-up "
                  f"{base.stats.seconds / out.stats.seconds:.2f}x")
            if not same:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
