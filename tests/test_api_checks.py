"""Bad input to every public op: the error type, and a message that names the argument.

Each case starts from valid arguments (which must pass), changes one thing, and expects
TypeError/ValueError mentioning the argument. Runs on the reference backend (CPU tensors, so
value checks are on).
"""
import pytest
import torch

import jetspec_kernels as jk

B, D, V, K, BUDGET = 3, 4, 50, 3, 10
N, HQ, HKV, DH, L = 5, 4, 2, 16, 12
F32, I32, I64 = torch.float32, torch.int32, torch.int64


def _tree():
    logits = torch.randn(B, D, V)
    return jk.draft_tree(logits, torch.arange(B, dtype=I32), budget=N, topk=2, backend="reference")


def draft_tree_args():
    return dict(logits=torch.randn(B, D, V), root_tokens=torch.zeros(B, dtype=I32), budget=BUDGET,
                topk=K, algorithm="topn")


def draft_tree_from_topk_args():
    lp = torch.sort(torch.log_softmax(torch.randn(B, D, V), -1), -1, descending=True).values[..., :K]
    return dict(topk_tokens=torch.randint(0, V, (B, D, K), dtype=I32), topk_logprobs=lp.contiguous(),
                root_tokens=torch.zeros(B, dtype=I32), budget=BUDGET, algorithm="accum_logp")


def draft_tree_from_hidden_args():
    return dict(hidden=torch.randn(B, D, 8), lm_head_weight=torch.randn(V, 8),
                root_tokens=torch.zeros(B, dtype=I32), budget=BUDGET, topk=K, algorithm="topn")


def pack_mask_args():
    return dict(parents=torch.tensor([[-1, 0, 0, 1, -1]] * B, dtype=I32),
                num_nodes=torch.tensor([4, 3, 1], dtype=I32))


def tree_attention_args():
    return dict(q=torch.randn(B, N, HQ, DH), k_cache=torch.randn(B, L, HKV, DH),
                v_cache=torch.randn(B, L, HKV, DH), prefix_lens=torch.tensor([0, 3, L - N], dtype=I32),
                tree_mask=_tree().mask, tail="causal", block_table=None, scale=None, out=None)


def paged_attention_args():
    a = tree_attention_args()
    a["k_cache"] = torch.randn(9, 4, HKV, DH)
    a["v_cache"] = torch.randn(9, 4, HKV, DH)
    a["block_table"] = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8]], dtype=I32)
    return a


def rope_args():
    return dict(q=torch.randn(B, N, HQ, DH), k=torch.randn(B, N, HKV, DH), v=torch.randn(B, N, HKV, DH),
                q_norm_w=torch.ones(DH), k_norm_w=torch.ones(DH),
                positions=torch.arange(N, dtype=I32).repeat(B, 1), k_cache=torch.zeros(B, L, HKV, DH),
                v_cache=torch.zeros(B, L, HKV, DH), rope_theta=1e4, eps=1e-6, block_table=None,
                cache_start=None)


def rope_kv_args():
    """The K/V-only form: q and q_norm_w None."""
    return {**rope_args(), "q": None, "q_norm_w": None}


def verify_args():
    tree = _tree()
    return dict(tree=tree, target_logits=torch.randn(B, N, V), target_tokens=None, temperature=0.0,
                seed=None, offset=None)


def commit_args():
    tree = _tree()
    verdict = jk.verify_tree(tree, torch.randn(B, N, V), backend="reference")
    return dict(k_cache=torch.randn(B, L, HKV, DH), v_cache=torch.randn(B, L, HKV, DH),
                prefix_lens=torch.tensor([0, 2, L - N], dtype=I32), verdict=verdict, block_table=None,
                hidden=torch.randn(B, N, 6))


def call(op, args):
    args = dict(args)
    if op is jk.draft_tree:
        return op(args.pop("logits"), args.pop("root_tokens"), backend="reference", **args)
    if op is jk.draft_tree_from_topk:
        return op(args.pop("topk_tokens"), args.pop("topk_logprobs"), args.pop("root_tokens"),
                  backend="reference", **args)
    if op is jk.draft_tree_from_hidden:
        return op(args.pop("hidden"), args.pop("lm_head_weight"), args.pop("root_tokens"),
                  backend="reference", **args)
    if op is jk.pack_mask:
        return op(args.pop("parents"), args.pop("num_nodes"), backend="reference")
    if op is jk.tree_attention:
        pos = [args.pop(k) for k in ("q", "k_cache", "v_cache", "prefix_lens", "tree_mask")]
        return op(*pos, backend="reference", **args)
    if op is jk.qk_norm_rope_append:
        pos = [args.pop(k) for k in ("q", "k", "v", "q_norm_w", "k_norm_w", "positions", "k_cache", "v_cache")]
        return op(*pos, backend="reference", **args)
    if op is jk.verify_tree:
        return op(args.pop("tree"), args.pop("target_logits"), backend="reference", **args)
    if op is jk.commit_kv:
        pos = [args.pop(k) for k in ("k_cache", "v_cache", "prefix_lens", "verdict")]
        return op(*pos, backend="reference", **args)
    raise AssertionError(op)


