"""The garbage-collector policy of a runtime process (``txnkeeper serve`` and the benchmarks).

Why it exists: a pod keeps many long-lived objects (ledger indexes, per-transaction state, recorded
positions) and allocates a handful of short-lived ones per log record. CPython's default thresholds
(700, 10, 10) then run a young collection every hundred records or so and, every hundred of those, a
collection that walks the older generations: with a thousand writers those pauses were the writer's
p99 (40-50 ms against a 1 ms batching delay) and a third of its CPU. The policy is the one large
Python services use: freeze what startup built (imports, replayed state) into the permanent generation
so no collection walks it again, and collect the young generation every 50,000 allocations instead of
700. Cycles are still collected; only how often changes. ``TXNKEEPER_GC_THRESHOLD`` (or the flag that
reads it) overrides the thresholds, ``default`` restores CPython's.
"""

from __future__ import annotations

import gc

RUNTIME_THRESHOLDS: tuple[int, int, int] = (50_000, 20, 100)
_CPYTHON_DEFAULT = "default"


def parse_thresholds(text: str | None) -> tuple[int, int, int]:
    """``"50000,20,100"`` -> thresholds; ``None`` -> the runtime's; ``"default"`` -> CPython's."""
    if text is None or not text.strip():
        return RUNTIME_THRESHOLDS
    if text.strip().lower() == _CPYTHON_DEFAULT:
        return (700, 10, 10)
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 3 or values[0] < 1 or values[1] < 1 or values[2] < 1:
        raise ValueError(
            f"GC threshold {text!r} is not three positive integers (gen0,gen1,gen2) such as"
            f" '{','.join(map(str, RUNTIME_THRESHOLDS))}'; use 'default' for CPython's 700,10,10"
        )
    return values[0], values[1], values[2]


def apply(thresholds: tuple[int, int, int] = RUNTIME_THRESHOLDS) -> None:
    """Set the collection thresholds of this process."""
    gc.set_threshold(*thresholds)


def freeze_startup_state() -> None:
    """Collect once, then move every surviving object to the permanent generation.

    Called when startup is over (stores opened and replayed): those objects live as long as the
    process, so walking them in every full collection is pure cost. Only the young generations are
    collected first: a full collection walked every replayed object once more (0.9 s of a coordinator
    pod's start with a million live txn-log records, before it could answer /ready), and startup's
    garbage is freed by reference counting; what the older generation holds of cyclic garbage is
    a bounded, one-time amount.
    """
    gc.collect(1)
    gc.freeze()
