"""Adaptive tree budget: ``generate(budget="auto")`` against every fixed budget.

Part 1, end to end, measured: the shipped tiny target and causal head (jetspec_kernels/assets/tiny)
decode held-out prompts (the recipe's "heldout" files, outside the training data; this
repository's own sources where that stdlib is missing), greedy, at batch 1 (each prompt alone)
and batch B (all together). Every configuration first runs once untimed on other held-out prompts
(warm-up, and the auto calibrator's first rounds); then ``--reps`` timed passes, configurations
interleaved call by call in a rotating order. tokens/s = tokens / seconds summed over the passes.
Auto's cost model is measured once per batch size (``measure_round_costs`` on the warm-up
prompts; its time is printed, not counted) and its calibrator kept across that batch size's runs.

Part 2, offline, from decodes of the B timed and the B warm-up prompts at a large budget: a
recording calibrator sees every round's tree and verdict, so for every round, sequence and size n
the accepted length of the topn tree of n nodes is known (that tree is the big tree's n - 1 best
nodes, and its accepted path the big path cut there). From these rounds:
  share    a fixed total of B * n nodes split equally, or given to the B * (n - 1) best non-root
           nodes across the batch (by draft score): accepted tokens per round;
  predict  tokens/s of every fixed budget and of auto (replayed with its calibrator) under a cost
           model: the one measured in part 1 (a check of the method against part 1), a roofline
           model of Qwen3-8B on an H200 (``h200-8b``), and with ``--device cuda`` one measured at
           Qwen3-8B shapes with random weights. Round boundaries are those of the big-budget
           decode, which is what makes this a prediction.

Writes ``adaptive_budget.csv`` (every row printed) and ``adaptive_budget.png`` (tokens/s against
the budget, auto as a horizontal line) under ``--out``.
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
from jetspec_kernels.adaptive import AcceptanceCalibrator, choose_budget, expected_accept_curve
from jetspec_kernels.tree import Tree

COLUMNS = ["part", "device", "batch", "config", "tokens_per_s", "tokens_per_round", "mean_size",
           "seconds", "tokens", "rounds", "spread", "choose_ms", "calibrate_ms", "note"]
# A Qwen3-8B verify forward on an H200: 7.57e9 parameters (36 layers + lm_head, bf16), streamed
# at the measured 4.3 TB/s or computed at 60 % of the measured 790 TFLOP/s, plus about 0.8 ms for
# the draft head, the tree and the round's glue (docs/perf/README.md, "Floor formulas").
H200_8B = dict(params=7.57e9, bandwidth=4.3e12, flops=0.6 * 790e12, fixed_s=0.8e-3)


def h200_8b_costs(batch: int, sizes) -> dict:
    """Roofline seconds per round at each size for Qwen3-8B at ``batch`` (a prediction)."""
    p = H200_8B
    return {n: p["fixed_s"] + max(2 * p["params"] / p["bandwidth"],
                                  2 * p["params"] * batch * n / p["flops"]) for n in sizes}


def _prompts(n: int, length: int, seed: int) -> tuple[list, str]:
    """``n`` byte-token prompts from held-out files (or this repository's sources) and a label."""
    from jetspec_kernels.models.assets import load_recipe
    from jetspec_kernels.train.data import heldout_prompts

    try:
        return heldout_prompts(load_recipe()["data"], n, length, seed=seed), "held-out stdlib files"
    except (ValueError, OSError):
        pass
    root = Path(__file__).resolve().parents[1] / "jetspec_kernels"
    text = b"".join(p.read_bytes() for p in sorted(root.rglob("*.py")))
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(text) - length, (n,), generator=gen).tolist()
    return [list(text[s:s + length]) for s in starts], "this repository's Python sources"


class Recorder(AcceptanceCalibrator):
    """A calibrator that keeps every round on the CPU (tree, verdict, active sequences) and
    learns nothing."""

    def __init__(self, device):
        super().__init__(device=device)
        self.rounds = []

    def update(self, tree, verdict, active=None):
        b = tree.batch_size
        self.rounds.append(SimpleNamespace(
            tree=Tree(*(getattr(tree, f).cpu() for f in TREE_FIELDS), max_depth=tree.max_depth),
            path=verdict.path.cpu(), accept_len=verdict.accept_len.cpu(),
            active=torch.ones(b, dtype=torch.bool) if active is None else active.cpu()))


