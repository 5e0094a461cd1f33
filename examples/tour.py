"""The README's API tour, runnable: one speculative round on small random data, every result
checked against the pure-PyTorch specification (python_ref).

    python examples/tour.py                      # auto backend (reference on a CPU)
    TRITON_INTERPRET=1 python examples/tour.py --backend triton
    python examples/tour.py --device cuda --backend cuda

Prints each step and exits with status 0 when every output equals python_ref's (within the
float32 tolerance of torch.testing.assert_close), else raises AssertionError.
"""
import argparse

import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref

B, D, V = 2, 4, 50            # batch, draft depths, vocabulary
BUDGET, TOPK = 16, 4          # tree nodes (root included), children per node
HQ, HKV, DH = 4, 2, 64        # query heads, key/value heads, head dim
HIDDEN = 32                   # width of the hidden-state taps the draft head reads
AGREE_DEPTH = 2               # the random target agrees with the draft down to this depth


def agreeing_target_logits(tree: jk.Tree, gen: torch.Generator) -> torch.Tensor:
    """Random target logits [B, N, V] that agree with each node's first child down to
    AGREE_DEPTH, so that the verdict accepts a few draft tokens (random logits alone would
    accept none)."""
    logits = torch.randn(B, tree.capacity, V, generator=gen, device=tree.tokens.device)
    for b in range(B):
        seen = set()
        for i in range(1, int(tree.num_nodes[b])):
            parent = int(tree.parents[b, i])
            if parent not in seen and int(tree.depths[b, parent]) < AGREE_DEPTH:
                seen.add(parent)
                logits[b, parent, int(tree.tokens[b, i])] += 20.0
    return logits


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="auto", choices=("auto", "reference", "triton", "cuda"))
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    jk.set_backend(args.backend)
    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=dev)

    # 1. Draft: per-depth logits [B, D, V] of the draft head -> a tree of BUDGET nodes.
    draft_logits = 3.0 * randn(B, D, V)
    root_tokens = torch.tensor([7, 11], dtype=torch.int32, device=dev)  # the last accepted tokens
    tree = jk.draft_tree(draft_logits, root_tokens, budget=BUDGET, topk=TOPK)
    want = ref.draft_tree(draft_logits, root_tokens, BUDGET, TOPK)
    for name in ("tokens", "parents", "depths", "num_nodes", "mask"):
        assert torch.equal(getattr(tree, name), want[name]), name
    torch.testing.assert_close(tree.scores, want["scores"].float())
    print("1. draft_tree: equal to python_ref")
    print(tree.pretty(0))

    # 2. Verify forward, one target layer: the tree's K/V go to cache slots prefix..prefix+N-1
    #    at RoPE positions prefix + depth, then tree-masked attention over prefix + tree.
    prefix_lens = torch.tensor([5, 9], dtype=torch.int32, device=dev)      # int32 sequence lengths
    cache_len = int(prefix_lens.max()) + BUDGET
    k_cache, v_cache = randn(B, cache_len, HKV, DH), randn(B, cache_len, HKV, DH)  # NHD layout
    ref_k_cache, ref_v_cache = k_cache.clone(), v_cache.clone()
    q, k, v = randn(B, BUDGET, HQ, DH), randn(B, BUDGET, HKV, DH), randn(B, BUDGET, HKV, DH)
    q_norm_w, k_norm_w = 1.0 + 0.1 * randn(DH), 1.0 + 0.1 * randn(DH)
    positions = tree.positions(prefix_lens)
    q_rot = jk.qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, k_cache, v_cache,
                                   rope_theta=1e6, cache_start=prefix_lens)
    want_q = ref.qk_norm_rope_append(q, k, v, q_norm_w, k_norm_w, positions, ref_k_cache,
                                     ref_v_cache, 1e6, cache_start=prefix_lens)
    torch.testing.assert_close(q_rot, want_q.to(q_rot.dtype))
    torch.testing.assert_close(k_cache, ref_k_cache)
    torch.testing.assert_close(v_cache, ref_v_cache)
    print("2. qk_norm_rope_append: q and both caches equal to python_ref")

    out = jk.tree_attention(q_rot, k_cache, v_cache, prefix_lens, tree.mask)
    want_out, _ = ref.tree_attention(want_q, ref_k_cache, ref_v_cache, prefix_lens, want["mask"])
    torch.testing.assert_close(out, want_out.to(out.dtype))
    print(f"   tree_attention: output {tuple(out.shape)} equal to python_ref")

    # 3. Accept the longest path the target agrees with, then commit it to the cache.
    target_logits = agreeing_target_logits(tree, gen)
    verdict = jk.verify_tree(tree, target_logits)
    want_v = ref.verify_tree(want["tokens"], want["parents"], want["num_nodes"], tree.max_depth,
                             target_logits)
    for name in ("accept_len", "path", "bonus", "emitted"):
        assert torch.equal(getattr(verdict, name), want_v[name]), name
    print(f"3. verify_tree: accepted {verdict.accept_len.tolist()} draft tokens, emitted "
          f"{[row[row >= 0].tolist() for row in verdict.emitted]}; equal to python_ref")

    taps = randn(B, BUDGET, HIDDEN)      # the target's hidden states at each tree node
    commit = jk.commit_kv(k_cache, v_cache, prefix_lens, verdict, hidden=taps)
    want_lens, want_rows = ref.commit_kv(ref_k_cache, ref_v_cache, prefix_lens, want_v["path"],
                                         want_v["accept_len"], hidden=taps)
    assert torch.equal(commit.prefix_lens, want_lens)
    torch.testing.assert_close(commit.hidden, want_rows)
    torch.testing.assert_close(k_cache, ref_k_cache)
    torch.testing.assert_close(v_cache, ref_v_cache)
    print(f"   commit_kv: prefix_lens {prefix_lens.tolist()} -> {commit.prefix_lens.tolist()} "
          "(the bonus token is the next round's root); equal to python_ref")
    print(f"all results equal to python_ref (backend {args.backend} on {dev})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
