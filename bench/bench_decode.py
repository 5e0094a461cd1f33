"""Decoding round bench: one speculative round and one autoregressive step of the same target,
graph-replayed, against their floors, per (batch, prompt, budget).

On CUDA: random bf16 weights of Qwen3-8B's shape with a 5-layer JetSpec head (``--model moe``:
Qwen3-30B-A3B's shape), B 1/4/16 (MoE 1/16), budgets 64/16/256, prompts 512 and 8192, in that
priority order (B1, budget 64, prompt 512 first: the issue's headline config). Per (batch,
prompt) one chunked prefill (bench/decode_round.py) serves every budget and the AR baseline.
Per config:
  - the library's round (decode's draft graph + verify graph, what ``generate`` replays), its
    first round eager (Triton compiles every shape there, before any timing), then timed replays
    with CUDA events (``median_us``) and the host's wall time per round including the one host
    sync (``round_wall_ms``);
  - the same round cut into a graph per stage (draft, verify, accept_commit), replayed with
    events between them (``*_ms``; they sum to a little more than the round: launch gaps);
  - host reads per round (``host_syncs_per_round``, decode_round.HostReads; must be 1) and, at
    budget 64, the GPU's busy fraction over a few rounds (torch.profiler kernel time / wall);
  - floors and predictions (bench/decode_costs.py, from the configs: weights, KV cache, lm_heads,
    attention FLOPs), and tokens/s projected at the JetSpec paper's accepted lengths beside the
    published JetSpec engine and our own graph-captured AR step.
Rows: ``prefill`` and ``ar`` per (batch, prompt), ``spec`` per config; ``skip`` rows say why a
config did not run (memory, deadline); rows are appended to the CSV as they finish.

On the CPU (``--quick``; tests): the tiny models in fp32, the reference backend, eager.
Random models accept almost nothing (``tokens_per_round`` about 1): the rows time the machinery at
real shapes; acceptance comes from the paper's numbers. ``--predict`` prints the prediction
tables (no device needed). Exit status: 2 when a model cannot be built or loaded, 1 when a config
failed, else 0.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench import common as bc
from bench import decode_costs as dc
from bench import decode_round as dr
from bench import model_setup as ms
from jetspec_kernels.generate_cli import int_at_least
from jetspec_kernels.limits import EXACT_GEMM_TILES

BASELINES: list[str] = []
# JetSpec paper, Qwen3-8B on an H100: mean tokens emitted per round at a budget.
PAPER_TOKENS_PER_ROUND = {64: 7.42, 256: 10.76}
# The published JetSpec engine: tokens/s at tokens/round, one B200, budget 128.
ENGINE_TOK_S, ENGINE_TOKENS_PER_ROUND = 1150.0, 9.56
TOPK = 8
CPU_REPLAYS = 3           # the CPU runs check the machinery, not speed
# Rounds one config runs at most (first, timed, with the host sync, counted, profiled, split): the
# cache and output buffers are sized for them (a random head accepts ~0, a trained one up to S-1).
ROUNDS_PER_CONFIG = 1 + 3 * dc.MAX_REPLAYS + dc.COUNTED_ROUNDS + dc.PROFILED_ROUNDS + 2
EXTRA = ["jk_backend", "draft_ms", "verify_ms", "accept_commit_ms", "split_sum_ms", "round_wall_ms",
         "host_syncs_per_round", "gpu_busy", "tokens_per_round", "floor_ms", "pred_ms",
         "floor_draft_ms", "floor_verify_ms", "floor_accept_commit_ms", "paper_tokens_per_round",
         "tok_s_paper", "ar_tok_s", "x_ar_paper", "tok_s_at_engine_len", "x_engine", "mem_est_gb",
         "replays"]


class ConfigTimeout(RuntimeError):
    """A config ran past its own deadline."""


def plan(args, cuda: bool) -> tuple[str, list[dc.Config], int]:
    """(model size, configs in priority order, prefill chunk)."""
    moe = args.model == "moe"
    if not cuda:
        return ("tiny_moe" if moe else "tiny"), [dc.Config(2, 24, 16), dc.Config(2, 24, 4)], 16
    size = "30b_a3b" if moe else "8b"
    batches = args.batches or ([1, 16] if moe else [1, 4, 16])
    prompts = args.prompts or [512, 8192]
    budgets = args.budgets or [64, 16, 256]
    if args.quick:
        batches, prompts, budgets = batches[:1], prompts[:1], budgets[:1]
    return size, [dc.Config(b, p, n) for p in prompts for b in batches for n in budgets], args.chunk


def parser() -> argparse.ArgumentParser:
    p = bc.parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="dense", choices=["dense", "moe"],
                   help="random target when no --target: Qwen3-8B shape, or Qwen3-30B-A3B (MoE)")
    p.add_argument("--target", default=None, help="Qwen3 checkpoint dir (must exist)")
    p.add_argument("--head", default=None, help="JetSpec draft-head checkpoint dir (must exist)")
    sizes = bc.comma_list(int_at_least(1))
    p.add_argument("--batches", type=sizes, default=None, help="comma list (default 1,4,16)")
    p.add_argument("--prompts", type=sizes, default=None, help="comma list (default 512,8192)")
    p.add_argument("--budgets", type=sizes, default=None, help="comma list (default 64,16,256)")
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk, positions per sequence")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds: configs predicted to end later are skipped (rows say so)")
    p.add_argument("--resume", type=Path, default=None,
                   help="a decode CSV of an earlier run: its finished (batch, prompt) groups are kept")
    p.add_argument("--fused-ops-backend", default=None, choices=["reference", "triton", "cuda"],
                   help="the models' fused layer ops (rms_norm, silu_mul) on this backend "
                        "(default: as auto runs them; on a GPU the torch ops until each is "
                        "hardware-verified); the predictions follow")
    p.add_argument("--exact", action="store_true",
                   help="the target in the exact mode (jetspec_kernels.exact_mode; rows labelled "
                        ":exact): on a GPU its triton path (--fused-ops-backend triton, or auto), "
                        "only on a GPU the hardware record lists or with "
                        "JETSPEC_EXACT_UNVERIFIED=1")
    p.add_argument("--exact-tile", choices=EXACT_GEMM_TILES, default=None,
                   help="with --exact: the target's exact GEMM tile on triton (exact_gemm_tile; "
                        "default narrow); wide rows are labelled :exact-wide")
    p.add_argument("--exact-k-parts", type=int, default=None,
                   help="with --exact: the target's exact_k_parts (K of o_proj and down in this "
                        "many fixed parts, the tp-invariant mode); rows labelled :exact-k<S>")
    p.add_argument("--predict", action="store_true",
                   help="print the floors and predictions of the plan on an H200 and an H100; no run")
    return p


# ----------------------------------------------------------------------------------------------
# Predictions (no device)
# ----------------------------------------------------------------------------------------------

def prediction_lines(m: dc.Model, configs: list[dc.Config], ceiling: dc.Ceiling, chunk: int) -> list[str]:
    """Markdown rows: per config the round's floor and predicted ms, the AR step's, tokens/s at the
    paper's accepted lengths, and the bench's cumulative predicted device seconds."""
    cum = dc.plan_seconds(m, configs, ceiling, chunk)
    lines = [f"{m.name} on {ceiling.name}",
             "| config | round floor ms (draft / verify / accept) | round pred ms | AR floor ms | "
             "AR pred ms | tok/s paper (pred) | AR tok/s (pred) | x AR | x engine (B1, 9.56/round) | "
             "memory GB | bench s (cum.) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for cfg, t_cum in zip(configs, cum):
        rc = dc.round_costs(m, cfg.batch, cfg.prompt, cfg.budget)
        floors = [rc[g].floor(ceiling) * 1e3 for g in dr.GROUPS]
        pred = dc.round_seconds(m, cfg, ceiling)
        ar = dc.ar_step(m, cfg.batch, cfg.prompt)
        ar_pred = ar.predicted(ceiling)
        paper = PAPER_TOKENS_PER_ROUND.get(cfg.budget)
        tok = cfg.batch * paper / pred if paper else math.nan
        ar_tok = cfg.batch / ar_pred
        engine = ENGINE_TOKENS_PER_ROUND / pred / ENGINE_TOK_S if cfg.batch == 1 else math.nan
        cap = dr.capacity(cfg.prompt, 40, max(cfg.budget, 256), m.block)
        mem = dc.memory(m, cfg.batch, cfg.prompt, cfg.budget, cap, chunk)["total"] / 1e9
        lines.append(f"| {cfg.label} | {sum(floors):.2f} ({' / '.join(f'{f:.2f}' for f in floors)}) | "
                     f"{pred * 1e3:.2f} | {ar.floor(ceiling) * 1e3:.2f} | {ar_pred * 1e3:.2f} | "
                     f"{_f(tok)} | {ar_tok:.0f} | {_f(tok / ar_tok)} | {_f(engine)} | {mem:.1f} | "
                     f"{t_cum:.0f} |")
    return lines


def _f(v: float) -> str:
    return "-" if not math.isfinite(v) else (f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}")


# ----------------------------------------------------------------------------------------------
# Timing on the device
# ----------------------------------------------------------------------------------------------

class Clock:
    """Times device work: CUDA events (median of replays), or perf_counter on the CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def once(self, fn) -> float:
        """Seconds of one call of ``fn`` (device-synchronised)."""
        if not self.cuda:
            return dr.wall(fn, False)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def replays(self, fn, n: int) -> tuple[float, float]:
        """(median device seconds of one ``fn()``, host wall seconds per call) over ``n`` calls."""
        if not self.cuda:
            times = [dr.wall(fn, False) for _ in range(n)]
            return statistics.median(times), sum(times) / n
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(n):
            events[i].record()
            fn()
        events[n].record()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / n
        return statistics.median(events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(n)), wall