def _with(field, value):
    return lambda a: {**a, field: value(a) if callable(value) else value}


def _tree_with(field, value):
    def change(a):
        t = a["tree"]
        return {**a, "tree": jk.Tree(**{**t.__dict__, field: value(t) if callable(value) else value})}
    return change


def _verdict_with(field, value):
    def change(a):
        return {**a, "verdict": a["verdict"]._replace(**{field: value(a["verdict"])})}
    return change


CASES = [
    # draft_tree
    (jk.draft_tree, draft_tree_args, _with("logits", lambda a: a["logits"].double()), TypeError, "logits"),
    (jk.draft_tree, draft_tree_args, _with("logits", lambda a: a["logits"][0]), ValueError, "logits"),
    (jk.draft_tree, draft_tree_args, _with("logits", [[1.0]]), TypeError, "logits"),
    (jk.draft_tree, draft_tree_args, _with("logits", lambda a: a["logits"].transpose(1, 2).transpose(1, 2)[..., ::2]), ValueError, "logits"),
    (jk.draft_tree, draft_tree_args, _with("logits", lambda a: a["logits"][:, :0]), ValueError, "logits"),
    # a last dim of stride 0 (an expanded row) is not contiguous either
    (jk.draft_tree, draft_tree_args, _with("logits", lambda a: a["logits"][..., :1].expand(B, D, V)), ValueError, "logits"),
    (jk.tree_attention, tree_attention_args, _with("q", lambda a: a["q"][..., :1].expand(B, N, HQ, DH)), ValueError, "q"),
    (jk.verify_tree, verify_args, _with("target_logits", lambda a: a["target_logits"][..., :1].expand(B, N, V)), ValueError, "target_logits"),
    (jk.qk_norm_rope_append, rope_args, _with("k_norm_w", torch.ones(1).expand(DH)), ValueError, "k_norm_w"),
    (jk.draft_tree, draft_tree_args, _with("logits", lambda a: a["logits"][..., :0]), ValueError, "logits"),
    (jk.draft_tree, draft_tree_args, _with("root_tokens", lambda a: a["root_tokens"].float()), TypeError, "root_tokens"),
    (jk.draft_tree, draft_tree_args, _with("root_tokens", torch.zeros(B + 1, dtype=I32)), ValueError, "root_tokens"),
    (jk.draft_tree, draft_tree_args, _with("root_tokens", torch.full((B,), V, dtype=I32)), ValueError, "root_tokens"),
    (jk.draft_tree, draft_tree_args, _with("budget", 0), ValueError, "budget"),
    (jk.draft_tree, draft_tree_args, _with("budget", 5000), ValueError, "budget"),
    (jk.draft_tree, draft_tree_args, _with("budget", 2.0), TypeError, "budget"),
    (jk.draft_tree, draft_tree_args, _with("topk", 0), ValueError, "topk"),
    (jk.draft_tree, draft_tree_args, _with("topk", V + 1), ValueError, "topk"),
    (jk.draft_tree, draft_tree_args, _with("topk", True), TypeError, "topk"),
    (jk.draft_tree, draft_tree_args, _with("algorithm", "beam"), ValueError, "algorithm"),
    (jk.draft_tree, draft_tree_args, _with("root_tokens", lambda a: a["root_tokens"].to("meta")), ValueError, "root_tokens"),
    # draft_tree_from_topk
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, _with("topk_tokens", lambda a: a["topk_tokens"].float()), TypeError, "topk_tokens"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, _with("topk_tokens", lambda a: -a["topk_tokens"] - 1), ValueError, "topk_tokens"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, _with("topk_logprobs", lambda a: a["topk_logprobs"].half()), TypeError, "topk_logprobs"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, _with("topk_logprobs", lambda a: a["topk_logprobs"][..., :2]), ValueError, "topk_logprobs"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, _with("topk_logprobs", lambda a: a["topk_logprobs"].flip(-1)), ValueError, "topk_logprobs"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, _with("topk_logprobs", lambda a: a["topk_logprobs"] + 100), ValueError, "topk_logprobs"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, _with("root_tokens", torch.zeros(B, 1, dtype=I32)), ValueError, "root_tokens"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, _with("budget", -1), ValueError, "budget"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, _with("algorithm", None), ValueError, "algorithm"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, lambda a: {**a, "topk_tokens": torch.zeros(B, D, 65, dtype=I32), "topk_logprobs": torch.full((B, D, 65), -1.0)}, ValueError, "topk_tokens"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, lambda a: {**a, "topk_tokens": torch.zeros(B, D, 0, dtype=I32), "topk_logprobs": torch.zeros(B, D, 0)}, ValueError, "topk_tokens"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, lambda a: {**a, "topk_tokens": a["topk_tokens"][:, :0], "topk_logprobs": a["topk_logprobs"][:, :0]}, ValueError, "topk_tokens"),
    # int64 tokens are narrowed to int32 by every backend: a value past int32 would wrap
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, _with("topk_tokens", lambda a: a["topk_tokens"].long() + 2**31), ValueError, "topk_tokens"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, _with("root_tokens", torch.full((B,), 2**32, dtype=I64)), ValueError, "root_tokens"),
    (jk.draft_tree_from_topk, draft_tree_from_topk_args, _with("root_tokens", torch.full((B,), -1, dtype=I32)), ValueError, "root_tokens"),
    # draft_tree_from_hidden
    (jk.draft_tree_from_hidden, draft_tree_from_hidden_args, _with("hidden", lambda a: a["hidden"].int()), TypeError, "hidden"),
    (jk.draft_tree_from_hidden, draft_tree_from_hidden_args, _with("lm_head_weight", lambda a: a["lm_head_weight"].half()), TypeError, "lm_head_weight"),
    (jk.draft_tree_from_hidden, draft_tree_from_hidden_args, _with("lm_head_weight", lambda a: a["lm_head_weight"][:, :4]), ValueError, "lm_head_weight"),
    (jk.draft_tree_from_hidden, draft_tree_from_hidden_args, _with("topk", 0), ValueError, "topk"),
    (jk.draft_tree_from_hidden, draft_tree_from_hidden_args, _with("root_tokens", torch.full((B,), -1, dtype=I32)), ValueError, "root_tokens"),
    (jk.draft_tree_from_hidden, draft_tree_from_hidden_args, _with("lm_head_weight", lambda a: a["lm_head_weight"][:0]), ValueError, "lm_head_weight"),
    (jk.draft_tree_from_hidden, draft_tree_from_hidden_args, _with("hidden", lambda a: a["hidden"][:, :0]), ValueError, "hidden"),
    (jk.draft_tree_from_hidden, draft_tree_from_hidden_args, lambda a: {**a, "hidden": a["hidden"][..., :0], "lm_head_weight": a["lm_head_weight"][:, :0]}, ValueError, "hidden"),
    # pack_mask
    (jk.pack_mask, pack_mask_args, _with("parents", lambda a: a["parents"].long()), TypeError, "parents"),
    (jk.pack_mask, pack_mask_args, _with("parents", lambda a: a["parents"][0]), ValueError, "parents"),
    (jk.pack_mask, pack_mask_args, _with("parents", torch.tensor([[-1, 0, 2, 1, -1]] * B, dtype=I32)), ValueError, "parents"),
    (jk.pack_mask, pack_mask_args, _with("num_nodes", torch.tensor([6, 3, 1], dtype=I32)), ValueError, "num_nodes"),
    (jk.pack_mask, pack_mask_args, _with("num_nodes", torch.tensor([4, 3], dtype=I32)), ValueError, "num_nodes"),
    (jk.pack_mask, pack_mask_args, _with("parents", torch.tensor([[4, 0, 0, 1, -1]] * B, dtype=I32)), ValueError, "parents"),
    (jk.pack_mask, pack_mask_args, lambda a: {**a, "parents": torch.zeros(B, 0, dtype=I32), "num_nodes": torch.zeros(B, dtype=I32)}, ValueError, "parents"),
    # tree_attention
    (jk.tree_attention, tree_attention_args, _with("q", lambda a: a["q"].int()), TypeError, "q"),
    (jk.tree_attention, tree_attention_args, _with("q", lambda a: a["q"][0]), ValueError, "q"),
    (jk.tree_attention, tree_attention_args, _with("q", lambda a: a["q"].transpose(2, 3)), ValueError, "q"),
    (jk.tree_attention, tree_attention_args, _with("k_cache", lambda a: a["k_cache"].half()), TypeError, "k_cache"),
    (jk.tree_attention, tree_attention_args, _with("k_cache", lambda a: a["k_cache"][..., :8]), ValueError, "k_cache"),
    (jk.tree_attention, tree_attention_args, _with("k_cache", lambda a: a["k_cache"][:2]), ValueError, "k_cache"),
    (jk.tree_attention, tree_attention_args, _with("v_cache", lambda a: a["v_cache"][:, :5]), ValueError, "v_cache"),
    (jk.tree_attention, tree_attention_args, _with("k_cache", torch.randn(B, L, 3, DH)), ValueError, "v_cache"),
    (jk.tree_attention, tree_attention_args, lambda a: {**a, "k_cache": torch.randn(B, L, 3, DH), "v_cache": torch.randn(B, L, 3, DH)}, ValueError, "heads"),
    (jk.tree_attention, tree_attention_args, _with("prefix_lens", lambda a: a["prefix_lens"].to(torch.int16)), TypeError, "prefix_lens"),
    (jk.tree_attention, tree_attention_args, _with("prefix_lens", lambda a: a["prefix_lens"].to("meta")), ValueError, "prefix_lens"),
    (jk.tree_attention, tree_attention_args, _with("k_cache", lambda a: a["k_cache"].to("meta")), ValueError, "k_cache"),
    (jk.tree_attention, tree_attention_args, _with("prefix_lens", torch.tensor([0, 3, L - N + 1], dtype=I32)), ValueError, "cache length"),
    (jk.tree_attention, tree_attention_args, _with("prefix_lens", torch.tensor([-1, 3, 2], dtype=I32)), ValueError, "prefix_lens"),
    (jk.tree_attention, tree_attention_args, _with("tree_mask", lambda a: a["tree_mask"][:, :, :0]), ValueError, "tree_mask"),
    (jk.tree_attention, tree_attention_args, _with("tree_mask", lambda a: a["tree_mask"].bool()), TypeError, "tree_mask"),
    (jk.tree_attention, tree_attention_args, _with("tail", "bidirectional"), ValueError, "tail"),
    (jk.tree_attention, tree_attention_args, _with("scale", -1.0), ValueError, "scale"),
    (jk.tree_attention, tree_attention_args, _with("scale", "x"), TypeError, "scale"),
    (jk.tree_attention, tree_attention_args, _with("out", torch.empty(B, N, HQ, DH, dtype=torch.float16)), TypeError, "out"),
    (jk.tree_attention, tree_attention_args, _with("out", torch.empty(B, N, HQ, DH + 1)), ValueError, "out"),
    (jk.tree_attention, tree_attention_args, _with("lse", torch.empty(B, N, HQ)), ValueError, "lse"),
    (jk.tree_attention, tree_attention_args, _with("lse", torch.empty(B, HQ, N, dtype=torch.float64)), TypeError, "lse"),
    (jk.tree_attention, tree_attention_args, _with("return_lse", "yes"), TypeError, "return_lse"),
    (jk.tree_attention, tree_attention_args, _with("return_lse", 1), TypeError, "return_lse"),
    (jk.tree_attention, tree_attention_args, _with("return_lse", None), TypeError, "return_lse"),
    (jk.tree_attention, tree_attention_args, lambda a: {**a, "q": torch.randn(B, N, HQ, 0), "k_cache": torch.randn(B, L, HKV, 0), "v_cache": torch.randn(B, L, HKV, 0)}, ValueError, "q head dim"),
    (jk.tree_attention, paged_attention_args, _with("block_table", lambda a: a["block_table"].long()), TypeError, "block_table"),
    (jk.tree_attention, paged_attention_args, _with("block_table", lambda a: a["block_table"][:2]), ValueError, "block_table"),
    (jk.tree_attention, paged_attention_args, _with("block_table", lambda a: a["block_table"] + 1), ValueError, "block_table"),
    (jk.tree_attention, paged_attention_args, _with("block_table", lambda a: a["block_table"][:, :2]), ValueError, "block table is too short"),
    # qk_norm_rope_append
    (jk.qk_norm_rope_append, rope_args, _with("q", lambda a: a["q"][..., :15]), ValueError, "q"),
    (jk.qk_norm_rope_append, rope_args, _with("k", lambda a: a["k"].half()), TypeError, "k"),
    (jk.qk_norm_rope_append, rope_args, _with("k", torch.randn(B, N + 1, HKV, DH)), ValueError, "k"),
    (jk.qk_norm_rope_append, rope_args, lambda a: {**a, "k": torch.randn(B, N, 3, DH), "v": torch.randn(B, N, 3, DH)}, ValueError, "heads"),
    (jk.qk_norm_rope_append, rope_args, _with("v", torch.randn(B, N, HKV, DH + 2)), ValueError, "v"),
    (jk.qk_norm_rope_append, rope_args, _with("q_norm_w", torch.ones(DH + 1)), ValueError, "q_norm_w"),
    (jk.qk_norm_rope_append, rope_args, _with("k_norm_w", torch.ones(DH, dtype=I32)), TypeError, "k_norm_w"),
    (jk.qk_norm_rope_append, rope_args, _with("positions", torch.zeros(B, N)), TypeError, "positions"),
    (jk.qk_norm_rope_append, rope_args, _with("positions", torch.zeros(B, N + 1, dtype=I32)), ValueError, "positions"),
    (jk.qk_norm_rope_append, rope_args, _with("positions", torch.full((B, N), L, dtype=I32)), ValueError, "positions"),
    (jk.qk_norm_rope_append, rope_args, _with("positions", torch.full((B, N), -2, dtype=I32)), ValueError, "positions"),
    (jk.qk_norm_rope_append, rope_args, _with("positions", torch.zeros((B, N), dtype=I32)), ValueError, "positions"),
    (jk.qk_norm_rope_append, rope_args, _with("k_cache", torch.zeros(B, L, HKV + 1, DH)), ValueError, "k_cache"),
    (jk.qk_norm_rope_append, rope_args, _with("v_cache", torch.zeros(B, L, HKV, DH, dtype=torch.float16)), TypeError, "v_cache"),
    (jk.qk_norm_rope_append, rope_args, _with("v", lambda a: a["v"].to("meta")), ValueError, "v"),
    (jk.qk_norm_rope_append, rope_args, _with("rope_theta", 0.0), ValueError, "rope_theta"),
    (jk.qk_norm_rope_append, rope_args, _with("eps", -1e-6), ValueError, "eps"),
    (jk.qk_norm_rope_append, rope_args, _with("cache_start", torch.tensor([0, 0, L - N + 1], dtype=I32)), ValueError, "cache_start"),
    (jk.qk_norm_rope_append, rope_args, _with("cache_start", torch.zeros(B, dtype=torch.int16)), TypeError, "cache_start"),
    (jk.qk_norm_rope_append, rope_args, lambda a: {**a, "positions": torch.full((B, N), 2**31, dtype=I64), "cache_start": torch.zeros(B, dtype=I32)}, ValueError, "positions"),
    (jk.qk_norm_rope_append, rope_args, _with("block_table", torch.full((B, 2), B, dtype=I32)), ValueError, "block_table"),
    (jk.qk_norm_rope_append, rope_args, _with("q", [[1.0]]), TypeError, "q"),
    # qk_norm_rope_append, K/V only (q None): sizes come from k; a given q_norm_w is still checked
    (jk.qk_norm_rope_append, rope_kv_args, _with("q_norm_w", torch.ones(DH + 1)), ValueError, "q_norm_w"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("q_norm_w", torch.ones(DH, dtype=I32)), TypeError, "q_norm_w"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("q_norm_w", lambda a: torch.ones(DH, device="meta")), ValueError, "q_norm_w"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("k", lambda a: a["k"].int()), TypeError, "k"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("k", lambda a: a["k"].double()), TypeError, "k"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("k", lambda a: a["k"][0]), ValueError, "k"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("k", lambda a: a["k"].transpose(2, 3)), ValueError, "k"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("k", "not a tensor"), TypeError, "k"),
    (jk.qk_norm_rope_append, rope_kv_args, lambda a: {**a, "k": torch.randn(B, N, HKV, DH - 1), "v": torch.randn(B, N, HKV, DH - 1)}, ValueError, "k head dim"),
    (jk.qk_norm_rope_append, rope_kv_args, lambda a: {**a, "k": torch.randn(B, N, 0, DH), "v": torch.randn(B, N, 0, DH)}, ValueError, "k"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("v", lambda a: a["v"].half()), TypeError, "v"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("v", torch.randn(B, N + 1, HKV, DH)), ValueError, "v"),
    (jk.qk_norm_rope_append, rope_args, _with("k_norm_w", None), ValueError, "k_norm_w"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("k_norm_w", torch.ones(DH - 2)), ValueError, "k_norm_w"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("positions", torch.arange(N, dtype=I32)), ValueError, "positions"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("positions", torch.full((B, N), L, dtype=I32)), ValueError, "positions"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("positions", torch.zeros((B, N), dtype=I32)), ValueError, "positions"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("positions", lambda a: a["positions"].to("meta")), ValueError, "positions"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("k_cache", torch.zeros(B, L, HKV + 1, DH)), ValueError, "k_cache"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("k_cache", torch.zeros(B + 1, L, HKV, DH)), ValueError, "k_cache"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("v_cache", torch.zeros(B, L - 1, HKV, DH)), ValueError, "v_cache"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("cache_start", torch.tensor([0, 0, L - N + 1], dtype=I32)), ValueError, "cache_start"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("block_table", torch.zeros(B, 2, dtype=I64)), TypeError, "block_table"),
    (jk.qk_norm_rope_append, rope_kv_args, _with("rope_theta", float("nan")), ValueError, "rope_theta"),
    # verify_tree
    (jk.verify_tree, verify_args, _with("tree", "not a tree"), TypeError, "tree"),
    (jk.verify_tree, verify_args, _tree_with("tokens", lambda t: t.tokens.long()), TypeError, "tree.tokens"),
    (jk.verify_tree, verify_args, _tree_with("parents", lambda t: t.parents[:, :-1]), ValueError, "tree.parents"),
    (jk.verify_tree, verify_args, _tree_with("mask", lambda t: t.mask[..., :0]), ValueError, "tree.mask"),
    (jk.verify_tree, verify_args, _tree_with("num_nodes", lambda t: t.num_nodes + N), ValueError, "tree.num_nodes"),
    (jk.verify_tree, verify_args, _tree_with("max_depth", N), ValueError, "tree.max_depth"),
    (jk.verify_tree, verify_args, lambda a: {**a, "target_logits": torch.randn(B, 0, V), "tree": jk.Tree(
        **{k: (v[:, :0, :0] if k == "mask" else v[:, :0]) if k not in ("num_nodes", "max_depth") else
           (v * 0 if k == "num_nodes" else 0) for k, v in a["tree"].__dict__.items()})}, ValueError, "root"),
    (jk.verify_tree, verify_args, _with("target_logits", lambda a: a["target_logits"][:, :-1]), ValueError, "target_logits"),
    (jk.verify_tree, verify_args, _with("target_logits", lambda a: a["target_logits"].int()), TypeError, "target_logits"),
    (jk.verify_tree, verify_args, _with("target_logits", None), ValueError, "target_tokens"),
    (jk.verify_tree, verify_args, _with("target_tokens", torch.zeros(B, N, dtype=I32)), ValueError, "target_logits"),
    (jk.verify_tree, verify_args, lambda a: {**a, "target_logits": None, "target_tokens": torch.zeros(B, N)}, TypeError, "target_tokens"),
    (jk.verify_tree, verify_args, _with("temperature", -0.5), ValueError, "temperature"),
    (jk.verify_tree, verify_args, lambda a: {**a, "target_logits": None, "target_tokens": torch.full((B, N), -5, dtype=I32)}, ValueError, "target_tokens"),
    (jk.verify_tree, verify_args, _tree_with("tokens", lambda t: t.tokens - V), ValueError, "tree.tokens"),
    (jk.verify_tree, verify_args, _tree_with("tokens", lambda t: t.tokens + V), ValueError, "tree.tokens"),
    (jk.verify_tree, verify_args, lambda a: {**a, "target_logits": None, "target_tokens": torch.zeros(B, N, dtype=I32), "tree": jk.Tree(**{**a["tree"].__dict__, "tokens": a["tree"].tokens - V})}, ValueError, "tree.tokens"),
    (jk.verify_tree, verify_args, lambda a: {**a, "temperature": 1.0, "seed": 2**64, "offset": 0}, ValueError, "seed"),
    (jk.verify_tree, verify_args, lambda a: {**a, "temperature": 1.0, "seed": 0, "offset": -2**63 - 1}, ValueError, "offset"),
    (jk.verify_tree, verify_args, _with("target_logits", lambda a: a["target_logits"].to("meta")), ValueError, "target_logits"),
    (jk.verify_tree, verify_args, lambda a: {**a, "temperature": 1.0, "offset": torch.zeros(B, dtype=I64)}, ValueError, "seed"),
    (jk.verify_tree, verify_args, lambda a: {**a, "temperature": 1.0, "seed": torch.zeros(B, dtype=I64)}, ValueError, "offset"),
    (jk.verify_tree, verify_args, lambda a: {**a, "temperature": 1.0, "seed": torch.zeros(B + 1, dtype=I64), "offset": 0}, ValueError, "seed"),
    (jk.verify_tree, verify_args, lambda a: {**a, "temperature": 1.0, "seed": torch.zeros(B), "offset": 0}, TypeError, "seed"),
    (jk.verify_tree, verify_args, lambda a: {**a, "target_logits": None, "target_tokens": torch.zeros(B, N, dtype=I32), "temperature": 1.0}, ValueError, "target_logits"),
    # commit_kv
    (jk.commit_kv, commit_args, _with("verdict", (1, 2)), TypeError, "verdict"),
    (jk.commit_kv, commit_args, _verdict_with("path", lambda v: v.path.long()), TypeError, "verdict.path"),
    (jk.commit_kv, commit_args, _verdict_with("accept_len", lambda v: v.accept_len[:1]), ValueError, "verdict.accept_len"),
    (jk.commit_kv, commit_args, _verdict_with("accept_len", lambda v: v.accept_len + N), ValueError, "verdict.accept_len"),
    (jk.commit_kv, commit_args, _verdict_with("path", lambda v: v.path.clamp_min(0) + N), ValueError, "verdict.path"),
    (jk.commit_kv, commit_args, _with("prefix_lens", torch.tensor([0, 2, L], dtype=I32)), ValueError, "cache length"),
    (jk.commit_kv, commit_args, _with("prefix_lens", torch.zeros(B, dtype=torch.float32)), TypeError, "prefix_lens"),
    (jk.commit_kv, commit_args, _verdict_with("path", lambda v: torch.where(v.path >= 0, v.path + 1, v.path)), ValueError, "verdict.path"),
    (jk.commit_kv, commit_args, lambda a: {**a, "verdict": a["verdict"]._replace(accept_len=torch.ones(B, dtype=I32), path=torch.tensor([[0, 0, -1]] * B, dtype=I32)[:, :a["verdict"].path.shape[1]])}, ValueError, "verdict.path"),
    (jk.commit_kv, commit_args, _with("k_cache", lambda a: a["k_cache"].int()), TypeError, "k_cache"),
    (jk.commit_kv, commit_args, _with("v_cache", lambda a: a["v_cache"][:, :-1]), ValueError, "v_cache"),
    (jk.commit_kv, commit_args, _with("hidden", lambda a: a["hidden"][:2]), ValueError, "hidden"),
    (jk.commit_kv, commit_args, _with("hidden", lambda a: a["hidden"].long()), TypeError, "hidden"),
    (jk.commit_kv, commit_args, _with("hidden", lambda a: a["hidden"].to("meta")), ValueError, "hidden"),
    (jk.commit_kv, commit_args, _with("block_table", torch.zeros(B, 0, dtype=I32)), ValueError, "block table is too short"),
]


