"""Settings of the Pulsar protocol on a pod: the ``--pulsar-urls`` serve flag.

Pulsar's clients find the pod that holds a topic by asking any pod (LOOKUP), so every pod must know
the store pods' addresses as clients reach them: ``pulsar://<host>:<port>`` of each store pod, in
ordinal order (the operator fills them with the pods' DNS names behind the headless Service). A topic
is held by the store pod txnkeeper's own clients place it on (crc32 of its name over the store pods),
so both protocols meet on the same pod. Without the flag a pod answers lookups with its own address
(one store pod, or a local run).

Why its own module: like ``txn_config``, one self-contained flag with its own validation.
"""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

from txnkeeper.server.config import ConfigError, env

_FLAG = "--pulsar-urls (or TXNKEEPER_PULSAR_URLS)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pulsar-urls",
        default=env("PULSAR_URLS"),
        help="comma-separated pulsar://host:port of every store pod in ordinal order: what Pulsar"
        " lookups answer (default: this pod's own address)",
    )


def pulsar_urls(ns: argparse.Namespace) -> tuple[str, ...]:
    text = ns.pulsar_urls
    if text is None or not text.strip():
        return ()
    urls = tuple(part.strip() for part in text.split(","))
    for url in urls:
        problem = url_problem(url)
        if problem is not None:
            raise ConfigError(f"{_FLAG}: {problem}")
    return urls


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a Pulsar service URL of one pod (None: it is)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"{url!r} is not a URL ({exc}); give pulsar://host:port"
    if parts.scheme != "pulsar" or not parts.hostname or port is None:
        return f"{url!r} is not pulsar://host:port"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return f"{url!r} has more than pulsar://host:port"
    return None
