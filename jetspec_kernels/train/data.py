"""Training data every machine has: the Python standard library's own top-level source files.

The selection is the sorted list of ``*.py`` files directly in the running interpreter's stdlib
directory; every ``heldout_every``-th file is held out (acceptance is measured on those). A
manifest (name, sha256, bytes, split) records the exact data so a run can be checked or remade;
:func:`load_corpus` refuses files whose hash differs from the manifest's.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig

import torch

from ..models.byte_tokenizer import BOS_ID, EOS_ID

__all__ = ["stdlib_dir", "make_manifest", "load_corpus", "sample_windows", "heldout_prompts"]


def stdlib_dir() -> str:
    """Directory of the running interpreter's standard library sources."""
    return sysconfig.get_paths()["stdlib"]


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def make_manifest(root: str | None = None, *, heldout_every: int = 10) -> dict:
    """Select the corpus files and record them.

    Parameters
    ----------
    root : stdlib directory (default: :func:`stdlib_dir`)
    heldout_every : every n-th file (sorted by name, starting with the 5th) is held out

    Returns
    -------
    dict with ``root``, ``python`` (version), ``heldout_every`` and ``files``: a list of
    ``{"name", "sha256", "bytes", "split"}`` with split ``"train"`` or ``"heldout"``.
    """
    import platform

    root = root or stdlib_dir()
    names = sorted(f for f in os.listdir(root) if f.endswith(".py") and os.path.isfile(os.path.join(root, f)))
    files = []
    for i, name in enumerate(names):
        path = os.path.join(root, name)
        split = "heldout" if i % heldout_every == 4 else "train"
        files.append({"name": name, "sha256": _sha256(path), "bytes": os.path.getsize(path), "split": split})
    return {"root": root, "python": platform.python_version(), "heldout_every": heldout_every,
            "files": files}


def load_corpus(manifest: dict, split: str, root: str | None = None) -> torch.Tensor:
    """The files of ``split`` as one token stream: ``BOS, bytes..., EOS`` per file, concatenated.

    Parameters
    ----------
    manifest : from :func:`make_manifest` (or a recipe.json's ``data`` entry)
    split : "train" or "heldout"
    root : where to read the files (default: the manifest's root if it exists, else this stdlib)

    Returns
    -------
    int64 [n_tokens]

    Raises
    ------
    ValueError if a file is missing or its sha256 differs from the manifest (another Python version).
    """
    if root is None:
        root = manifest["root"] if os.path.isdir(manifest["root"]) else stdlib_dir()
    parts = []
    for f in manifest["files"]:
        if f["split"] != split:
            continue
        path = os.path.join(root, f["name"])
        if not os.path.isfile(path):
            raise ValueError(f"corpus file {f['name']} is missing from {root}")
        with open(path, "rb") as fh:
            data = fh.read()
        if hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise ValueError(f"corpus file {path} differs from the manifest (sha256); this Python "
                             f"({root}) is not the one the recipe used (Python {manifest['python']})")
        parts.append(torch.tensor([BOS_ID] + list(data) + [EOS_ID], dtype=torch.int64))
    if not parts:
        raise ValueError(f"the manifest has no {split!r} files")
    return torch.cat(parts)


def sample_windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """``batch`` random windows of ``length`` tokens from ``stream``: int64 [batch, length]."""
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=gen)
    return stream[starts[:, None] + torch.arange(length)]


def heldout_prompts(manifest: dict, n: int, length: int, *, seed: int = 0,
                    root: str | None = None) -> list[list[int]]:
    """``n`` prompts of ``length`` byte tokens from the held-out files, each starting at a line start.

    Parameters
    ----------
    manifest : as for :func:`load_corpus`; n, length : ints; seed : int

    Returns
    -------
    list of n lists of token ids (no specials).
    """
    stream = load_corpus(manifest, "heldout", root)
    newline = (stream[:-length - 1] == ord("\n")).nonzero().flatten() + 1
    gen = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < n:
        s = int(newline[torch.randint(0, newline.numel(), (1,), generator=gen)])
        window = stream[s:s + length]
        if bool((window >= 256).any()):          # crosses a file boundary
            continue
        out.append(window.tolist())
    return out
