"""Benchmark one Gated DeltaNet layer's tree verify and commit: gated_delta_tree and
gated_delta_commit per backend, against the floor of docs/perf/gated_delta_tree.md.

Row groups per (B, N) shape, Qwen3.6-35B-A3B's linear-attention sizes (16 q/k heads, 32 v-heads,
Dk = Dv = 128; q/k/v in bf16 on CUDA, fp32 on the CPU; a float32 state pool):
  ``.../tree``    gated_delta_tree on a real draft tree (JetSpec's heap, bench.common.random_tree).
      Floor bytes = B * (Hv Dk Dv * 4 + N * (2 H Dk + 2 Hv Dv) * elt + N * Hv * (4 + elt)) (the state
      read, q/k/v read, o written, g and beta read); FLOPs = B * Hv * (4 N Dk Dv + N^2 (2 Dk + 2 Dv))
      (the chunked form with the tree's node pairs dense).
  ``.../commit``  gated_delta_commit along the tree's deepest path (up to 6 nodes). Floor bytes =
      B * Hv * Dk * Dv * 4 * 2 (the state read and written once); FLOPs 7 Dk Dv a node and head.
The ``triton-exact`` rows (when triton runs) are the exact mode's walk
(``triton.exact_gated_delta.walk``: node by node from each parent's state, depth first; the
commit a chain), and ``exact-plan`` its plan (``models.walk_plan.tree_plan``, built once a
forward for all the linear layers), timed against the same floors (docs/perf/exact_mode.md,
"Hybrid targets", has its prediction).
The ``reference`` rows are torch's chunked form: what ``auto`` runs on CUDA tensors until a GPU
backend has passed there (backend.REFERENCE_UNTIL_VERIFIED), hence the baseline. The CPU's quick
run shrinks the heads (H 2, Hv 4, Dk = Dv = 32) so the interpreter finishes.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench import common as bc

BASELINES = ["reference"]
QWEN36_LINEAR = (16, 32, 128)        # q/k heads, v-heads, Dk = Dv


def shapes(opts: bc.Options):
    """([(B, N)], (H, Hv, D))."""
    if opts.quick and not opts.cuda:
        return [(1, 16), (2, 24)], (2, 4, 32)
    if opts.quick:
        return [(1, 64), (16, 64)], QWEN36_LINEAR
    return [(b, n) for b in (1, 16) for n in (16, 64, 256)], QWEN36_LINEAR


def deepest_path(tree, most: int):
    """int32 [B, P] root-first paths to each row's deepest node (at most ``most`` nodes) and
    their accept lengths."""
    paths, accept = [], []
    for b in range(tree.parents.shape[0]):
        parents = tree.parents[b].tolist()
        depths = tree.depths[b].tolist()
        node = max(range(int(tree.num_nodes[b])), key=lambda i: depths[i])
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path = path[::-1][:most]
        accept.append(len(path) - 1)
        paths.append(path + [-1] * (most - len(path)))
    return (torch.tensor(paths, dtype=torch.int32, device=tree.parents.device),
            torch.tensor(accept, dtype=torch.int32, device=tree.parents.device))


def main(argv=None) -> int:
    p = bc.parser(__doc__.splitlines()[0])
    opts = bc.options(p, argv)
    if not opts.args.backends:
        opts.backends = ["reference", "triton"]     # the cuda backend has no kernel for these
    dtype = torch.bfloat16 if opts.cuda else torch.float32
    dev = opts.device
    import jetspec_kernels as jk
    from jetspec_kernels.models.walk_plan import chain_plan, tree_plan
    from jetspec_kernels.python_ref.gated_delta_tree import l2norm
    walk = None
    if "triton" in opts.backends:
        try:
            from jetspec_kernels.triton.exact_gated_delta import walk
        except ImportError:          # its row says why (backend_status)
            pass

    ceil = bc.measure_ceilings(dev, dtype, opts.quick)
    table = bc.Table("gated_delta", opts, ceil, BASELINES)
    grid, (h, hv, d) = shapes(opts)
    table.header_lines.append(f"H {h}, Hv {hv}, Dk = Dv = {d}, {str(dtype)[6:]} q/k/v, float32 "
                              f"state; one layer (x 30 for Qwen3.6-35B-A3B); shape = BxN/<op>")
    status = bc.backend_status(opts)
    gen = torch.Generator(device=dev).manual_seed(0)
    e = bc.elt(dtype)
    for si, (b, n) in enumerate(grid):
        tree = bc.random_tree(b, n, dev, seed=si)
        q = torch.randn(b, n, h, d, device=dev, generator=gen).to(dtype)
        k = torch.randn(b, n, h, d, device=dev, generator=gen).to(dtype)
        v = torch.randn(b, n, hv, d, device=dev, generator=gen).to(dtype)
        g = -torch.rand(b, n, hv, device=dev, generator=gen)
        beta = torch.rand(b, n, hv, device=dev, generator=gen).to(dtype)
        state = torch.randn(b, hv, d, d, device=dev, generator=gen) * 0.1
        pool = state.clone()

        shape = f"{b}x{n}/tree"
        nbytes = float(b * (hv * d * d * 4 + n * (2 * h * d + 2 * hv * d) * e + n * hv * (4 + e)))
        flops = float(b * hv * (4 * n * d * d + n * n * 4 * d))
        for name, why in status.items():
            table.run_ours(shape, name, why,
                           lambda: jk.gated_delta_tree(q, k, v, g, beta, tree.parents, state,
                                                       num_nodes=tree.num_nodes, backend=name),
                           first_shape=si == 0, flops=flops, nbytes=nbytes)
        units = [l2norm(x.float()) for x in (q, k)]
        slots = torch.arange(b, dtype=torch.int32, device=dev)
        if "triton" in status:
            plan = tree_plan(tree.parents, tree.num_nodes, tree.max_depth)
            table.run_ours(shape, "triton", status["triton"],
                           lambda: walk(*units, v, g, beta.float(), plan, tree.num_nodes, state,
                                        slots, out=True, store_last=False),
                           first_shape=si == 0, flops=flops, nbytes=nbytes, label="triton-exact")
            # the plan: once a forward, for every linear layer
            table.run_ours(shape, "triton", status["triton"],
                           lambda: tree_plan(tree.parents, tree.num_nodes, tree.max_depth),
                           first_shape=si == 0, flops=flops, nbytes=nbytes, label="exact-plan")

        shape = f"{b}x{n}/commit"
        path, accept = deepest_path(tree, 6)
        nbytes = float(b * hv * d * d * 4 * 2)
        flops = float(b * hv * 7 * d * d * (int(accept.max()) + 1))
        for name, why in status.items():
            table.run_ours(shape, name, why,
                           lambda: jk.gated_delta_commit(k, v, g, beta, path, accept, pool,
                                                         backend=name),
                           first_shape=si == 0, flops=flops, nbytes=nbytes)
        if "triton" in status:
            rows = torch.arange(b, device=dev)[:, None]
            on_path = [t[rows, path.long().clamp(min=0)] for t in (units[1], v, g, beta.float())]
            chain = chain_plan(b, path.shape[1], dev)
            table.run_ours(shape, "triton", status["triton"],
                           lambda: walk(on_path[0], *on_path, chain, accept + 1, pool, slots,
                                        out=False, store_last=True),
                           first_shape=si == 0, flops=flops, nbytes=nbytes, label="triton-exact")
        del q, k, v, state, pool
    return table.finish()


if __name__ == "__main__":
    bc.main_guard(main)