def gpu_busy(fn, rounds: int) -> tuple[float, str]:
    """(kernel time / wall time over ``rounds`` calls of ``fn``, note): torch.profiler's CUDA
    kernel intervals, merged (nan and why when the profiler sees none)."""
    from torch.profiler import ProfilerActivity, profile
    try:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(rounds):
                fn()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception as e:  # the profiler is a measurement aid: its failure must not end the config
        return math.nan, f"profiler failed: {type(e).__name__}: {e}"[:200]
    if not spans:
        return math.nan, "profiler saw no kernels"
    busy, cur_s, cur_e = 0.0, *spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    return busy / 1e6 / wall, ""


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------

def _resume(table: bc.Table, path: Path | None) -> set[tuple[int, int]]:
    """Rows of an earlier run's CSV whose (batch, prompt) group finished (every spec row ok or
    skipped): copied into ``table``; returns those groups."""
    if path is None or not path.exists():
        return set()
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))

    def group(r):
        b, p = r["shape"].split("/")[:2]
        return int(b[1:]), int(p[1:])
    done = {group(r) for r in rows if r["backend"].startswith("ar")}
    done -= {group(r) for r in rows if r["backend"].startswith("spec") and r["status"] not in ("ok", "skip")}
    done -= {group(r) for r in rows if r["status"] == "skip" and "deadline" in r["note"]}
    for r in rows:
        if group(r) in done:
            table.rows.append({k: (math.nan if v == "" else v) for k, v in r.items()})
            if table.stream:
                table._write_csv([table.rows[-1]])
    return done


