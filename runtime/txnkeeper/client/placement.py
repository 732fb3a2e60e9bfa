"""Following placement (docs/contracts.md §12): where a topic's store pod is now, and how a request
answered ``NOT_SERVED_HERE`` reaches the pod that serves it.

Why the client follows: shards and coordinator ids move between pods while clients run. A pod that
does not serve a topic (or a coordinator id) any more answers with the owner's address: the client
re-sends there and remembers the topic's new pod, so later requests go straight to it. While a shard is
fenced for a move the answer carries no owner: nothing was applied, and the client waits (0.05 s doubling
to 1 s) and asks again, within the operation's timeout; a move lasts a few seconds. A refusal is never
applied, so re-sending it elsewhere cannot write anything twice.

The first placement is the arithmetic one (``crc32(topic) mod stores`` over the addresses the client was
given); a redirect overrides it per topic. A store pod that cannot be connected to at all (removed by a
scale-in, or not there yet) sent nothing and applied nothing: once this client has had a placement
answer from some store (so the stores hold a placement record and refuse what they do not own), the
request goes to the other store addresses in turn, any of which redirects it to the owner. Before
that it does not: stores started without placement serve every topic, and a topic written to
whichever store answered would be split between two pods (silent loss to its readers; the cluster
soak found exactly that).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TypeVar, cast

from txnkeeper.aio import failure_of, settle
from txnkeeper.client.futures import converted
from txnkeeper.errors import ConnectionClosedError, NotServedHereError, ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api

log = logging.getLogger(__name__)
T = TypeVar("T")
E = TypeVar("E", bound=ServiceError)

MAX_HOPS = 3  # redirects in a row before the client gives up (pods disagreeing about placement)
MOVE_BACKOFF = (0.05, 1.0)  # seconds: first wait while a shard is being moved, cap
STORE_CACHE = 100_000  # topics whose store pod is remembered (the hash of each name is computed once)


def unreachable(failure: BaseException | None) -> bool:
    """Whether ``failure`` is a connection that could not be made (nothing was sent)."""
    return isinstance(failure, ConnectionClosedError) and str(failure).startswith("cannot connect")


def is_placement(failure: BaseException | None) -> bool:
    """Whether ``failure`` is a placement answer (a redirect, or "being moved: retry"), not a pod of
    the wrong role (those carry neither an owner nor an epoch and are not retried)."""
    return isinstance(failure, NotServedHereError) and bool(
        failure.owner_address or failure.placement_epoch > 0
    )


class Redirects:
    """Counts one operation's redirects and waits: ``after(failure)`` returns the address to try next
    (the owner), or None after waiting out a move; raises once the hops or the deadline are used up."""

    def __init__(self, what: str, timeout: float) -> None:
        self._what = what
        self._deadline = time.monotonic() + timeout
        self._timeout = timeout
        self._hops = 0
        self._delay = MOVE_BACKOFF[0]

    async def after(self, failure: NotServedHereError) -> str | None:
        owner = failure.owner_address
        if owner:
            self._hops += 1
            if self._hops > MAX_HOPS:
                raise NotServedHereError(
                    f"{self._what}: redirected {self._hops} times in a row (last to {owner}, placement "
                    f"epoch {failure.placement_epoch}): the pods disagree about placement; retry later",
                    owner_address=owner,
                    placement_epoch=failure.placement_epoch,
                ) from failure
            return owner
        self._hops = 0
        if time.monotonic() + self._delay > self._deadline:
            raise NotServedHereError(
                f"{self._what}: still being moved between pods after {self._timeout:g}s ({failure}); "
                "nothing was applied: retry later",
                placement_epoch=failure.placement_epoch,
            ) from failure
        await asyncio.sleep(self._delay)
        self._delay = min(self._delay * 2, MOVE_BACKOFF[1])
        return None


class StoreRouter:
    """topic -> the store pod that serves it: the arithmetic rule, overridden by redirects."""

    def __init__(
        self,
        stores: Sequence[str],
        operation_timeout: float,
        request: Callable[[str, api.Command], Awaitable[api.Command]],
        on_new_address: Callable[[str], None],
    ) -> None:
        self._stores = list(stores)
        self.operation_timeout = operation_timeout
        self._request = request
        self._on_new_address = on_new_address
        self._store_of: dict[str, str] = {}
        self._known = set(self._stores)
        self.moves = 0  # redirects taken: what a cache of store addresses compares to know it is stale
        # A store answered by placement: the stores refuse topics they do not own, so an unreachable
        # one may be asked around (never before: see the module docstring).
        self.placement_seen = False

    def is_store(self, address: str) -> bool:
        return address in self._known

    def address(self, topic: str) -> str:
        """The store pod that serves ``topic``, as far as this client knows."""
        store = self._store_of.get(topic)
        if store is None:
            if not self._stores:
                raise ValueError("this client was given no store addresses")
            store = self._stores[zlib.crc32(topic.encode()) % len(self._stores)]
            if len(self._store_of) >= STORE_CACHE:
                self._store_of.clear()  # an application naming ever new topics: start over
            self._store_of[topic] = store
        return store

    def moved(self, topic: str, address: str) -> None:
        """A pod said ``topic`` is served at ``address`` now."""
        self.placement_seen = True
        if self._store_of.get(topic) == address:
            return
        log.info("topic %s is served at %s now (redirected)", topic, address)
        if address not in self._known:
            self._known.add(address)
            self._on_new_address(address)
        self._store_of[topic] = address
        self.moves += 1

    async def at_owner(self, topic: str, attempt: Callable[[str], Awaitable[T]], what: str) -> T:
        """``attempt(address)`` at the topic's store pod, following redirects and waiting out a move
        (within the operation timeout)."""
        redirects = Redirects(what, self.operation_timeout)
        tried: set[str] = set()
        while True:
            address = self.address(topic)
            try:
                return await attempt(address)
            except NotServedHereError as exc:
                if not is_placement(exc):
                    raise
                self.placement_seen = True
                owner = await redirects.after(exc)
                if owner is not None:
                    self.moved(topic, owner)
            except ConnectionClosedError as exc:
                tried.add(address)
                if not (unreachable(exc) and self._elsewhere(topic, tried)):
                    raise

    def request(self, topic: str, command: api.Command) -> asyncio.Future[api.Command]:
        """Send ``command`` for ``topic``; a placement answer re-sends it where the topic is served."""
        return self.request_then(topic, command, same)

    def request_then(
        self, topic: str, command: api.Command, convert: Callable[[api.Command], T]
    ) -> asyncio.Future[T]:
        """``request`` whose future resolves to ``convert(answer)`` (a send's message id)."""
        first = self._request(self.address(topic), command)
        return following(first, partial(self._follow, topic, command), convert, self._retried)

    def _retried(self, failure: BaseException | None) -> bool:
        return is_placement(failure) or (
            unreachable(failure) and len(self._stores) > 1 and self.placement_seen
        )

    async def _follow(self, topic: str, command: api.Command, failure: ServiceError) -> api.Command:
        redirects = Redirects(f"{command.WhichOneof('body')} of {topic}", self.operation_timeout)
        tried: set[str] = set()
        while True:
            if isinstance(failure, NotServedHereError):
                self.placement_seen = True
                owner = await redirects.after(failure)
                if owner is not None:
                    self.moved(topic, owner)
            else:
                tried.add(self.address(topic))
                if not self._elsewhere(topic, tried):
                    raise failure
            try:
                return await self._request(self.address(topic), command)
            except NotServedHereError as exc:
                if not is_placement(exc):
                    raise
                failure = exc
            except ConnectionClosedError as exc:
                if not unreachable(exc):
                    raise
                failure = exc

    def _elsewhere(self, topic: str, tried: set[str]) -> bool:
        """Point ``topic`` at the next store address not ``tried`` (a pod that cannot be reached
        cannot redirect; any other can); False when every one was tried, or when no store has shown
        it holds placement (one without would serve the topic: the module docstring)."""
        if not self.placement_seen:
            return False
        for address in self._stores:
            if address not in tried:
                log.info("topic %s: %s cannot be reached; asking %s", topic, sorted(tried), address)
                self._store_of[topic] = address
                self.moves += 1
                return True
        return False


def same(response: api.Command) -> api.Command:
    """The answer itself (``following``'s conversion when none is given)."""
    return response


def following(
    first: Awaitable[api.Command],
    retry: Callable[[E], Awaitable[api.Command]],
    convert: Callable[[api.Command], T] = same,  # type: ignore[assignment]
    retried: Callable[[BaseException | None], bool] = is_placement,
) -> asyncio.Future[T]:
    """``convert`` of ``first``'s answer, or, when that is a failure ``retried`` says to retry (a
    placement answer), of ``retry(that failure)``'s. As cheap as ``futures.then`` when no redirect
    comes (one future, one callback); only a redirect takes a task."""
    result: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    answered = partial(_first_answered, (retry, retried), convert, result)
    asyncio.ensure_future(first).add_done_callback(answered)
    return result


def _first_answered(
    retrying: tuple[Callable[[E], Awaitable[api.Command]], Callable[[BaseException | None], bool]],
    convert: Callable[[api.Command], T],
    result: asyncio.Future[T],
    response: asyncio.Future[api.Command],
) -> None:
    retry, retried = retrying
    failure = failure_of(response)
    if not retried(failure):
        _settle_converted(result, convert, response)
        return
    again = asyncio.ensure_future(retry(cast(E, failure)))
    again.add_done_callback(partial(_settle_converted, result, convert))


def _settle_converted(
    result: asyncio.Future[T], convert: Callable[[api.Command], T], response: asyncio.Future[api.Command]
) -> None:
    failure, value = converted(convert, response)
    settle(result, failure, cast(T, value))
