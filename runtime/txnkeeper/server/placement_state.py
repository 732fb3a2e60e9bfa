"""A pod's own copy of its resource's placement record and its local move markers (docs/contracts.md
§12), and the one question every request asks of them: does this pod serve that shard (coordinator id)
now, and if not, where should the client go?

Why a pod keeps a copy: it must answer by the record while the writer (the operator) is away, also
right after a restart, and it must never go back to an older epoch. Why the move markers live in the
same state file: "fenced for move M" and "received for move M" must survive a crash together with the
record they are judged against, so that a repeated move verb finds the state it left.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from txnkeeper import statefile
from txnkeeper.contract.placement import Placement, PlacementError, PlacementKind, shard_of
from txnkeeper.errors import NotServedHereError

STATE_FILE = "placement.json"
STATE_KIND = "placement"
STATE_VERSION = 1
_REMEDY = (
    "the operator (or the fleet driver) writes the record again with PUT /admin/v1/placement; to start "
    "from the arithmetic placement instead, move the file aside (only if no shard was ever moved)"
)
MarkerState = Literal["fenced", "received"]
MARKER_STATES: tuple[MarkerState, ...] = ("fenced", "received")
MAX_MOVE_ID = 128


@dataclass(frozen=True)
class MoveMarker:
    """What this pod did for a move of one shard: fenced it (the source) or received it (the target)."""

    move: str
    state: MarkerState


class PlacementRefusal(Exception):
    """A record or marker change refused: HTTP ``status`` (400 bad, 409 not in this state) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def pod_ordinal(pod_name: str) -> int:
    """The ordinal that ends a StatefulSet pod's name (``pas-2`` -> 2); 0 for a name without one (a
    single local process)."""
    tail = pod_name.rpartition("-")[2]
    return int(tail) if tail.isascii() and tail.isdecimal() and len(tail) <= 6 else 0


