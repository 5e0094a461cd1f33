"""Byte-level tokenisation of the tiny models: ids 0..255 are bytes, then BOS, EOS and MASK.

MASK is never seen by the target in training; the draft head fills its block with it
(``dflash_config.mask_token_id``).
"""
from __future__ import annotations

__all__ = ["BOS_ID", "EOS_ID", "MASK_ID", "VOCAB_SIZE", "encode", "decode"]

BOS_ID = 256
EOS_ID = 257
MASK_ID = 258
VOCAB_SIZE = 259


def encode(text: str | bytes, *, bos: bool = False) -> list[int]:
    """Token ids of ``text`` (UTF-8 bytes), with ``BOS_ID`` first when ``bos``.

    Parameters
    ----------
    text : str (encoded as UTF-8) or bytes
    bos : prepend ``BOS_ID``

    Returns
    -------
    list of ints in ``[0, VOCAB_SIZE)``.
    """
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return ([BOS_ID] if bos else []) + list(data)


def decode(ids) -> str:
    """Text of token ids: special ids are dropped, invalid UTF-8 is replaced.

    Parameters
    ----------
    ids : iterable of ints in ``[0, VOCAB_SIZE)``

    Returns
    -------
    str
    """
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
