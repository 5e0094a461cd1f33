"""End-to-end benchmark: speculative decoding (``generate``) vs autoregressive (``generate_ar``) on
the same target, per backend: tokens/s, their ratio, acceptance, and time per stage.

Rows per (config, backend): ``spec`` and ``ar`` (the baseline); ``x_ar`` on the spec row is the
tokens/s ratio (both emit the same number of tokens: no EOS is set). ``lossless`` is 1 when the
greedy speculative tokens equal the autoregressive ones. ``stage_*_ms`` are the loop's own stage
timers (total over the call; ``draft_step`` / ``verify_step`` when CUDA graphs are replayed).
Times are host wall clock with a device sync (the host work is part of what is measured).

Floor (weight streaming): bytes = forward passes * weight bytes (target layers + lm_head, plus
the head's for spec); FLOPs = 2 * target params * tokens the target processes (prompt + new
tokens for ar, prompt + rounds * budget for spec). Random models accept almost nothing, so on
them the ratio measures overhead; pass --target/--head checkpoint dirs for real numbers.

``--model moe`` benches a MoE target: random Qwen3-30B-A3B-shaped weights on CUDA (``tiny_moe``
on the CPU). Its floor counts the expert bytes a forward touches (model_setup.target_read_params:
k experts per token, all of them for a large verify tree or prompt), and its FLOPs the active
parameters per token.
"""
from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench import common as bc
from bench import model_setup as ms

BASELINES = ["ar"]
STAGES = ["prefill", "draft", "tree", "verify", "accept", "commit", "append", "emit",
          "draft_step", "verify_step", "decode"]
EXTRA = ["tokens_per_s", "mean_accept", "tokens_per_round", "lossless"] + [f"stage_{s}_ms" for s in STAGES]


def configs(opts: bc.Options):
    """(B, prompt length, new tokens, budget, topk) tuples and the model size."""
    moe = opts.args.model == "moe"
    if not opts.cuda:
        return [(2, 8, 8, 16, 4)], "tiny_moe" if moe else "tiny"
    size = "30b_a3b" if moe else "small"
    if opts.quick:
        return [(1, 128, 64, 64, 8), (4, 128, 64, 64, 8)], size
    return [(b, 512, 256, n, 8) for b, n in itertools.product((1, 4, 16), (64, 128, 256))], size


def main(argv=None) -> int:
    p = bc.parser(__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=sorted(bc.DTYPES), default=None,
                   help="model dtype (default bf16 on CUDA, fp32 on the CPU)")
    p.add_argument("--target", default=None, help="Qwen3 checkpoint dir")
    p.add_argument("--head", default=None, help="JetSpec draft-head checkpoint dir")
    p.add_argument("--algorithm", default="topn", choices=["topn", "accum_logp"])
    p.add_argument("--model", default="dense", choices=["dense", "moe"],
                   help="random target when no --target: dense Qwen3, or MoE (Qwen3-30B-A3B-shaped "
                        "on CUDA, tiny on the CPU)")
    opts = bc.options(p, argv)
    dtype = bc.DTYPES[opts.args.dtype or ("bf16" if opts.cuda else "fp32")]
    dev = opts.device
    ceil = bc.measure_ceilings(dev, torch.bfloat16 if opts.cuda else torch.float32, opts.quick)
    table = bc.Table("decode", opts, ceil, BASELINES, extra_columns=EXTRA)
    grid, size = configs(opts)
    status = bc.backend_status(opts)
    try:
        _, decode = ms.import_models()
        m = ms.build(dev, dtype, size=size, with_target=True, target_dir=opts.args.target,
                     head_dir=opts.args.head)
    except ms.ModelsUnavailable as ex:
        print(f"bench_decode: skipping: {ex}")
        for b, plen, new, budget, topk in grid:
            table.skip(f"B{b}/p{plen}/new{new}/n{budget}k{topk}", "all", str(ex))
        return table.finish()
    target, head = m.target, m.head
    tcfg = target.config
    table.header_lines.append(f"{m.label}: target {tcfg.num_hidden_layers} layers H {tcfg.hidden_size} "
                              f"V {tcfg.vocab_size}; head {head.config.num_hidden_layers} layers, block "
                              f"{head.block_size}; {str(dtype)[6:]}, greedy, {opts.args.algorithm}")
    if getattr(tcfg, "num_experts", 0):
        table.header_lines.append(f"MoE target: {tcfg.num_experts} experts, top-{tcfg.num_experts_per_tok}, "
                                  f"expert width {tcfg.moe_intermediate_size}; "
                                  f"{sum(map(tcfg.is_sparse, range(tcfg.num_hidden_layers)))} sparse layers")
    e = bc.elt(dtype)
    _, head_lin, _ = ms.head_param_counts(head)
    w_head = (head_lin + head.fc_weight.numel()) * e
    p_target = ms.target_active_params(target) + target.lm_head_weight.numel()

    def w_target(tokens):        # bytes one target forward over `tokens` tokens reads
        return ms.target_read_params(target, tokens) * e
    gen = torch.Generator().manual_seed(0)

    for b, plen, new, budget, topk in grid:
        prompts = [torch.randint(0, tcfg.vocab_size, (plen - i,), generator=gen).tolist() for i in range(b)]
        for name, why in status.items():
            shape = f"B{b}/p{plen}/new{new}/n{budget}k{topk}/{name}"
            if why is not None:
                for row in ("spec", "ar"):
                    table.skip(shape, row, why)
                continue
            if bc.interpreted(name, dev):
                for row in ("spec", "ar"):
                    table.skip(shape, row, "Triton interpreter: whole decoding runs are too slow "
                               "for a quick run")
                continue
            kw = dict(max_new_tokens=new)
            results = {}
            for row, fn in (("ar", lambda: decode.generate_ar(target, prompts, **kw)),
                            ("spec", lambda: decode.generate(target, head, prompts, budget=budget,
                                                             topk=topk, algorithm=opts.args.algorithm,
                                                             **kw))):
                def call(row=row, fn=fn):
                    with bc.using_backend(name):
                        results[row] = fn()
                try:
                    secs = bc.wall_time(call, dev, reps=1 if not opts.cuda else 3)
                except Exception as ex:
                    table.add(shape, row, None, flops=0.0, nbytes=0.0, status="error",
                              note=f"{type(ex).__name__}: {ex}"[:300])
                    continue
                st = results[row].stats
                passes = st.rounds + 1
                if row == "ar":
                    nbytes = w_target(b * plen) + st.rounds * w_target(b)
                    tokens = b * plen + st.new_tokens
                else:
                    nbytes = w_target(b * plen) + st.rounds * w_target(b * budget) + passes * w_head
                    tokens = b * plen + st.rounds * b * budget
                stages = {f"stage_{k}_ms": v * 1e3 for k, v in st.stage_seconds.items()}
                table.add(shape, row, secs, flops=2.0 * p_target * tokens, nbytes=float(nbytes),
                          tokens_per_s=st.new_tokens / secs, mean_accept=float(st.mean_accept),
                          tokens_per_round=float(st.tokens_per_round),
                          **{k: stages.get(k, math.nan) for k in EXTRA if k.startswith("stage_")})
            if "ar" in results and "spec" in results:
                same = float(results["ar"].tokens == results["spec"].tokens)
                for r in table.rows:
                    if r["shape"] == shape and r["status"] == "ok":
                        r["lossless"] = same
    return table.finish()


if __name__ == "__main__":
    bc.main_guard(main)
