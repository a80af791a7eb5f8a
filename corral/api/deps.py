"""Injected dependencies of the routes: the server's runtime objects, a DB session per
request, the clock and the caller's identity (from their bearer token, never from a header
they could set)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Annotated, TypeVar

from fastapi import Depends, HTTPException, Request
from starlette.requests import HTTPConnection
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from corral.admission import Admission
from corral.api.intake import Intake
from corral.api.streams import Streams
from corral.api.waits import CycleWaits
from corral.auth.accounts import Accounts
from corral.auth.audit import Auditor
from corral.auth.roles import Identity, Role, configured_role
from corral.auth.tokens import TokenBook, missing
from corral.control.commands import Change, Outcome
from corral.control.loop import ControlLoop
from corral.executors.registry import infras
from corral.pool import NodeSpec
from corral.settings import Settings
from corral.site import Site


T = TypeVar("T")
READ_TIMEOUT_S = 10.0
CHANGE_TIMEOUT_S = 30.0


@dataclass
class ServerState:
    settings: Settings
    sessions: sessionmaker[Session]
    site: Site
    loop: ControlLoop
    clock: Callable[[], float] = field(default=time.time)
    owner: str = ""  # the OS user running the server: the local token speaks for them
    local_token: str | None = None  # see corral.credentials
    intake: Intake = field(init=False)
    admission: Admission = field(init=False)
    tokens: TokenBook = field(init=False)
    auditor: Auditor = field(init=False)
    streams: Streams = field(init=False)
    accounts: Accounts = field(init=False)
    waits: CycleWaits = field(init=False)

    def __post_init__(self) -> None:
        self.intake = Intake(self.sessions, self.clock, self.loop.submitted, arriving=self.loop.arriving)
        self.admission = Admission(self.site, self.loop.misfit, pool=lambda: self.loop.view.nodes,
                                   outages=lambda: (self.loop.view.down_partitions, self.loop.view.unreachable))
        self.tokens = TokenBook(self.sessions, self.clock, self.local_token)
        self.auditor = Auditor(self.sessions, self.clock)
        # the loop writes the entry of each change it carries out, in that change's transaction
        self.loop.commands.audit = self.auditor.add
        self.streams = Streams(self.site.api.max_streams_per_user)
        self.accounts = Accounts(self.site.identity)
        self.waits = CycleWaits(lambda: self.loop.view)

    def run_as(self, user: str, partition: str) -> str:
        """The Unix account ``user``'s job on ``partition`` runs as; ``AccountRefusal`` (one
        sentence) when it cannot run here as any."""
        infra = self.site.partition_infra.get(partition)
        entry = infras().get(infra) if infra else None
        only = entry.runs_as(self.site.infras.get(infra) or entry.config()) if entry and entry.runs_as else None
        return self.accounts.run_as(user, only, f"partition {partition} (infra {infra})")

    def change(self, change: Change, timeout: float = CHANGE_TIMEOUT_S) -> Outcome:
        """A change carried out by the control loop in its own transaction; its outcome once
        committed (503 if the loop does not get there in time: then nothing was done)."""
        return self._wait(self.loop.change(change), timeout)

    def changes(self, changes: list[Change], timeout: float = CHANGE_TIMEOUT_S) -> list[Outcome]:
        """Several changes (an array's elements), queued together so one cycle carries them."""
        futures = [self.loop.change(change) for change in changes]
        return [self._wait(future, timeout) for future in futures]

    def _wait(self, future, timeout: float) -> Outcome:  # noqa: ANN001 - a concurrent Future
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            if future.cancel():  # the loop had not taken it: it never will
                raise HTTPException(503, f"the control loop did not get to the change within {timeout:g}s (its "
                                         "database may be unreachable); nothing was changed: try again") from None
        try:  # being carried out: its outcome
            return future.result(timeout=timeout)
        except FutureTimeout:
            raise HTTPException(503, "the change is being carried out but its commit is not done yet (the "
                                     "database may be unreachable); `corral status` will show it") from None

    def read(self, read: Callable[[], T], timeout: float = READ_TIMEOUT_S) -> T:
        """An answer computed on the control loop's thread (it never shares its memory)."""
        try:
            return self.loop.ask(read).result(timeout=timeout)
        except FutureTimeout:
            raise HTTPException(503, f"the control loop did not answer within {timeout:g}s; try again") from None

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The node pool as the loop last published it."""
        return self.loop.view.nodes


# Trivial dependencies are async so FastAPI does not hop to a worker thread for each one.
async def get_state(request: Request) -> ServerState:
    return request.app.state.corral


async def get_session(state: Annotated[ServerState, Depends(get_state)]) -> AsyncIterator[Session]:
    # Opening a session does no I/O (the connection is taken on first use, in the route's
    # worker thread), so this need not cost a thread hop of its own.
    with state.sessions() as session:
        yield session


async def get_clock(state: Annotated[ServerState, Depends(get_state)]) -> Callable[[], float]:
    return state.clock


bearer = HTTPBearer(auto_error=False, scheme_name="token", description=(
    "`corral token create USER` makes one; the embedded server's owner uses the local token in "
    "CORRAL_HOME/local.token"))


async def get_identity(request: Request, state: Annotated[ServerState, Depends(get_state)],
                       credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Identity:
    """Who is calling: the owner (admin) through the local token, or a token's holder. Every
    request without a valid token is refused, on loopback too: anyone on the machine can
    reach a loopback port. Async, and answered from memory: no thread hop, no query."""
    if credentials is None:
        raise missing()
    return await identify(state, credentials.credentials, request)


async def identify(state: ServerState, token: str, connection: HTTPConnection) -> Identity:
    """The identity ``token`` speaks for on ``connection`` (a request or a WebSocket); 401 or
    403 (an ``HTTPException``) otherwise."""
    if state.tokens.is_local(token):
        identity = Identity(state.owner, Role.admin, "local")
    else:
        record = state.tokens.verify(token)
        role = Role(record.role) if record.role else configured_role(record.user, state.site.operators)
        identity = Identity(record.user, role, connection.client.host if connection.client else "unknown", record.id)
        now = state.clock()
        if state.tokens.due_for_touch(record, now):
            await run_in_threadpool(state.tokens.touch, record, now)
    claimed = connection.headers.get("x-corral-user")
    if claimed is not None and claimed != identity.user:
        # Clients once named their user in this header; a request naming someone else is refused
        # rather than quietly acted on as the token's holder.
        raise HTTPException(403, f"the X-Corral-User header names {claimed[:64]!r} but the token is "
                                 f"{identity.user}'s: the acting user comes from the token alone (drop the header)")
    return identity


StateDep = Annotated[ServerState, Depends(get_state)]
SessionDep = Annotated[Session, Depends(get_session)]
ClockDep = Annotated[Callable[[], float], Depends(get_clock)]
IdentityDep = Annotated[Identity, Depends(get_identity)]