@pytest.mark.parametrize("op,make,change,err,needle", CASES,
                         ids=[f"{c[0].__name__}-{i}-{c[4]}" for i, c in enumerate(CASES)])
def test_bad_argument_is_named(op, make, change, err, needle):
    args = make()
    call(op, args)  # the valid arguments pass
    with pytest.raises(err) as info:
        call(op, change(args))
    assert needle in str(info.value), f"message {str(info.value)!r} does not name {needle!r}"


@pytest.mark.parametrize("make", [draft_tree_args, draft_tree_from_topk_args, draft_tree_from_hidden_args,
                                  pack_mask_args, tree_attention_args, paged_attention_args, rope_args,
                                  rope_kv_args, verify_args, commit_args])
def test_every_op_covered(make):
    assert any(c[1] is make for c in CASES)


TREE_METHOD_CASES = [
    # prefix_lens has one entry per tree: never broadcast from fewer, never silently truncated
    ("positions", lambda t: t.positions(torch.tensor([1], dtype=I32)), ValueError, "prefix_lens"),
    ("positions", lambda t: t.positions(torch.ones(B + 1, dtype=I32)), ValueError, "prefix_lens"),
    ("positions", lambda t: t.positions(torch.ones(B)), TypeError, "prefix_lens"),
    ("positions", lambda t: t.positions(torch.full((B,), -1, dtype=I32)), ValueError, "prefix_lens"),
    ("positions", lambda t: t.positions(torch.full((B,), 2**31 - 2, dtype=I64)), ValueError, "prefix_lens"),
    ("positions", lambda t: t.positions(torch.ones(B, dtype=I32, device="meta")), ValueError, "prefix_lens"),
    ("to_flashinfer_mask", lambda t: t.to_flashinfer_mask(torch.tensor([1], dtype=I32)), ValueError, "prefix_lens"),
    ("to_flashinfer_mask", lambda t: t.to_flashinfer_mask(torch.ones(B + 1, dtype=I32)), ValueError, "prefix_lens"),
    ("to_flashinfer_mask", lambda t: t.to_flashinfer_mask(torch.tensor([1, -2, 3], dtype=I32)), ValueError, "prefix_lens"),
    ("to_flashinfer_mask", lambda t: t.to_flashinfer_mask(torch.ones(B)), TypeError, "prefix_lens"),
    ("to_flashinfer_mask", lambda t: t.to_flashinfer_mask([1, 2, 3]), TypeError, "prefix_lens"),
    ("pretty", lambda t: t.pretty(B), ValueError, "b must be"),
    ("pretty", lambda t: t.pretty(-1), ValueError, "b must be"),
    ("pretty", lambda t: t.pretty(0, decode="vocab.json"), TypeError, "decode"),
]


