"""The soak's judge is not vacuous: planted loss and planted wrong data are reported as such, and an
announced-but-unfinished delete is allowed either way while a finished one must stay finished."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from pathlib import Path

from txnkeeper.txnlog import TxnID
from txnkeeper.txnlog.store import TxnLogState

from . import workload as w
from .soak import Observed, Verdict, check_txn_log, run_child, verify


def killed_run(root: Path) -> Observed:
    seen = Observed()
    error = run_child(root, 1, "on", random.Random(1), seen, target=300)
    assert error is None, error
    assert seen.txn_records and seen.route_done, "the run should have acknowledged records and routes"
    return seen


def test_a_plain_kill_is_judged_clean_and_planted_damage_is_caught(tmp_path: Path) -> None:
    root = tmp_path / "pod"
    seen = killed_run(root)
    assert asyncio.run(verify(root, seen)).findings == []

    lost = tmp_path / "lost"
    shutil.copytree(root, lost)
    shutil.rmtree(w.ledgers_dir(lost) / "__transaction_log_0")  # the whole txn log, gone silently
    findings = asyncio.run(verify(lost, seen)).findings
    assert any(c == "silent_loss" and "txn log" in m for c, m in findings), findings

    wrong = tmp_path / "wrong"
    shutil.copytree(root, wrong)
    topic = sorted(seen.route_done)[0]
    w.routes_path(wrong).write_text(json.dumps({topic: "elsewhere:6650"}))  # valid JSON, wrong value
    findings = asyncio.run(verify(wrong, seen)).findings
    assert ("wrong_data", f"route of {topic} is elsewhere:6650, never learned") in findings, findings


def test_a_finished_delete_must_stay_finished_an_announced_one_may_go_either_way() -> None:
    seen = Observed()
    for line in ("Q 3", "A 3 0 1 0 0 0", "X 3", "Q 6", "A 6 0 1 1 0 0", "X 6", "XD 6"):
        seen.take(line)
    state = TxnLogState(TxnID(0, 3), timeout_ms=1003, owner="owner-3", start_time=1_700_000_000_003)
    state.complete = True
    for served in ({}, {TxnID(0, 3): state}):
        verdict = Verdict()
        check_txn_log(verdict, seen, served)
        assert verdict.findings == []  # 3's delete was under way: whole or gone are both right
    resurrected = TxnLogState(TxnID(0, 6), complete=True, timeout_ms=1006, owner="owner-6")
    verdict = Verdict()
    check_txn_log(verdict, seen, {TxnID(0, 6): resurrected})
    assert ("wrong_data", "txn log serves (0,6), whose delete completed") in verdict.findings
