"""Kopf registration: every event and a periodic timer funnel into one level-based reconcile.

Kopf is only the trigger and the event poster here; all decisions happen in the engine and all I/O in
reconcile.py. Handler progress is kept in annotations (not status), so kopf never competes with the
operator's own status writes, and one lock per resource keeps a timer tick and a change handler from
reconciling the same object at once.

Run: `txnkeeper-operator [--namespace NS]` or `kopf run --standalone -m txnkeeper_operator.handlers -A`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, cast

import aiohttp
import kopf

from txnkeeper.contract.admin import AdminClient
from txnkeeper_operator import metrics
from txnkeeper_operator.context import Context
from txnkeeper_operator.kube import KubernetesClient
from txnkeeper_operator.naming import API_VERSION, GROUP, KINDS
from txnkeeper_operator.reconcile import reconcile
from txnkeeper_operator.settings import OperatorSettings

log = logging.getLogger("txnkeeper_operator")


class KopfEvents:
    """Post Kubernetes Events through kopf (batched, rate-limited, attached to the resource)."""

    def emit(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message[:1000])


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    ours = OperatorSettings.from_env()
    session = aiohttp.ClientSession()
    memo["session"] = session
    memo["context"] = Context(
        kube=KubernetesClient.from_environment(),
        admin=AdminClient(session, ours.admin_timeout_seconds),
        settings=ours,
        events=KopfEvents(),
    )
    memo["locks"] = {}
    log.info("txnkeeper operator configured: %s", ours)


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    session = memo.get("session")
    if session is not None:
        await session.close()


async def _reconcile(body: kopf.Body, memo: kopf.Memo) -> None:
    locks: dict[str, asyncio.Lock] = memo["locks"]
    lock = locks.setdefault(str(body["metadata"]["uid"]), asyncio.Lock())
    async with lock:
        try:
            await reconcile(body, memo["context"])
        except Exception as err:
            metrics.RESOURCES.failed(_key(body))
            # Level-based: the next trigger recomputes everything; say why this one did not finish.
            raise kopf.TemporaryError(f"reconcile failed: {type(err).__name__}: {err}", delay=5) from err


def _key(body: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = body["metadata"]
    return str(meta.get("namespace", "")), str(body.get("kind", "")), str(meta["name"])


_INTERVAL = OperatorSettings.from_env().reconcile_seconds


def _register(plural: str) -> None:
    @kopf.on.resume(GROUP, API_VERSION, plural, id="reconcile")
    @kopf.on.create(GROUP, API_VERSION, plural, id="reconcile")
    @kopf.on.update(GROUP, API_VERSION, plural, id="reconcile")
    async def changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await _reconcile(body, memo)

    @kopf.timer(GROUP, API_VERSION, plural, interval=_INTERVAL, sharp=False, id="reconcile-timer")
    async def tick(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await _reconcile(body, memo)

    @kopf.on.delete(GROUP, API_VERSION, plural, optional=True, id="forget")
    async def deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        memo["locks"].pop(str(body["metadata"]["uid"]), None)
        metrics.RESOURCES.forget(_key(body))
        metrics.CERTIFICATES.forget(
            str(body["metadata"].get("namespace", "")), f"{body['metadata']['name']}-tls"
        )


for _kind in KINDS:
    _register(_kind.plural)
