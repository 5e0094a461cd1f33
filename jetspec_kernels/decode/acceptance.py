"""Measure a draft head's acceptance the way decoding sees it: :func:`jetspec_kernels.decode.generate`
(greedy) on held-out prompts, mean accepted draft tokens per round, for several tree budgets.
"""
from __future__ import annotations

from .loop import generate

__all__ = ["BUDGETS", "acceptance", "acceptance_table"]

BUDGETS = (1, 4, 16, 64, 256)


def acceptance(target, head, prompts, *, budget: int, topk: int, max_new_tokens: int,
               eos_token_id=None, batch: int = 8) -> float:
    """Mean accepted draft tokens per (sequence, round) of greedy speculative decoding.

    Parameters
    ----------
    target : models.Qwen3; head : models.DraftHead
    prompts : list of token-id lists; budget, topk : tree shape; max_new_tokens : per prompt
    eos_token_id : as for ``generate`` (the tiny byte models: ``models.byte_tokenizer.EOS_ID``)
    batch : prompts decoded together

    Returns
    -------
    float, the mean of ``stats.accept_lengths`` over all prompts.
    """
    total, rounds = 0, 0
    for i in range(0, len(prompts), batch):
        out = generate(target, head, prompts[i:i + batch], max_new_tokens=max_new_tokens,
                       budget=budget, topk=topk, eos_token_id=eos_token_id)
        total += sum(out.stats.accept_lengths)
        rounds += len(out.stats.accept_lengths)
    return total / rounds


def acceptance_table(target, heads: dict, prompts, *, budgets=BUDGETS, topk: int = 8,
                     max_new_tokens: int = 64, eos_token_id=None,
                     chain_head: str | None = None) -> dict:
    """Mean accepted length against budget for each head, plus a chain.

    Parameters
    ----------
    target : models.Qwen3
    heads : dict name -> models.DraftHead (trees with ``topk`` children per node)
    prompts : list of token-id lists; budgets : tree budgets (root included)
    eos_token_id : as for ``generate``
    chain_head : name of the head whose top-1 chain is measured (``topk=1``, budget
        ``min(budget, block_size)``, i.e. depth ``budget - 1``); None: no chain row

    Returns
    -------
    dict row name -> {budget (str): mean accepted length}; the chain row is ``"chain"``.
    """
    table = {}
    for name, head in heads.items():
        table[name] = {str(b): acceptance(target, head, prompts, budget=b, topk=topk,
                                          max_new_tokens=max_new_tokens, eos_token_id=eos_token_id)
                      for b in budgets}
    if chain_head is not None:
        head = heads[chain_head]
        table["chain"] = {str(b): acceptance(target, head, prompts, budget=min(b, head.block_size),
                                             topk=1, max_new_tokens=max_new_tokens,
                                             eos_token_id=eos_token_id) for b in budgets}
    return table
