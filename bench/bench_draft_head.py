"""Benchmark the draft stage: the draft head's cached per-round forward plus the fused tree, and
the fused lm_head + top-K (``draft_tree_from_hidden``) alone.

Row groups per (B, T = context rows) shape:
  ``.../round``  per backend: ``head.draft_hidden`` over a context already in the draft KV cache,
      then ``draft_tree_from_hidden`` (fused: no [B, S-1, V] logits in memory; the cuda
      backend, which has no fused hidden top-K, writes them by cuBLAS, its GEMM method). Baseline
      ``published``: ``head.draft_logits`` from scratch (fc and every layer's K/V over all T
      context rows, then the lm_head) plus the host tree path, as the published drafter does.
      Rows ``<backend>:torch_ops`` run the same with the head's fused layer ops (rms_norm,
      silu_mul) as torch ops (``head.fused_ops_backend = "reference"``: what ``auto`` runs on a
      GPU until a GPU backend of each passes there), against the plain rows' fused kernels on
      that backend: the launches they save.
      Floor (ours): bytes = head layer weights + lm_head + context K/V (2*layers*B*(T+S)*Hkv*Dh)
      + block embeddings, all * elt; FLOPs = 2*layer_params*B*S + 4*layers*B*S*(T+S)*Hq*Dh
      + 2*B*(S-1)*V*H. The baseline's floor adds fc, the taps and the context K/V projections.
  ``.../lm_head_topk``  ``draft_tree_from_hidden`` per backend against ``unfused`` (F.linear to
      logits, log_softmax in fp32, topk). Floor: bytes = (V*H + B*D*H)*elt, FLOPs = 2*B*D*V*H.
Models: random (bench/model_setup.py) unless --target/--head give checkpoint directories.
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from bench import common as bc
from bench import model_setup as ms
from bench.bench_draft_tree import host_tree

BASELINES = ["published", "unfused"]


def shapes(opts: bc.Options):
    """(B, T) pairs, model size, (budget, topk)."""
    if not opts.cuda:
        return [(1, 16), (2, 32)], "tiny", (16, 4)
    if opts.quick:
        return [(1, 1024), (16, 1024)], "8b", (128, 8)
    return list(itertools.product((1, 4, 16), (1024, 4096))), "8b", (128, 8)


def main(argv=None) -> int:
    p = bc.parser(__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=sorted(bc.DTYPES), default=None,
                   help="weights dtype (default bf16 on CUDA, fp32 on the CPU)")
    p.add_argument("--target", default=None, help="Qwen3 checkpoint dir (embedding and lm_head)")
    p.add_argument("--head", default=None, help="JetSpec draft-head checkpoint dir")
    opts = bc.options(p, argv)
    dtype = bc.DTYPES[opts.args.dtype or ("bf16" if opts.cuda else "fp32")]
    dev = opts.device
    import jetspec_kernels as jk

    ceil = bc.measure_ceilings(dev, torch.bfloat16 if opts.cuda else torch.float32, opts.quick)
    table = bc.Table("draft_head", opts, ceil, BASELINES, stream=True)
    grid, size, (budget, topk) = shapes(opts)
    status = bc.backend_status(opts)
    usable = [n for n, why in status.items() if why is None and not bc.interpreted(n, dev)]
    e = bc.elt(dtype)
    gen = torch.Generator(device=dev).manual_seed(0)
    try:
        m = ms.build(dev, dtype, size=size, with_target=False, target_dir=opts.args.target,
                     head_dir=opts.args.head)
    except ms.ModelsUnavailable as ex:
        print(f"bench_draft_head: skipping the head forward: {ex}")
        m = None
    if m is not None:
        cfg = m.head.config
        table.header_lines.append(
            f"{m.label}: H {cfg.hidden_size}, {cfg.num_hidden_layers} layers, block {cfg.block_size}, "
            f"V {m.lm_head_weight.shape[0]}; tree budget {budget}, topk {topk}; "
            f"{str(dtype)[6:]}; shape = BxT/<group>")
        v, h = m.lm_head_weight.shape
    else:
        v, h = (97, 64) if not opts.cuda else (151936, 4096)
    lm_head = m.lm_head_weight if m is not None else \
        (torch.randn(v, h, device=dev, generator=gen) / h ** 0.5).to(dtype)

    for si, (b, t) in enumerate(grid):
        if m is not None:
            _round(table, opts, m, status, usable, b, t, budget, topk, e, gen, si)
        else:
            table.skip(f"{b}x{t}/round", "all", "jetspec_kernels.models is not importable")
        d = m.head.config.block_size - 1 if m is not None else 15
        shape = f"{b}x{t}/lm_head_topk"
        hidden = torch.randn(b, d, h, device=dev, generator=gen).to(dtype)
        root = torch.randint(0, v, (b,), device=dev, dtype=torch.int32, generator=gen)
        flops, nbytes = 2.0 * b * d * v * h, float((v * h + b * d * h) * e)
        table.run(shape, "unfused",
                  lambda: torch.log_softmax(F.linear(hidden, lm_head).float(), -1).topk(topk, -1),
                  flops=flops, nbytes=nbytes)
        for name, why in status.items():
            table.run_ours(shape, name, why,
                           lambda name=name: jk.draft_tree_from_hidden(
                               hidden, lm_head, root, budget=budget, topk=topk, backend=name),
                           first_shape=si == 0, flops=flops, nbytes=nbytes)
    return table.finish()


def _round(table, opts, m, status, usable, b, t, budget, topk, e, gen, si):
    import jetspec_kernels as jk

    dev = opts.device
    head, cfg = m.head, m.head.config
    s, layers = cfg.block_size, cfg.num_hidden_layers
    hq, hkv, dh, hid = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
    v = m.lm_head_weight.shape[0]
    width = head.fc_weight.shape[1]
    fc, lin, kv = ms.head_param_counts(head)
    shape = f"{b}x{t}/round"
    taps = torch.randn(b, t, width, device=dev, generator=gen).to(head.dtype)
    anchor = torch.randint(0, v, (b,), device=dev, dtype=torch.int32, generator=gen)
    attn = 4.0 * layers * b * s * (t + s) * hq * dh
    flops = 2.0 * lin * b * s + attn + 2.0 * b * (s - 1) * v * hid
    nbytes = float((lin + v * hid + 2 * layers * b * (t + s) * hkv * dh + b * s * hid) * e)
    base_flops = flops + 2.0 * (fc + kv) * b * t
    base_bytes = nbytes + float((fc + b * t * width) * e)

    for name, why in status.items():
        if why is not None:
            table.skip(shape, name, why, flops=flops, nbytes=nbytes)
            continue
        if bc.interpreted(name, dev):
            table.skip(shape, name, "Triton interpreter: a whole model forward is too slow for "
                       "a quick run", flops=flops, nbytes=nbytes)
            continue
        try:
            with bc.using_backend(name):
                state = head.new_state(b, t + s)
                head.append_context(state, taps, torch.full((b,), t, dtype=torch.int32, device=dev))
        except Exception as ex:
            table.add(shape, name, None, flops=flops, nbytes=nbytes, status="error",
                      note=f"context append failed: {type(ex).__name__}: {ex}"[:300])
            continue

        def ours(name=name, state=state, fused_ops=None):
            with bc.using_backend(name):
                head.fused_ops_backend = fused_ops
                try:
                    hidden = head.draft_hidden(state, anchor, m.embed_weight)
                finally:
                    head.fused_ops_backend = None
                return jk.draft_tree_from_hidden(hidden, m.lm_head_weight, anchor, budget=budget,
                                                 topk=topk)
        table.run(shape, name, ours, flops=flops, nbytes=nbytes)
        table.run(shape, f"{name}:torch_ops", lambda ours=ours: ours(fused_ops="reference"),
                  flops=flops, nbytes=nbytes)

    # The baseline last: a device_check step cut by its limit keeps our rows first.
    def published(name):
        with bc.using_backend(name):
            logits = head.draft_logits(taps, anchor, embed_weight=m.embed_weight,
                                       lm_head_weight=m.lm_head_weight)
        return host_tree(logits, anchor, budget, topk)

    # The baseline's model ops run on the first backend that has them all.
    runs_on, why_not = None, "no backend runs the model ops here at speed"
    for name in usable:
        try:
            published(name)
            runs_on = name
            break
        except Exception as ex:
            why_not = f"{name}: {type(ex).__name__}: {ex}"[:300]
    if runs_on is not None:
        table.run(shape, "published", lambda: published(runs_on), flops=base_flops,
                  nbytes=base_bytes, note=f"model ops on the {runs_on} backend")
    else:
        table.skip(shape, "published", why_not, flops=base_flops, nbytes=base_bytes)


if __name__ == "__main__":
    bc.main_guard(main)
