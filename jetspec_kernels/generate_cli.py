"""``jetspec generate`` (also ``python -m jetspec_kernels generate``): speculative decoding.

Examples::

    jetspec generate --tiny --prompt "def f(x):" --max-new-tokens 48
    jetspec generate --target Qwen3-8B/ --head JetSpec-Qwen3-8B/ --prompt "The capital of France is" \\
        --max-new-tokens 64 --budget 128 --dtype bfloat16 --device cuda --ar
    jetspec generate --random-tiny --prompt "1 2 3" --max-new-tokens 16

``--tiny`` loads the shipped trained tiny byte-level target and its causal head
(``jetspec_kernels/assets/tiny``): prompts are text and the continuation is printed as text.
With ``--target``, prompts are text when the target directory has a ``tokenizer.json`` and the
``tokenizers`` package is installed, else token ids separated by spaces or commas (ids are then
printed). ``--random-tiny`` uses small random models and token ids. ``--token-ids`` makes prompts
token ids (and the output ids) in every mode.

Tensor parallelism: ``torchrun --nproc-per-node N -m jetspec_kernels generate --tp N ...`` splits
the models over the N processes (gloo on the CPU, NCCL on CUDA, each rank on ``cuda:LOCAL_RANK``);
rank 0 alone prints. A ``--tp`` that is not the number of processes, or that does not divide the
models' heads, is a usage error.

Bad input (an option out of range, a missing or unsupported checkpoint, a head that does not fit
the target, a token id outside the vocabulary) prints one line ``jetspec: error: ...`` to stderr
and exits with status 2.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import platform
import re
import sys
import time
from datetime import timedelta

import torch

from .adaptive.cost_cache import (cache_dir, checkpoint_identity, config_identity, cost_file,
                                  load_costs, store_costs)
from .cli_common import PROG, Parser, UsageError, int_at_least, report  # noqa: F401 (re-exported)
from .limits import EXACT_GEMM_TILES, MAX_BUDGET

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BUDGET_FORMAT = (f"an int in [1, {MAX_BUDGET}], 'auto', or comma-separated sizes in [1, {MAX_BUDGET}] "
                 "like 8,16,32")


def _budget(text: str):
    """``--budget``: a tree size, ``auto``, or comma-separated candidate sizes (``8,16,32``); every
    bad value gets the one message naming all three forms."""
    if text.strip() == "auto":
        return "auto"
    parts = text.split(",")
    try:
        sizes = [int(part) for part in parts]
    except ValueError:
        sizes = []
    if not sizes or not all(1 <= n <= MAX_BUDGET for n in sizes):
        raise argparse.ArgumentTypeError(f"must be {BUDGET_FORMAT}, got {text!r}")
    return sizes[0] if len(parts) == 1 else sizes


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0 = greedy), got {text!r}")
    return value


def _top_p(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1] (1 = off), got {text!r}")
    return value


def _parser() -> Parser:
    p = Parser(prog=f"{PROG} generate", description="JetSpec speculative decoding with a Qwen3 "
               "target and a draft head.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--target", help="Hugging Face Qwen3, Qwen3-MoE or Qwen3.5 / Qwen3.6 (hybrid) "
                     "checkpoint directory (with --head)")
    src.add_argument("--tiny", action="store_true",
                     help="the shipped trained tiny byte-level target and causal head (text prompts)")
    src.add_argument("--random-tiny", action="store_true",
                     help="small random untrained models (token-id prompts; for tests)")
    p.add_argument("--head", help="JetSpec / DFlash draft-head checkpoint directory (with --target)")
    p.add_argument("--prompt", action="append", required=True,
                   help="a prompt (repeat for a batch): text with a tokenizer, else token ids")
    p.add_argument("--max-new-tokens", type=int_at_least(1), default=64)
    p.add_argument("--budget", type=_budget, default=64,
                   help="tree nodes per round (root included); 'auto' or sizes like 8,16,32: each "
                        "round picks its size from the draft's confidence and the measured round "
                        "costs, kept on disk (see --no-cache)")
    p.add_argument("--no-cache", action="store_true",
                   help="with an adaptive --budget: measure the round costs again instead of "
                        "reading them from $XDG_CACHE_HOME/jetspec_kernels (else "
                        "~/.cache/jetspec_kernels), and store the new ones")
    p.add_argument("--topk", type=int_at_least(1), default=8, help="children per tree node")
    p.add_argument("--algorithm", choices=("topn", "accum_logp"), default="topn")
    p.add_argument("--temperature", type=_temperature, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int_at_least(0), default=0,
                   help="sample among the k most likely tokens (0 = off; with --temperature > 0)")
    p.add_argument("--top-p", type=_top_p, default=1.0,
                   help="then among the smallest set of probability >= p (1 = off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eos", type=int, action="append",
                   help="EOS token id (repeatable); default: eos_token_id of the target's "
                        "generation_config.json, else of its config.json")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", choices=("auto", "cuda", "triton", "reference"), default=None)
    p.add_argument("--page-size", type=int_at_least(1), default=None, help="use paged KV caches")
    p.add_argument("--ar", action="store_true", help="also run the autoregressive baseline and compare")
    p.add_argument("--exact", action="store_true",
                   help="exact mode: the verify pass's rows are the same bits as autoregressive "
                        "decoding's, so greedy output equals the baseline's bit for bit (the "
                        "reference backend on the CPU, or --backend triton)")
    p.add_argument("--exact-tile", choices=EXACT_GEMM_TILES, default=None,
                   help="with --exact: the exact GEMM tile on triton (narrow for small batches, "
                        "the default; wide for large ones); speculative and --ar runs share it. "
                        "The reference backend computes every row alone: no tile there")
    p.add_argument("--exact-k-parts", type=int_at_least(1), default=None,
                   help="with --exact: K of the row-parallel GEMMs (o_proj, down) in this many "
                        "fixed parts (a power of two that --tp divides): every --tp dividing it "
                        "gives the same bits, --tp 1 included (default: --tp parts, so each tp's "
                        "bits are its own)")
    p.add_argument("--token-ids", action="store_true",
                   help="prompts (and the printed output) are token ids even with a tokenizer")
    p.add_argument("--tp", type=int_at_least(1), default=1,
                   help="tensor-parallel ranks: run under torchrun --nproc-per-node N (gloo on "
                        "cpu, NCCL on cuda); rank 0 prints")
    return p


def parse_device(text: str) -> torch.device:
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {text!r} is not a device (cpu, cuda, cuda:N)") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageError(f"--device {text}: no CUDA device is available")
        if dev.index is not None and dev.index >= count:
            raise UsageError(f"--device {text}: there are {count} CUDA devices")
    elif dev.type != "cpu":
        raise UsageError(f"--device {text}: only cpu and cuda devices are supported")
    return dev


def _load_tokenizer(target_dir: str | None):
    """``(encode: text -> ids, decode: ids -> text)`` from ``target_dir/tokenizer.json``, or None."""
    if target_dir is None or not os.path.isfile(os.path.join(target_dir, "tokenizer.json")):
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("note: tokenizer.json found but the 'tokenizers' package is not installed; "
              "prompts are token ids", file=sys.stderr)
        return None
    try:
        tok = Tokenizer.from_file(os.path.join(target_dir, "tokenizer.json"))
    except Exception as e:   # tokenizers raises its own exception type for a malformed file
        raise UsageError(f"--target {target_dir}: tokenizer.json cannot be read: {e}") from None
    return (lambda text: tok.encode(text).ids), tok.decode


def _parse_ids(prompt: str, i: int) -> list[int]:
    try:
        return [int(tok) for tok in prompt.replace(",", " ").split()]
    except ValueError:
        raise UsageError(f"--prompt {i + 1} ({prompt!r}) is not a list of token ids (give ids "
                         "separated by spaces, use --tiny for text, or a --target directory "
                         "with tokenizer.json)") from None


def _default_eos(target_dir: str | None, target):
    """EOS ids from ``generation_config.json`` when present (chat models list several there),
    else from the target's config.json."""
    path = None if target_dir is None else os.path.join(target_dir, "generation_config.json")
    if path is not None and os.path.isfile(path):
        try:
            with open(path) as f:
                eos = json.load(f).get("eos_token_id")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise UsageError(f"--target {target_dir}: generation_config.json cannot be read: "
                             f"{e}") from None
        if eos is not None:
            return eos
    return target.config.eos_token_id


