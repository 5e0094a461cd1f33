"""Safetensors checkpoint loading (single file or sharded with an index) and key checks.

Errors name the offending directory, file or key: a missing directory or weights file, an
unreadable file, a missing tensor (with the checkpoint it was expected in), a tensor of the wrong
shape (the key, the expected and the found shape) and a per-layer tensor the model would not read
all raise :class:`CheckpointError`.
"""
from __future__ import annotations

import json
import os

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

__all__ = ["CheckpointError", "load_safetensors", "save_safetensors", "take", "check_layer_keys"]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint directory or file is missing, a tensor is missing, has the wrong shape or is
    not used by the model, or config.json is malformed or asks for an unsupported feature."""


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
    elif not os.path.isdir(path):
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    elif os.path.isfile(os.path.join(path, INDEX_NAME)):
        index = os.path.join(path, INDEX_NAME)
        try:
            with open(index) as f:
                weight_map = json.load(f).get("weight_map")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise CheckpointError(f"{index} is not a readable JSON object: {e}") from None
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
        raise CheckpointError(f"no weights in {path}: neither {SINGLE_NAME} nor {INDEX_NAME}")

    out: dict[str, torch.Tensor] = {}
    for name in files:
        try:
            with safe_open(name, framework="pt", device="cpu") as f:
                tensors = {key: f.get_tensor(key) for key in f.keys()}
        except (OSError, SafetensorError) as e:
            raise CheckpointError(f"{name} is not a readable safetensors file: {e}") from None
        for key, t in tensors.items():
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


def check_layer_keys(weights: dict[str, torch.Tensor], prefix: str, num_layers: int, layer_keys,
                     where: str) -> None:
    """Every ``{prefix}{i}.{key}`` tensor has ``i < num_layers`` and ``key`` in ``layer_keys``
    (the keys of every layer, or a function of the layer index giving that layer's keys).

    A tensor the model would not read (a bias, an extra layer) means config.json does not describe
    these weights; ignoring it would give a silently different model.
    """
    buffers = {"self_attn.rotary_emb.inv_freq"}    # a buffer some exports keep
    keys_of = layer_keys if callable(layer_keys) else (lambda i, keys=frozenset(layer_keys): keys)
    for name in weights:
        if not name.startswith(prefix):
            continue
        index, _, key = name[len(prefix):].partition(".")
        if not index.isdigit() or int(index) >= num_layers:
            raise CheckpointError(f"{where}: tensor {name!r} is beyond the {num_layers} layers "
                                  "config.json declares")
        if key not in buffers and key not in keys_of(int(index)):
            raise CheckpointError(f"{where}: tensor {name!r} is not used by this model "
                                  "(config.json does not describe these weights)")
