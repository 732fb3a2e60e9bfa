"""The scaling state's JSON (ConfigMap key moves.json): what is written reads back the same, and a
damaged document is refused naming the field, never half-read."""

from __future__ import annotations

import pytest

from txnkeeper_operator.engine.placement import (
    FailedMove,
    Move,
    MovePhase,
    MoveReason,
    Rebalance,
    ScalingState,
    ScalingStateError,
)


def test_round_trip() -> None:
    state = ScalingState(
        initial_replicas=2,
        next_move=7,
        moves=(Move("s3-m6", 3, 1, 0, MovePhase.SWITCH, MoveReason.DRAIN, 2, "HTTP 503", ""),),
        failed=(FailedMove("s1-m2", 1, 1, 0, "receive failed 5 times"),),
        rebalance=Rebalance("spec.replicas 2 -> 1", frozenset({3, 1}), by_load=True),
        balanced_for=2,
    )
    assert ScalingState.loads(state.dumps()) == state
    assert ScalingState.loads(ScalingState(initial_replicas=1).dumps()) == ScalingState(initial_replicas=1)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "not JSON"),
        ('{"version": 2}', "version 1"),
        (
            '{"version": 1, "initialReplicas": 0, "nextMove": 1, "balancedFor": 0, "moves": [], '
            '"failed": []}',
            "initialReplicas",
        ),
        (
            '{"version": 1, "initialReplicas": 1, "nextMove": 1, "balancedFor": 1, "failed": [], "moves": '
            '[{"id": "x", "unit": 0, "source": 0, "target": 1, "phase": "teleport", "reason": "drain"}]}',
            "teleport",
        ),
        (
            '{"version": 1, "initialReplicas": 1, "nextMove": 1, "balancedFor": 1, "failed": [], "moves": '
            '[{"id": "x", "unit": true, "source": 0, "target": 1, "phase": "fence", "reason": "drain"}]}',
            "unit",
        ),
    ],
)
def test_damaged_state_is_refused_naming_the_field(text: str, fragment: str) -> None:
    with pytest.raises(ScalingStateError, match=r"moves\.json") as err:
        ScalingState.loads(text)
    assert fragment in str(err.value)
