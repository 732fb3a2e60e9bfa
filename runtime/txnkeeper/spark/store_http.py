"""The data source's calls to a store pod's admin API: a topic's read state and ranges of its entries.

Why its own module: the driver asks for read state and the executors for entries, both over plain
HTTP (urllib: no event loop inside a Spark task), and every way a pod can fail to answer becomes one
StoreReadError that names the pod, the topic and what to check, never a half-read range.
"""

from __future__ import annotations

import functools
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from txnkeeper.contract import entry_frames, tls

READ_STATE_PATH = "/admin/v1/topics/read-state"
ENTRIES_PATH = "/admin/v1/topics/entries"


@functools.cache
def _opener() -> urllib.request.OpenerDirector:
    """No proxy between executors and pods; https:// admin URLs are verified against
    TXNKEEPER_TLS_CA_FILE (+ _CERT_FILE/_KEY_FILE for client certificates; contract/tls.py)."""
    return tls.url_opener(tls.TlsClientSettings.from_env())


class StoreReadError(RuntimeError):
    """A store pod could not be read (unreachable, refused, or answered something unusable)."""


class TopicNotHere(StoreReadError):
    """The pod answered that it does not hold the topic (404)."""


def _get(url: str, timeout_s: float, what: str) -> bytes:
    try:
        with _opener().open(url, timeout=timeout_s) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError as exc:
        detail = _error_text(exc)
        if exc.code == 404:
            raise TopicNotHere(f"{what}: {detail}") from None
        raise StoreReadError(f"{what}: the store answered HTTP {exc.code}: {detail}") from None
    except tls.TlsSettingsError as exc:
        raise StoreReadError(f"{what}: TLS settings: {exc}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        reason = tls.describe_url_error(reason, url, tls.TlsClientSettings.from_env()) or reason
        base = url.split("/admin/", maxsplit=1)[0]
        raise StoreReadError(
            f"{what}: the store's admin API at {base} is unreachable ({reason}); check the adminUrl "
            "option and that the store pod is running"
        ) from None


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        doc = json.loads(exc.read())
        return str(doc.get("error", doc)) if isinstance(doc, dict) else str(doc)
    except (ValueError, OSError):
        return str(exc.reason)


def read_state(admin_url: str, topic: str, timeout_s: float) -> dict[str, Any]:
    query = urllib.parse.urlencode({"topic": topic})
    what = f"reading the state of topic {topic!r} from {admin_url}"
    body = _get(f"{admin_url.rstrip('/')}{READ_STATE_PATH}?{query}", timeout_s, what)
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise StoreReadError(f"{what}: the answer is not JSON ({exc})") from None
    if not isinstance(doc, dict) or not {"maxReadPosition", "ledgers", "abortedTxns"} <= doc.keys():
        raise StoreReadError(f"{what}: the answer is not a topic read state (an older store release?)")
    return doc


def read_entries(
    admin_url: str, topic: str, position: tuple[int, int], limits: tuple[int, int], timeout_s: float
) -> entry_frames.EntryRange:
    """Entries of one ledger from ``position`` on, at most ``limits`` = (entries, bytes)."""
    ledger_id, first = position
    query = urllib.parse.urlencode(
        {"topic": topic, "ledger": ledger_id, "entry": first, "maxEntries": limits[0], "maxBytes": limits[1]}
    )
    what = f"reading entries {ledger_id}:{first}.. of topic {topic!r} from {admin_url}"
    body = _get(f"{admin_url.rstrip('/')}{ENTRIES_PATH}?{query}", timeout_s, what)
    try:
        found = entry_frames.decode(body)
    except entry_frames.EntryFramesError as exc:
        raise StoreReadError(f"{what}: {exc}") from None
    if (found.ledger_id, found.first_entry_id) != (ledger_id, first):
        raise StoreReadError(f"{what}: the store answered entries {found.ledger_id}:{found.first_entry_id}..")
    return found
