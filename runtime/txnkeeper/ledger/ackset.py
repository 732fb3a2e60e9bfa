"""Pulsar's ack-set arithmetic for batched entries (pure functions).

An ack set is Java's ``BitSet.toLongArray()``: 64-bit words, bit i of the batch is bit (i % 64) of
word (i // 64), and a SET bit means "batch index still present". Words may arrive signed (protobuf
int64, Java long) or unsigned; they are returned signed, trailing zero words dropped, as Java does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_WORD = 64
_MASK64 = (1 << 64) - 1


def validate_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (got {batch_size}): a batched entry holds records")


def full_mask(batch_size: int) -> int:
    """Every index of the batch present."""
    return (1 << batch_size) - 1


def words_to_mask(words: Sequence[int], batch_size: int) -> int:
    """Join the words into one integer bitmask, keeping only bits of the batch."""
    mask = 0
    for i, word in enumerate(words):
        if not -(1 << 63) <= word <= _MASK64:
            raise ValueError(f"ack-set word {i} ({word}) does not fit in 64 bits")
        mask |= (word & _MASK64) << (_WORD * i)
    return mask & full_mask(batch_size)


def mask_to_words(mask: int) -> list[int]:
    """Split a bitmask into signed 64-bit words, like BitSet.toLongArray (no trailing zero words)."""
    words: list[int] = []
    while mask:
        word = mask & _MASK64
        words.append(word - (1 << 64) if word >= 1 << 63 else word)
        mask >>= _WORD
    return words


def lowest_index(mask: int) -> int:
    """The lowest batch index set in ``mask`` (which must not be 0)."""
    return (mask & -mask).bit_length() - 1


def mask_without(batch_size: int, indexes: Iterable[int]) -> int:
    """The ack set PIP-160 sends to delete ``indexes``: every bit set except those."""
    mask = full_mask(batch_size)
    for index in indexes:
        if not 0 <= index < batch_size:
            raise ValueError(f"batch index {index} is outside the batch of {batch_size} records")
        mask &= ~(1 << index)
    return mask
