"""Who owns what: the placement record of one resource's shards (store pods) or coordinator ids
(coordinator pods), shared by the pods, the clients, the operator and the local fleet.

Why it exists: with a fixed number of pods, placement was arithmetic (a topic on store pod
``crc32(topic) mod pods``, coordinator ``c`` on pod ``c mod pods``), so pods could not be added or
removed without moving every client's topics. Placement is now a record: topics hash into a fixed
number of shards (Pulsar's bundles, Pravega's segment containers), coordinator ids are a fixed set,
and each shard or id is owned by one pod at a time. The record changes only by whole new epochs
written by one writer (the operator, or the local fleet's driver), so any two copies can be ordered
and a pod never goes back to an older one.

A resource's first record keeps every topic where the arithmetic rule put it: ``shards`` is a multiple
of the replica count ``R`` at that time and shard ``s`` starts on pod ``s mod R``, so
``crc32(topic) mod shards mod R == crc32(topic) mod R``.

Standard library only (docs/contracts.md §0).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

PlacementKind = Literal["store-shards", "coordinator-ids"]
KINDS: tuple[PlacementKind, ...] = ("store-shards", "coordinator-ids")
SHARDS_PER_REPLICA = 16
MAX_SHARDS = 4096
MAX_MEMBERS = 1024
MAX_ADDRESS_LENGTH = 512
# A store shard's pre-copy (its closed ledgers copied while the old pod still serves) runs at most this
# fast unless told otherwise (0: as fast as the pods go). Unbounded, the copy's writes queue the
# clients' fsyncs wherever both pods share a disk and two cores: clients kept 0.21-0.33 of their
# throughput during it (bench/rebalance.py, 2026-11-29); the lower the bound, the more they keep (the
# pods' CPU hardly moves: it is the one disk): at 1 GiB, 40 MiB/s kept 0.67-0.83, 25 MiB/s
# 0.65-0.87, 15 MiB/s 0.79-1.01, 10 MiB/s 0.95-0.98 (docs/performance.md): the goal is 0.8, so 10, at the
# price of ~108 s of pre-copy per GiB (the pause does not grow: it copies only what changed since). Pods
# with disks of their own can take more (spec.scaling.precopyMiBPerSecond).
DEFAULT_PRECOPY_MIB_PER_S = 10


class PlacementError(ValueError):
    """A placement record that cannot be used, with what is wrong and where."""


def shard_of(topic: str, shards: int) -> int:
    """The shard a topic hashes into: the own clients' crc32 rule over the shard count."""
    return zlib.crc32(topic.encode()) % shards


@dataclass(frozen=True)
class Member:
    """How to reach one pod: the own protocol's ``host:port``, Pulsar clients' ``pulsar://`` URL and
    the admin API's base URL (empty when unknown, e.g. a pod that never started)."""

    address: str
    pulsar_url: str = ""
    admin_url: str = ""

    def to_json(self) -> dict[str, str]:
        out = {"address": self.address}
        if self.pulsar_url:
            out["pulsarUrl"] = self.pulsar_url
        if self.admin_url:
            out["adminUrl"] = self.admin_url
        return out