def _load(cls, option: str, path: str, dtype, device, shard):
    """``cls.from_pretrained(path)`` split over ``shard``; a bad checkpoint is a usage error naming
    ``option``, a tp the model cannot be split by one naming ``--tp``."""
    from .models import CheckpointError
    try:
        return cls.from_pretrained(path, dtype=dtype, device=device, group=shard)
    except CheckpointError as e:
        raise UsageError(f"{option}: {e}") from None
    except ValueError as e:
        raise UsageError(f"--tp {shard.size}: {e}") from None


def _load_models(args, dtype, device, shard):
    """(target, head, codec: (encode, decode) or None, directory for the default EOS or None,
    what identifies the weights: a dict for the round-cost cache)."""
    from .models import DraftHead, tiny_models
    from .models.target import Target

    if args.head is not None and args.target is None:
        raise UsageError("--head is only used with --target")
    if args.random_tiny:
        try:
            target, head = tiny_models(dtype=dtype, device=device, group=shard)
        except ValueError as e:
            raise UsageError(f"--tp {shard.size}: {e}") from None
        return target, head, None, None, {"random_tiny": "tiny_models(seed=0)"}
    if args.tiny:
        from .models.assets import TINY_DIR
        from .models.byte_tokenizer import decode, encode
        target_dir, head_dir = os.path.join(TINY_DIR, "target"), os.path.join(TINY_DIR, "head_causal")
        codec = encode, decode
    else:
        if args.head is None:
            raise UsageError("--head is required with --target")
        target_dir, head_dir = args.target, args.head
        codec = _load_tokenizer(target_dir)
    target = _load(Target, "--target", target_dir, dtype, device, shard)
    head = _load(DraftHead, "--head", head_dir, dtype, device, shard)
    identity = {"target": checkpoint_identity(target_dir), "head": checkpoint_identity(head_dir)}
    return target, head, codec, target_dir, identity