TREE_FIELDS = ("tokens", "parents", "depths", "scores", "num_nodes", "mask")


def _rows(tree: Tree, sel) -> Tree:
    return Tree(*(getattr(tree, f)[sel] for f in TREE_FIELDS), max_depth=tree.max_depth)


def _order(scores: torch.Tensor) -> torch.Tensor:
    """int64 [B, N - 1]: non-root node indices minus 1, in topn's order (a stable sort by score
    over node order, which is (depth, lexicographic))."""
    return torch.sort(scores[:, 1:].float(), dim=1, descending=True, stable=True).indices


def budget_subtree(tree: Tree, n: int) -> Tree:
    """What a calibrator sees of the budget-n topn tree inside ``tree``: the root and the n - 1
    best non-root nodes keep their scores, every other node gets -inf (contributes nothing)."""
    keep = torch.zeros_like(tree.scores, dtype=torch.bool)
    keep[:, 0] = True
    keep.scatter_(1, _order(tree.scores)[:, :n - 1] + 1, True)
    scores = torch.where(keep, tree.scores, torch.full_like(tree.scores, -math.inf))
    return Tree(tree.tokens, tree.parents, tree.depths, scores, tree.num_nodes, tree.mask,
                tree.max_depth)


def counterfactual(rnd) -> torch.Tensor:
    """int64 [B, N]: column n - 1 = accepted length of the budget-n topn tree in this round (the
    n - 1 best non-root nodes; its accepted path is the big tree's, cut at the first node ranked
    n - 1 or later)."""
    b, n = rnd.tree.scores.shape
    rank = torch.empty(b, n - 1, dtype=torch.int64)
    rank.scatter_(1, _order(rnd.tree.scores), torch.arange(n - 1).expand(b, -1).contiguous())
    rank = torch.cat([torch.full((b, 1), -1, dtype=rank.dtype), rank], 1)      # root: -1
    steps = torch.arange(1, rnd.path.shape[1])
    on = steps[None, :] <= rnd.accept_len[:, None].long()
    path_rank = torch.where(on, rank.gather(1, rnd.path[:, 1:].clamp_min(0).long()),
                            torch.full_like(steps, n)[None, :])
    return (path_rank[:, None, :] < torch.arange(n)[None, :, None]).sum(-1)


def replay(rounds, accepted, costs: dict, sizes, *, max_depth: int, groups=None):
    """Predicted {config: (tokens/s, tokens/round per sequence, mean size)} for each fixed size and
    for auto (choosing per round, its calibrator fed the budget-n* tree and path) over recorded
    ``rounds`` (``accepted``: their counterfactual tables). ``groups``: lists of rows that decode
    as one batch (default: all rows of a round)."""
    groups = groups or [slice(None)]
    cost_t = torch.tensor([costs[n] for n in sizes])
    out = {}
    for n in sizes:
        tok = nr = seqs = 0
        for rows in groups:
            for r, acc in zip(rounds, accepted):
                act = r.active[rows]
                if bool(act.any()):
                    tok += float((1 + acc[rows, n - 1][act]).sum())
                    nr += 1
                    seqs += int(act.sum())
        out[n] = (tok / (nr * costs[n]), tok / seqs, float(n))
    tok = secs = seqs = size_sum = nr = 0
    for rows in groups:
        cal = AcceptanceCalibrator(max_depth=max_depth)
        for r, acc in zip(rounds, accepted):
            act = r.active[rows]
            if not bool(act.any()):
                continue
            tree = _rows(r.tree, rows)
            n = sizes[int(choose_budget(expected_accept_curve(tree, cal), sizes, cost_t, act))]
            got = acc[rows, n - 1]
            tok += float((1 + got[act]).sum())
            secs += costs[n]
            seqs += int(act.sum())
            size_sum += n
            nr += 1
            cal.update(budget_subtree(tree, n),
                       SimpleNamespace(accept_len=got.to(torch.int32), path=r.path[rows]), act)
    out["auto"] = (tok / secs, tok / seqs, size_sum / nr)
    return out


