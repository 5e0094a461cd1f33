"""causal_conv1d_tree: the depthwise causal conv of a Gated DeltaNet layer over a token tree.

Each node's window is its own input preceded by the inputs of its W - 1 nearest ancestors; where
the path to the root is shorter, the window continues into the committed prefix's conv state (the
last W - 1 inputs before the root, oldest first, as transformers keeps it). So a node's output is
what the layer's conv gives that token when the sequence is decoded one token at a time along the
node's ancestor path. Written with gathers (no host reads) so the reference backend runs it as it
is, also inside a CUDA graph.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["causal_conv1d_tree", "conv_window_sources"]


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def conv_window_sources(parents: torch.Tensor, width: int) -> torch.Tensor:
    """int64 [B, N, W]: where each tap of each node's window reads, in the sequence
    ``cat(conv_state columns (W - 1 of them), the N node inputs)``: tap ``j`` (0 = oldest, W - 1 =
    the node itself) of node ``i`` is ``W - 1 + a`` for the ancestor ``a`` that many steps up, or
    the state column ``W - 1 - s`` when the path leaves the tree ``s >= 1`` steps before it."""
    b, n = parents.shape
    par = parents.long()
    node = torch.arange(n, device=parents.device).expand(b, n)
    beyond = torch.zeros_like(node)                   # steps taken past the root (into the state)
    taps = []
    for _ in range(width):                            # newest tap first
        taps.append(torch.where(node >= 0, width - 1 + node, width - 1 - beyond))
        up = torch.where(node >= 0, par.gather(1, node.clamp(min=0)), -1)
        beyond = torch.where(node >= 0, (up < 0).long(), beyond + 1)
        node = up
    return torch.stack(taps[::-1], dim=-1)


def causal_conv1d_tree(x: torch.Tensor, parents: torch.Tensor, conv_state: torch.Tensor,
                       weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                       state_slots: torch.Tensor | None = None, num_nodes: torch.Tensor | None = None,
                       activation: str | None = "silu") -> torch.Tensor:
    """Depthwise causal conv of every tree node along its own ancestor path.

    Parameters
    ----------
    x : [B, N, C]                 the nodes' conv inputs (node 0 the root, parents before children)
    parents : int [B, N]          parent node, -1 for the root (child of the prefix) and padding
    conv_state : [S, C, W - 1]    per slot, the prefix's last W - 1 inputs, oldest first
    weight : [C, W]               weight[:, W - 1] multiplies the node's own input
    bias : [C] or None
    state_slots : int [B] or None  the slot of each sequence in conv_state (None: S == B, slot b)
    num_nodes : int [B] or None   valid nodes per tree (None: all N); the rest are padding
    activation : "silu" or None

    Returns
    -------
    y : [B, N, C] in float64 for float64 x, float32 otherwise: ``act(bias + sum_j weight[:, j]
    * window[j])``; padding nodes' rows are 0.
    """
    dt = _compute_dtype(x)
    b, n, c = x.shape
    width = weight.shape[1]
    slots = torch.arange(b, device=x.device) if state_slots is None else state_slots.long()
    seq = torch.cat([conv_state[slots].to(dt).transpose(1, 2), x.to(dt)], dim=1)  # [B, W-1+N, C]
    src = conv_window_sources(parents, width)                                     # [B, N, W]
    windows = seq.gather(1, src.reshape(b, n * width, 1).expand(-1, -1, c)).view(b, n, width, c)
    y = (windows * weight.to(dt).t()).sum(dim=2)
    if bias is not None:
        y = y + bias.to(dt)
    if activation == "silu":
        y = F.silu(y)
    if num_nodes is not None:
        valid = torch.arange(n, device=x.device)[None, :] < num_nodes[:, None]
        y = torch.where(valid[..., None], y, 0)    # selected away: padding's NaN stays out
    return y