# generate's argument names -> the options they come from (for its ValueErrors).
_OPTION_OF = {"budget": "--budget", "topk": "--topk", "algorithm": "--algorithm",
              "temperature": "--temperature", "max_new_tokens": "--max-new-tokens",
              "eos_token_id": "--eos", "seed": "--seed", "page_size": "--page-size",
              "prompt_ids": "--prompt", "head": "--head", "top_k": "--top-k", "top_p": "--top-p",
              "group": "--tp"}


def _as_option_error(e: Exception, eos_given: bool) -> UsageError:
    """``e`` from check_generate_args, prefixed with the option its argument came from."""
    name = re.match(r"\w+", str(e))
    name = name.group(0) if name else None
    if name == "eos_token_id" and not eos_given:
        return UsageError(f"the target's default eos_token_id (override it with --eos): {e}")
    option, message = _OPTION_OF.get(name), str(e)
    if option is None:
        return UsageError(message)
    return UsageError(f"{option}: {message.removeprefix(name + ': ')}")


def _format_stats(name: str, stats) -> str:
    stages = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in stats.stage_seconds.items())
    line = (f"[{name}] {stats.new_tokens} tokens in {stats.seconds:.3f} s "
            f"({stats.tokens_per_s:.1f} tok/s), {stats.rounds} rounds"
            + (f", tp {stats.tp}" if stats.tp > 1 else ""))
    if name == "jetspec":
        line += (f", mean accepted {stats.mean_accept:.2f}, tokens/round {stats.tokens_per_round:.2f}, "
                 f"accept histogram {stats.accept_histogram}")
    return line + f"\n  stages: {stages}"


