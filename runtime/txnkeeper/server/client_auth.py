"""Which principal each client connection of a store pod authenticated as (``ClientAuth``).

Why a module of its own: the principal is a property of the connection that several edges consult
(the writer sessions of ``server.blocks`` qualify writer ids and producer names with it), while the
token format lives in ``protocol.clientauth``. A store without a client token key authenticates
nobody: every connection is principal "" and a ClientAuth is answered with that, unchecked.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.auth import UnauthorizedError
from txnkeeper.protocol.clientauth import KEY_FLAG, ClientTokenKey
from txnkeeper.protocol.server import Session


class ClientPrincipals:
    def __init__(self, key: ClientTokenKey | None, clock_s: Callable[[], float] = time.time) -> None:
        self._key = key
        self._clock_s = clock_s
        self._principals: dict[int, str] = {}  # connection -> its principal

    @property
    def required(self) -> bool:
        """Whether writer sessions need an authenticated connection (a client token key is set)."""
        return self._key is not None

    def authenticate(self, session: Session, command: api.Command) -> api.Command:
        answer = api.Command()
        answer.client_authenticated.SetInParent()
        if self._key is None:
            return answer  # principal "": nothing is checked on this store
        principal = self._key.principal_of(command.client_auth.token, self._clock_s())
        held = self._principals.get(session.session_id)
        if held is not None and held != principal:
            raise UnauthorizedError(
                f"this connection is authenticated as {held!r}; a token of {principal!r} cannot change"
                " that: open a new connection for another principal"
            )
        self._principals[session.session_id] = principal
        answer.client_authenticated.principal = principal
        return answer

    def principal(self, session: Session, what: str) -> str:
        """The connection's principal for ``what``; "" on a store that authenticates nobody."""
        if self._key is None:
            return ""
        principal = self._principals.get(session.session_id)
        if principal is None:
            raise UnauthorizedError(
                f"{what}: this store authenticates clients ({KEY_FLAG}), and writer ids and producer"
                " names belong to a principal: send ClientAuth with your token on this connection first"
                " (the client: Client(auth_token=...))"
            )
        return principal

    def session_closed(self, session: Session) -> None:
        self._principals.pop(session.session_id, None)