def main(argv=None) -> int:
    opts = bc.options(parser(), argv)
    args = opts.args
    cuda = opts.cuda
    size, configs, chunk = plan(args, cuda or args.predict)   # --predict: the GPU plan
    if args.fused_ops_backend is not None:
        dc.FUSED_OPS = args.fused_ops_backend != "reference"
    for what, path in (("target", args.target), ("head", args.head)):
        if path and not Path(path).is_dir():
            print(f"bench_decode: --{what} {path} is not a directory", file=sys.stderr)
            return 2
    for flag, value in (("--exact-tile", args.exact_tile), ("--exact-k-parts", args.exact_k_parts)):
        if value and not args.exact:
            print(f"bench_decode: {flag} needs --exact", file=sys.stderr)
            return 2
    if args.exact:   # refused by name where the exact mode cannot run, before any model is built
        from jetspec_kernels import BackendUnavailableError
        from jetspec_kernels.ops.exact import ExactModeError, exact_backend
        names = [b.strip() for b in args.backends.split(",")] if args.backends else ["auto"]
        try:
            for name in names:      # the target's ops follow --fused-ops-backend, else the backend
                exact_backend("bench_decode --exact", torch.device(opts.device),
                              args.fused_ops_backend or name)
        except ExactModeError as ex:
            print(f"bench_decode: --exact: {ex}", file=sys.stderr)
            return 2
        except BackendUnavailableError as ex:   # not on this machine: predictions need no run
            if not args.predict:
                print(f"bench_decode: --exact: {ex}", file=sys.stderr)
                return 2
    if args.predict:
        m = dc.Model.of_size(size)
        for ceiling in (dc.H200, dc.H100):
            print("\n".join(prediction_lines(m, configs, ceiling, chunk)) + "\n")
        return 0
    started = time.monotonic()
    dtype = torch.bfloat16 if cuda else torch.float32
    backends = [b.strip() for b in args.backends.split(",")] if args.backends else \
        (["auto"] if cuda else ["reference"])
    ceil = bc.measure_ceilings(opts.device, dtype, opts.quick)
    ceiling = dc.Ceiling(ceil.bandwidth, ceil.flops, "measured here")
    table = bc.Table("decode", opts, ceil, BASELINES, extra_columns=EXTRA, stream=True)
    if cuda and not (args.target or args.head):
        need = dc.Model.of_size(size).weight_bytes() + dc.MEMORY_SLACK
        free = torch.cuda.mem_get_info(opts.device)[0]
        if need > free:                   # e.g. the MoE target on an H100
            for c in configs:
                table.skip(c.label, "spec", f"the {size} weights need about {need / 1e9:.1f} GB, "
                           f"{free / 1e9:.1f} GB free")
            table.finish()
            return 0
    try:
        m = ms.build(opts.device, dtype, size=size, with_target=True, target_dir=args.target,
                     head_dir=args.head)
    except Exception as ex:      # a model that cannot be built or loaded: nothing to measure
        print(f"bench_decode: cannot build the models ({type(ex).__name__}: {ex})", file=sys.stderr)
        return 2
    target, head = m.target, m.head
    target.fused_ops_backend = head.fused_ops_backend = args.fused_ops_backend
    if args.exact_tile:
        target.exact_gemm_tile = args.exact_tile
    if args.exact_k_parts:
        target.exact_k_parts = args.exact_k_parts
        try:
            target.resolved_exact_k_parts()
        except (ValueError, NotImplementedError) as ex:     # ExactModeError is one
            print(f"bench_decode: --exact-k-parts: {ex}", file=sys.stderr)
            return 2
    from jetspec_kernels.models.moe import grouped_mm_impl
    if getattr(target.config, "num_experts", 0) and grouped_mm_impl() is not None:
        target.experts_grouped_mm = True     # the GPU's bf16 path; on the CPU the loop would sync
    cm = dc.Model.from_configs(target.config, head.config, elt=bc.elt(dtype), name=m.label)
    table.header_lines.append(
        f"{m.label}: target {cm.layers} layers H {cm.hidden} V {cm.vocab}"
        + (f", MoE {cm.experts} experts top-{cm.top_k}" if cm.experts else "")
        + f"; head {cm.head_layers} layers, block {cm.block}; {str(dtype)[6:]}, greedy topn, top-K {TOPK}; "
        f"backends {','.join(backends)}; prefill chunk {chunk}"
        + (f"; fused layer ops on {args.fused_ops_backend}" if args.fused_ops_backend else ""))
    done = _resume(table, args.resume)
    failed = False
    old_checks = os.environ.get("JETSPEC_VALUE_CHECKS", "cpu")
    import jetspec_kernels as jk
    jk.set_value_checks("never")     # as on CUDA tensors: no value check reads the host in a round
    exact_label = (":exact" + ("-wide" if args.exact_tile == "wide" else "")
                   + (f"-k{args.exact_k_parts}" if args.exact_k_parts else "")) if args.exact else ""
    if args.exact:
        table.header_lines.append(f"the target in the exact mode (rows {exact_label}), GEMM tile "
                                  f"{args.exact_tile or 'narrow'}, K parts "
                                  f"{args.exact_k_parts or 'tp'}")
    try:
        groups = list(dict.fromkeys((c.batch, c.prompt) for c in configs))
        for name in backends:
            label = ("" if len(backends) == 1 else f":{name}") + exact_label
            for b, p in groups:
                if (b, p) in done:
                    continue
                mine = [c for c in configs if (c.batch, c.prompt) == (b, p)]
                with bc.using_backend(name), jk.exact_mode(args.exact):
                    failed |= run_group(table, target, head, cm, ceiling, mine, chunk, cuda, name,
                                        label, started, args.deadline)
    finally:
        jk.set_value_checks(old_checks)
    table.finish()
    return 1 if failed else 0


