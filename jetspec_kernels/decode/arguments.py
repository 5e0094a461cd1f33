"""The arguments of :func:`~jetspec_kernels.decode.generate` and
:func:`~jetspec_kernels.decode.generate_ar`: checked once, before any model work."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import backend as _backend
from .. import checks, tp
from ..adaptive import AcceptanceCalibrator, CostModel, parse_budget
from ..limits import MAX_TOPK
from ..ops.draft_tree import ALGORITHMS
from ..ops.verify_tree import check_sampling

__all__ = ["Sampling", "GenerateArgs", "check_generate_args", "checked_generate_args",
           "check_shared_args", "check_group"]


class Sampling(NamedTuple):
    """Checked sampling controls (ops.verify_tree.check_sampling): temperature a float or float32
    [B]; top_k int32 [B] or None (off); top_p float32 [B] or None (off)."""

    temperature: float | torch.Tensor
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None

    @property
    def greedy(self) -> bool:
        """Every sequence greedy (the number 0): the target's fused argmax serves."""
        return not torch.is_tensor(self.temperature) and self.temperature == 0.0

    def kwargs(self) -> dict:
        """The controls as verify_tree's keyword arguments."""
        return dict(temperature=self.temperature, top_k=0 if self.top_k is None else self.top_k,
                    top_p=1.0 if self.top_p is None else self.top_p)


class GenerateArgs(NamedTuple):
    """What :func:`checked_generate_args` read from generate's arguments."""

    shard: tp.Shard               # the tensor-parallel group the models are split over
    sampling: Sampling
    taps: list[int]               # the target layers the head taps
    sizes: tuple[int, ...]        # candidate tree sizes, ascending (one for a fixed budget)
    adaptive: bool                # budget "auto" or a list: one size chosen per round
    cuda_graphs: bool             # cuda_graphs as given, else the default (_graphs_default)


def _check_prompts(prompt_ids, vocab: int) -> None:
    """``prompt_ids``: a non-empty list of non-empty lists of int token ids in ``[0, vocab)``."""
    if not isinstance(prompt_ids, (list, tuple)):
        raise TypeError(f"prompt_ids must be a list of token-id lists, got {type(prompt_ids).__name__}")
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one prompt, got an empty list")
    for i, p in enumerate(prompt_ids):
        if not isinstance(p, (list, tuple)):
            raise TypeError(f"prompt_ids[{i}] must be a list of int token ids, got {type(p).__name__}")
        if not p:
            raise ValueError(f"prompt_ids[{i}] is empty (a prompt needs at least one token)")
        for j, tok in enumerate(p):
            if isinstance(tok, bool) or not isinstance(tok, int):
                raise TypeError(f"prompt_ids[{i}][{j}] must be an int token id, got "
                                f"{type(tok).__name__} {tok!r}")
            if not 0 <= tok < vocab:
                raise ValueError(f"prompt_ids[{i}][{j}] = {tok} is outside the target's vocabulary "
                                 f"[0, {vocab})")