def share(rounds, accepted, sizes, cap: int) -> list[dict]:
    """Accepted tokens per round with B * n nodes split equally vs. to the best nodes across the
    batch (by draft score; each sequence keeps its root and at most ``cap`` nodes)."""
    rows = []
    for n in sizes:
        equal = shared = widest = 0.0
        count = 0
        for r, acc in zip(rounds, accepted):
            act = r.active
            if int(act.sum()) < 2:
                continue
            count += 1
            equal += float(acc[act, n - 1].sum())
            sc = r.tree.scores[act, 1:]
            flat = sc.flatten()
            best = torch.topk(flat, min((n - 1) * int(act.sum()), flat.numel())).indices
            per = torch.bincount(best // sc.shape[1], minlength=sc.shape[0]).clamp(max=cap - 1)
            shared += float(acc[act].gather(1, per[:, None]).sum())
            widest += float(per.max() + 1)
        if count:
            rows.append(dict(n=n, rounds=count, equal=equal / count, shared=shared / count,
                             gain=shared / equal - 1 if equal else math.nan, widest=widest / count))
    return rows


def write_png(path: Path, rows: list[dict], title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        print(f"no PNG: matplotlib is not importable ({e})", file=sys.stderr)
        return False
    panels = list(dict.fromkeys((r["part"], r["batch"]) for r in rows if r["part"] != "share"))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.2), squeeze=False)
    for ax, (part, batch) in zip(axes[0], panels):
        sel = [r for r in rows if r["part"] == part and r["batch"] == batch]
        fixed = [(int(r["config"]), r["tokens_per_s"]) for r in sel if r["config"] != "auto"]
        auto = [r["tokens_per_s"] for r in sel if r["config"] == "auto"]
        xs, ys = zip(*fixed)
        ax.plot(xs, ys, marker="o", label="fixed budget")
        if auto:
            ax.axhline(auto[0], color="C3", ls="--", label="auto")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("tree budget")
        ax.set_title(f"{part}, batch {batch}", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("tokens/s")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def end_to_end(target, head, batch, prompts, warm, sizes, reps, new_tokens, topk, device):
    """Part 1 at one batch size: rows for every fixed size and auto, and auto's cost model."""
    from jetspec_kernels.adaptive import AcceptanceCalibrator
    from jetspec_kernels.decode import generate, measure_round_costs

    groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    warm_groups = [warm[i:i + batch] for i in range(0, len(warm), batch)]
    t0 = time.perf_counter()
    cost = measure_round_costs(target, head, warm_groups[0], list(sizes), topk=topk)
    measure_s = time.perf_counter() - t0
    cal = AcceptanceCalibrator(max_depth=head.block_size - 1, device=device)
    configs = [*sizes, "auto"]
    kw = dict(max_new_tokens=new_tokens, topk=topk)

    def run(cfg, group):
        if cfg == "auto":     # "auto" is these sizes (the default list unless --budgets)
            return generate(target, head, group, budget=list(sizes), cost_model=cost, calibrator=cal,
                            **kw)
        return generate(target, head, group, budget=cfg, **kw)

    for cfg in configs:                          # warm-up (untimed), auto learns its first rounds
        for g in warm_groups:
            run(cfg, g)
    acc = {c: dict(tok=0, secs=0.0, rounds=0, seq_rounds=0, acc=0, size=0, rates=[], out=[],
                   choose=0.0, calibrate=0.0) for c in configs}
    for rep in range(reps):
        per_rep = {c: [0, 0.0] for c in configs}
        for gi, g in enumerate(groups):          # configurations interleaved call by call, rotated
            shift = (rep * len(groups) + gi) % len(configs)
            for cfg in configs[shift:] + configs[:shift]:
                o = run(cfg, g)
                st, a = o.stats, acc[cfg]
                per_rep[cfg][0] += st.new_tokens
                per_rep[cfg][1] += st.seconds
                a["rounds"] += st.rounds
                a["seq_rounds"] += len(st.accept_lengths)
                a["acc"] += sum(st.accept_lengths)
                a["size"] += sum(st.budget_sizes)
                for stage in ("choose", "calibrate"):
                    a[stage] += st.stage_seconds.get(stage, 0.0)
                if rep == 0:
                    a["out"].extend(o.tokens)
        for cfg, (tok, secs) in per_rep.items():
            acc[cfg]["tok"] += tok
            acc[cfg]["secs"] += secs
            acc[cfg]["rates"].append(tok / secs)
    same = all(acc[c]["out"] == acc[configs[0]]["out"] for c in configs)
    rows = []
    for cfg in configs:
        a = acc[cfg]
        lo, hi = min(a["rates"]), max(a["rates"])
        # Host time of the adaptive round's own work (auto only), ms per round.
        per_round = {f"{s}_ms": 1e3 * a[s] / a["rounds"] for s in ("choose", "calibrate")
                     if cfg == "auto"}
        rows.append(dict(part="measured", batch=batch, config=str(cfg), **per_round,
                         tokens_per_s=a["tok"] / a["secs"],
                         tokens_per_round=1 + a["acc"] / a["seq_rounds"],
                         mean_size=a["size"] / a["rounds"], seconds=a["secs"], tokens=a["tok"],
                         rounds=a["rounds"], spread=f"{lo:.0f}-{hi:.0f}",
                         note="" if same else "OUTPUTS DIFFER"))
    return rows, cost, measure_s


def main(argv=None) -> int:
    p = bc.parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8, help="the batched setting's batch size")
    p.add_argument("--prompts", type=int, default=None, help="timed prompts (default: --batch)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=None, help="default 64 (quick: 8)")
    p.add_argument("--reps", type=int, default=None, help="timed passes (default 3; quick: 1)")
    p.add_argument("--budgets", default=None, help="fixed budgets (default 4,8,16,32,64)")
    p.add_argument("--record-budget", type=int, default=None,
                   help="budget of the recorded decode for part 2 (default 256; quick: 32)")
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default 1 on the CPU: steadier on a shared machine)")
    opts = bc.options(p, argv)
    a = opts.args
    threads = a.threads or (1 if not opts.cuda else None)
    backend = (a.backends or ("reference" if not opts.cuda else "auto")).split(",")[0]
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with bc.using_backend(backend):
            return _run(opts)
    finally:
        torch.set_num_threads(old_threads)


