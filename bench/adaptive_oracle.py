"""Exact replay of greedy decoding at every tree size, and the best any size policy could do.

Greedy speculative decoding is lossless, so a sequence's output never depends on the tree sizes
chosen: only where its rounds start does. This script decodes each held-out prompt once
autoregressively, then runs one round at a large budget starting at *every* output position p
(the prompt plus the first p - 1 output tokens prefilled; the prefill emits token p - 1 and the
round drafts from it). Each such round tells, for every size n, how many draft tokens the topn
tree of n nodes would accept there (``counterfactual``). With that table any policy can be
replayed exactly -- sequence positions advance by the accepted lengths it would really get, and a
batch runs until its slowest sequence is done -- under a cost model, with no timing noise and no
per-round overhead:

  fixed n       every round n nodes
  auto          the per-round choice of ``generate(budget="auto")`` (calibrated draft curve,
                ratio rule, its calibrator fed as in a real decode)
  marginal      ``argmax_n sum_b (1 + E_b(n)) - rate * c(n)``, rate the tokens per second so far
  clairvoyant   per round, knowing that round's outcome: the size with the most useful tokens
                per second, or net of its time at a rate (the best of 0.6-2x the best fixed
                size's rate, per batch): what a per-round rule with a perfect predictor of the
                round gets
  optimal       batch 1: the best policy knowing every outcome, planning where rounds land
                (dynamic programming over positions)
  bound         batch B: no policy beats it (the batch's slowest sequence decoded alone,
                optimally, at batch B's costs)

Writes ``adaptive_oracle.csv`` under ``--out``. ``--check`` compares the replayed fixed-size round
counts with real decodes. ``--quick``: 2 prompts x 12 tokens, batch 2, sizes 4 and 16.
"""
from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench import common as bc
from bench.bench_adaptive_budget import (TREE_FIELDS, Recorder, _prompts, _rows, budget_subtree,
                                         counterfactual)
from jetspec_kernels.adaptive import AcceptanceCalibrator, choose_budget, expected_accept_curve
from jetspec_kernels.tree import Tree

COLUMNS = ["device", "batch", "policy", "tokens_per_s", "rel_best_fixed", "rounds", "mean_size",
           "seconds", "costs", "note"]


NOTES = {"clairvoyant": "knows each round's outcome, not the next ones",
         "optimal": "knows every outcome, plans ahead (dynamic programming)",
         "bound": "upper bound: the slowest sequence decoded alone, optimally"}


def position_table(target, head, prompts, new_tokens: int, record: int, topk: int):
    """Per output position p = 1 .. new_tokens - 1 (tokens already emitted), one recorded round of
    every prompt at budget ``record``: (list over p of the round, list over p of [B, record]
    accepted lengths per size), and the greedy outputs."""
    from jetspec_kernels.decode import generate, generate_ar

    greedy = generate_ar(target, prompts, max_new_tokens=new_tokens).tokens
    rounds, accepted = [None], [None]
    for p in range(1, new_tokens):
        rec = Recorder(target.device)
        out = generate(target, head, [pr + g[:p - 1] for pr, g in zip(prompts, greedy)],
                       max_new_tokens=2, budget=[record], topk=topk, cost_model={record: 1.0},
                       calibrator=rec)
        for g, o in zip(greedy, out.tokens):
            if o[0] != g[p - 1]:
                raise RuntimeError(f"prefill at position {p} emitted {o[0]}, greedy has {g[p - 1]}")
        r = rec.rounds[0]
        rounds.append(r)
        accepted.append(counterfactual(r))
    return rounds, accepted, greedy


def _stack(rounds, accepted, pos, rows):
    """The round each sequence of ``rows`` is at (positions ``pos``), as one batch."""
    parts = [_rows(rounds[p].tree, [b]) for b, p in zip(rows, pos)]
    tree = Tree(*(torch.cat([getattr(t, f) for t in parts]) for f in TREE_FIELDS),
                max_depth=parts[0].max_depth)
    acc = torch.stack([accepted[p][b] for b, p in zip(rows, pos)])
    path = torch.cat([rounds[p].path[b:b + 1] for b, p in zip(rows, pos)])
    return tree, acc, path


