"""An optional, process-wide record of what the offloader did when: for finding what delays producers.

Streaming offload shares two cores, one disk and (for its main part) one interpreter with the managed
ledgers it reads back. When producers' tail latency grows with streaming on, the question is which of
its steps the slow appends coincided with: a read-back worker call, a block upload, a tier object's
fdatasync, a metadata write, a segment close. ``bench/offload.py --timeline`` switches this record on,
lines the spans up against every append's latency and prints the shares.

Off (the default) a span costs one clock read and one ``None`` check; nothing is kept. Spans are
``(kind, start, end)`` in ``time.perf_counter`` seconds (CLOCK_MONOTONIC on Linux, so spans measured in
the read-back worker process line up with this process's). Threads append to one list: a list append is
atomic under the GIL.
"""

from __future__ import annotations

import time

Span = tuple[str, float, float]

_recording: dict[str, list[Span]] = {}  # "spans" while recording
now = time.perf_counter


def start() -> None:
    """Begin recording (dropping anything recorded before)."""
    _recording["spans"] = []


def stop() -> list[Span]:
    """Stop recording; returns the spans recorded since ``start``."""
    return _recording.pop("spans", [])


def span(kind: str, started: float, ended: float | None = None) -> None:
    """Record that ``kind`` ran from ``started`` (a ``now()`` reading) until ``ended`` (default: now)."""
    spans = _recording.get("spans")
    if spans is not None:
        spans.append((kind, started, now() if ended is None else ended))
