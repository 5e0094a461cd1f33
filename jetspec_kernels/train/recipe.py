"""The whole recipe: data manifest -> target -> causal and DFlash heads -> acceptance -> recipe.json.

Weights are stored as float16 (the loaders cast to the requested dtype). The heads are trained
against the float16-rounded target, and acceptance is measured on the stored files reloaded in
float32, so the recorded numbers are those of the shipped checkpoints.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time

import torch

from ..models import DraftHead, Qwen3, load_safetensors, save_draft_head, save_qwen3
from .data import heldout_prompts, load_corpus, make_manifest
from ..decode.acceptance import BUDGETS, acceptance_table
from .head import head_config, train_head
from .target import target_config, train_target
from ..models.byte_tokenizer import BOS_ID, EOS_ID, MASK_ID, VOCAB_SIZE

__all__ = ["PRESETS", "run_recipe", "evaluate_dir", "EVAL"]

# "default" ships; "quick" exercises the same code in well under a minute (not for shipping).
PRESETS = {
    "default": {"target": dict(steps=1200, batch=8, length=256, lr=4e-3),
                "head": dict(steps=1500, batch=8, length=256, blocks=16, lr=4e-3, gamma=7.0)},
    "quick": {"target": dict(steps=3, batch=2, length=64, lr=3e-3),
              "head": dict(steps=3, batch=2, length=64, blocks=2, lr=2e-3, gamma=7.0)},
}
# The acceptance measurement recorded in recipe.json (and re-checked by the tests).
EVAL = dict(prompts=8, prompt_len=64, max_new_tokens=32, topk=8, seed=0, budgets=list(BUDGETS))
HEADS = {"head_causal": True, "head_dflash": False}


def _half(w: dict) -> dict:
    return {k: t.to(torch.float16) for k, t in w.items()}


def evaluate_dir(out_dir: str, manifest: dict, ev: dict = EVAL) -> dict:
    """Acceptance table of the checkpoints in ``out_dir`` (loaded in float32) on held-out prompts.

    Returns
    -------
    dict row ("head_causal", "head_dflash", "chain") -> {budget (str): mean accepted length}
    """
    target = Qwen3.from_pretrained(os.path.join(out_dir, "target"))
    heads = {name: DraftHead.from_pretrained(os.path.join(out_dir, name)) for name in HEADS}
    prompts = heldout_prompts(manifest, ev["prompts"], ev["prompt_len"], seed=ev["seed"])
    return acceptance_table(target, heads, prompts, budgets=ev["budgets"], topk=ev["topk"],
                            max_new_tokens=ev["max_new_tokens"], eos_token_id=EOS_ID,
                            chain_head="head_causal")


def run_recipe(out_dir: str, *, preset: str = "default", seed: int = 0, threads: int = 2,
               command: str | None = None, log=print) -> dict:
    """Train everything, write the checkpoints and ``recipe.json`` under ``out_dir``.

    Parameters
    ----------
    out_dir : destination (``target/``, ``head_causal/``, ``head_dflash/``, ``recipe.json``)
    preset : key of :data:`PRESETS`; seed : base seed; threads : torch intra-op threads
    command : the command line recorded in recipe.json (default: this process's argv)

    Returns
    -------
    the recipe dict written to ``out_dir/recipe.json``.
    """
    torch.set_num_threads(threads)
    hp = PRESETS[preset]
    t0 = time.perf_counter()
    manifest = make_manifest()
    train, heldout = load_corpus(manifest, "train"), load_corpus(manifest, "heldout")
    log(f"corpus: {train.numel()} train / {heldout.numel()} held-out tokens from "
        f"{len(manifest['files'])} stdlib files (Python {manifest['python']})")

    tcfg = target_config()
    tw, tsum = train_target(tcfg, train, heldout, seed=seed, log=log, **hp["target"])
    save_qwen3(tcfg, _half(tw), os.path.join(out_dir, "target"))
    tw = load_safetensors(os.path.join(out_dir, "target"), dtype=torch.float32)

    heads = {}
    for i, (name, causal) in enumerate(HEADS.items()):
        hcfg = head_config(tcfg, causal=causal)
        hw, hsum = train_head(hcfg, tw, tcfg, train, heldout, seed=seed + 10 * (i + 1), log=log,
                              **hp["head"])
        save_draft_head(hcfg, _half(hw), os.path.join(out_dir, name))
        heads[name] = hsum

    log("measuring acceptance on held-out prompts ...")
    table = evaluate_dir(out_dir, manifest)
    recipe = {
        "command": command or " ".join(["python -m jetspec_kernels.train"] + sys.argv[1:]),
        "preset": preset, "hyperparameters": hp, "seed": seed, "threads": threads,
        "torch": torch.__version__, "python": platform.python_version(),
        "tokenizer": {"kind": "bytes", "vocab_size": VOCAB_SIZE, "bos_token_id": BOS_ID,
                      "eos_token_id": EOS_ID, "mask_token_id": MASK_ID},
        "storage_dtype": "float16",
        "target": tsum, "heads": heads,
        "acceptance": {"eval": EVAL, "mean_accepted_length": table},
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "data": manifest,
    }
    with open(os.path.join(out_dir, "recipe.json"), "w") as f:
        json.dump(recipe, f, indent=1)
    return recipe