def simulate(rounds, accepted, rows, new_tokens: int, costs: dict, sizes, policy, cal=None,
             rate: float = 0.0):
    """Replay one batch (``rows``) under ``policy``; returns (seconds, rounds, mean size).
    ``cal``: the calibrator of "auto" and "marginal" (updated in place, as generate keeps it
    across calls); ``rate``: the tokens per second "clairvoyant" trades time at (0: the ratio
    rule)."""
    pos = [1] * len(rows)
    cost_t = torch.tensor([costs[n] for n in sizes])
    secs = nrounds = size_sum = 0
    state = SimpleNamespace(tokens=0.0, secs=0.0)
    while min(pos) < new_tokens:
        active = torch.tensor([p < new_tokens for p in pos])
        tree, acc, path = _stack(rounds, accepted, [min(p, new_tokens - 1) for p in pos], rows)
        remaining = torch.tensor([max(new_tokens - p, 0) for p in pos])
        if isinstance(policy, int):
            n = policy
        elif policy == "clairvoyant":    # the round's useful tokens net of its time at ``rate``
            useful = (torch.minimum(1 + acc[:, [s - 1 for s in sizes]], remaining[:, None])
                      * active[:, None]).sum(0)
            n = sizes[int(torch.argmax(useful - rate * cost_t if rate else useful / cost_t))]
        else:
            curve = expected_accept_curve(tree, cal)
            if policy == "auto" or state.secs == 0:
                n = sizes[int(choose_budget(curve, sizes, cost_t, active))]
            else:        # marginal: most expected tokens net of the time at the running rate
                gain = ((1 + curve[:, [s - 1 for s in sizes]]) * active[:, None]).sum(0)
                n = sizes[int(torch.argmax(gain - state.tokens / state.secs * cost_t))]
            got = acc[:, n - 1]
            cal.update(budget_subtree(tree, n), SimpleNamespace(accept_len=got.to(torch.int32), path=path), active)
            state.tokens += float(((1 + got) * active).sum())
            state.secs += costs[n]
        step = (1 + acc[:, n - 1]) * active
        pos = [p + int(s) for p, s in zip(pos, step)]
        secs += costs[n]
        nrounds += 1
        size_sum += n
    return secs, nrounds, size_sum / max(nrounds, 1)


def best_policy_b1(accepted, b: int, new_tokens: int, costs: dict, sizes):
    """Batch 1, the optimum knowing every outcome: T(p) = min_n c(n) + T(p + 1 + a(p, n))."""
    t = [0.0] * (new_tokens + 1)
    rounds = [0] * len(t)
    sz = [0] * len(t)
    for p in range(new_tokens - 1, 0, -1):
        best = None
        for n in sizes:
            q = min(p + 1 + int(accepted[p][b, n - 1]), new_tokens)
            cand = (costs[n] + t[q], n, q)
            if best is None or cand[0] < best[0]:
                best = cand
        t[p] = best[0]
        rounds[p] = 1 + rounds[best[2]]
        sz[p] = best[1] + sz[best[2]]
    return t[1], rounds[1], sz[1] / max(rounds[1], 1)


def replay_policies(tables, groups, new_tokens: int, costs: dict, sizes, max_depth: int) -> dict:
    """{policy: (seconds, rounds, summed sizes)} over ``groups`` (lists of rows decoded as one
    batch) for every fixed size and the policies of the module docstring. ``tables``: the
    position tables of the timed and of the warm-up prompts."""
    (rounds, accepted), (warm_rounds, warm_accepted) = tables
    policies = [*sizes, "auto", "marginal", "clairvoyant",
                "optimal" if len(groups[0]) == 1 else "bound"]
    res, best = {}, math.inf
    for pol in policies:
        # Auto's calibrator learns on the warm-up prompts first and keeps learning, as in
        # bench_adaptive_budget (one calibrator per batch size and policy).
        cal = AcceptanceCalibrator(max_depth=max_depth)
        if pol in ("auto", "marginal"):
            for g in groups:
                simulate(warm_rounds, warm_accepted, g, new_tokens, costs, sizes, pol, cal)
        tot = [0.0, 0, 0]
        for g in groups:
            if pol in ("optimal", "bound"):
                # Each sequence alone, optimally: the batch cannot finish sooner than its
                # slowest sequence would (rounds and sizes are those of that sequence).
                s, r, m = max(best_policy_b1(accepted, b, new_tokens, costs, sizes) for b in g)
            elif pol == "clairvoyant":   # the best of the ratio rule and a range of rates
                rate = len(g) * new_tokens * len(groups) / best
                s, r, m = min(simulate(rounds, accepted, g, new_tokens, costs, sizes, pol, rate=x)
                              for x in [0.0] + [rate * f for f in (0.6, 0.8, 1, 1.2, 1.4, 1.7, 2)])
            else:
                s, r, m = simulate(rounds, accepted, g, new_tokens, costs, sizes, pol, cal)
            tot = [tot[0] + s, tot[1] + r, tot[2] + m * r]
        res[pol] = tuple(tot)
        best = min(res[n][0] for n in sizes) if pol == sizes[-1] else best
    return res


