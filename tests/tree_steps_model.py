"""How many batched steps the CUDA topn build_tree takes: a model of the rule, not of the kernel.

The rule (jetspec_kernels/triton/build_tree.py's docstring, csrc/include/jetspec/build_tree.cuh):
the heap is every unselected child of a selected node, keyed ``q | depth | parent position |
rank`` with ``q`` the 31-bit magnitude of the float32 score; a node's window is its next
``min(K, 8)`` unselected children. A step takes every window entry ``e`` with

* ``key(e)`` below every child hidden behind a window (full key), and
* ``(q, depth)`` of ``e`` below ``(q, depth)`` of the best child any window entry could have,

plus always the heap minimum; when that passes the node count it keeps the smallest keys. Each
bound is taken here over every entry it names (the whole heap, every window entry, every hidden
child), not just the first entry of each window as the kernel does.

The heap minimum always passes both bounds (it precedes every hidden child, and a window
entry's child can tie its ``(q, depth)`` only from a lower depth at the same ``q``, i.e. from an
entry with a smaller key), so "always the heap minimum" never adds an entry; the model asserts it.
"""
import numpy as np

WINDOW = 8  # kTopnWindow


def _q(score):
    """31-bit magnitude of a float32 score's bits (smaller is better for scores <= 0)."""
    return int(np.float32(score).view(np.uint32)) & 0x7FFFFFFF


def _key(score, depth, parent_pos, rank):
    return (_q(score) << 30) | (depth << 18) | (parent_pos << 6) | rank


def topn_steps(lp, budget):
    """lp: float32 [D, K] (sorted descending, <= 0), budget >= 1 -> the kernel's step count."""
    lp = np.asarray(lp, dtype=np.float32)
    D, K = lp.shape
    target = min(budget, sum(K ** d for d in range(D + 1)))
    window = min(K, WINDOW)
    tree = {(): np.float32(0.0)}  # rank sequence -> float32 score (left-to-right sums)
    steps = 0
    while len(tree) < target:
        steps += 1
        # output positions: breadth first, children of one depth in lexicographic order
        pos = {seq: i for i, seq in enumerate(sorted(tree, key=lambda s: (len(s), s)))}
        heap, win, hidden, best_child = [], [], [], []
        for seq, score in tree.items():
            d = len(seq)
            if d == D:
                continue
            taken = sum(1 for r in range(K) if seq + (r,) in tree)
            for r in range(taken, K):
                cs = np.float32(score + lp[d, r])
                entry = (_key(cs, d + 1, pos[seq], r), seq + (r,), cs)
                heap.append(entry[0])
                if r >= taken + window:
                    hidden.append(entry[0])
                    continue
                win.append(entry)
                if d + 1 < D:  # the best child this entry could have: rank 0, one deeper
                    best_child.append((_q(np.float32(cs + lp[d + 1, 0])), d + 2))
        heap_min = min(heap)
        bound2 = min(hidden, default=None)
        bound1 = min(best_child, default=None)
        def passes(key):
            return ((bound2 is None or key < bound2)
                    and (bound1 is None or (key >> 30, (key >> 18) & 0xFFF) < bound1))

        assert passes(heap_min)
        take = sorted(e for e in win if e[0] == heap_min or passes(e[0]))
        for _, seq, cs in take[:target - len(tree)]:
            tree[seq] = cs
    return steps