def _launched_rank() -> int:
    """This process's rank as torchrun set it (``RANK``; 0 when not launched by it)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _start_tp(tp_size: int, device: torch.device):
    """``(shard, device)`` for ``--tp``: alone for 1; else the default process group of the
    torchrun launch (initialised here: gloo on the CPU, NCCL on CUDA with each rank on
    ``cuda:LOCAL_RANK``). A ``--tp`` that is not WORLD_SIZE is a usage error."""
    import torch.distributed as dist

    from . import tp
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        world = 1
    if tp_size != world:
        raise UsageError(f"--tp {tp_size} needs exactly {tp_size} processes (run under torchrun "
                         f"--nproc-per-node {tp_size}); this launch has WORLD_SIZE={world}")
    if tp_size == 1:
        return tp.ALONE, device
    if device.type == "cuda":
        if device.index is not None:
            raise UsageError(f"--device {device}: with --tp give 'cuda' (rank r runs on "
                             "cuda:LOCAL_RANK)")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(minutes=10))
    return tp.shard_of(dist.group.WORLD), device


def main(argv=None) -> int:
    """Run the CLI; returns the process exit status (2 for bad input, 1 if greedy outputs differ).
    Under torchrun, only rank 0 prints (its output and its errors)."""
    import jetspec_kernels as jk
    previous = jk.get_backend()
    quiet = _launched_rank() != 0
    try:
        with contextlib.ExitStack() as stack:
            if quiet:
                stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
            return _run(_parser().parse_args(argv))
    except UsageError as e:
        return 2 if quiet else report(str(e))
    finally:
        jk.set_backend(previous)


def _run(args) -> int:
    import torch.distributed as dist

    owned = not (dist.is_available() and dist.is_initialized())
    shard, device = _start_tp(args.tp, parse_device(args.device))
    try:
        return _decode(args, shard, device)
    finally:
        if owned and shard.parallel:
            dist.destroy_process_group()


def _device_name(device: torch.device) -> str:
    """The device's model, which the round costs depend on (CPU: its model name and threads)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    return f"cpu {model}, {torch.get_num_threads()} threads"


def _cost_key(args, target, head, prompts, device, shard, identity, sizes) -> dict:
    """Everything that changes the time of a round of this decode (the disk cache's key)."""
    import jetspec_kernels as jk
    from . import backend as _backend

    backends = [_backend.resolve(device),
                *(_backend.resolve(device, fn=fn) for fn in _backend.REFERENCE_UNTIL_VERIFIED),
                target.fused_ops_backend, head.fused_ops_backend]
    return {"package": jk.__version__, "torch": torch.__version__, "weights": identity,
            "target_config": config_identity(target.config),
            "head_config": config_identity(head.config), "device": _device_name(device),
            "dtype": args.dtype, "batch": len(prompts), "sizes": list(sizes), "topk": args.topk,
            "greedy": args.temperature == 0.0, "page_size": args.page_size, "tp": shard.size,
            "tp_rank": shard.rank, "backends": backends,
            "exact": ([target.exact_gemm_tile, getattr(target, "exact_k_parts", None)]
                      if args.exact else False)}


