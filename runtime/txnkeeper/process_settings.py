"""The settings every runtime process shares, as command-line flags: GC policy, event loop, GIL switch
interval, C heap policy.

Why it exists: ``txnkeeper serve`` and the benchmarks (which must run as serve runs, or their figures say
nothing about a pod) each declared, checked and applied the same three settings; this is the one place
that does. Defaults come from ``TXNKEEPER_GC_THRESHOLD``, ``TXNKEEPER_EVENT_LOOP`` and
``TXNKEEPER_SWITCH_INTERVAL_MS``, ``TXNKEEPER_MALLOC_POLICY`` (what the operator's StatefulSet can
set), then from the runtime's own policy (``gcpolicy``, ``eventloop``, ``memtrim``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from txnkeeper import eventloop, gcpolicy, memtrim

T = TypeVar("T")


def _env(name: str) -> str | None:
    value = os.environ.get(f"TXNKEEPER_{name}")
    return value if value else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``--event-loop``, ``--switch-interval-ms`` and ``--gc-threshold`` on ``parser``."""
    parser.add_argument(
        "--event-loop",
        choices=eventloop.CHOICES,
        default=_env("EVENT_LOOP") or "auto",
        help="auto (uvloop when installed), uvloop or asyncio",
    )
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=_env("SWITCH_INTERVAL_MS") or f"{eventloop.IO_SWITCH_INTERVAL_S * 1000:g}",
        help="how often (ms) the busy loop thread lets the ledger's I/O threads take the GIL (default 0.5)",
    )
    parser.add_argument(
        "--gc-threshold",
        default=_env("GC_THRESHOLD"),
        help="garbage-collector thresholds gen0,gen1,gen2 (default 50000,20,100; 'default' for CPython's)",
    )
    parser.add_argument(
        "--malloc-policy",
        default=_env("MALLOC_POLICY") or "fixed",
        help="fixed (large allocations mapped on their own from 128 KiB, 2 arenas: keeps the C heap from"
        " fragmenting) or glibc (its defaults)",
    )


@dataclass(frozen=True)
class ProcessSettings:
    gc_thresholds: tuple[int, int, int]
    event_loop: str  # "uvloop" or "asyncio", resolved
    switch_interval_s: float
    malloc_policy: str = "fixed"

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ProcessSettings:
        """Check the flags :func:`add_arguments` declared; ValueError says what is wrong."""
        return cls(
            gcpolicy.parse_thresholds(ns.gc_threshold),
            eventloop.resolve(ns.event_loop),
            eventloop.check_switch_interval(ns.switch_interval_ms / 1000),
            memtrim.check_policy(ns.malloc_policy),
        )

    @classmethod
    def from_args_or_exit(cls, parser: argparse.ArgumentParser, ns: argparse.Namespace) -> ProcessSettings:
        """:meth:`from_args` for a command line tool: a bad flag exits through ``parser.error``."""
        try:
            return cls.from_args(ns)
        except ValueError as exc:
            parser.error(str(exc))

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Apply the heap policy and the GC thresholds, then run ``main`` on the chosen loop with the
        switch interval."""
        memtrim.apply_policy(self.malloc_policy)
        gcpolicy.apply(self.gc_thresholds)
        return eventloop.run(main, self.event_loop, switch_interval_s=self.switch_interval_s)