@dataclass(frozen=True)
class Placement:
    """One epoch of a resource's placement: ``owners[s]`` is the ordinal of the pod that owns shard
    (or coordinator id) ``s``; ``members`` maps ordinals to addresses."""

    kind: PlacementKind
    epoch: int
    owners: tuple[int, ...]
    members: Mapping[int, Member] = field(default_factory=dict)

    @property
    def shards(self) -> int:
        return len(self.owners)

    @classmethod
    def initial(
        cls,
        kind: PlacementKind,
        replicas: int,
        shards: int | None = None,
        members: Mapping[int, Member] | None = None,
    ) -> Placement:
        """Epoch 1: ``shards`` (default ``SHARDS_PER_REPLICA * replicas`` for store shards) spread as
        the arithmetic rule placed them. A store-shard count must be a multiple of ``replicas`` (so no
        existing topic changes pod); a coordinator-id count is the resource's ``coordinators``."""
        if not 1 <= replicas <= MAX_MEMBERS:
            raise PlacementError(f"replicas must be 1..{MAX_MEMBERS}, not {replicas}")
        count = SHARDS_PER_REPLICA * replicas if shards is None else shards
        if not 1 <= count <= MAX_SHARDS:
            raise PlacementError(f"the shard count must be 1..{MAX_SHARDS}, not {count}")
        if kind == "store-shards" and count % replicas:
            raise PlacementError(
                f"{count} shards cannot start on {replicas} pods: the first record must keep every "
                f"topic on its pod (crc32 mod {replicas}), so the shard count must be a multiple of it"
            )
        placement = cls(kind, 1, tuple(s % replicas for s in range(count)), dict(members or {}))
        placement.check()
        return placement

    # --- queries -----------------------------------------------------------------------------------
    def owner_of(self, shard: int) -> int:
        if not 0 <= shard < self.shards:
            raise PlacementError(f"shard {shard} is not in 0..{self.shards - 1}")
        return self.owners[shard]

    def owner_of_topic(self, topic: str) -> int:
        return self.owners[shard_of(topic, self.shards)]

    def shards_of(self, ordinal: int) -> tuple[int, ...]:
        return tuple(s for s, owner in enumerate(self.owners) if owner == ordinal)

    def member(self, ordinal: int) -> Member | None:
        return self.members.get(ordinal)

    # --- changes (each a new epoch) ----------------------------------------------------------------
    def with_owner(self, shard: int, ordinal: int) -> Placement:
        self.owner_of(shard)
        if not 0 <= ordinal < MAX_MEMBERS:
            raise PlacementError(f"pod ordinal must be 0..{MAX_MEMBERS - 1}, not {ordinal}")
        owners = list(self.owners)
        owners[shard] = ordinal
        return replace(self, epoch=self.epoch + 1, owners=tuple(owners))

    def supersedes(self, other: Placement | None) -> bool:
        """Whether a pod holding ``other`` takes this one: same kind and shard count, a newer epoch."""
        if other is None:
            return True
        if other.kind != self.kind or other.shards != self.shards:
            return False
        return self.epoch > other.epoch

    # --- JSON (the operator's ConfigMap, the pods' state file, the admin API) ----------------------
    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "epoch": self.epoch,
            "owners": list(self.owners),
            "members": {str(k): m.to_json() for k, m in sorted(self.members.items())},
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: object, where: str = "placement") -> Placement:
        """Parse and check a record; every problem names ``where`` and the field."""
        if not isinstance(raw, dict):
            raise PlacementError(f"{where}: must be a JSON object, not {type(raw).__name__}")
        unknown = set(raw) - {"kind", "epoch", "owners", "members"}
        if unknown:
            raise PlacementError(f"{where}: unknown keys {sorted(unknown)}")
        kind = raw.get("kind")
        if kind not in KINDS:
            raise PlacementError(f"{where}.kind must be one of {list(KINDS)}, not {kind!r}")
        epoch = raw.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
            raise PlacementError(f"{where}.epoch must be an integer >= 1, not {epoch!r}")
        owners = raw.get("owners")
        if not isinstance(owners, list) or not all(_is_int(o) for o in owners):
            raise PlacementError(f"{where}.owners must be a list of pod ordinals")
        members_raw = raw.get("members", {})
        if not isinstance(members_raw, dict):
            raise PlacementError(f"{where}.members must be an object of ordinal -> member")
        members: dict[int, Member] = {}
        for key, value in members_raw.items():
            if not (isinstance(key, str) and key.isascii() and key.isdigit()):
                raise PlacementError(f"{where}.members: key {key!r} is not a pod ordinal")
            members[int(key)] = _member(value, f"{where}.members.{key}")
        placement = cls(kind, epoch, tuple(owners), members)
        placement.check(where)
        return placement

    @classmethod
    def loads(cls, text: str | bytes, where: str = "placement") -> Placement:
        try:
            raw = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise PlacementError(f"{where}: not JSON ({exc})") from None
        return cls.from_json(raw, where)

    def check(self, where: str = "placement") -> None:
        if not 1 <= self.shards <= MAX_SHARDS:
            raise PlacementError(f"{where}.owners must name 1..{MAX_SHARDS} owners, not {self.shards}")
        bad = [o for o in self.owners if not 0 <= o < MAX_MEMBERS]
        if bad:
            raise PlacementError(f"{where}.owners: ordinal {bad[0]} is not in 0..{MAX_MEMBERS - 1}")
        if len(self.members) > MAX_MEMBERS:
            raise PlacementError(f"{where}.members: more than {MAX_MEMBERS}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _member(raw: object, where: str) -> Member:
    if not isinstance(raw, dict):
        raise PlacementError(f"{where} must be an object with address, pulsarUrl, adminUrl")
    unknown = set(raw) - {"address", "pulsarUrl", "adminUrl"}
    if unknown:
        raise PlacementError(f"{where}: unknown keys {sorted(unknown)}")
    values = []
    for key in ("address", "pulsarUrl", "adminUrl"):
        value = raw.get(key, "")
        if not isinstance(value, str) or len(value) > MAX_ADDRESS_LENGTH or not value.isprintable():
            raise PlacementError(f"{where}.{key} must be a printable string of at most {MAX_ADDRESS_LENGTH}")
        values.append(value)
    if not values[0]:
        raise PlacementError(f"{where}.address is required (host:port of the own protocol)")
    return Member(values[0], values[1], values[2])