def run_group(table, target, head, cm, ceiling, configs, chunk, cuda, backend, label, started,
              deadline) -> bool:
    """Prefill, the AR step and every config of one (batch, prompt) group. Returns whether one failed."""
    b, p = configs[0].batch, configs[0].prompt
    group = f"B{b}/p{p}"
    dev = target.device
    budgets = [c.budget for c in configs]
    cap = dr.capacity(p, ROUNDS_PER_CONFIG, max(budgets), head.block_size)
    mem = dc.memory(cm, b, p, max(budgets), cap, chunk)
    if cuda:
        free = torch.cuda.mem_get_info(dev)[0]
        if mem["total"] > free:
            why = f"needs about {mem['total'] / 1e9:.1f} GB (decode_costs.memory), {free / 1e9:.1f} GB free"
            for c in configs:
                table.skip(c.label, "spec" + label, why)
            return False
    clock = Clock(cuda)
    failed = False
    try:
        gen = torch.Generator(device=dev).manual_seed(b * 100003 + p)
        tokens = torch.randint(0, cm.vocab, (b, p), device=dev, generator=gen)
        pre = dr.prefill(target, head, tokens, cap, chunk, clock.once)
        pc = dc.prefill(cm, b, p)
        table.add(group, "prefill" + label, sum(pre.chunk_seconds), flops=pc.flops, nbytes=pc.nbytes,
                  jk_backend=backend, mem_est_gb=mem["total"] / 1e9, floor_ms=pc.floor(ceiling) * 1e3)
        pre.reset()
        ar = dr.ARStep(target, pre)
        ar()                                  # eager: compiles the decode shapes
        if cuda:
            ar.capture()
        arc = dc.ar_step(cm, b, p)
        n_ar = dc.replays(arc.predicted(ceiling)) if cuda else CPU_REPLAYS
        t_ar, _ = clock.replays(ar, n_ar)
        ar_tok_s = b / t_ar
        table.add(group, "ar" + label, t_ar, flops=arc.flops, nbytes=arc.nbytes, jk_backend=backend,
                  floor_ms=arc.floor(ceiling) * 1e3, pred_ms=arc.predicted(ceiling) * 1e3,
                  ar_tok_s=ar_tok_s, replays=n_ar)
        del ar
    except Exception as ex:
        table.add(group, "prefill" + label, None, flops=0.0, nbytes=0.0, status="error",
                  note=f"{type(ex).__name__}: {ex}"[:300])
        return True
    for i, cfg in enumerate(configs):
        pred_s = dc.config_seconds(cm, cfg, ceiling, first=False)
        if deadline is not None and time.monotonic() - started + pred_s > deadline:
            table.skip(cfg.label, "spec" + label, f"deadline: {deadline:.0f} s would pass (predicted "
                       f"{pred_s:.0f} s for this config); rerun with --resume")
            continue
        # A runaway config on a GPU stops at 3x its prediction; on the CPU the prediction knows
        # nothing of the Triton interpreter or of other processes on the cores, so only
        # --deadline bounds the run there.
        limit = time.monotonic() + 3 * pred_s + 30 if cuda else math.inf
        try:
            run_config(table, target, head, cm, ceiling, cfg, pre, clock, backend, label, ar_tok_s,
                       mem, config_deadline=limit)
        except Exception as ex:
            failed = True
            table.add(cfg.label, "spec" + label, None, flops=0.0, nbytes=0.0,
                      status="timeout" if isinstance(ex, ConfigTimeout) else "error",
                      note=f"{type(ex).__name__}: {ex}"[:300])
    return failed


