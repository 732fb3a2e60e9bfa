"""The store pod's subscription registry on disk: which subscriptions exist on which topic.

Why a file: a restarted pod must reopen every subscription's cursor and pending-ack store before it is
ready, and nothing else lists them. It is a checksummed state file (kind ``subscription-registry``,
``txnkeeper.statefile``); the previous release's plain JSON object (topic -> list of subscriptions) is
still read and is rewritten checksummed when the next subscription is created.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from txnkeeper import statefile
from txnkeeper.statefile import StateFileError, StateShapeError

REGISTRY_KIND = "subscription-registry"
REGISTRY_VERSION = 1
_REMEDY = (
    "the pod does not start, since a subscription it does not reopen would lose its pending acks; "
    "restore the file from a backup"
)


def load_registry(path: Path) -> dict[str, list[str]]:
    """The persisted registry ({} if there is none); StateFileError naming ``path`` if damaged."""
    doc = statefile.read(
        path, REGISTRY_KIND, frozenset({REGISTRY_VERSION}), legacy=_legacy_body, remedy=_REMEDY
    )
    if doc is None:
        return {}
    try:
        return _topics(statefile.obj(doc.body, "registry", {"topics"})["topics"])
    except StateShapeError as exc:
        raise StateFileError(path, f"not a valid subscription registry: {exc}", _REMEDY) from exc


def save_registry(path: Path, registry: dict[str, list[str]]) -> None:
    """Durably replace the registry (blocking: run it in a thread)."""
    statefile.write(path, REGISTRY_KIND, REGISTRY_VERSION, {"topics": registry})


def _legacy_body(raw: bytes) -> dict[str, Any]:
    """The previous release's subscriptions.json: a plain JSON object, topic -> [subscription]."""
    return {"topics": _topics(statefile.parse_json(raw))}


def _topics(value: Any) -> dict[str, list[str]]:
    registry: dict[str, list[str]] = {}
    for topic, subs in statefile.obj(value, "registry").items():
        what = f"subscriptions of topic {topic!r}"
        registry[topic] = [statefile.string(s, what) for s in statefile.array(subs, what)]
    return registry