def _check_eos(eos_token_id, vocab: int) -> None:
    """None, an int, or a non-empty list of ints, each in ``[0, vocab)``."""
    if eos_token_id is None:
        return
    ids = list(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
    if not ids:
        raise ValueError("eos_token_id must be None, an int or a non-empty list of ints, got []")
    for tok in ids:
        checks.integer("eos_token_id", tok, lo=0, hi=vocab - 1)


def check_group(group, **models) -> tp.Shard:
    """The :class:`~jetspec_kernels.tp.Shard` of ``group`` (None: the default process group when
    torch.distributed is initialised with several ranks), which every model (name -> model) must
    be split over: the same process group, size and rank (a model without a ``shard`` runs
    alone)."""
    shard = tp.shard_of(group)
    for name, model in models.items():
        mine = getattr(model, "shard", tp.ALONE)
        if (mine.size, mine.rank) != (shard.size, shard.rank):
            raise ValueError(f"group: the {name} is split over tp={mine.size} ranks (this rank "
                             f"{mine.rank}), the process group has {shard.size} (this rank "
                             f"{shard.rank}); load the models with the group generate runs on")
        if mine.group is not shard.group:
            raise ValueError(f"group: the {name} is split over another process group of "
                             f"{mine.size} ranks than the one generate runs on; load the models "
                             f"with the group generate runs on")
    return shard


def check_shared_args(target, prompt_ids, max_new_tokens, temperature, eos_token_id, seed,
                      page_size, top_k=0, top_p=1.0) -> Sampling:
    """The arguments :func:`generate` and :func:`generate_ar` share; returns the sampling controls."""
    vocab = target.config.vocab_size
    _check_prompts(prompt_ids, vocab)
    checks.integer("max_new_tokens", max_new_tokens, lo=1)
    sampling = Sampling(*check_sampling(temperature, top_k, top_p, len(prompt_ids), target.device))
    _check_eos(eos_token_id, vocab)
    checks.integer("seed", seed, lo=-2 ** 63, hi=2 ** 63 - 1)
    if page_size is not None:
        checks.integer("page_size", page_size, lo=1)
    return sampling


def _check_pair(target, head) -> list[int]:
    """The draft head fits the target (taps, sizes, vocabulary, device); returns the tapped layers."""
    hc, tc = head.config, target.config
    if hc.target_hidden_size != tc.hidden_size:
        raise ValueError(f"head: the draft head taps a target of hidden size {hc.target_hidden_size} "
                         f"(dflash_config.target_hidden_size), the target has {tc.hidden_size}")
    if hc.hidden_size != tc.hidden_size:
        raise ValueError(f"head: the draft head's hidden_size {hc.hidden_size} differs from the "
                         f"target's {tc.hidden_size} (the head uses the target's embedding and lm_head)")
    if hc.vocab_size != tc.vocab_size:
        raise ValueError(f"head: the draft head's vocab_size {hc.vocab_size} differs from the "
                         f"target's {tc.vocab_size}")
    if not 0 <= hc.mask_token_id < tc.vocab_size:
        raise ValueError(f"head: mask_token_id {hc.mask_token_id} is outside the target's vocabulary "
                         f"[0, {tc.vocab_size})")
    if hc.num_target_layers and hc.num_target_layers != tc.num_hidden_layers:
        raise ValueError(f"head: the draft head was made for a {hc.num_target_layers}-layer target "
                         f"(num_target_layers), the target has {tc.num_hidden_layers} layers")
    if head.device != target.device:
        raise ValueError(f"head: the draft head is on {head.device}, the target on {target.device}")
    try:
        return target.check_taps(head.target_layer_ids)
    except ValueError as e:
        raise ValueError(f"head: {e}") from None


def checked_generate_args(target, head, prompt_ids, *, max_new_tokens, budget=64, topk=8,
                          algorithm="topn", temperature=0.0, eos_token_id=None, seed=0,
                          page_size=None, fused_draft=True, cuda_graphs=None, sync_every=1, top_k=0,
                          top_p=1.0, cost_model=None, calibrator=None, group=None) -> GenerateArgs:
    """:func:`check_generate_args`, returning what it read (``budget`` parsed once)."""
    shard = check_group(group, target=target, head=head)
    sampling = check_shared_args(target, prompt_ids, max_new_tokens, temperature, eos_token_id,
                                 seed, page_size, top_k, top_p)
    checks.integer("topk", topk, lo=1, hi=min(MAX_TOPK, target.config.vocab_size))
    checks.choice("algorithm", algorithm, ALGORITHMS)
    taps = _check_pair(target, head)
    sizes, adaptive = parse_budget(budget, topk=topk, depth=head.block_size - 1)
    if adaptive and algorithm != "topn":
        raise ValueError(f"budget={budget!r} (adaptive) needs algorithm='topn', got {algorithm!r}")
    if not isinstance(fused_draft, bool):
        raise TypeError(f"fused_draft must be a bool, got {type(fused_draft).__name__}")
    if cuda_graphs is not None and not isinstance(cuda_graphs, bool):
        raise TypeError(f"cuda_graphs must be a bool or None, got {type(cuda_graphs).__name__}")
    checks.integer("sync_every", sync_every, lo=1)
    if cuda_graphs and target.device.type != "cuda":
        raise ValueError("cuda_graphs=True needs models on a CUDA device")
    if cost_model is not None:
        model = CostModel(cost_model)
        if adaptive:
            model.table(sizes)
    if calibrator is not None:
        if not isinstance(calibrator, AcceptanceCalibrator):
            raise TypeError(f"calibrator must be an AcceptanceCalibrator or None, got "
                            f"{type(calibrator).__name__}")
        if calibrator.device != target.device:
            raise ValueError(f"calibrator lives on {calibrator.device}, the models on {target.device}")
    return GenerateArgs(shard, sampling, taps, sizes, adaptive,
                        _graphs_default(target.device, cuda_graphs))


def check_generate_args(target, head, prompt_ids, *, max_new_tokens, budget=64, topk=8,
                        algorithm="topn", temperature=0.0, eos_token_id=None, seed=0, page_size=None,
                        fused_draft=True, cuda_graphs=None, sync_every=1, top_k=0, top_p=1.0,
                        cost_model=None, calibrator=None, group=None) -> tuple[Sampling, list[int]]:
    """The checks :func:`generate` runs before any model work (same arguments); a caller such as
    the CLI runs them first to tell bad input apart from a failure inside decoding.

    Returns ``(the checked sampling controls, the tapped target layers)``; raises ``TypeError``
    (wrong type) or ``ValueError`` naming the argument (``head: ...`` when the head does not fit).
    """
    args = checked_generate_args(
        target, head, prompt_ids, max_new_tokens=max_new_tokens, budget=budget, topk=topk,
        algorithm=algorithm, temperature=temperature, eos_token_id=eos_token_id, seed=seed,
        page_size=page_size, fused_draft=fused_draft, cuda_graphs=cuda_graphs, sync_every=sync_every,
        top_k=top_k, top_p=top_p, cost_model=cost_model, calibrator=calibrator, group=group)
    return args.sampling, args.taps


def _graphs_default(device: torch.device, cuda_graphs: bool | None) -> bool:
    """``cuda_graphs`` as given, or the default: on CUDA unless the backend is ``reference``."""
    if cuda_graphs is not None:
        return cuda_graphs
    # The reference backend reads values on the host inside its ops: it cannot be captured.
    return device.type == "cuda" and _backend.resolve(device) != "reference"