def run_config(table, target, head, cm, ceiling, cfg, pre, clock, backend, label, ar_tok_s, mem,
               config_deadline):
    """One config: the library round (eager first round, capture, timed replays, host reads, GPU
    busy), then the stage graphs; adds the ``spec`` row."""
    def check_time(what):
        if time.monotonic() > config_deadline:
            raise ConfigTimeout(f"past the config's deadline after {what}")

    cuda = clock.cuda
    b, n = cfg.batch, cfg.budget
    pre.reset()
    max_new = ROUNDS_PER_CONFIG * head.block_size
    rnd = dr.new_round(target, head, pre, n, TOPK, max_new)
    steps = dr.library_steps(rnd, cuda)
    accepts = []

    def one_round():
        steps.draft(True)
        accepts.append(steps.verify(n))

    def generate_round():               # as generate's loop: the done check, then the round
        if bool(rnd.out.done.all()):
            raise RuntimeError("a sequence finished: the output buffer is too small")
        one_round()

    one_round()                         # eager (compiles every shape), then captured
    check_time("the first round and the capture")
    costs = dc.round_costs(cm, b, cfg.prompt, n)
    pred = dc.round_seconds(cm, cfg, ceiling)
    reps = dc.replays(pred) if cuda else CPU_REPLAYS
    t_round, _ = clock.replays(one_round, reps)
    _, wall = clock.replays(generate_round, reps)
    check_time("the timed rounds")
    with dr.HostReads() as reads:
        for _ in range(dc.COUNTED_ROUNDS):
            generate_round()
    busy, busy_note = math.nan, ""
    if cuda and n == dc.PROFILED_BUDGET:
        busy, busy_note = gpu_busy(generate_round, dc.PROFILED_ROUNDS)
    check_time("the host-read count and the profiler")
    acc = torch.stack(accepts).float()
    tokens_per_round = float(acc.mean()) + 1.0

    split = dr.StageGraphs(dr.new_round(target, head, pre, n, TOPK, max_new), n, cuda)
    per_group = {g: [] for g in dr.GROUPS}
    for _ in range(reps):
        out = split.replay()
        if cuda:
            out[-1].synchronize()
            out = {g: out[i].elapsed_time(out[i + 1]) / 1e3 for i, g in enumerate(dr.GROUPS)}
        for g in dr.GROUPS:
            per_group[g].append(out[g])
    stage_ms = {f"{g}_ms": statistics.median(v) * 1e3 for g, v in per_group.items()}

    floor = sum(c.floor(ceiling) for c in costs.values())
    paper = PAPER_TOKENS_PER_ROUND.get(n, math.nan)
    tok_s_paper = b * paper / t_round
    engine_len = ENGINE_TOKENS_PER_ROUND / t_round
    total = dc.Cost() + costs["draft"] + costs["verify"] + costs["accept_commit"]
    table.add(cfg.label, "spec" + label, t_round, flops=total.flops, nbytes=total.nbytes, floor_s=floor,
              note=busy_note, jk_backend=backend, **stage_ms, split_sum_ms=sum(stage_ms.values()),
              round_wall_ms=wall * 1e3, host_syncs_per_round=len(reads.reads) / dc.COUNTED_ROUNDS,
              gpu_busy=busy, tokens_per_round=tokens_per_round, floor_ms=floor * 1e3,
              pred_ms=pred * 1e3, **{f"floor_{g}_ms": costs[g].floor(ceiling) * 1e3 for g in dr.GROUPS},
              paper_tokens_per_round=paper, tok_s_paper=tok_s_paper, ar_tok_s=ar_tok_s,
              x_ar_paper=tok_s_paper / ar_tok_s, tok_s_at_engine_len=b * engine_len,
              x_engine=engine_len / ENGINE_TOK_S if b == 1 else math.nan,
              mem_est_gb=mem["total"] / 1e9, replays=reps)
    del split, steps, rnd
    if cuda:
        torch.cuda.empty_cache()


if __name__ == "__main__":
    bc.main_guard(main)
