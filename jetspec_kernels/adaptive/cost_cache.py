"""Measured cost models kept on disk, so that ``jetspec generate --budget auto`` measures a
configuration once rather than at every call (:func:`jetspec_kernels.decode.measure_round_costs`
takes minutes on a CPU).

A cost model is stored as one JSON file named by the hash of its key, a dict of everything that
changes a round's time (the caller builds it: models, device, dtype, batch, candidate sizes,
backends, package version). The file holds the key itself, checked on load, so a hash collision
or a file edited by hand is a miss. A file that cannot be read or does not hold a valid cost model
is ignored with a warning (and replaced by the next store).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from pathlib import Path

from .round_costs import CostModel

__all__ = ["cache_dir", "checkpoint_identity", "config_identity", "cost_file", "load_costs",
           "store_costs"]

FORMAT = 1


def cache_dir(env=os.environ) -> Path:
    """``$XDG_CACHE_HOME/jetspec_kernels``, else ``~/.cache/jetspec_kernels``."""
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "jetspec_kernels"


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def config_identity(config) -> str:
    """A short hash of a model config (a dataclass or a dict): its every field."""
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    return hashlib.sha256(_canonical(fields).encode()).hexdigest()[:16]


def checkpoint_identity(path: str) -> dict:
    """What identifies the weights of a checkpoint directory without reading them: its absolute
    path and the name, size and modification time of every file in it (a re-saved checkpoint is a
    new identity)."""
    root = Path(path).resolve()
    files = sorted(p for p in root.iterdir() if p.is_file()) if root.is_dir() else []
    return {"path": str(root),
            "files": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]}


def cost_file(key: dict, directory: Path) -> Path:
    """Where the cost model of ``key`` is stored in ``directory``."""
    digest = hashlib.sha256(_canonical(key).encode()).hexdigest()[:24]
    return Path(directory) / f"round_costs-{digest}.json"


def load_costs(key: dict, directory: Path) -> CostModel | None:
    """The stored cost model of ``key``, or None (never stored, stored under another key, or a
    file that cannot be read: then a warning names the file)."""
    path = cost_file(key, directory)
    if not path.exists():
        return None
    try:
        with open(path) as f:
            stored = json.load(f)
        if stored.get("format") != FORMAT or stored.get("key") != json.loads(_canonical(key)):
            return None
        return CostModel({int(n): c for n, c in stored["costs"].items()})
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, TypeError,
            ValueError) as e:
        warnings.warn(f"ignoring the cached round costs {path}: {type(e).__name__}: {e}",
                      RuntimeWarning, stacklevel=2)
        return None


def store_costs(key: dict, model: CostModel, directory: Path) -> Path:
    """Write ``model`` (a dict cost model) under ``key`` in ``directory`` (created if needed; the
    file replaced whole, so a reader never sees half of it); returns the file's path."""
    if not isinstance(model.costs, dict):
        raise TypeError("store_costs needs a CostModel of measured sizes ({n: seconds}), got a "
                        "callable one")
    path = cost_file(key, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "key": json.loads(_canonical(key)),
                   "costs": {str(n): c for n, c in sorted(model.costs.items())}}, f, indent=1)
    os.replace(tmp, path)
    return path
