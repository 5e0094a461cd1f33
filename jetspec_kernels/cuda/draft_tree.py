"""cuda backend: log_softmax_topk and hidden_topk (vocab-parallel) and build_tree (one CTA per
sequence)."""
from __future__ import annotations

import torch

from ..tree import mask_words
from . import _util as U
from .supports import supports


@torch.library.custom_op("jetspec::log_softmax_topk", mutates_args=())
def _log_softmax_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    from .. import _C
    with U.on_device(logits):
        b, d, v = logits.shape
        tokens = torch.empty(b, d, k, device=logits.device, dtype=torch.int32)
        logprobs = torch.empty(b, d, k, device=logits.device, dtype=torch.float32)
        ws = torch.empty(_C.topk_workspace_bytes(b * d, v, k), device=logits.device, dtype=torch.uint8)
        _C.log_softmax_topk(logits=U.ptr(logits), logits_batch_stride=logits.stride(0),
                            logits_row_stride=logits.stride(1),
                            tokens=U.ptr(tokens), logprobs=U.ptr(logprobs), workspace=U.ptr(ws),
                            batch=b, depth=d, vocab=v, k=k, dtype=U.dtype_code(logits),
                            stream=U.stream())
        return tokens, logprobs


@_log_softmax_topk.register_fake
def _(logits, k):
    b, d, _ = logits.shape
    return (logits.new_empty(b, d, k, dtype=torch.int32),
            logits.new_empty(b, d, k, dtype=torch.float32))


def log_softmax_topk(logits, k):
    """logits float [B, D, V] -> (tokens int32 [B, D, K], logprobs float32 [B, D, K])."""
    return _log_softmax_topk(logits, int(k))


@torch.library.custom_op("jetspec::hidden_topk", mutates_args=())
def _hidden_topk(hidden: torch.Tensor, lm_head_weight: torch.Tensor,
                 k: int) -> tuple[torch.Tensor, torch.Tensor]:
    from .. import _C
    with U.on_device(hidden):
        b, d, h = hidden.shape
        v = lm_head_weight.shape[0]
        # Layout decisions read data_ptr(), so they live inside the op (opaque to torch.compile).
        if not U.aligned16(lm_head_weight):
            raise ValueError("lm_head_weight rows must start on 16-byte boundaries for the cuda backend "
                             f"(strides {lm_head_weight.stride()}, data_ptr % 16 = "
                             f"{lm_head_weight.data_ptr() % 16})")
        if not U.aligned16(hidden):
            hidden = hidden.clone(memory_format=torch.contiguous_format)
        tokens = torch.empty(b, d, k, device=hidden.device, dtype=torch.int32)
        logprobs = torch.empty(b, d, k, device=hidden.device, dtype=torch.float32)
        ws = torch.empty(_C.hidden_topk_workspace_bytes(b * d, v, k), device=hidden.device,
                         dtype=torch.uint8)
        _C.hidden_topk(hidden=U.ptr(hidden), hidden_batch_stride=hidden.stride(0),
                       hidden_row_stride=hidden.stride(1),
                       weight=U.ptr(lm_head_weight), weight_row_stride=lm_head_weight.stride(0),
                       tokens=U.ptr(tokens), logprobs=U.ptr(logprobs), workspace=U.ptr(ws),
                       batch=b, depth=d, hidden_dim=h, vocab=v, k=k,
                       dtype=U.dtype_code(hidden), stream=U.stream())
        return tokens, logprobs


@_hidden_topk.register_fake
def _(hidden, lm_head_weight, k):
    b, d, _ = hidden.shape
    return (hidden.new_empty(b, d, k, dtype=torch.int32),
            hidden.new_empty(b, d, k, dtype=torch.float32))


def hidden_topk(hidden, lm_head_weight, k):
    """hidden fp16/bf16 [B, D, H], lm_head_weight [V, H] -> (tokens int32 [B, D, K], logprobs
    float32 [B, D, K]): the top-K of log_softmax(hidden @ lm_head_weight.T) in fp32, without
    materialising the logits. A ``hidden`` that :func:`supports` refuses is a
    BackendUnavailableError (lm_head_weight's row alignment is checked on its pointer)."""
    U.require(supports("hidden_topk", hidden=hidden))
    return _hidden_topk(hidden, lm_head_weight, int(k))


@torch.library.custom_op("jetspec::build_tree", mutates_args=())
def _build_tree(topk_tokens: torch.Tensor, topk_logprobs: torch.Tensor, root_tokens: torch.Tensor,
                budget: int, algorithm: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                      torch.Tensor, torch.Tensor, torch.Tensor]:
    from .. import _C
    with U.on_device(topk_tokens):
        b, d, k = topk_tokens.shape
        dev = topk_tokens.device
        n, w = budget, mask_words(budget)
        tt = topk_tokens.to(torch.int32).contiguous()
        tl = topk_logprobs.to(torch.float32).contiguous()
        root = root_tokens.to(torch.int32).contiguous()
        tokens = torch.empty(b, n, device=dev, dtype=torch.int32)
        parents = torch.empty(b, n, device=dev, dtype=torch.int32)
        depths = torch.empty(b, n, device=dev, dtype=torch.int32)
        scores = torch.empty(b, n, device=dev, dtype=torch.float32)
        num_nodes = torch.empty(b, device=dev, dtype=torch.int32)
        mask = torch.empty(b, n, w, device=dev, dtype=torch.int32)
        _C.build_tree(topk_tokens=U.ptr(tt), topk_logprobs=U.ptr(tl), root_tokens=U.ptr(root),
                      tokens=U.ptr(tokens), parents=U.ptr(parents), depths=U.ptr(depths),
                      scores=U.ptr(scores), num_nodes=U.ptr(num_nodes), mask=U.ptr(mask),
                      batch=b, depth=d, k=k, budget=n, words=w,
                      algorithm=U.enum("TreeAlgorithm")[algorithm], stream=U.stream())
        return tokens, parents, depths, scores, num_nodes, mask


@_build_tree.register_fake
def _(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    b = topk_tokens.shape[0]
    i32 = dict(dtype=torch.int32)
    return (topk_tokens.new_empty(b, budget, **i32), topk_tokens.new_empty(b, budget, **i32),
            topk_tokens.new_empty(b, budget, **i32),
            topk_tokens.new_empty(b, budget, dtype=torch.float32),
            topk_tokens.new_empty(b, **i32), topk_tokens.new_empty(b, budget, mask_words(budget), **i32))


def build_tree(topk_tokens, topk_logprobs, root_tokens, budget, algorithm):
    """Per-depth top-K [B, D, K] -> (tokens, parents, depths, scores, num_nodes, mask).

    Bit-exact with python_ref.build_tree given log-probs sorted descending along K.
    """
    return _build_tree(topk_tokens, topk_logprobs, root_tokens, int(budget), algorithm)
