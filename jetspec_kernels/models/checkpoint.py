"""Safetensors checkpoint loading (single file or sharded with an index) and key checks.

Errors name the offending key: a missing tensor raises :class:`CheckpointError` with the key and
the file it was expected in; a tensor of the wrong shape names the key, the expected and the
found shape.
"""
from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file

__all__ = ["CheckpointError", "load_safetensors", "save_safetensors", "take"]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint misses a tensor, has one of the wrong shape, or its files are inconsistent."""


def load_safetensors(path: str, *, dtype: torch.dtype | None = None,
                     device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory.

    Parameters
    ----------
    path : directory holding ``model.safetensors``, or ``model.safetensors.index.json`` and the
        shards it names, or a single ``*.safetensors`` file.
    dtype : floating tensors are cast to it (integer tensors are kept); None keeps the stored dtype.
    device : where the tensors are placed.

    Returns
    -------
    dict key -> tensor, keys exactly as stored.
    """
    if os.path.isfile(path):
        files = [path]
    elif os.path.isfile(os.path.join(path, INDEX_NAME)):
        with open(os.path.join(path, INDEX_NAME)) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{INDEX_NAME} in {path} has no 'weight_map'")
        files = [os.path.join(path, name) for name in sorted(set(weight_map.values()))]
        for name in files:
            if not os.path.isfile(name):
                raise CheckpointError(f"shard {os.path.basename(name)} named by {INDEX_NAME} is "
                                      f"missing from {path}")
    elif os.path.isfile(os.path.join(path, SINGLE_NAME)):
        files = [os.path.join(path, SINGLE_NAME)]
    else:
        raise FileNotFoundError(f"no {SINGLE_NAME} or {INDEX_NAME} in {path}")

    out: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(name, framework="pt", device="cpu") as f:
            for key in f.keys():
                t = f.get_tensor(key)
                if dtype is not None and t.is_floating_point():
                    t = t.to(dtype)
                out[key] = t.to(device)
    return out


def save_safetensors(tensors: dict[str, torch.Tensor], path: str, *,
                     max_shard_bytes: int | None = None) -> None:
    """Write ``tensors`` into directory ``path`` as one file or as shards plus the index file.

    Parameters
    ----------
    tensors : dict key -> tensor (made contiguous, moved to the CPU)
    path : output directory (created)
    max_shard_bytes : when given, start a new shard once a shard would exceed this size
        and write ``model.safetensors.index.json``; otherwise one ``model.safetensors``.
    """
    os.makedirs(path, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    if max_shard_bytes is None:
        save_file(tensors, os.path.join(path, SINGLE_NAME), metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, name), metadata={"format": "pt"})
        weight_map.update({key: name for key in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(path, INDEX_NAME), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)


def take(weights: dict[str, torch.Tensor], key: str, shape, where: str) -> torch.Tensor:
    """``weights[key]`` checked to have ``shape``; the error names the key and ``where`` it was sought."""
    t = weights.get(key)
    if t is None:
        raise CheckpointError(f"{where}: missing tensor {key!r} (expected shape {list(shape)})")
    if list(t.shape) != list(shape):
        raise CheckpointError(f"{where}: tensor {key!r} has shape {list(t.shape)}, expected {list(shape)}")
    return t
