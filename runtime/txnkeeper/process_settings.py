"""The settings every runtime process shares, as command-line flags: GC policy, event loop, GIL switch
interval, C heap policy.

Why it exists: ``txnkeeper serve`` and the benchmarks (which must run as serve runs, or their figures say
nothing about a pod) each declared, checked and applied the same three settings; this is the one place
that does. Flags win over ``TXNKEEPER_GC_THRESHOLD``, ``TXNKEEPER_EVENT_LOOP``,
``TXNKEEPER_SWITCH_INTERVAL_MS`` and ``TXNKEEPER_MALLOC_POLICY`` (what the operator's StatefulSet can
set), and those over the runtime's own policy (``gcpolicy``, ``eventloop``, ``memtrim``); the flags,
their env and their shapes are declared in ``contract/settings/interpreter.py``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from txnkeeper import eventloop, gcpolicy, memtrim
from txnkeeper.contract.settings import schema
from txnkeeper.contract.settings.interpreter import INTERPRETER

T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``--event-loop``, ``--switch-interval-ms``, ``--gc-threshold`` and ``--malloc-policy``
    on ``parser`` (contract/settings/interpreter.py: their env, defaults and allowed values)."""
    schema.add_flags(parser.add_argument_group("interpreter"), INTERPRETER)


@dataclass(frozen=True)
class ProcessSettings:
    gc_thresholds: tuple[int, int, int]
    event_loop: str  # "uvloop" or "asyncio", resolved
    switch_interval_s: float
    malloc_policy: str = "fixed"

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ProcessSettings:
        """The flags :func:`add_arguments` declared, over their env, checked by the declaration (its
        error names the flag or variable), then what each means; ValueError says what is wrong."""
        values = schema.load(INTERPRETER, flags=vars(ns), environ=os.environ, file=None, file_where="").values
        return cls(
            gcpolicy.parse_thresholds(values["gc_threshold"]),
            eventloop.resolve(values["event_loop"]),
            eventloop.check_switch_interval(values["switch_interval_ms"] / 1000),
            memtrim.check_policy(values["malloc_policy"]),
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
