"""The demo's live progress display: one line per action or phase change, plus a live status line.

On a terminal the status line (phase of each group, member versions and batch state, load counters)
is redrawn in place; in a log (CI, `make demo | tee`) only the event lines are printed, so the output
reads as a transcript of what the engine decided and why.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from txnkeeper.fleet.group import MemberGroup
from txnkeeper.fleet.load import LoadFigures
from txnkeeper_operator.engine import Decision, Phase


class Display:
    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out
        self.live = out.isatty()
        self.started = time.monotonic()
        self._last: dict[str, tuple[str, str]] = {}
        self._status_shown = False

    def _clock(self) -> str:
        return f"[{time.monotonic() - self.started:6.1f}s]"

    def _clear_status(self) -> None:
        if self.live and self._status_shown:
            self.out.write("\r\033[K")
            self._status_shown = False

    def line(self, text: str) -> None:
        self._clear_status()
        self.out.write(f"{self._clock()} {text}\n")
        self.out.flush()

    def stage(self, title: str) -> None:
        self._clear_status()
        self.out.write(f"\n{self._clock()} == {title}\n")
        self.out.flush()

    def decision(self, group: MemberGroup, decision: Decision, history_len: int) -> None:
        if len(group.history) > history_len:
            for action in group.history[history_len:]:
                self.line(f"{group.name:>3}: {action}")
        key = (str(decision.phase), decision.reason.removesuffix("; verifying again"))
        # Waits are news; so is a held downgrade even while the engine asks the verifier again.
        worth_saying = decision.action is None or decision.phase == Phase.DOWNGRADE_BLOCKED
        if self._last.get(group.name) != key and worth_saying:
            self._last[group.name] = key
            self.line(f"{group.name:>3}: {decision.phase}: {decision.reason}")

    def status(self, groups: list[MemberGroup], states: dict[str, str], load: LoadFigures | None) -> None:
        if not self.live:
            return
        parts = [f"{g.name} {states.get(g.name, '?')}" for g in groups]
        if load is not None:
            parts.append(f"load: {load.committed_txns} txns, {load.acked} acks")
        self.out.write("\r\033[K" + self._clock() + " " + " | ".join(parts))
        self.out.flush()
        self._status_shown = True

    def close(self) -> None:
        self._clear_status()
        self.out.flush()
