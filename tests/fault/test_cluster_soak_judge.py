"""The cluster soak's judge is not vacuous: planted loss, duplicates, aborted data, a commit's id that
holds another event and a lost transactional ack are each reported in their category, and an in-doubt
outcome is allowed either way but never half."""

from __future__ import annotations

from collections.abc import Callable

from txnkeeper.client import MessageId
from txnkeeper.errors import ServiceError, UnavailableError

from .cluster_soak import FullTxn, NamedSend, Read, Record, SrkTxn, Topics, judge

TOPICS = Topics.of_trial(7, 2)
Plant = Callable[[Record, dict[str, Read], Read], object]


def mid(n: int) -> MessageId:
    return MessageId(1, n)


def acknowledged() -> tuple[Record, dict[str, Read], Read]:
    """A record and the reads that match it exactly."""
    record = Record()
    record.inputs_sent = {"i|0", "i|1", "i|2"}
    record.inputs = {"i|0": mid(0), "i|1": mid(1), "i|2": mid(2)}
    record.txns["a"] = FullTxn("a", "i|0", "commit", outputs={"o|a|i|0|0": mid(0), "o|a|i|0|1": mid(1)})
    record.txns["a"].outcome = "committed"
    record.txns["b"] = FullTxn("b", "i|1", "abort", outputs={"o|b|i|1|0": mid(2), "o|b|i|1|1": mid(3)})
    record.txns["b"].outcome = "aborted"
    record.srk[("w0", 1, 0)] = SrkTxn("w0", 1, 0, ["s|w0|1|0|0", "s|w0|1|0|1"], [mid(0), mid(1)], "committed")
    record.srk[("w0", 2, 0)] = SrkTxn("w0", 2, 0, ["s|w0|2|0|0"])  # in doubt
    record.named["n|p0|1|0"] = NamedSend("p0", 1, 0, mid(0), "acknowledged")
    record.named["n|p0|1|1"] = NamedSend("p0", 1, 1)  # in doubt
    reads = {
        TOPICS.inputs: [("i|0", mid(0)), ("i|1", mid(1)), ("i|2", mid(2))],
        TOPICS.outputs: [("o|a|i|0|0", mid(0)), ("o|a|i|0|1", mid(1))],
        TOPICS.srk: [("s|w0|1|0|0", mid(0)), ("s|w0|1|0|1", mid(1))],
        TOPICS.named: [("n|p0|1|0", mid(0))],
    }
    work: Read = [("i|1", mid(1)), ("i|2", mid(2))]  # b aborted: its input is back; a's is consumed
    return record, reads, work


def test_what_was_acknowledged_judges_clean_and_in_doubt_may_go_either_way() -> None:
    record, reads, work = acknowledged()
    assert judge(record, TOPICS, reads, work) == []
    reads[TOPICS.srk].append(("s|w0|2|0|0", mid(2)))  # the in-doubt block applied: fine too
    reads[TOPICS.named].append(("n|p0|1|1", mid(1)))
    assert judge(record, TOPICS, reads, work) == []


def test_planted_damage_is_reported_in_its_category() -> None:
    cases: dict[str, list[Plant]] = {
        "silent_loss": [
            lambda r, reads, w: reads[TOPICS.outputs].pop(),  # a committed output gone
            lambda r, reads, w: reads[TOPICS.named].clear(),  # an acknowledged send gone
            lambda r, reads, w: w.remove(("i|2", mid(2))),  # an input neither consumed nor there
        ],
        "wrong_data": [
            lambda r, reads, w: reads[TOPICS.outputs].append(("o|b|i|1|0", mid(5))),  # aborted delivered
            lambda r, reads, w: reads[TOPICS.srk].append(("s|w0|1|0|0", mid(7))),  # duplicated
            lambda r, reads, w: w.append(("i|0", mid(0))),  # delivered after its committed ack
            lambda r, reads, w: (
                r.srk[("w0", 1, 0)].ids or []
            ).reverse(),  # the commit's ids hold other events
            lambda r, reads, w: reads[TOPICS.inputs].append(("i|9", mid(9))),  # never written
        ],
    }
    for category, plants in cases.items():
        for plant in plants:
            record, reads, work = acknowledged()
            plant(record, reads, work)
            findings = judge(record, TOPICS, reads, work)
            assert findings and {c for c, _ in findings} == {category}, findings


def test_an_in_doubt_transaction_is_never_half_visible() -> None:
    record, reads, work = acknowledged()
    record.txns["c"] = FullTxn("c", "i|2", "commit", outputs={"o|c|i|2|0": mid(4), "o|c|i|2|1": mid(5)})
    reads[TOPICS.outputs].append(("o|c|i|2|0", mid(4)))
    work.remove(("i|2", mid(2)))  # consistent with c committed, as its visible output says
    findings = judge(record, TOPICS, reads, work)
    assert [c for c, _ in findings] == ["wrong_data"] and "partly visible" in findings[0][1], findings


def test_only_clear_refusals_pass() -> None:
    record = Record()
    record.refused(UnavailableError("store restarting; retry"), "send")
    record.refused(ServiceError("expected a receipt, got nothing"), "send")  # UNKNOWN_ERROR, untyped
    record.refused(KeyError("x"), "send")
    record.refused(UnavailableError(""), "send")
    assert record.refusals == {"UnavailableError": 1}
    assert len(record.bad_refusals) == 3, record.bad_refusals