def _given_costs(text: str | None, sizes) -> dict:
    """``--costs "1:8.8,9.2;8:29,34"`` -> {batch: {n: seconds}} (ms per size, in --budgets order)."""
    out = {}
    for part in (text or "").split(";"):
        if part.strip():
            batch, ms = part.split(":")
            vals = [float(v) * 1e-3 for v in ms.split(",")]
            if len(vals) != len(sizes):
                raise SystemExit(f"--costs: batch {batch} has {len(vals)} costs for {len(sizes)} sizes")
            out[int(batch)] = dict(zip(sizes, vals))
    return out


def run(opts) -> int:
    a = opts.args
    dev = opts.device
    from jetspec_kernels.decode import generate, measure_round_costs
    from jetspec_kernels.models.assets import load_tiny

    quick = opts.quick
    sizes = tuple(int(x) for x in (a.budgets or ("4,16" if quick else "4,8,16,32,64")).split(","))
    new, n_prompts = (12, 2) if quick else (a.new_tokens, a.prompts)
    batch_b, record = (2, 32) if quick else (a.batch, a.record_budget)
    given = _given_costs(a.costs, sizes)
    target, heads = load_tiny(device=dev)
    head = heads["head_causal"]
    prompts, source = _prompts(n_prompts, a.prompt_len, seed=1)
    warm, _ = _prompts(n_prompts, a.prompt_len, seed=2)
    t0 = time.perf_counter()
    key = (tuple(map(tuple, prompts)), tuple(map(tuple, warm)), new, record, a.topk)
    tables = None
    if a.table and a.table.exists():
        saved_key, tables = torch.load(a.table, weights_only=False)
        tables = tables if saved_key == key else None
    if tables is None:
        tables = [position_table(target, head, ps, new, record, a.topk)[:2] for ps in (prompts, warm)]
        if a.table:
            torch.save((key, tables), a.table)
    print(f"position tables: 2 x {n_prompts} prompts x {new - 1} positions at budget {record} "
          f"in {time.perf_counter() - t0:.1f}s ({source})")
    rows_out = []
    for batch in (1, batch_b):
        groups = [list(range(i, min(i + batch, n_prompts))) for i in range(0, n_prompts, batch)]
        if batch in given:
            costs, how = given[batch], "given"
        else:
            costs = measure_round_costs(target, head, warm[:batch], list(sizes),
                                        topk=a.topk).table(sizes)
            how = "measure_round_costs"
        cnote = how + " " + " ".join(f"{n}:{c * 1e3:.2f}" for n, c in costs.items())
        res = replay_policies(tables, groups, new, costs, sizes, head.block_size - 1)
        if a.check:
            for n in sizes:
                real = sum(generate(target, head, [prompts[i] for i in g], max_new_tokens=new,
                                    budget=n, topk=a.topk).stats.rounds for g in groups)
                note = "" if real == res[n][1] else f" REAL DECODE TOOK {real}"
                print(f"batch {batch} fixed {n}: replayed rounds {res[n][1]}{note}")
        best = min(res[n][0] for n in sizes)
        for pol, (s, r, sz) in res.items():
            rows_out.append(dict(device=bc.device_name(dev), batch=batch, policy=str(pol),
                                 tokens_per_s=n_prompts * new / s, rel_best_fixed=best / s,
                                 rounds=r, mean_size=sz / r, seconds=s, costs=cnote,
                                 note=NOTES.get(pol, "")))
    for r in rows_out:
        print(f"batch {r['batch']:2d} {r['policy']:>8}: {r['tokens_per_s']:7.1f} tok/s "
              f"(x{r['rel_best_fixed']:.3f} best fixed), {r['rounds']} rounds, mean size "
              f"{r['mean_size']:.1f} {r['note']}")
    opts.out.mkdir(parents=True, exist_ok=True)
    path = opts.out / "adaptive_oracle.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows_out)
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    p = bc.parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--budgets", default=None, help="fixed sizes (default 4,8,16,32,64; quick: 4,16)")
    p.add_argument("--costs", default=None,
                   help='seconds per round to replay with, e.g. "1:8.8,9.2,9.9,11.2,14.4;8:29,34,39,48,73"'
                        " (ms per --budgets size; default: measure_round_costs per batch size)")
    p.add_argument("--record-budget", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--table", type=Path, default=None,
                   help="keep the position tables in this file (reused when it holds the same "
                        "prompts and settings)")
    p.add_argument("--check", action="store_true", help="compare replayed rounds with real decodes")
    opts = bc.options(p, argv)
    torch.set_num_threads(1)
    with bc.using_backend("reference" if opts.device.type == "cpu" else "auto"):
        return run(opts)


if __name__ == "__main__":
    raise SystemExit(main())