def _run(opts) -> int:
    a = opts.args
    quick = opts.quick
    sizes = tuple(int(x) for x in (a.budgets or ("4,16" if quick else "4,8,16,32,64")).split(","))
    batch = 2 if quick and a.batch == 8 else a.batch
    n_prompts = a.prompts or batch
    new = a.new_tokens or (8 if quick else 64)
    reps = a.reps or (1 if quick else 3)
    record = a.record_budget or (32 if quick else 256)
    dev = opts.device

    from jetspec_kernels import backend as jk_backend
    from jetspec_kernels.decode import generate, measure_round_costs
    from jetspec_kernels.models.assets import load_tiny

    target, heads = load_tiny(device=dev)
    head = heads["head_causal"]
    prompts, source = _prompts(n_prompts, a.prompt_len, seed=1)
    warm, _ = _prompts(n_prompts, a.prompt_len, seed=2)
    backend = jk_backend.resolve(dev)
    print(f"== adaptive_budget on {bc.device_name(dev)} ({'quick' if quick else 'full'}) ==")
    print(f"tiny byte-level target + causal head, float32, backend {backend}, greedy, topk {a.topk}, "
          f"{n_prompts} prompts x {a.prompt_len} bytes from {source}, {new} new tokens each, "
          f"{reps} timed passes, torch threads {torch.get_num_threads()}")
    rows, costs = [], {}
    for b in (1, batch):
        r, cost, secs = end_to_end(target, head, b, prompts, warm, sizes, reps, new, a.topk, dev)
        rows += r
        costs[b] = cost.table(sizes)
        print(f"batch {b}: auto's cost model, measured in {secs:.1f}s: {_costs_note(costs[b])}")

    # Part 2: the timed and the warm-up prompts decoded at a large budget, every round recorded.
    rec = Recorder(dev)
    for group in (prompts[:batch], warm[:batch]):
        generate(target, head, group, max_new_tokens=new, budget=[record], topk=a.topk,
                 cost_model={record: 1.0}, calibrator=rec)
    accepted = [counterfactual(r) for r in rec.rounds]
    print(f"recorded {len(rec.rounds)} rounds of batch {batch} at budget {record}")
    shares = share(rec.rounds, accepted, sizes, record)
    for s in shares:
        rows.append(dict(part="share", batch=batch, config=str(s["n"]), tokens_per_round=s["shared"],
                         mean_size=s["widest"], rounds=s["rounds"],
                         note=f"equal split {s['equal']:.2f} accepted/round, best-nodes split "
                              f"{s['shared']:.2f} ({100 * s['gain']:+.1f}%), widest tree "
                              f"{s['widest']:.1f}"))
    models = {"predicted (costs measured above)": costs, "predicted h200-8b roofline": {
        b: h200_8b_costs(b, sizes) for b in (1, batch)}}
    if opts.cuda:
        from bench import model_setup as ms

        big = ms.build(dev, torch.bfloat16, size="8b", with_target=True)
        gen = torch.Generator().manual_seed(0)
        models["predicted 8b shapes measured"] = {}
        for b in (1, batch):
            ps = [torch.randint(0, 151936, (512,), generator=gen).tolist() for _ in range(b)]
            models["predicted 8b shapes measured"][b] = measure_round_costs(
                big.target, big.head, ps, list(sizes), topk=a.topk, rounds=3).table(sizes)
        del big
    for label, per_batch in models.items():
        for b, cm in per_batch.items():
            groups = [[i] for i in range(batch)] if b == 1 else None
            pred = replay(rec.rounds, accepted, cm, sizes, max_depth=head.block_size - 1,
                          groups=groups)
            for cfg, (tps, tpr, size) in pred.items():
                rows.append(dict(part=label, batch=b, config=str(cfg), tokens_per_s=tps,
                                 tokens_per_round=tpr, mean_size=size,
                                 note=_costs_note(cm) if cfg == "auto" else ""))
    _print(rows)
    opts.out.mkdir(parents=True, exist_ok=True)
    path = opts.out / "adaptive_budget.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({"device": bc.device_name(dev), **r})
    print(f"wrote {path}")
    if opts.plot:
        png = opts.out / "adaptive_budget.png"
        if write_png(png, [r for r in rows if r["part"] in ("measured", "predicted h200-8b roofline")],
                     f"tiny model on {bc.device_name(dev)}: fixed budgets vs auto"):
            print(f"wrote {png}")
    bad = [r for r in rows if r.get("note") == "OUTPUTS DIFFER"]
    return 1 if bad else 0


def _costs_note(costs: dict) -> str:
    return "costs " + ", ".join(f"{n}: {c * 1e3:.2f} ms" for n, c in costs.items())


def _print(rows: list[dict]) -> None:
    last = None
    for r in rows:
        key = (r["part"], r["batch"])
        if key != last:
            print(f"-- {r['part']}, batch {r['batch']}")
            print(f"{'config':>7} {'tokens/s':>9} {'tok/round':>9} {'mean n':>7} {'spread':>10} "
                  f"{'choose ms':>9} {'calib ms':>8}  note")
            last = key
        tps = r.get("tokens_per_s")
        print(f"{r['config']:>7} {'' if tps is None else f'{tps:9.1f}':>9} "
              f"{r.get('tokens_per_round', math.nan):9.2f} {r.get('mean_size', math.nan):7.1f} "
              f"{r.get('spread', ''):>10} {_ms(r.get('choose_ms')):>9} {_ms(r.get('calibrate_ms')):>8}"
              f"  {r.get('note', '')}")


def _ms(v) -> str:
    return "" if v is None else f"{v:.3f}"


if __name__ == "__main__":
    bc.main_guard(main)