@pytest.mark.parametrize("method,bad_call,err,needle", TREE_METHOD_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(TREE_METHOD_CASES)])
def test_tree_method_bad_argument_is_named(method, bad_call, err, needle):
    tree = _tree()
    prefix = torch.tensor([0, 3, 7], dtype=I32)
    assert {"positions": lambda: tree.positions(prefix), "pretty": lambda: tree.pretty(0),
            "to_flashinfer_mask": lambda: tree.to_flashinfer_mask(prefix)}[method]() is not None
    with pytest.raises(err) as info:
        bad_call(tree)
    assert needle in str(info.value), f"message {str(info.value)!r} does not name {needle!r}"


@pytest.mark.parametrize("make", [draft_tree_args, draft_tree_from_topk_args, draft_tree_from_hidden_args])
def test_empty_batch_gives_empty_trees(make):
    """B = 0 is valid input (as for the other ops): a Tree of 0 rows, not a crash."""
    first = {draft_tree_args: "logits", draft_tree_from_topk_args: "topk_tokens",
             draft_tree_from_hidden_args: "hidden"}[make]
    args = make()
    args = {k: v[:0] if k in (first, "topk_logprobs", "root_tokens") else v for k, v in args.items()}
    op = {draft_tree_args: jk.draft_tree, draft_tree_from_topk_args: jk.draft_tree_from_topk,
          draft_tree_from_hidden_args: jk.draft_tree_from_hidden}[make]
    tree = call(op, args)
    assert tree.tokens.shape == tree.parents.shape == tree.scores.shape == (0, BUDGET)
    assert tree.num_nodes.shape == (0,) and tree.mask.shape == (0, BUDGET, 1)
    assert tree.tokens.dtype == tree.num_nodes.dtype == I32 and tree.scores.dtype == F32
    packed, indptr = tree.to_flashinfer_mask(torch.zeros(0, dtype=I32))
    assert packed.shape == (0,) and packed.dtype == torch.uint8 and indptr.tolist() == [0]