class PodPlacement:
    """The record this pod judges by, its move markers, and the state file that keeps both."""

    def __init__(
        self,
        path: Path,
        ordinal: int,
        record: Placement,
        markers: Mapping[int, MoveMarker] | None = None,
    ) -> None:
        self.path = path
        self.ordinal = ordinal
        self.record = record
        self.markers: dict[int, MoveMarker] = dict(markers or {})
        self._listeners: list[Callable[[Placement], None]] = []

    @classmethod
    def load(cls, data_dir: Path, kind: PlacementKind, ordinal: int, initial: Placement) -> PodPlacement:
        """The persisted copy, or ``initial`` (nothing written) when the pod never received one.
        A damaged file stops the start (StateFileError naming it); one of another kind or shard count
        than this pod's flags say is refused too (the pod would serve the wrong topics)."""
        path = data_dir / STATE_FILE
        doc = statefile.read(path, STATE_KIND, frozenset({STATE_VERSION}), remedy=_REMEDY)
        if doc is None:
            return cls(path, ordinal, initial)
        body = statefile.obj(doc.body, "placement state", {"record", "markers"})
        try:
            record = Placement.from_json(body.get("record"), f"{path}: record")
        except PlacementError as exc:
            raise statefile.StateFileError(path, str(exc), _REMEDY) from None
        if record.kind != initial.kind or record.shards != initial.shards:
            raise statefile.StateFileError(
                path,
                f"it holds a {record.kind} record of {record.shards} shards, but this pod runs "
                f"{initial.kind} with {initial.shards}",
                "start the pod with the flags of its resource (--shards, --coordinators)",
            )
        markers: dict[int, MoveMarker] = {}
        for key, raw in statefile.obj(body.get("markers", {}), "markers").items():
            entry = statefile.obj(raw, f"marker {key}", {"move", "state"})
            state = entry.get("state")
            if not key.isdecimal() or int(key) >= record.shards or state not in MARKER_STATES:
                raise statefile.StateFileError(path, f"marker {key!r} is not a shard and state", _REMEDY)
            markers[int(key)] = MoveMarker(statefile.string(entry.get("move"), "move"), state)
        return cls(path, ordinal, record, markers)

    # --- the question every request asks ----------------------------------------------------------
    def serves(self, shard: int) -> bool:
        marker = self.markers.get(shard)
        fenced = marker is not None and marker.state == "fenced"
        return self.record.owner_of(shard) == self.ordinal and not fenced

    def shard_of_topic(self, topic: str) -> int:
        return shard_of(topic, self.record.shards)

    def check_topic(self, topic: str) -> None:
        self.check(self.shard_of_topic(topic), f"topic '{topic}'")

    def check(self, shard: int, what: str) -> None:
        """Raise the redirect for ``shard`` unless this pod serves it."""
        if self.serves(shard):
            return
        epoch = self.record.epoch
        owner = self.record.owner_of(shard)
        if owner == self.ordinal:  # ours, fenced for a move: nowhere to send the client yet
            raise NotServedHereError(
                f"{what} (shard {shard}) is being moved off this pod; retry shortly",
                placement_epoch=epoch,
            )
        member = self.record.member(owner)
        address = member.address if member is not None else ""
        where = f"pod {owner} at {address}" if address else f"pod {owner} (address unknown: look it up)"
        raise NotServedHereError(
            f"{what} (shard {shard}) is served by {where}, not this pod (placement epoch {epoch})",
            owner_address=address,
            placement_epoch=epoch,
        )

    # --- changes ----------------------------------------------------------------------------------
    def on_change(self, listener: Callable[[Placement], None]) -> None:
        self._listeners.append(listener)

    def put(self, record: Placement) -> bool:
        """Take a record from the writer; True if it changed anything. The same epoch again with the
        same content is a no-op (a repeated PUT); an older epoch, another epoch with the same number,
        another kind or shard count is refused (409 / 400)."""
        held = self.record
        if record.kind != held.kind or record.shards != held.shards:
            raise PlacementRefusal(
                400,
                f"this pod holds a {held.kind} record of {held.shards} shards; a {record.kind} record of "
                f"{record.shards} is not for this resource",
            )
        if record.epoch == held.epoch and record == held:
            return False
        if record.epoch <= held.epoch:
            raise PlacementRefusal(
                409, f"this pod holds placement epoch {held.epoch}; epoch {record.epoch} is not newer"
            )
        self.record = record
        self._persist()
        for listener in self._listeners:
            listener(record)
        return True

    def mark(self, shard: int, move: str, state: MarkerState) -> None:
        self.record.owner_of(shard)
        if not move or len(move) > MAX_MOVE_ID or not move.isprintable():
            raise PlacementRefusal(400, f"a move id is 1..{MAX_MOVE_ID} printable characters, not {move!r}")
        held = self.markers.get(shard)
        if held is not None and held.move != move:
            raise PlacementRefusal(
                409,
                f"shard {shard} is {held.state} for move {held.move!r}, not {move!r}: finish or roll "
                "that move back first",
            )
        if held == MoveMarker(move, state):
            return
        self.markers[shard] = MoveMarker(move, state)
        self._persist()

    def clear(self, shard: int, move: str) -> None:
        held = self.markers.get(shard)
        if held is None:
            return
        if held.move != move:
            raise PlacementRefusal(409, f"shard {shard} is {held.state} for move {held.move!r}, not {move!r}")
        del self.markers[shard]
        self._persist()

    def to_json(self) -> dict[str, object]:
        return {
            "ordinal": self.ordinal,
            "record": self.record.to_json(),
            "markers": {str(s): {"move": m.move, "state": m.state} for s, m in sorted(self.markers.items())},
        }

    def _persist(self) -> None:
        body = {
            "record": self.record.to_json(),
            "markers": {str(s): {"move": m.move, "state": m.state} for s, m in sorted(self.markers.items())},
        }
        statefile.write(self.path, STATE_KIND, STATE_VERSION, body)