def _round_costs(args, target, head, prompts, device, shard, identity, spec, kw):
    """The cost model of an adaptive ``--budget``: read from the disk cache, else (and with
    ``--no-cache``) measured and stored; prints the sizes and their costs."""
    from .adaptive.budget import parse_budget
    from .decode import measure_round_costs
    from .ops.exact import exact_scope

    sizes, _ = parse_budget(args.budget, topk=args.topk, depth=head.block_size - 1)
    key = _cost_key(args, target, head, prompts, device, shard, identity, sizes)
    directory = cache_dir()
    path = cost_file(key, directory)
    model = None if args.no_cache else load_costs(key, directory)
    if model is not None:
        source = f"read from {path} (--no-cache measures them again)"
    else:
        print(f"[budget] measuring the round costs of tree sizes {', '.join(map(str, sizes))} "
              "(once for these models, device, dtype and batch) ...", flush=True)
        start = time.perf_counter()
        with exact_scope(args.exact, device, target.fused_ops_backend):  # the rounds that will run
            model = measure_round_costs(target, head, prompts, sizes, topk=args.topk,
                                        temperature=kw["temperature"], top_k=kw["top_k"],
                                        top_p=kw["top_p"], seed=kw["seed"],
                                        page_size=kw["page_size"], group=shard)
        try:
            store_costs(key, model, directory)
            kept = f"kept in {path}"
        except OSError as e:
            kept = f"not kept: {e}"
        source = f"measured in {time.perf_counter() - start:.1f} s, {kept}"
    print(f"[budget] round costs {source}: "
          + ", ".join(f"{n}: {model(n) * 1e3:.3g} ms" for n in sizes))
    return model


def _decode(args, shard, device) -> int:
    import jetspec_kernels as jk
    from .decode import check_generate_args, generate, generate_ar
    from .ops.exact import ExactModeError

    if args.backend is not None:
        jk.set_backend(args.backend)
        reason = None if args.backend == "auto" else jk.available_backends(device)[args.backend]
        if reason is not None:
            raise UsageError(f"--backend {args.backend}: not available on {device}: {reason}")
    for flag, value in (("--exact-tile", args.exact_tile), ("--exact-k-parts", args.exact_k_parts)):
        if value and not args.exact:
            raise UsageError(f"{flag} needs --exact")
    target, head, codec, target_dir, identity = _load_models(args, DTYPES[args.dtype], device, shard)
    if args.exact_tile:
        target.exact_gemm_tile = args.exact_tile
    if args.exact_k_parts:
        target.exact_k_parts = args.exact_k_parts
        try:
            target.resolved_exact_k_parts()
        except (ValueError, ExactModeError) as e:
            raise UsageError(f"--exact-k-parts: {e}") from None
    if args.token_ids:
        codec = None
    if codec is not None:
        prompts = [codec[0](p) for p in args.prompt]
    else:
        prompts = [_parse_ids(p, i) for i, p in enumerate(args.prompt)]
    eos = args.eos if args.eos else _default_eos(target_dir, target)

    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, eos_token_id=eos,
              seed=args.seed, page_size=args.page_size, top_k=args.top_k, top_p=args.top_p,
              group=shard)
    spec = dict(budget=args.budget, topk=args.topk, algorithm=args.algorithm)
    try:
        check_generate_args(target, head, prompts, **spec, **kw)
    except (TypeError, ValueError) as e:
        raise _as_option_error(e, bool(args.eos)) from None
    try:
        if not isinstance(args.budget, int):
            spec["cost_model"] = _round_costs(args, target, head, prompts, device, shard,
                                              identity, spec, kw)
        out = generate(target, head, prompts, **spec, **kw, exact=args.exact)
        base = generate_ar(target, prompts, **kw, exact=args.exact) if args.ar else None
    except jk.BackendUnavailableError as e:
        raise UsageError(f"--backend {args.backend or jk.get_backend()}: {e}") from None
    except ExactModeError as e:
        raise UsageError(f"--exact: {e}") from None
    for i, toks in enumerate(out.tokens):
        text = codec[1](toks) if codec is not None else " ".join(map(str, toks))
        print(f"--- prompt {i}: {args.prompt[i]!r}\n{text}")
    print(_format_stats("jetspec", out.stats))
    if out.stats.budget_sizes and not isinstance(args.budget, int):
        chosen = collections.Counter(out.stats.budget_sizes)
        print("  tree sizes chosen: " + ", ".join(f"{n} in {chosen[n]} rounds" for n in sorted(chosen)))
    if base is not None:
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