def test_kv_only_rope_returns_none_and_writes_the_cache():
    a = rope_kv_args()
    assert call(jk.qk_norm_rope_append, a) is None
    assert (a["k_cache"][:, :N] != 0).any() and torch.equal(a["v_cache"][:, :N], a["v"])
    # a q_norm_w of the right shape is accepted (and ignored) without q
    assert call(jk.qk_norm_rope_append, {**rope_kv_args(), "q_norm_w": torch.ones(DH)}) is None


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="backend"):
        jk.tree_attention(**{k: v for k, v in tree_attention_args().items() if k != "out"}, backend="tpu")


@pytest.mark.parametrize("dh", [8, 24])
def test_kernel_backends_reject_unsupported_head_dims(dh, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    a = tree_attention_args()
    a.update(q=torch.randn(B, N, HQ, dh), k_cache=torch.randn(B, L, HKV, dh), v_cache=torch.randn(B, L, HKV, dh))
    args = (a["q"], a["k_cache"], a["v_cache"], a["prefix_lens"], a["tree_mask"])
    with pytest.raises(jk.BackendUnavailableError, match=f"backend 'triton' is not available: .*head dim {dh}"):
        jk.tree_attention(*args, backend="triton")
    # auto passes the call on to the next backend that can take it
    want = jk.tree_attention(*args, backend="reference")
    assert torch.equal(jk.tree_attention(*args, backend="auto"), want)


def test_one_value_controls_apply_to_every_sequence():
    """verify_tree's seed, offset, temperature, top_k and top_p given as a [] or [1] tensor (or
    a number) mean one value for every sequence: the same verdict as [B] tensors of it."""
    tree = _tree()
    logits = torch.randn(B, N, V, generator=torch.Generator().manual_seed(4)) * 3
    full = dict(seed=torch.full((B,), 5, dtype=I64), offset=torch.full((B,), 3, dtype=I64),
                temperature=torch.full((B,), 0.8), top_k=torch.full((B,), 4, dtype=I32),
                top_p=torch.full((B,), 0.9))
    want = jk.verify_tree(tree, logits, backend="reference", **full)
    for form in (lambda t: t[:1], lambda t: t[0], lambda t: t[0].item()):
        got = jk.verify_tree(tree, logits, backend="reference", **{k: form(v) for k, v in full.items()})
        for g, w in zip(got, want):
            assert torch.equal(g, w)


# A message starts with the argument that is wrong and says what was expected (the fragment).
BLAME_CASES = [
    (jk.commit_kv, commit_args, _with("prefix_lens", torch.zeros(B + 1, dtype=I32)), "prefix_lens",
     f"shape [{B}] (verdict.accept_len's)"),
    (jk.commit_kv, commit_args, _with("hidden", lambda a: a["hidden"][:, :0]), "hidden",
     "at least"),
    (jk.tree_attention, tree_attention_args,
     lambda a: {**a, "k_cache": torch.randn(B, 128, L, DH), "v_cache": torch.randn(B, 128, L, DH)},
     "k_cache", "[B, L, Hkv, Dh]"),
    (jk.qk_norm_rope_append, rope_args, _with("k", torch.randn(B, N, 3, DH)), "k", "dividing q's"),
    (jk.verify_tree, verify_args, lambda a: {**a, "target_logits": None,
                                             "target_tokens": torch.full((B, N), -5, dtype=I32)},
     "target_tokens", "values must be >= 0, got min -5"),
    (jk.tree_attention, tree_attention_args, _with("prefix_lens", torch.tensor([0, 3, L - N + 1], dtype=I32)),
     "prefix_lens", f"must be <= {L - N} so that its {N} rows fit the cache length {L}, got max {L - N + 1}"),
]


@pytest.mark.parametrize("op,make,change,name,expected", BLAME_CASES,
                         ids=[f"{c[0].__name__}-{c[3]}" for c in BLAME_CASES])
def test_message_blames_the_wrong_argument(op, make, change, name, expected):
    args = make()
    call(op, args)
    with pytest.raises(ValueError) as info:
        call(op, change(args))
    msg = str(info.value)
    assert msg.startswith(f"{name} ") and expected in msg, msg
    assert "None" not in msg, msg
