"""How a runtime process runs its interpreter, declared once: event loop, GIL switch interval, garbage
collector thresholds and C heap policy, as the flags ``txnkeeper serve`` and the benchmarks share
(``process_settings``) and their ``TXNKEEPER_*`` env (what a StatefulSet can set).

Why flags and env only: they tune one process (a benchmark must run as serve runs), not a resource's
pods alike. Each value's shape is checked here; what it means (uvloop installed, three positive
thresholds) is ``eventloop``'s, ``gcpolicy``'s and ``memtrim``'s.
"""

from __future__ import annotations

from txnkeeper.contract.settings.schema import Section, Setting

EVENT_LOOPS = ("auto", "uvloop", "asyncio")
MALLOC_POLICIES = ("fixed", "glibc")
DEFAULT_SWITCH_INTERVAL_MS = 0.5
# Three ASCII integers (int() would take "١٢٣"), or "default" for CPython's own thresholds.
_THRESHOLDS = r"^\s*(?i:default)\s*$|^\s*[0-9]{1,9}\s*,\s*[0-9]{1,9}\s*,\s*[0-9]{1,9}\s*$"

INTERPRETER = Section(
    "interpreter",
    "How one runtime process runs Python (flags and env only; serve and the benchmarks share them).",
    (
        Setting(
            "eventLoop",
            "event_loop",
            "text",
            "auto",
            "auto (uvloop when installed), uvloop or asyncio.",
            flag="--event-loop",
            env="EVENT_LOOP",
            pattern="(?i)^(" + "|".join(EVENT_LOOPS) + ")$",
            range_text="one of auto, uvloop, asyncio",
            in_file=False,
            in_cr=False,
        ),
        Setting(
            "switchIntervalMs",
            "switch_interval_ms",
            "number",
            DEFAULT_SWITCH_INTERVAL_MS,
            "How often (ms) the busy loop thread lets the ledger's I/O threads take the GIL.",
            flag="--switch-interval-ms",
            env="SWITCH_INTERVAL_MS",
            minimum=0.001,
            maximum=1000,
            unit="ms",
            hint=f" (default {DEFAULT_SWITCH_INTERVAL_MS:g})",
            in_file=False,
            in_cr=False,
        ),
        Setting(
            "gcThreshold",
            "gc_threshold",
            "text",
            None,
            "Garbage-collector thresholds gen0,gen1,gen2 (default: the runtime's 50000,20,100; 'default' for "
            "CPython's).",
            flag="--gc-threshold",
            env="GC_THRESHOLD",
            pattern=_THRESHOLDS,
            range_text="three positive integers gen0,gen1,gen2 such as 50000,20,100, or default",
            in_file=False,
            in_cr=False,
        ),
        Setting(
            "mallocPolicy",
            "malloc_policy",
            "enum",
            "fixed",
            "fixed (large allocations mapped on their own from 128 KiB, 2 arenas: keeps the C heap from "
            "fragmenting) or glibc (its defaults).",
            flag="--malloc-policy",
            env="MALLOC_POLICY",
            choices=MALLOC_POLICIES,
            error="{where} is {value}: give 'fixed' (large allocations mapped on their own from 128 KiB, 2 "
            "arenas) or 'glibc' (glibc's own defaults)",
            in_file=False,
            in_cr=False,
        ),
    ),
)
