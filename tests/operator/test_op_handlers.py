"""Kopf registration: both kinds reconcile on create, update, resume and a timer; deletion needs no
finalizer (children are garbage-collected through owner references, PVCs are kept on purpose)."""

from __future__ import annotations

import kopf

import txnkeeper_operator.handlers  # noqa: F401  (registers)
from txnkeeper_operator.naming import KINDS


def test_both_kinds_are_reconciled_by_events_and_a_timer() -> None:
    registry = kopf.get_default_registry()
    for kind in KINDS:
        timers = [h for h in registry._spawning.get_all_handlers() if kind.plural in str(h.selector)]
        assert [h.id for h in timers] == ["reconcile-timer"]
        changing = [h for h in registry._changing.get_all_handlers() if kind.plural in str(h.selector)]
        reasons = {h.reason for h in changing if h.id == "reconcile"}
        assert {kopf.Reason.CREATE, kopf.Reason.UPDATE} <= reasons
        assert any(h.initial for h in changing if h.id == "reconcile")  # resume on operator start
        deletes = [h for h in changing if h.id == "forget"]
        assert deletes and all(h.requires_finalizer is False for h in deletes)
