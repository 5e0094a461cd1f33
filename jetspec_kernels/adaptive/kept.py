"""What adaptive decoding keeps per (target, head) model pair across ``generate`` calls, while both
models live: measured cost models (keyed by what changes a round's time) and acceptance
calibrators (greedy and sampling apart)."""
from __future__ import annotations

import weakref

__all__ = ["kept_for"]

_KEPT = weakref.WeakKeyDictionary()


def kept_for(target, head) -> dict:
    """The dict kept for this model pair (empty at first; a fresh, unkept one for models that
    cannot be weakly referenced)."""
    try:
        return _KEPT.setdefault(target, weakref.WeakKeyDictionary()).setdefault(head, {})
    except TypeError:          # a model that cannot be weakly referenced: nothing is kept
        return {}
